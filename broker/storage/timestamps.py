"""Finding an offset by time, and the record of the greatest timestamp.

By time: the first record at or after the time, as Kafka's time index finds it
whatever the order of the timestamps. The log's time index (log_times, schema 018)
holds a row for each batch whose greatest timestamp passed the index's last row by
TIME_INDEX_STEP_MS or more; each row's timestamp is its partition's greatest so far,
and both its columns grow with the offsets. A binary search over it, O(log2(end
offset)) probes of its primary key, finds the last row below the time: every record up
to its batch is older. The first record at or after the time is in the batches after
it, up to the next row's (which holds one), or in the batches after the last row when
the time is less than TIME_INDEX_STEP_MS past it (none reaches further). Those batches
are passed by their greatest timestamp, a column of their row (no record is unpacked),
and the first that reaches the time is read. Nothing below the log start is read: where
the start falls after the row, the search begins at the start. Compaction only lowers
a batch's greatest timestamp, so the search stays exact after it.

The greatest: the batch holding the log start is read record by record (its stored
greatest may be below the start), every later one by its max_timestamp_ms column.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from broker.limits import INT64_MIN
from broker.storage import batches
from broker.storage.logs import batch_of
from broker.storage.queries import Q

# What the time index's rows are apart at least, in their timestamps: the `+ 10` of
# schema 018's triggers
TIME_INDEX_STEP_MS: Final = 10


def offset_for_time(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    bounds: tuple[int, int],
    timestamp_ms: int,
) -> tuple[int, int] | None:
    """(offset, timestamp_ms) of the first record at or after timestamp_ms, or None
    when every record is older; bounds: the log start and end offsets."""
    start, end = bounds
    at = _past_older(conn, topic_id, partition, end, timestamp_ms)
    if at is None:
        return None
    at = max(at, start)
    while at < end:
        batch = _batch_reaching(conn, topic_id, partition, at, timestamp_ms)
        if batch is None:
            return None
        part = batches.Part(batch, batches.index_at(batch, at), batch.records)
        for offset, stamp in zip(batches.offsets(part), batches.timestamps(part), strict=True):
            if stamp >= timestamp_ms:
                return offset, stamp
        at = batch.last_offset + 1  # its records at or after `at` are all older
    return None


def _past_older(
    conn: sqlite3.Connection, topic_id: int, partition: int, end: int, timestamp_ms: int
) -> int | None:
    """The offset past the batch of the time index's last row below timestamp_ms (0:
    none is), where the first record at or after the time is to be looked for; None
    when no record can be that late (the last row is TIME_INDEX_STEP_MS or more below
    it, or there is none)."""
    low, high = 0, end  # the lowest offset whose next index row reaches the time
    while low < high:
        middle = (low + high) // 2
        row = conn.execute(Q["log_times_from"], (topic_id, partition, middle)).fetchone()
        if row is None or row[1] >= timestamp_ms:
            high = middle
        else:
            low = row[0] + 1  # every index row up to it is below the time
    if conn.execute(Q["log_times_from"], (topic_id, partition, low)).fetchone() is not None:
        return low  # a row at or after `low` reaches the time
    last = conn.execute(Q["log_times_last"], (topic_id, partition)).fetchone()
    if last is None or last[1] + TIME_INDEX_STEP_MS <= timestamp_ms:
        return None
    return low


def _batch_reaching(
    conn: sqlite3.Connection, topic_id: int, partition: int, at: int, timestamp_ms: int
) -> batches.Stored | None:
    """The first batch holding a record at or after offset `at` whose greatest timestamp
    is at or after timestamp_ms, read without its keys and values (its timestamps and
    offsets are what a search by time uses), or None."""
    row = conn.execute(Q["log_reaching"], (topic_id, partition, at, timestamp_ms)).fetchone()
    return None if row is None else batch_of(row[:-1], vals_bytes=row[-1])


def offset_of_greatest_time(
    conn: sqlite3.Connection, topic_id: int, partition: int, start: int
) -> tuple[int, int] | None:
    """(offset, timestamp_ms) of the record with the partition's greatest timestamp at
    or after the log start, the first of them on a tie (Kafka's MAX_TIMESTAMP); None
    when nothing is stored there. The batch holding the start is read record by record
    (its greatest timestamp may be below the start); every later one by its
    max_timestamp_ms column, then the one chosen for where its greatest record is."""
    first = _batch_reaching(conn, topic_id, partition, start, INT64_MIN)
    if first is None:
        return None
    best = _greatest(batches.Part(first, batches.index_at(first, start), first.records))
    where = (topic_id, partition, first.first_offset)
    row = conn.execute(Q["log_greatest_time_after"], where).fetchone()
    if row is not None and row[1] > best[1]:
        chosen = _batch_reaching(conn, topic_id, partition, row[0], row[1])
        if chosen is not None:
            best = _greatest(batches.Part(chosen, 0, chosen.records))
    return best


def _greatest(part: batches.Part) -> tuple[int, int]:
    """(offset, timestamp_ms) of the part's first record of its greatest timestamp."""
    stamps = batches.timestamps(part)
    greatest = max(stamps)
    return batches.offsets(part)[stamps.index(greatest)], greatest
