"""Who a session is and whether it is still alive.

Two kinds of session hold claims (and, later, exclusive producer access):
- conn-RUN-N: a connection to `fencelog serve` run RUN. It is live exactly while that
  server has the connection open; the server answers that from memory.
- proc-PID-START-N: the Nth client of a process that opened the data directory
  embedded (a severed client is done; a new client is a new session). It is live while
  that process exists (same pid and same start time, so a reused pid is not mistaken
  for it), has not been severed, and has written a heartbeat within session_timeout_ms.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Collection

from broker.storage.ownership import SessionRow

ServedSessions = Callable[[], Collection[str]]


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
) -> bool:
    if session_id.startswith("conn-"):
        return session_id in served
    if row is None or row.severed_ms is not None:
        return False
    if now_ms - row.heartbeat_ms > session_timeout_ms:
        return False
    return _process_alive(session_id)
