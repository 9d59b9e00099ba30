"""What one connection's produce transactions may remember from one to the next.

A produce reads the same few rows every time: the topic by name, each partition's log
end, the topic's epoch. `WriteCache` keeps them between produce transactions, and trusts
them only while nothing else can have changed them:

- the previous write transaction on this connection was a produce that committed and
  kept the cache up to date (any other write, or a rollback, leaves it stale), and
- no other connection, in this process or another, has committed since (SQLite's
  `PRAGMA data_version` is unchanged).

Otherwise the cache starts empty and fills again from the database. So the engine still
holds no state another process could make stale: it only skips reads whose answer it
knows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from broker.storage import logs
from broker.storage.database import Database

Part = tuple[int, int]  # (topic id, partition)


class WriteCache:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._topics: dict[str, logs.TopicRow] = {}
        self._ends: dict[Part, int] = {}
        self._epochs: dict[int, int] = {}  # topics with no producer attachments at all
        self._valid_for: tuple[int, int] | None = None  # (data_version, write_transactions)
        self._version = 0

    def begin(self) -> None:
        """Inside a produce's write transaction, before any read: forget everything
        unless this transaction directly follows the one that last kept the cache."""
        # Read under the write lock: nobody else can commit until this transaction ends.
        self._version = self._database.data_version()
        if (self._version, self._database.write_transactions - 1) != self._valid_for:
            self._topics.clear()
            self._ends.clear()
            self._epochs.clear()
        self._valid_for = None  # until kept: a rollback leaves the cache stale

    def kept(self) -> None:
        """After the produce's COMMIT: what the cache holds is what the database holds."""
        self._valid_for = (self._version, self._database.write_transactions)

    def topic(self, name: str, load: Callable[[], logs.TopicRow]) -> logs.TopicRow:
        row = self._topics.get(name)
        if row is None:
            row = self._topics[name] = load()
        return row

    def end(self, conn: sqlite3.Connection, topic: logs.TopicRow, partition: int) -> int:
        part = (topic.topic_id, partition)
        end = self._ends.get(part)
        if end is None:
            end = self._ends[part] = logs.end_offset(conn, topic, partition)
        return end

    def appended(self, topic_id: int, partition: int, end: int) -> None:
        self._ends[(topic_id, partition)] = end

    def epoch(self, topic_id: int) -> int | None:
        return self._epochs.get(topic_id)

    def unattached(self, topic_id: int, epoch: int) -> None:
        """The topic has no producer attachments: its writes carry `epoch` until a write
        of another kind (an attach) makes the cache stale."""
        self._epochs[topic_id] = epoch
