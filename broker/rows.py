"""Stored rows as they leave storage: what a fetch answers and what the client decodes.

These values cross the wire (the served FETCH carries rows and pages), so the codec, the
client and the CLI read them here, never in broker/storage. Nothing here touches SQLite:
the decoding of a page (records_of_page) and of rows (records_of) is pure, and a page or
row that contradicts itself is a ValueError for the caller to turn into its own error.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from itertools import repeat
from typing import Any, Final, NamedTuple

import msgpack
from msgspec import Struct

from broker.types import Headers, Record, collector_paused


def decode_headers(stored: bytes) -> Headers:
    headers: Headers = msgpack.unpackb(stored, use_list=False, raw=False)
    return headers


def encode_headers(headers: Headers) -> bytes:
    packed: bytes = msgpack.packb(headers, use_bin_type=True)
    return packed


EMPTY_HEADERS: Final = encode_headers(())


# A stored record without its topic, headers still msgpack: (partition, offset,
# timestamp_ms, key, value, headers, producer_id, generation, sequence, epoch, txn_id).
# What the server sends and the Spark reader turns into columns; records_of() makes
# Records of them.
Row = tuple[int, int, int, bytes | None, bytes | None, bytes, int, int, int, int, int | None]


ROW_KEY, ROW_VALUE, ROW_HEADERS, ROW_FIELDS = 3, 4, 5, 11
# What a Kafka record batch holds of a stored record: (offset, timestamp_ms, key, value,
# headers as stored).
KafkaRow = tuple[int, int, bytes | None, bytes | None, bytes]


def records_of(topic: str, rows: Sequence[Row]) -> list[Record]:
    new, empty = tuple.__new__, EMPTY_HEADERS
    return [
        new(
            Record,
            (topic, p, o, t, k, v, () if h == empty else decode_headers(h), pid, g, s, e, x),
        )
        for p, o, t, k, v, h, pid, g, s, e, x in rows
    ]


NO_TXN: Final = -1  # txn_id in a page's text of a record outside transactions


# A page's number column as runs: (records, first number, step), in offset order; the
# records of a run have first, first + step, first + 2 * step...
Runs = list[tuple[int, int, int]]
Column = int | bytes | Runs


class Page(NamedTuple):
    """`count` records of one partition from `offset`. A column given as an int (or
    `producer` as a tuple) is every record's; given as bytes it is one decimal number
    per record, a line each; given as a list it is Runs (a page read from its batches'
    shapes)."""

    partition: int
    offset: int
    record_count: int
    values: bytes  # every value, concatenated in offset order
    value_lengths: Column  # in text, -1: a null value (no bytes); never as a number or runs
    timestamps: Column  # timestamp_ms
    keys: bytes  # every key, concatenated (b"" when no record has one)
    key_lengths: int | bytes  # -1: no key
    headers: list[tuple[int, bytes]]  # (offset, stored headers) of records that have some
    # each column one number for every record, text or runs (txn_id -1: none, there)
    producer: tuple[Column, Column, Column, Column, Column | None]


# What a fetch gives for one partition: a page, or its rows where SQLite cannot page it
Chunk = Page | list[Row]


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
    headers: Iterator[Headers] | list[Headers]
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
    if not isinstance(page.producer[4], int | None):
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
    with collector_paused():
        return list(map(tuple.__new__, repeat(Record), columns))


def expand_runs(runs: Runs, count: int, what: str) -> list[int]:
    """Every record's number of a column given as runs; ValueError: runs that do not
    hold `count` records."""
    numbers: list[int] = []
    for records, first, step in runs:
        if records < 1:
            raise ValueError(f"a run of {records} {what}s")
        numbers += range(first, first + records * step, step) if step else [first] * records
    if len(numbers) != count:
        raise ValueError(f"{len(numbers)} {what}s for a page of {count} records")
    return numbers


def text_of_runs(runs: Runs) -> bytes:
    """Runs as a page's text column: a decimal number a line."""
    parts = []
    for records, first, step in runs:
        if step == 0:
            parts.append(b"%d\n" % first * records)
        else:
            stop = first + records * step
            parts.append("\n".join(map(str, range(first, stop, step))).encode() + b"\n")
    return b"".join(parts)[:-1]


def page_as_text(page: Page) -> Page:
    """The page with any column given as runs given as text instead (for a reader
    that knows only numbers and text)."""

    def text(column: Any) -> Any:
        return text_of_runs(column) if isinstance(column, list) else column

    return page._replace(
        value_lengths=text(page.value_lengths),
        timestamps=text(page.timestamps),
        producer=tuple(map(text, page.producer)),
    )


def _column(column: Column | None, count: int, what: str) -> Iterable[int | None]:
    if isinstance(column, list):
        return expand_runs(column, count, what)
    if not isinstance(column, bytes):
        return repeat(column, count)
    numbers = list(map(int, column.split()))
    if len(numbers) != count:
        raise ValueError(f"{len(numbers)} {what}s for a page of {count} records")
    return numbers


def _split(data: bytes, lengths: Column, count: int, what: str) -> Sequence[bytes | None]:
    if isinstance(lengths, list):
        return _slices(data, expand_runs(lengths, count, what), count, what)
    if isinstance(lengths, bytes):
        sizes = list(map(int, lengths.split()))
        if b"-" not in lengths:
            return _slices(data, sizes, count, what)
        return _split_nullable(data, sizes, count, what)
    if lengths * count != len(data):
        raise ValueError(f"{count} {what}s of {lengths} bytes in {len(data)} bytes")
    if lengths == 0:
        return [b""] * count
    return split_equal(data, lengths, count)


def _split_nullable(data: bytes, sizes: list[int], count: int, what: str) -> list[bytes | None]:
    """Values of a text column holding -1s: None for each (a null, no bytes)."""
    if min(sizes) < -1:
        raise ValueError(f"a {what} length of {min(sizes)}")
    found: list[bytes | None] = list(_slices(data, [max(0, n) for n in sizes], count, what))
    return [None if size < 0 else value for size, value in zip(sizes, found, strict=True)]


def without_nulls(page: Page) -> Page:
    """The page with every null value given as empty: for a reader that did not say it
    reads nulls (a client before them; FETCH's "nulls"), which got b"" for a null then."""
    lengths = page.value_lengths
    if isinstance(lengths, bytes) and b"-" in lengths:
        return page._replace(value_lengths=lengths.replace(b"-1", b"0"))
    return page


def row_without_null(row: Row) -> Row:
    """The row with a null value given as empty (without_nulls, for rows)."""
    if row[ROW_VALUE] is not None:
        return row
    partition, offset, stamp, key, _, headers, pid, generation, sequence, epoch, txn = row
    return (partition, offset, stamp, key, b"", headers, pid, generation, sequence, epoch, txn)


def _slices(data: bytes, sizes: list[int], count: int, what: str) -> list[bytes]:
    if len(sizes) != count:
        raise ValueError(f"{len(sizes)} {what} lengths for a page of {count} records")
    if sum(sizes) != len(data) or min(sizes) < 0:
        raise ValueError(f"{what} lengths that do not add up to {len(data)} bytes")
    return split_sized(data, sizes)


# Splitting concatenated values is struct's work: one unpack of a format of `count`
# byte strings makes them in C (35 ns a 100-byte value here, against 185 for a list
# comprehension of slices, which the interpreter runs a step at a time). A format of
# one length repeated is compiled once and kept; one of varying lengths costs its
# compile (about 30 ns a value) and is still faster than slicing.


@lru_cache(maxsize=128)
def _equal_format(length: int, count: int) -> struct.Struct:
    return struct.Struct(b"%ds" % length * count)


def split_equal(data: bytes, length: int, count: int, start: int = 0) -> list[bytes]:
    """count values of length bytes from data[start:] (which holds at least that many),
    in pieces of a power of two values, so that the formats kept for one length are a
    few whatever the counts asked for."""
    found: list[bytes] = []
    while count:
        piece = 1 << (count.bit_length() - 1)
        found += _equal_format(length, piece).unpack_from(data, start)
        start += piece * length
        count -= piece
    return found


def split_sized(data: bytes, sizes: Sequence[int], start: int = 0) -> list[bytes]:
    """Values of these sizes (each >= 0) from data[start:] (which holds them all)."""
    if not sizes:
        return []
    return list(struct.Struct(b"%ds" * len(sizes) % tuple(sizes)).unpack_from(data, start))


def _split_keys(data: bytes, lengths: int | bytes, count: int) -> list[bytes | None]:
    sizes = list(map(int, lengths.split())) if isinstance(lengths, bytes) else [lengths] * count
    found: list[bytes | None] = list(_slices(data, [max(0, n) for n in sizes], count, "key"))
    if min(sizes) < 0:
        found = [None if size < 0 else key for size, key in zip(sizes, found, strict=True)]
    return found


class AuditRow(Struct, frozen=True):
    audit_id: int
    at_ms: int
    group: str
    resource: str
    event: str
    session_id: str | None
    generation: int
    requested: int | None
    other: str | None


class SnapshotRow(Struct, frozen=True):
    snapshot_id: int
    created_ms: int
    producers: int
    evictions: int
    bytes: int


class OffsetRow(Struct, frozen=True):
    partition: int
    next_offset: int
    producer_state: bytes | None
    committed_ms: int
    metadata: str | None = None  # committed with the offset (Kafka's OffsetCommit metadata)
    leader_epoch: int = -1  # Kafka's committed leader epoch (-1: none)


class GroupOffsetRow(Struct, frozen=True):
    """A consumer group's next offset on one partition of a topic (Client.consumer_groups)."""

    group: str
    topic: str
    partition: int
    next_offset: int
    committed_ms: int
