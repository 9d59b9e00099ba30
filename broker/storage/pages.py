"""A page of a partition as a few values SQLite builds, not as a row per record.

Reading records through Python's sqlite3 costs a tuple and eleven objects per record
(about 1.8 us each here), and sending them costs as much again to pack and unpack. A
page is instead read with SQLite's aggregates: every value concatenated into one
buffer; every column that is the same on the whole page (value size, timestamp,
producer fields: a batch written together) as one number; a column that varies as
text, one number a line, which the reader splits in C; headers, which most records do
not have, only for the records that have them. The served FETCH carries pages
(protocol/codec.py); the engine's fetch and the Arrow reader (columnar.py) read them.

Rules a page keeps:
- The records of logs.read_rows, cut as the engine cuts them: committed records only
  (a transaction's records enter the log at commit), offsets from `offset`, at most
  max_records, then the first records within bytes_max of keys and values (at least
  one).
- One snapshot: every query of a page runs inside the caller's read transaction.
- Order: an aggregate over a range of the records' primary key walks it in key order.
  The offsets must be contiguous and the page's first and last values must be where
  that order puts them, or read_page answers None and the caller reads rows instead.
  (SQLite 3.44's group_concat(... ORDER BY) would guarantee it; Debian's is 3.40.)
- Memory: SQLite's length limit is lowered to concat_bytes_max while a page is read;
  a page past it answers None.

Where the page's records are all in large batches whose shape log_batches keeps
(schema 013: timestamp, value size, keys or headers, producer fields of each batch),
the page learns its columns from those few rows and reads the records once, for their
values (and keys or headers, where a batch has some). That read checks the
concatenation's ends as the scan below does, and its length against what the shapes
say (where they give every record's value length; else SQLite counts the records);
anything it does not expect sends the page down the scan, which knows any log.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from itertools import accumulate
from typing import Any, NamedTuple

from broker.rows import (
    NO_TXN,
    Column,
    Page,
    Runs,
)
from broker.storage.logs import TopicRow
from broker.storage.queries import Q

_PageRange = tuple[int, int, int, int]  # topic_id, partition, first offset, last offset


def read_page(
    conn: sqlite3.Connection,
    topic: TopicRow,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
    concat_bytes_max: int,
) -> Page | None:
    """Records of a partition from offset, as logs.read_rows and the byte cut would give
    them (count 0: nothing there). None: read this page as rows instead."""
    with _length_limit(conn, concat_bytes_max):
        try:
            return _read_page(conn, topic.topic_id, partition, offset, max_records, bytes_max)
        except sqlite3.DataError:  # "string or blob too big": past concat_bytes_max
            return None


def _read_page(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
) -> Page | None:
    first = None
    if max_records > 0:
        where = (topic_id, partition, offset)
        first = conn.execute(Q["records_page_first"], where).fetchone()
    if first is None:
        if max_records > 0 and conn.execute(Q["records_after"], where).fetchone():
            return None  # a gap compaction left: read the records after it as rows
        return Page(partition, offset, 0, b"", 0, 0, b"", -1, [], (0, 0, 0, 0, None))
    timestamp_ms, length, pid, generation, sequence, epoch, txn_id, first_value = first
    shaped = _read_shaped(conn, topic_id, partition, offset, max_records, bytes_max, first_value)
    if shaped is not None:
        return shaped
    like_first = (timestamp_ms, length, pid, generation, sequence, epoch, txn_id)
    summary = conn.execute(
        Q["records_page_summary"],
        (topic_id, partition, offset, offset + max_records, *like_first),
    ).fetchone()
    count, last, size, keyed, headed, times_vary, lengths_vary, producers_vary = summary
    if last - offset + 1 != count:  # offsets with a gap: not a log this module knows
        return None
    page: _PageRange = (topic_id, partition, offset, last)
    if size > bytes_max:
        count = _within(_lines(conn, "records_page_sizes", page), bytes_max)
        page = (topic_id, partition, offset, offset + count - 1)
    last_value = conn.execute(Q["records_page_value_at"], page[:2] + page[3:]).fetchone()[0]
    values = _values(conn, page, count, first_value, last_value)
    if values is None:
        return None
    key_lengths, keys = _keys(conn, page, bool(keyed))
    return Page(
        partition,
        offset,
        count,
        values,
        _lines(conn, "records_page_value_lengths", page) if lengths_vary else length,
        _lines(conn, "records_page_timestamps", page) if times_vary else timestamp_ms,
        keys,
        key_lengths,
        conn.execute(Q["records_page_headers"], page).fetchall() if headed else [],
        (
            tuple(conn.execute(Q["records_page_producers"], page).fetchone())
            if producers_vary
            else (pid, generation, sequence, epoch, txn_id)
        ),
    )


class _Run(NamedTuple):
    """The part of one batch on a page, as log_batches gives its shape."""

    records: int
    timestamp_ms: int | None  # None: each record's own
    value_length: int | None  # None: each record's own
    keyed: int
    headed: int
    producer_id: int
    generation: int
    sequence: int  # of the run's first record
    sequence_step: int
    epoch: int
    txn_id: int | None


def _read_shaped(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
    first_value: bytes,
) -> Page | None:
    """The page read from its batches' shapes; None: read it by the scan."""
    end = offset + max_records  # past the page
    shapes = conn.execute(Q["log_batches_page"], (topic_id, partition, offset, end)).fetchall()
    if not shapes:
        return None
    last_row = conn.execute(Q["records_page_last"], (topic_id, partition, offset, end)).fetchone()
    last, last_value = last_row
    runs = _runs(shapes, offset, last)
    if runs is None:
        return None
    count = last - offset + 1
    value_bytes = _shaped_value_bytes(runs)
    if value_bytes is None or any(run.keyed for run in runs):
        size = conn.execute(
            Q["records_page_bytes"], (topic_id, partition, offset, last)
        ).fetchone()[0]
    else:
        size = value_bytes
    if size > bytes_max:
        page_range: _PageRange = (topic_id, partition, offset, last)
        count = _within(_lines(conn, "records_page_sizes", page_range), bytes_max)
        last = offset + count - 1
        last_value = conn.execute(
            Q["records_page_value_at"], (topic_id, partition, last)
        ).fetchone()[0]
        runs = _runs(shapes, offset, last)
        assert runs is not None, "a page's first records are in the shapes that hold them all"
        value_bytes = _shaped_value_bytes(runs)
    page: _PageRange = (topic_id, partition, offset, last)
    values = _values(conn, page, count, first_value, last_value, value_bytes)
    if values is None:
        return None
    key_lengths, keys = _keys(conn, page, any(run.keyed for run in runs))
    return Page(
        partition,
        offset,
        count,
        values,
        _shaped_column(conn, page, runs, "value_length", "records_page_value_lengths"),
        _shaped_column(conn, page, runs, "timestamp_ms", "records_page_timestamps"),
        keys,
        key_lengths,
        conn.execute(Q["records_page_headers"], page).fetchall()
        if any(run.headed for run in runs)
        else [],
        (
            _constant_or_runs([(r.records, r.producer_id, 0) for r in runs]),
            _constant_or_runs([(r.records, r.generation, 0) for r in runs]),
            _constant_or_runs([(r.records, r.sequence, r.sequence_step) for r in runs]),
            _constant_or_runs([(r.records, r.epoch, 0) for r in runs]),
            _txn_column(runs),
        ),
    )


def _shaped_value_bytes(runs: list[_Run]) -> int | None:
    """Bytes of the runs' values where their shapes give every record's value length."""
    if any(run.value_length is None for run in runs):
        return None
    return sum(run.records * (run.value_length or 0) for run in runs)


def _values(
    conn: sqlite3.Connection,
    page: _PageRange,
    count: int,
    first: bytes,
    last: bytes,
    shaped_bytes: int | None = None,
) -> bytes | None:
    """The page's values concatenated; None unless they are `count` records' that
    begin with the first record's value and end with the last one's (the order the
    module's rules ask for). Where the shapes give every record's value length
    (shaped_bytes), a record missing or added changes the concatenation's length, so
    SQLite does not count them (a fifth of the read)."""
    values: bytes
    if shaped_bytes is not None:
        values = conn.execute(Q["records_page_values"], page).fetchone()[0]
        size, counted = shaped_bytes, count
    else:
        values, size, counted = conn.execute(Q["records_page_values_counted"], page).fetchone()
    if (
        counted == count
        and size == len(values)
        and values.startswith(first)
        and values.endswith(last)
    ):
        return values
    return None


def _keys(conn: sqlite3.Connection, page: _PageRange, keyed: bool) -> tuple[int | bytes, bytes]:
    """Key lengths (-1: no key) and the keys concatenated; (-1, b"") for a page none of
    whose records has a key."""
    if not keyed:
        return -1, b""
    lengths, keys = conn.execute(Q["records_page_keys"], page).fetchone()
    return lengths, keys or b""


def _runs(shapes: list[tuple[Any, ...]], offset: int, last: int) -> list[_Run] | None:
    """The runs of records offset..last, batch by batch; None: the shapes do not hold
    every one of them (records written before schema 013, small batches between)."""
    runs = []
    expected = offset
    for first_offset, last_offset, *rest in shapes:
        if first_offset > expected or last_offset < expected:
            return None
        stop = min(last_offset, last)
        (timestamp_ms, value_length, keyed, headed, pid, generation, sequence, step) = rest[:8]
        sequence += (expected - first_offset) * step
        runs.append(
            _Run(
                stop - expected + 1,
                timestamp_ms,
                value_length,
                keyed,
                headed,
                pid,
                generation,
                sequence,
                step,
                rest[8],
                rest[9],
            )
        )
        expected = stop + 1
        if expected > last:
            return runs
    return None


def _shaped_column(
    conn: sqlite3.Connection, page: _PageRange, runs: list[_Run], field: str, query: str
) -> Column:
    """A column the shapes may give (one number, or runs of them), or the records."""
    numbers = [getattr(run, field) for run in runs]
    if None in numbers:
        return _lines(conn, query, page)
    return _constant_or_runs([(run.records, n, 0) for run, n in zip(runs, numbers, strict=True)])


def _txn_column(runs: list[_Run]) -> int | Runs | None:
    txns = {run.txn_id for run in runs}
    if len(txns) == 1:
        return txns.pop()
    return _constant_or_runs(
        [(run.records, NO_TXN if run.txn_id is None else run.txn_id, 0) for run in runs]
    )


def _constant_or_runs(runs: Runs) -> int | Runs:
    """Runs of (records, first number, step): one number if it is every record's."""
    first = runs[0][1]
    if all(number == first and (step == 0 or records == 1) for records, number, step in runs):
        return first
    return runs


@contextlib.contextmanager
def _length_limit(conn: sqlite3.Connection, bytes_max: int) -> Iterator[None]:
    previous = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bytes_max)
    try:
        yield
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, previous)


def _lines(conn: sqlite3.Connection, query: str, page: _PageRange) -> bytes:
    found: bytes | None = conn.execute(Q[query], page).fetchone()[0]
    return found or b""


def _within(sizes: bytes, bytes_max: int) -> int:
    """How many of the first records fit in bytes_max (at least one)."""
    within = 0
    for total in accumulate(map(int, sizes.split())):
        if total > bytes_max:
            break
        within += 1
    return max(1, within)


# a page's records ---------------------------------------------------------------------
