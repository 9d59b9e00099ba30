"""Finding an offset by time: a binary search over the log's primary key.

There is no index on timestamps: the log's primary key (topic_id, partition,
first_offset) is the index. The search takes a partition's
timestamps to ascend with its offsets (Kafka's time index, which keeps the greatest
timestamp so far, does not need to: it finds the first record at or after the time
whatever their order), and probes
O(log2(end offset)) records, each one seek of the primary key reading the batch that
holds the offset (logs.first_at_or_after): 25 probes on a partition of 10M records.

Exact semantics. The search is a lower bound over offsets o of the predicate
"the first record at or after o is at or after the time (or there is none)":
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

from broker.storage.logs import first_at_or_after


def offset_for_time(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    bounds: tuple[int, int],
    timestamp_ms: int,
) -> tuple[int, int] | None:
    """(offset, timestamp_ms) of the first record at or after timestamp_ms, or None;
    bounds: the log start and end offsets."""
    low, end_offset = bounds
    high = end_offset
    while low < high:
        middle = (low + high) // 2
        found = first_at_or_after(conn, topic_id, partition, middle)
        if found is None or found[1] >= timestamp_ms:
            high = middle
        else:
            low = found[0] + 1  # every offset up to the probed record is before the time
    return first_at_or_after(conn, topic_id, partition, low) if low < end_offset else None
