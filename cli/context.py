"""The global options and the one client a command uses, opened on first use."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Final

import click
from msgspec import Struct

from broker.client.client import Client, address_of, connect
from broker.limits import DEFAULT_LIMITS
from broker.types import Durability
from cli.output import warn

# What an open or a refused `serve` leaves in a data directory it created.
_FRESH_FILES: Final = frozenset(
    {"fencelog.db", "fencelog.db-wal", "fencelog.db-shm"}
    | {"server.lock", "server.json", "fencelog.sock"}
    | {"sessions"}  # a claim's session pulse (own), empty once its client closed
)


class State(Struct):
    broker: str
    durability: Durability
    token: str | None = None
    explicit_broker: bool = True  # --broker or FENCELOG_BROKER named it
    explicit_durability: bool = False  # --durability on the command line
    request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000
    connect_timeout_s: float = 0.5  # retries of a refused connection (cli.main's default)
    _client: Client | None = None
    _created: Path | None = None

    def address(self) -> str | None:
        """The broker's URL when --broker names a server rather than a directory."""
        return address_of(self.broker)

    def client(self, *, create: bool = False) -> Client:
        """The command's client. A data directory that does not exist is created only
        for a command that writes (create=True), or when it is the default ./.fencelog;
        if the command then fails, the directory it created is removed again."""
        if self._client is None:
            create = create or not self.explicit_broker
            self._created = _first_missing(Path(self.broker)) if create else None
            if self.address() is not None:
                self._created = None
            self._client = connect(
                self.broker,
                durability=self.durability,
                token=self.token,
                create=create,
                request_timeout_s=self.request_timeout_s,
                connect_timeout_s=self.connect_timeout_s,
            )
            click.get_current_context().call_on_close(self._client.close)
            if self.explicit_durability and self._client.served:
                warn(
                    f"--durability {self.durability} applies to a data directory opened "
                    "here; the server decides its own (fencelog --durability ... serve)"
                )
        return self._client

    def creating(self) -> None:
        """The command is about to create the data directory itself (serve, snapshot
        restore): if it fails, the directory goes again."""
        self._created = _first_missing(Path(self.broker))

    def failed(self) -> None:
        """The command failed: close the client, and remove the data directory it
        created if that holds nothing but a fresh database, so that a mistake leaves
        nothing behind."""
        if self._client is not None:
            self._client.close()
        created, self._created = self._created, None
        if created is None or not created.is_dir():
            return
        data_dir = Path(self.broker)
        expected = {d for d in (data_dir, *data_dir.parents) if d.is_relative_to(created)}
        expected |= {data_dir / name for name in _FRESH_FILES}
        for root, dirs, files in os.walk(created):
            if any(Path(root, name) not in expected for name in (*dirs, *files)):
                return  # something else was put there meanwhile: keep it all
        with contextlib.suppress(OSError):
            shutil.rmtree(created)


def _first_missing(path: Path) -> Path | None:
    """The outermost directory an open of path would create, or None if it exists."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def state() -> State:
    obj = click.get_current_context().find_object(State)
    assert obj is not None, "the root callback sets State"
    return obj
