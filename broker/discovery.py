"""Which process owns a data directory: a running server, or nobody.

`fencelog serve` holds an exclusive lock on DATA_DIR/server.lock for as long as it runs
(the kernel drops it when the process dies, however it dies) and publishes how to reach
it in DATA_DIR/server.json. An embedded open first asks `find_server()`: while a server
holds the lock, the open goes through that server instead of around it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Final

from msgspec import Struct
from msgspec.structs import asdict

from broker.errors import BrokerError, ErrorCode

DB_FILE: Final = "fencelog.db"  # the database; SQLite keeps its -wal and -shm beside it
LOCK_FILE: Final = "server.lock"
INFO_FILE: Final = "server.json"
SOCKET_FILE: Final = "fencelog.sock"
_STARTING_WAIT_S: Final = 5.0


class ServerInfo(Struct, frozen=True):
    pid: int
    tcp: str | None
    unix: str | None
    kafka: str | None = None  # the Kafka listener's HOST:PORT, when serve has one
    http: str | None = None  # /healthz, /readyz and /metrics: HOST:PORT, when serve has it

    def url(self) -> str:
        if self.unix:
            return f"unix://{self.unix}"
        assert self.tcp is not None, "a server listens somewhere"
        return f"tcp://{self.tcp}"


class ServerLock:
    """Held by the serving process for its whole life."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        path = data_dir / LOCK_FILE
        while True:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                owner = read_info(data_dir)
                raise BrokerError(
                    ErrorCode.DATA_DIR_IN_USE,
                    f"a fencelog server already owns {data_dir}"
                    + (f" (pid {owner.pid}, {owner.url()})" if owner else ""),
                    path=str(data_dir),
                    hint="use --broker with its address, or stop it first",
                ) from None
            # A stopping server unlinks the file before it lets go: a lock taken on the
            # unlinked file is no lock, so take it again on the file the path names now.
            try:
                if os.fstat(self._fd).st_ino == os.stat(path).st_ino:
                    return
            except FileNotFoundError:
                pass
            os.close(self._fd)

    def publish(self, info: ServerInfo) -> None:
        temporary = self.data_dir / (INFO_FILE + ".tmp")
        temporary.write_text(json.dumps(asdict(info)))
        os.chmod(temporary, 0o600)
        temporary.replace(self.data_dir / INFO_FILE)

    def release(self) -> None:
        """Remove server.json and server.lock, then let go: a clean stop leaves neither."""
        for name in (INFO_FILE, LOCK_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / name).unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def read_info(data_dir: Path) -> ServerInfo | None:
    try:
        raw = json.loads((data_dir / INFO_FILE).read_text())
        return ServerInfo(
            int(raw["pid"]), raw.get("tcp"), raw.get("unix"), raw.get("kafka"), raw.get("http")
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _locked(data_dir: Path) -> bool:
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def find_server(data_dir: Path) -> ServerInfo | None:
    """The server that owns data_dir right now, or None."""
    if not _locked(data_dir):
        return None
    deadline = time.monotonic() + _STARTING_WAIT_S
    while True:  # the lock is taken before server.json is written: wait for it
        info = read_info(data_dir)
        if info is not None or not _locked(data_dir):
            return info
        if time.monotonic() > deadline:
            raise BrokerError(
                ErrorCode.DATA_DIR_IN_USE,
                f"a process holds {data_dir / LOCK_FILE} but publishes no address",
                path=str(data_dir),
            )
        time.sleep(0.05)
