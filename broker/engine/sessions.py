"""Who a session is and whether it is still alive.

Two kinds of session hold claims (and, later, exclusive producer access):
- conn-RUN-N: a connection to `fencelog serve` run RUN. It is live exactly while that
  server has the connection open; the server answers that from memory.
- proc-PID-START-N: the Nth client of a process that opened the data directory
  embedded (a severed client is done; a new client is a new session). It is live while
  that process exists (same pid and same start time, so a reused pid is not mistaken
  for it), has not been severed, and its pulse is fresh.

A process session's pulse is a small file, DATA_DIR/sessions/SESSION, in which the
process writes the time every beat, without SQLite. Heartbeats in the database need
the write lock: a process that held it past the session timeout (stopped inside a
write, or only a long one) would make every other live session look dead to the first
writer after it. The pulse never waits for the lock, so a live process keeps it fresh
however long another holds the lock; a stopped one cannot, and is judged dead once its
pulse is older than session_timeout_ms. A process that finds, when it resumes, that
its own last beat is older than that marks its pulse stopped for good: it may have been
judged dead meanwhile, so it is, whoever looks first. A session without a pulse file
(written by an older fencelog) is judged by its database heartbeat.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Final

from broker.storage.ownership import SessionRow

ServedSessions = Callable[[], Collection[str]]
PULSE_DIR: Final = "sessions"
_STOPPED: Final = b"stopped"
_PULSE_BYTES: Final = 20


def new_server_run() -> str:
    # What secrets.token_hex(4) does, without importing hmac and hashlib into every
    # one-shot command that imports this module.
    return os.urandom(4).hex()


def connection_session_id(run: str, number: int) -> str:
    return f"conn-{run}-{number}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode()


_process_sessions = itertools.count(1)


def process_session_id() -> str:
    pid = os.getpid()
    return f"proc-{pid}-{_start_time(pid) or '0'}-{next(_process_sessions)}"


def session_pid(session_id: str) -> int:
    return int(session_id.split("-")[1])


def _process_alive(session_id: str) -> bool:
    _, pid, start, _ = session_id.split("-", 3)
    return pid.isascii() and pid.isdigit() and _start_time(int(pid)) == start


def is_live(
    session_id: str,
    row: SessionRow | None,
    now_ms: int,
    session_timeout_ms: int,
    served: Collection[str],
    data_dir: Path,
) -> bool:
    if session_id.startswith("conn-"):
        return session_id in served
    if row is None or row.severed_ms is not None:
        return False
    pulse = read_pulse(data_dir, session_id)
    last_ms = row.heartbeat_ms if pulse is None else pulse
    if last_ms < 0 or now_ms - last_ms > session_timeout_ms:
        return False
    if not _process_alive(session_id):
        with contextlib.suppress(OSError):
            pulse_path(data_dir, session_id).unlink()
        return False
    return True


def pulse_path(data_dir: Path, session_id: str) -> Path:
    return data_dir / PULSE_DIR / session_id


def read_pulse(data_dir: Path, session_id: str) -> int | None:
    """The session's last beat (ms), -1 if it marked itself stopped, None if no pulse."""
    try:
        with open(pulse_path(data_dir, session_id), "rb") as file:
            text = file.read(_PULSE_BYTES).strip()
    except OSError:
        return None
    if text == _STOPPED:
        return -1
    return int(text) if text.isdigit() else None


class Pulse:
    """A process session's pulse, beaten by a thread of its own (see the module)."""

    def __init__(
        self, data_dir: Path, session_id: str, clock: Callable[[], int], timeout_ms: int
    ) -> None:
        self.path = pulse_path(data_dir, session_id)
        self.path.parent.mkdir(mode=0o700, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._clock = clock
        self._timeout_ms = timeout_ms
        self._last_ms = clock()
        self._write(str(self._last_ms).encode())

    def beat(self) -> int | None:
        """Write the time; None, or once the last beat is older than the session
        timeout (this process was stopped), how long ago that was: the pulse is then
        marked stopped for good."""
        now_ms = self._clock()
        gap_ms = now_ms - self._last_ms
        if gap_ms > self._timeout_ms:
            self._write(_STOPPED)
            return gap_ms
        self._write(str(now_ms).encode())
        self._last_ms = now_ms
        return None

    def _write(self, text: bytes) -> None:
        # One small write at offset 0, padded to a fixed size: a reader sees the old
        # contents or the new, never a mix of two lengths.
        os.pwrite(self._fd, text.ljust(_PULSE_BYTES - 1) + b"\n", 0)

    def close(self, *, remove: bool) -> None:
        os.close(self._fd)
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
