"""Finding an offset by time: a binary search over the log's index of batches.

There is no index on timestamps: the log's index on (topic_id, partition, first_offset)
(log_offsets) is the one it uses. The search takes a partition's timestamps to ascend with
its offsets (Kafka's time index, which keeps the greatest timestamp so far, does not
need to: it finds the first record at or after the time whatever their order). It goes
in two steps: over batches, O(log2(end offset)) probes, each one seek of that index
reading one batch's first timestamp (a column of its row: no record is unpacked); then
inside the one batch where the time is crossed, whose timestamps it reads once.

Exact semantics. The search is a lower bound over records of "the record is at or after
the time" (first over the batches' first records, then over the records of one batch):
- when a partition's timestamps never decrease, the answer is the first record at or after
  the time, and None exactly when every record is older;
- when they do decrease somewhere (a clock stepped back; a Kafka producer's own
  timestamps), the answer is a record at or after the time whose previous record is
  older than the time (or that is the partition's first record): a place where the log
  crosses the time, not necessarily the first. None means the search ended at the end:
  the partition's last record is older than the time.
Gaps in offsets (compacted away) cost nothing: a probe lands on the next record that
exists. The search starts at the log start: records below it are gone, even where their
batch is still stored.
"""

from __future__ import annotations

import sqlite3

from broker.storage import batches
from broker.storage.logs import batch_at_or_after
from broker.storage.queries import Q


def offset_for_time(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    bounds: tuple[int, int],
    timestamp_ms: int,
) -> tuple[int, int] | None:
    """(offset, timestamp_ms) of the first record at or after timestamp_ms, or None;
    bounds: the log start and end offsets."""
    start, end = bounds
    low, high = start, end
    before: batches.Part | None = None  # the last batch whose first record is older
    while low < high:
        middle = (low + high) // 2
        found = batch_at_or_after(conn, topic_id, partition, max(middle, start))
        if found is None or _first_stamp(found, start) >= timestamp_ms:
            high = middle
        else:
            before = batches.Part(found, batches.index_at(found, start), found.records)
            low = found.last_offset + 1  # every batch up to it begins before the time
    if before is not None:
        stamps = batches.timestamps(before)
        inside, outside = 1, len(stamps)  # its first record is older: the others
        while inside < outside:
            middle = (inside + outside) // 2
            if stamps[middle] >= timestamp_ms:
                outside = middle
            else:
                inside = middle + 1
        if inside < len(stamps):
            return batches.offsets(before)[inside], stamps[inside]
    found = batch_at_or_after(conn, topic_id, partition, max(low, start)) if low < end else None
    if found is None:
        return None
    first = batches.Part(found, batches.index_at(found, start), found.records)
    return batches.offsets(first)[0], batches.timestamps(first)[0]


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


def _first_stamp(batch: batches.Stored, start: int) -> int:
    """The timestamp of the batch's first record at or after the log start."""
    index = batches.index_at(batch, start)
    if batch.timestamps is None:
        return batch.timestamp_ms
    if index == 0:
        return batch.timestamp_ms
    return batches.timestamps(batches.Part(batch, index, index + 1))[0]
