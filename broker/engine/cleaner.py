"""Retention and compaction: cleaning a partition in bounded steps.

Each step is one write transaction that examines at most limits.clean_step_records
records of one partition, so a writer never waits long behind it:
- retention: batches from the front of the partition whose newest record is older than
  retention_ms, or that make the partition larger than retention_bytes, are deleted and
  the log start offset moves past them (a batch newer than the cutoff stops the step:
  the front is cut, never a batch behind a newer one);
- compaction (cleanup compact): in a window that walks from the log start to the end and
  starts again, keyed records that a later record of the same key supersedes are deleted,
  and so is a tombstone (a key with a null value, Kafka's; or with an empty one, which
  fencelog took for a tombstone before it had nulls, when Kafka's were stored empty,
  and still does) that has been the newest of its key for tombstone_retention_ms:
  each batch holding one is rewritten without it (a batch
  left with none goes). Offsets stay as they were: the log has gaps. Which record is a
  key's newest the cleaner learns by reading the partition's keys once and then only
  what was appended since (a map of key to offset in memory, per partition compacted):
  no index on keys costs every append.

What the rules rely on survives: the producer table is snapshotted before records it was
derived from are deleted (a start then loads it instead of replaying them); transactions
wait in their journals, not in the log, so an open or prepared one is never touched;
committed offsets and owner fences are other tables.

Kafka's DeleteRecords cuts the front the same way, below an offset instead of a time or
a size (cut_below), in the same bounded steps; the log start may then fall inside a
batch, which stays until all of it is below the start (nothing below it is read).
SQLite reuses the freed pages for new records (the file does not shrink; `fencelog
snapshot create` writes a compact copy).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from msgspec import Struct

from broker.core import retention as rules
from broker.engine.producer_table import ProducerTable
from broker.limits import Limits
from broker.storage import batches, logs
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
        # compaction's newest offset of each key, and the offset it has read keys up to
        self._newest: dict[tuple[int, int], tuple[int, dict[bytes, int]]] = {}

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
        tombstone_before = now_ms - self.limits.tombstone_retention_ms
        deleted = 0
        with self.database.write() as conn:
            newest = self._newest_offsets(conn, row, partition)
            for batch in logs.keyed_batches(conn, row, partition, low, high):
                high = max(high, batch.last_offset + 1)
                keep = _kept(batch, newest, info.start_offset, tombstone_before)
                if len(keep) < batch.records:
                    logs.rewrite(conn, batch, keep)
                    deleted += batch.records - len(keep)
        self._windows[key] = high
        return Step(deleted, high < info.end_offset)

    def _newest_offsets(
        self, conn: sqlite3.Connection, row: logs.TopicRow, partition: int
    ) -> dict[bytes, int]:
        """Each key's newest offset in the partition, read on from where the last step
        stopped (records are only ever appended after it)."""
        read_to, newest = self._newest.get((row.topic_id, partition), (0, {}))
        end = logs.end_offset(conn, row, partition)
        for batch in logs.keyed_batches(conn, row, partition, read_to, end):
            whole = batches.Part(batch, 0, batch.records)
            for offset, found in zip(batches.offsets(whole), batches.keys(whole), strict=True):
                if found is not None:
                    newest[found] = offset
        self._newest[(row.topic_id, partition)] = (end, newest)
        return newest

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
            more = sum(records for *_, records in front) >= limit
            cut = rules.offset_cut(front, start, before, more)
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


def _kept(
    batch: batches.Stored, newest: dict[bytes, int], start: int, tombstone_before: int
) -> list[int]:
    """The indexes of the batch's records compaction keeps (broker/core/retention.py)."""
    whole = batches.Part(batch, 0, batch.records)
    return rules.compaction_keeps(
        batches.offsets(whole),
        batches.keys(whole),
        batches.value_lengths(batch),
        batches.timestamps(whole),
        newest,
        start,
        tombstone_before,
    )
