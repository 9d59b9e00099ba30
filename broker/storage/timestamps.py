"""Finding an offset by time, and the record of the greatest timestamp.

By time: the first record at or after the time, as Kafka's time index finds it
whatever the order of the timestamps. The log's time index (log_times, schema 018)
holds a row for each batch that raised its partition's greatest timestamp so far; both
its columns grow with the offsets. A binary search over it, O(log2(end offset)) probes
of its primary key, finds the first row reaching the time: every record before that
batch is older (the greatest before it is), and the batch holds one at or after the
time (its greatest is). The records of that batch are read once to find it. Where the
batch is below the log start, or compaction has since taken the record that raised the
greatest, the search goes on from there to the next batch whose greatest timestamp
(a column of its row: no record is unpacked) reaches the time; nothing below the log
start is read.

The greatest: the batch holding the log start is read record by record (its stored
greatest may be below the start), every later one by its max_timestamp_ms column.
"""

from __future__ import annotations

import sqlite3

from broker.storage import batches
from broker.storage.logs import batch_at_or_after, batch_of
from broker.storage.queries import Q


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
    reached = _first_reaching(conn, topic_id, partition, end, timestamp_ms)
    if reached is None:
        return None
    at = max(reached, start)
    while at < end:
        row = conn.execute(Q["log_reaching"], (topic_id, partition, at, timestamp_ms)).fetchone()
        if row is None:
            return None
        batch = batch_of(row[:-1], vals_bytes=row[-1])  # read without its values
        part = batches.Part(batch, batches.index_at(batch, at), batch.records)
        for offset, stamp in zip(batches.offsets(part), batches.timestamps(part), strict=True):
            if stamp >= timestamp_ms:
                return offset, stamp
        at = batch.last_offset + 1  # its records at or after `at` are all older
    return None


def _first_reaching(
    conn: sqlite3.Connection, topic_id: int, partition: int, end: int, timestamp_ms: int
) -> int | None:
    """The first offset of the batch where the partition's greatest timestamp first
    reached timestamp_ms (the first row of log_times at or after it), or None: no
    record ever had a timestamp that late."""
    low, high = 0, end  # the lowest offset whose next index row reaches the time
    while low < high:
        middle = (low + high) // 2
        row = conn.execute(Q["log_times_from"], (topic_id, partition, middle)).fetchone()
        if row is None or row[1] >= timestamp_ms:
            high = middle
        else:
            low = row[0] + 1  # every index row up to it is below the time
    found = conn.execute(Q["log_times_from"], (topic_id, partition, low)).fetchone()
    if found is None:
        return None
    return int(found[0])


def offset_of_greatest_time(
    conn: sqlite3.Connection, topic_id: int, partition: int, start: int
) -> tuple[int, int] | None:
    """(offset, timestamp_ms) of the record with the partition's greatest timestamp at
    or after the log start, the first of them on a tie (Kafka's MAX_TIMESTAMP); None
    when nothing is stored there. The batch holding the start is read record by record
    (its greatest timestamp may be below the start); every later one by its
    max_timestamp_ms column, then the one chosen for where its greatest record is."""
    first = batch_at_or_after(conn, topic_id, partition, start)
    if first is None:
        return None
    best = _greatest(batches.Part(first, batches.index_at(first, start), first.records))
    later = conn.execute(Q["log_greatest_time_after"], (topic_id, partition, first.first_offset))
    row = later.fetchone()
    later.close()
    if row is not None and row[1] > best[1]:
        chosen = batch_at_or_after(conn, topic_id, partition, row[0])
        if chosen is not None:
            best = _greatest(batches.Part(chosen, 0, chosen.records))
    return best


def _greatest(part: batches.Part) -> tuple[int, int]:
    """(offset, timestamp_ms) of the part's first record of its greatest timestamp."""
    stamps = batches.timestamps(part)
    greatest = max(stamps)
    return batches.offsets(part)[stamps.index(greatest)], greatest
