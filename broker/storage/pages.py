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
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, repeat
from typing import Final, NamedTuple

from broker.storage.database import decode_headers
from broker.storage.logs import Row, TopicRow, records_of
from broker.storage.queries import Q
from broker.types import Record

NO_TXN: Final = -1  # txn_id in a page's text of a record outside transactions

# (producer_id, generation, sequence, epoch, txn_id) of a record
ProducerColumns = tuple[int, int, int, int, int | None]


class Page(NamedTuple):
    """`count` records of one partition from `offset`. A column given as an int (or
    `producer` as a tuple) is every record's; given as bytes it is one decimal number
    per record, a line each."""

    partition: int
    offset: int
    record_count: int
    values: bytes  # every value, concatenated in offset order
    value_lengths: int | bytes
    timestamps: int | bytes  # timestamp_ms
    keys: bytes  # every key, concatenated (b"" when no record has one)
    key_lengths: int | bytes  # -1: no key
    headers: list[tuple[int, bytes]]  # (offset, stored headers) of records that have some
    producer: ProducerColumns | tuple[bytes, bytes, bytes, bytes, bytes]  # txn_id -1: none


# What a fetch gives for one partition: a page, or its rows where SQLite cannot page it
Chunk = Page | list[Row]
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
        return Page(partition, offset, 0, b"", 0, 0, b"", -1, [], (0, 0, 0, 0, None))
    timestamp_ms, length, pid, generation, sequence, epoch, txn_id, first_value = first
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
    values, values_size = conn.execute(Q["records_page_values"], page).fetchone()
    last_value = conn.execute(Q["records_page_value_at"], page[:2] + page[3:]).fetchone()[0]
    if not (
        values_size == len(values)
        and values.startswith(first_value)
        and values.endswith(last_value)
    ):
        return None
    key_lengths, keys = (
        conn.execute(Q["records_page_keys"], page).fetchone() if keyed else (-1, b"")
    )
    return Page(
        partition,
        offset,
        count,
        values,
        _lines(conn, "records_page_value_lengths", page) if lengths_vary else length,
        _lines(conn, "records_page_timestamps", page) if times_vary else timestamp_ms,
        keys or b"",
        key_lengths,
        conn.execute(Q["records_page_headers"], page).fetchall() if headed else [],
        (
            tuple(conn.execute(Q["records_page_producers"], page).fetchone())
            if producers_vary
            else (pid, generation, sequence, epoch, txn_id)
        ),
    )


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


def records_of_chunks(topic: str, chunks: Sequence[Chunk]) -> list[Record]:
    """The records of a fetch's pages and rows, in their order."""
    found: list[Record] = []
    for chunk in chunks:
        if isinstance(chunk, Page):
            found += records_of_page(topic, chunk)
        else:
            found += records_of(topic, chunk)
    return found


def records_of_page(topic: str, page: Page) -> list[Record]:
    """The page's records, built column by column with no Python loop per record.
    ValueError: the page contradicts itself (a column of another length, lengths that
    do not add up to the concatenation)."""
    count = page.record_count
    if count == 0:
        return []
    values = _split(page.values, page.value_lengths, count, "value")
    keys: Iterator[bytes | None] | list[bytes | None]
    if page.key_lengths == -1:
        keys = repeat(None, count)
    else:
        keys = _split_keys(page.keys, page.key_lengths, count)
    headers: Iterator[tuple[tuple[str, bytes], ...]] | list[tuple[tuple[str, bytes], ...]]
    if page.headers:
        headers = [()] * count
        for offset, stored in page.headers:
            index = offset - page.offset
            if not 0 <= index < count:
                raise ValueError(f"headers of offset {offset}, outside the page")
            headers[index] = decode_headers(stored)
    else:
        headers = repeat((), count)
    pid, generation, sequence, epoch, txns = (
        _column(column, count, "producer field") for column in page.producer
    )
    txn_id: Iterable[int | None] = txns
    if isinstance(page.producer[4], bytes):
        txn_id = [None if txn == NO_TXN else txn for txn in txns]
    columns = zip(
        repeat(topic, count),
        repeat(page.partition, count),
        range(page.offset, page.offset + count),
        _column(page.timestamps, count, "timestamp"),
        keys,
        values,
        headers,
        pid,
        generation,
        sequence,
        epoch,
        txn_id,
        strict=True,
    )
    with _collector_paused():
        return list(map(tuple.__new__, repeat(Record), columns))


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a page's Records are made: they hold
    numbers, bytes and strings, no cycles, and a run of the collector every 700 new
    tuples cost a third of the time of making them (0.35 us a record, measured)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _column(column: int | bytes | None, count: int, what: str) -> Iterable[int | None]:
    if not isinstance(column, bytes):
        return repeat(column, count)
    numbers = list(map(int, column.split()))
    if len(numbers) != count:
        raise ValueError(f"{len(numbers)} {what}s for a page of {count} records")
    return numbers


def _split(data: bytes, lengths: int | bytes, count: int, what: str) -> list[bytes]:
    if isinstance(lengths, bytes):
        return _slices(data, list(map(int, lengths.split())), count, what)
    if lengths * count != len(data):
        raise ValueError(f"{count} {what}s of {lengths} bytes in {len(data)} bytes")
    if lengths == 0:
        return [b""] * count
    return [data[start : start + lengths] for start in range(0, len(data), lengths)]


def _slices(data: bytes, sizes: list[int], count: int, what: str) -> list[bytes]:
    if len(sizes) != count:
        raise ValueError(f"{len(sizes)} {what} lengths for a page of {count} records")
    ends = list(accumulate(sizes))
    if ends[-1] != len(data) or min(sizes) < 0:
        raise ValueError(f"{what} lengths that do not add up to {len(data)} bytes")
    return list(map(data.__getitem__, map(slice, [0, *ends[:-1]], ends)))


def _split_keys(data: bytes, lengths: int | bytes, count: int) -> list[bytes | None]:
    sizes = list(map(int, lengths.split())) if isinstance(lengths, bytes) else [lengths] * count
    found: list[bytes | None] = list(_slices(data, [max(0, n) for n in sizes], count, "key"))
    if min(sizes) < 0:
        found = [None if size < 0 else key for size, key in zip(sizes, found, strict=True)]
    return found
