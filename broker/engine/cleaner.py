"""Retention and compaction: cleaning a partition in bounded steps.

Each step is one write transaction that examines at most limits.clean_step_records
records of one partition, so a writer never waits long behind it:
- retention: records from the front of the partition whose timestamp is older than
  retention_ms, or that make the partition larger than retention_bytes, are deleted and
  the log start offset moves past them (a record newer than the cutoff stops the step:
  the front is cut, never a record behind a newer one);
- compaction (cleanup compact): in a window that walks from the log start to the end and
  starts again, keyed records that a later record of the same key supersedes are deleted,
  and so is a tombstone (a key with an empty value) that has been the newest of its key
  for tombstone_retention_ms. Offsets stay as they were: the log has gaps.

What the rules rely on survives: the producer table is snapshotted before records it was
derived from are deleted (a start then loads it instead of replaying them); transactions
wait in their journals, not in the log, so an open or prepared one is never touched;
committed offsets and owner fences are other tables.

Kafka's DeleteRecords cuts the front the same way, below an offset instead of a time or
a size (cut_below), in the same bounded steps. SQLite reuses the freed pages for new
records (the file does not shrink; `fencelog snapshot create` writes a compact copy).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from msgspec import Struct

from broker.core import retention as rules
from broker.engine.producer_table import ProducerTable
from broker.limits import Limits
from broker.storage import logs
from broker.storage.database import Database
from broker.types import Clock, PartitionInfo


class Step(Struct, frozen=True):
    deleted: int  # records deleted by this step
    more: bool  # another step of this partition may find more


class Cleaner:
    def __init__(
        self,
        database: Database,
        producers: ProducerTable,
        limits: Limits,
        clock: Clock,
        snapshot: Callable[[], int],
    ) -> None:
        self.database = database
        self.producers = producers
        self.limits = limits
        self.clock = clock
        self._snapshot = snapshot
        self._windows: dict[tuple[int, int], int] = {}  # compaction's next offset

    def step(self, topic: str, partition: int) -> Step:
        """One bounded step of cleaning one partition."""
        limit = self.limits.clean_step_records
        now_ms = self.clock()
        with self.database.read() as conn:
            row = logs.topic_by_name(conn, topic)
            if row is None or partition >= row.partitions:
                return Step(0, False)
            config = logs.topic_config(conn, row.topic_id)
            info = logs.partition_infos(conn, row)[partition]
            doomed = self._front(
                conn,
                row,
                partition,
                info,
                config.retention_ms,
                config.retention_bytes,
                now_ms,
                limit,
            )
        if doomed is not None:
            if any(self.producers.entries_of(row.topic_id)):
                self._snapshot()  # the producer table outlives the records it came from
            with self.database.write() as conn:
                new_start, size, count = doomed
                current = logs.partition_infos(conn, row)[partition]
                if current.start_offset == info.start_offset:  # nobody cleaned meanwhile
                    logs.delete_front(conn, row, partition, info.start_offset, new_start, size)
                    return Step(count, count >= limit)
            return Step(0, True)
        if config.cleanup != "compact":
            return Step(0, False)
        return self._compact(row, partition, info, now_ms, limit)

    @staticmethod
    def _front(
        conn: sqlite3.Connection,
        row: logs.TopicRow,
        partition: int,
        info: PartitionInfo,
        retention_ms: int | None,
        retention_bytes: int | None,
        now_ms: int,
        limit: int,
    ) -> rules.Cut | None:
        """The cut of the front past its retention (broker/core/retention.py)."""
        cutoff = now_ms - retention_ms if retention_ms is not None else None
        excess = info.bytes - retention_bytes if retention_bytes is not None else 0
        if cutoff is None and excess <= 0:
            return None
        front = logs.front(conn, row, partition, info.start_offset, limit)
        return rules.front_cut(front, info.start_offset, cutoff, excess)

    def _compact(
        self, row: logs.TopicRow, partition: int, info: PartitionInfo, now_ms: int, limit: int
    ) -> Step:
        key = (row.topic_id, partition)
        low = max(self._windows.get(key, info.start_offset), info.start_offset)
        if low >= info.end_offset:
            low = info.start_offset
        high = min(low + limit, info.end_offset)
        with self.database.write() as conn:
            doomed = logs.superseded(conn, row, partition, low, high, limit)
            tombstones = logs.old_tombstones(
                conn, row, partition, low, high, now_ms - self.limits.tombstone_retention_ms, limit
            )
            gone = {offset for offset, _ in doomed}
            doomed += [(offset, size) for offset, size in tombstones if offset not in gone]
            if doomed:
                logs.delete_records(conn, row, partition, doomed)
        self._windows[key] = high
        return Step(len(doomed), high < info.end_offset)

    def cut_below(self, topic: str, partition: int, before: int) -> int:
        """Delete the records of a partition below offset `before` (the caller checked
        it is at most the end offset) in bounded steps; the log start offset after."""
        limit = self.limits.clean_step_records
        while True:
            with self.database.read() as conn:
                row = logs.topic_by_name(conn, topic)
                if row is None or partition >= row.partitions:
                    return 0
                start = logs.start_offset(conn, row, partition)
                front = logs.front(conn, row, partition, start, limit)
            cut = rules.offset_cut(front, start, before, len(front) >= limit)
            if cut is None:
                return start
            if cut.records and any(self.producers.entries_of(row.topic_id)):
                self._snapshot()  # the producer table outlives the records it came from
            with self.database.write() as conn:
                if logs.start_offset(conn, row, partition) == start:  # nobody cut meanwhile
                    logs.delete_front(conn, row, partition, start, cut.new_start, cut.freed)

    def clean(self, topic: str) -> int:
        """Every step every partition of topic needs now, compaction sweeping each once
        from its log start (on demand); the records deleted."""
        with self.database.read() as conn:
            row = logs.topic_by_name(conn, topic)
        if row is None:
            return 0
        deleted = 0
        for partition in range(row.partitions):
            self._windows.pop((row.topic_id, partition), None)
            while True:
                step = self.step(topic, partition)
                deleted += step.deleted
                if not step.more:
                    break
        return deleted
