"""A page of a partition: its stored batches' columns joined, not a row per record.

Reading records through Python's sqlite3 as a row each cost a tuple and eleven objects
per record, and sending them as much again to pack and unpack. The log keeps each batch
packed as a page's columns (schema 015, storage/batches.py), so a page is those columns
joined: the values concatenated; a column the same on the whole page (value size,
timestamp, producer fields: a batch written together) as one number, or runs of one
number per batch; a column that varies as text, one number a line, which the reader
splits in C; headers only for the records that have them. The served FETCH carries
pages (protocol/codec.py); the engine's fetch and the Arrow reader (columnar.py) read
them.

Rules a page keeps:
- The records of logs.read_rows, cut as the engine cuts them: committed records only
  (a transaction's records enter the log at commit), offsets from `offset`, at most
  max_records, then the first records within bytes_max of keys and values (at least
  one).
- One snapshot: the page's batches are read inside the caller's read transaction.
- Offsets with no gap from `offset`: where compaction left one (or the offset asked is
  in one), read_page answers None and the caller reads rows instead.
"""

from __future__ import annotations

import sqlite3

from broker.rows import Page
from broker.storage import batches
from broker.storage.logs import TopicRow, parts


def read_page(
    conn: sqlite3.Connection,
    topic: TopicRow,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
) -> Page | None:
    """Records of a partition from offset, as logs.read_rows and the byte cut would give
    them (count 0: nothing there). None: read them as rows instead."""
    if max_records <= 0:
        return batches.empty_page(partition, offset)
    found = parts(conn, topic.topic_id, partition, offset, max_records, bytes_max)
    if not found:
        return batches.empty_page(partition, offset)
    expected = offset
    for part in found:
        if not batches.contiguous(part.batch) or part.batch.first_offset + part.low != expected:
            return None
        expected += part.high - part.low
    return batches.page(partition, offset, found)
