"""A batch of the log as one row of `log` (schema 015): records packed into its columns,
and read back as rows, as the part of a page a fetch sends, or as record sizes.

Pure: no SQLite here (storage/logs.py runs the queries). The packing is a page's
(broker/rows.py Page): the values concatenated, and every other column one number for
all the batch's records or text, one decimal number a line, so that a page is the
stored columns joined. Text splits in C (bytes.split) and joins in C; building it from
numbers costs a str() a record, paid only where a column varies within a batch.
"""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import accumulate, compress, repeat
from typing import Any, NamedTuple

import msgspec

from broker.rows import (
    EMPTY_HEADERS,
    NO_TXN,
    Column,
    Page,
    Row,
    Runs,
    split_equal,
    split_sized,
)
from broker.types import collector_paused

_encode = msgspec.msgpack.Encoder().encode
_HEADERS = msgspec.msgpack.Decoder(list[tuple[int, bytes]])


class Stored(NamedTuple):
    """A row of `log`, its columns in table order (the queries' log_* SELECT them all)."""

    topic_id: int
    partition: int
    first_offset: int
    last_offset: int
    records: int
    size: int  # the `bytes` column: of its keys and values
    timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    generation: int
    first_sequence: int
    epoch: int
    txn_id: int | None
    value_lengths: int | bytes
    timestamps: bytes | None
    key_lengths: bytes | None
    headers: bytes | None
    offset_deltas: bytes | None
    keys: bytes | None
    vals: bytes


# (pid, generation, first sequence (0: none), epoch, transaction)
Producer = tuple[int, int, int, int, int | None]


def text(numbers: Iterable[int]) -> bytes:
    """Numbers as a text column: one a line. Many of one count of digits (a batch's
    timestamps, its value lengths) are written by numpy four digits at a time for all:
    a 13-digit number in 41 ns from an array('q'), 128 from a list, against 280 for a
    str() each."""
    if isinstance(numbers, Sequence) and len(numbers) >= _TEXT_DIGITS_MIN:
        written = _digits(numbers)
        if written is not None:
            return written
    return "\n".join(map(str, numbers)).encode("ascii")


_TEXT_DIGITS_MIN = 64  # numbers: fewer are written as fast one at a time


def _digits(numbers: Sequence[int]) -> bytes | None:
    """text() of numbers that are all of one count of digits, none negative, written
    four digits at a time from a table of their text; None for any others."""
    import numpy  # here: a one-shot CLI command never writes such a column (150 ms to import)

    column = numpy.asarray(numbers)
    if column.dtype != numpy.int64 or column.ndim != 1:
        return None  # a number past 64 bits, or not a number (str() would say it)
    low, high = int(column.min()), int(column.max())
    places = len(str(high))
    if low < 0 or len(str(low)) != places:
        return None
    words = numpy.empty((len(column), (places + 3) // 4), numpy.uint32)
    rest = column
    for word in range(words.shape[1] - 1, -1, -1):
        higher = rest // 10_000
        words[:, word] = _four_digits()[rest - higher * 10_000]
        rest = higher
    out = numpy.empty((len(column), places + 1), numpy.uint8)
    out[:, :places] = words.view(numpy.uint8)[:, words.shape[1] * 4 - places :]
    out[:, places] = ord("\n")
    return out.tobytes()[:-1]


@functools.cache
def _four_digits() -> Any:
    """The text of 0 to 9999, four digits each ("0042"), as one 32-bit word each."""
    import numpy

    return numpy.frombuffer(b"".join(b"%04d" % number for number in range(10_000)), numpy.uint32)


def numbers(column: bytes) -> list[int]:
    return list(map(int, column.split()))


def pack(
    where: tuple[int, int, int],
    values: Sequence[Any],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[bytes] | None,
    stamps: int | Sequence[int],
    producer: Producer,
) -> tuple[object, ...]:
    """The `log` row of a batch at `where` (topic id, partition, first offset): its
    values (bytes-like, or None: a null value, -1 in the text of value lengths), keys
    (None: none has one), headers as stored (EMPTY_HEADERS for a record without; None:
    none has any), timestamps (one int: every record's), and producer fields."""
    count = len(values)
    nulls = False
    try:
        vals = b"".join(values)
        lengths = list(map(len, values))
    except TypeError:  # a null value: -1 in the text column, no bytes (never a number)
        nulls = True
        vals = b"".join(value for value in values if value is not None)
        lengths = [-1 if value is None else len(value) for value in values]
    size = len(vals)
    value_lengths: int | bytes = lengths[0]
    if nulls or lengths.count(lengths[0]) != count:
        value_lengths = text(lengths)
    timestamps: bytes | None = None
    if isinstance(stamps, int):
        first_ms = max_ms = stamps
    elif isinstance(stamps, array) and stamps.typecode == "q":  # a Kafka producer's: numpy
        import numpy

        column = numpy.frombuffer(stamps, numpy.int64)
        first_ms, max_ms = int(column[0]), int(column.max())
        if (column != first_ms).any():
            timestamps = text(stamps)
    else:
        first_ms, max_ms = stamps[0], max(stamps)
        if stamps.count(first_ms) != count:
            timestamps = text(stamps)
    key_lengths = packed_keys = None
    if keys is not None and keys.count(None) != count:
        key_lengths = text(-1 if key is None else len(key) for key in keys)
        packed_keys = b"".join(key for key in keys if key is not None)
        size += len(packed_keys)
    packed_headers = None
    if headers is not None and headers.count(EMPTY_HEADERS) != count:
        packed_headers = _encode(
            [(index, stored) for index, stored in enumerate(headers) if stored != EMPTY_HEADERS]
        )
    topic_id, partition, first_offset = where
    return (
        topic_id,
        partition,
        first_offset,
        first_offset + count - 1,
        count,
        size,
        first_ms,
        max_ms,
        *producer,
        value_lengths,
        timestamps,
        key_lengths,
        packed_headers,
        None,  # offsets contiguous
        packed_keys,
        vals,
    )


def pack_one(
    where: tuple[int, int, int], value: Any, stamp: int, producer: Producer
) -> tuple[object, ...]:
    """pack() of one record without key or headers: the one-record produce's row."""
    topic_id, partition, first_offset = where
    vals = b"" if value is None else bytes(value)
    return (
        topic_id,
        partition,
        first_offset,
        first_offset,
        1,
        len(vals),
        stamp,
        stamp,
        *producer,
        b"-1" if value is None else len(vals),
        None,
        None,
        None,
        None,
        None,
        vals,
    )


def coalesced(rows: list[tuple[Any, ...]], records_max: int) -> list[tuple[Any, ...]]:
    """rows (pack()'s and pack_one()'s) with each run of one-record rows that continue
    one another, up to records_max, as one row: the same partition, the next offset, the
    same producer id, generation and epoch, the next sequence (an idempotent producer's)
    or none, no key, no headers, no transaction. A group commit's one-record produces (a
    producer's requests in flight, or plain ones from many clients) then cost SQLite one
    row, and readers one batch; a batch's records keep their offsets, sequences,
    timestamps and values, as pack() of them together stores them."""
    joined: list[tuple[Any, ...]] = []
    run: list[tuple[Any, ...]] = []
    for row in rows:
        if run and len(run) < records_max and _continues(run[-1], row):
            run.append(row)
            continue
        if run:
            joined.append(_one_row(run))
        run = [row] if _single(row) else []
        if not run:
            joined.append(row)
    if run:
        joined.append(_one_row(run))
    return joined


def _single(row: tuple[Any, ...]) -> bool:
    """A one-record row without key, headers or transaction (pack_one's)."""
    return row[4] == 1 and row[12] is None and row[15] is None and row[16] is None


def _continues(last: tuple[Any, ...], row: tuple[Any, ...]) -> bool:
    return (
        _single(row)
        and row[2] == last[2] + 1
        and row[0] == last[0]
        and row[1] == last[1]
        and row[8] == last[8]  # producer id
        and row[9] == last[9]  # generation
        and row[11] == last[11]  # epoch
        and (row[10] == last[10] + 1 if last[10] else row[10] == 0)  # sequence
    )


def _one_row(run: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """pack() of a run of one-record rows: its records as one batch."""
    first = run[0]
    if len(run) == 1:
        return first
    return pack(
        first[:3],
        [None if isinstance(row[13], bytes) else row[19] for row in run],  # b"-1": null
        None,
        None,
        [row[6] for row in run],
        first[8:13],
    )


# reading ---------------------------------------------------------------------------


class Part(NamedTuple):
    """Records [low, high) of a stored batch, by index."""

    batch: Stored
    low: int
    high: int


def index_at(batch: Stored, offset: int) -> int:
    """The index of the batch's first record at or after offset."""
    delta = offset - batch.first_offset
    if delta <= 0:
        return 0
    if batch.offset_deltas is None:
        return min(delta, batch.records)
    return bisect_left(numbers(batch.offset_deltas), delta)


def offsets(part: Part) -> Sequence[int]:
    batch, low, high = part
    first = batch.first_offset
    if batch.offset_deltas is None:
        return range(first + low, first + high)
    return [first + delta for delta in numbers(batch.offset_deltas)[low:high]]


def contiguous(batch: Stored) -> bool:
    return batch.offset_deltas is None


def value_lengths(batch: Stored) -> list[int]:
    lengths = batch.value_lengths
    return numbers(lengths) if isinstance(lengths, bytes) else [lengths] * batch.records


def key_lengths(batch: Stored) -> list[int] | None:
    return None if batch.key_lengths is None else numbers(batch.key_lengths)


def sizes(part: Part) -> list[int]:
    """Bytes of key and value of each record of the part."""
    batch, low, high = part
    found = value_lengths(batch)[low:high]
    if isinstance(batch.value_lengths, bytes) and b"-" in batch.value_lengths:
        found = [max(0, size) for size in found]  # a null value has no bytes
    keyed = key_lengths(batch)
    if keyed is not None:
        found = [size + max(0, key) for size, key in zip(found, keyed[low:high], strict=True)]
    return found


def part_bytes(part: Part) -> int:
    batch, low, high = part
    if low == 0 and high == batch.records:
        return batch.size
    if isinstance(batch.value_lengths, int) and batch.key_lengths is None:
        return (high - low) * batch.value_lengths
    return sum(sizes(part))


def _slices(data: bytes, lengths: list[int], low: int, high: int) -> list[bytes]:
    return split_sized(data, lengths[low:high], sum(lengths[:low]))


def values(part: Part) -> Sequence[bytes | None]:
    batch, low, high = part
    length = batch.value_lengths
    if isinstance(length, int):
        if length == 0:
            return [b""] * (high - low)
        return split_equal(batch.vals, length, high - low, low * length)
    lengths = numbers(length)
    if b"-" not in length:
        return _slices(batch.vals, lengths, low, high)
    present = _slices(batch.vals, [max(0, n) for n in lengths], low, high)
    return [None if n < 0 else value for n, value in zip(lengths[low:high], present, strict=True)]


def keys(part: Part) -> Sequence[bytes | None]:
    batch, low, high = part
    lengths = key_lengths(batch)
    if lengths is None:
        return [None] * (high - low)
    present = _slices(batch.keys or b"", [max(0, n) for n in lengths], low, high)
    return [None if n < 0 else key for n, key in zip(lengths[low:high], present, strict=True)]


def timestamps(part: Part) -> Sequence[int]:
    batch, low, high = part
    if batch.timestamps is None:
        return [batch.timestamp_ms] * (high - low)
    return numbers(batch.timestamps)[low:high]


def headers(part: Part) -> list[tuple[int, bytes]]:
    """(index, stored headers) of the part's records that have some."""
    batch, low, high = part
    if batch.headers is None:
        return []
    return [
        (index, stored) for index, stored in _HEADERS.decode(batch.headers) if low <= index < high
    ]


def sequences(part: Part, at: Sequence[int]) -> Sequence[int]:
    batch = part.batch
    if not batch.first_sequence:
        return [0] * len(at)
    shift = batch.first_sequence - batch.first_offset
    return [offset + shift for offset in at]


def rows(part: Part) -> list[Row]:
    """The part's records as stored rows (broker/rows.py Row)."""
    batch, low, high = part
    count = high - low
    if count <= 0:
        return []
    at = offsets(part)
    stored_headers: list[bytes] = [EMPTY_HEADERS] * count
    for index, stored in headers(part):
        stored_headers[index - low] = stored
    with collector_paused():
        return list(
            zip(
                repeat(batch.partition, count),
                at,
                timestamps(part),
                keys(part),
                values(part),
                stored_headers,
                repeat(batch.producer_id, count),
                repeat(batch.generation, count),
                sequences(part, at),
                repeat(batch.epoch, count),
                repeat(batch.txn_id, count),
                strict=True,
            )
        )


def repack(batch: Stored, keep: Sequence[int]) -> tuple[Any, ...]:
    """The `log` row of a batch keeping only the records at these indexes (ascending,
    at least one), their offsets unchanged (compaction)."""
    whole = Part(batch, 0, batch.records)
    at, found_values, found_keys = offsets(whole), values(whole), keys(whole)
    stamps, stored = timestamps(whole), dict(headers(whole))
    row = list(
        pack(
            (batch.topic_id, batch.partition, batch.first_offset),
            [found_values[index] for index in keep],
            [found_keys[index] for index in keep],
            [stored.get(index, EMPTY_HEADERS) for index in keep],
            [stamps[index] for index in keep],
            (batch.producer_id, batch.generation, batch.first_sequence, batch.epoch, batch.txn_id),
        )
    )
    kept_at = [at[index] for index in keep]
    row[3] = kept_at[-1]  # last_offset
    if kept_at[-1] - batch.first_offset + 1 != len(kept_at):  # a gap: offsets given
        row[17] = text(offset - batch.first_offset for offset in kept_at)
    return tuple(row)


def _lines_hold(column: bytes | None, count: int) -> bool:
    return column is None or column.count(b"\n") + 1 == count


def _bytes_of(lengths: bytes) -> int:
    """The bytes a text column of value lengths adds up to (-1, a null: none)."""
    found = numbers(lengths)
    return sum(found) if b"-" not in lengths else sum(max(0, n) for n in found)


def unreadable(batch: Stored) -> str | None:
    """What a read finds wrong with a batch's columns before it uses them (cheaper than
    damage(): line counts, and the values' total length), or None."""
    return unreadable_shape(batch, len(batch.vals))


class Shape(NamedTuple):
    """The columns of a batch that unreadable() looks at, read without its values
    (storage/txns.py asks SQLite for these and the values' length alone)."""

    first_offset: int
    last_offset: int
    records: int
    value_lengths: int | bytes
    timestamps: bytes | None
    key_lengths: bytes | None
    offset_deltas: bytes | None


def unreadable_shape(shape: Stored | Shape, vals_bytes: int) -> str | None:
    """unreadable() of a batch's columns and the length of its values."""
    count = shape.records
    lengths = shape.value_lengths
    if isinstance(lengths, int):
        values_fit = count * lengths == vals_bytes
    else:
        values_fit = _lines_hold(lengths, count) and _bytes_of(lengths) == vals_bytes
    if not values_fit:
        return f"its values do not hold its {count} records"
    if not (
        _lines_hold(shape.timestamps, count)
        and _lines_hold(shape.key_lengths, count)
        and _lines_hold(shape.offset_deltas, count)
    ):
        return f"its columns do not hold its {count} records"
    if shape.offset_deltas is None and shape.first_offset + count - 1 != shape.last_offset:
        return f"its last offset is {shape.last_offset}, its records end elsewhere"
    return None


def damage(batch: Stored) -> str | None:
    """What is wrong with a stored batch's columns, or None: they hold its records."""
    try:
        return _damage(batch)
    except (ValueError, msgspec.MsgspecError) as error:
        return str(error)


def _damage(batch: Stored) -> str | None:
    count = batch.records
    lengths = value_lengths(batch)
    keyed = key_lengths(batch)
    problems = {
        "values": len(lengths) != count
        or sum(max(0, n) for n in lengths) != len(batch.vals)
        or min(lengths) < (0 if isinstance(batch.value_lengths, int) else -1),
        "timestamps": batch.timestamps is not None and len(numbers(batch.timestamps)) != count,
        "keys": keyed is not None
        and (len(keyed) != count or sum(max(0, n) for n in keyed) != len(batch.keys or b"")),
        "headers": any(not 0 <= index < count for index, _ in headers(Part(batch, 0, count))),
    }
    last = batch.first_offset + count - 1
    if batch.offset_deltas is not None:
        deltas = numbers(batch.offset_deltas)
        problems["offsets"] = len(deltas) != count or deltas != sorted(set(deltas))
        last = batch.first_offset + (deltas[-1] if deltas else -1)
    wrong = [column for column, bad in problems.items() if bad]
    if wrong:
        return f"its {', '.join(wrong)} do not hold its {count} records"
    if last != batch.last_offset:
        return f"its last offset is {batch.last_offset}, its records end at {last}"
    return None


# pages --------------------------------------------------------------------------


def empty_page(partition: int, offset: int) -> Page:
    return Page(partition, offset, 0, b"", 0, 0, b"", -1, [], (0, 0, 0, 0, None))


def page(partition: int, offset: int, parts: list[Part]) -> Page:
    """The page of parts holding offsets offset, offset + 1, ... with no gap (the caller
    checked): each column the parts' stored ones joined."""
    count = sum(high - low for _, low, high in parts)
    producer_runs: list[list[tuple[int, int, int]]] = [[], [], [], []]
    txns: list[tuple[int, int | None]] = []
    for batch, low, high in parts:
        records = high - low
        producer_runs[0].append((records, batch.producer_id, 0))
        producer_runs[1].append((records, batch.generation, 0))
        if batch.first_sequence:
            producer_runs[2].append((records, batch.first_sequence + low, 1))
        else:
            producer_runs[2].append((records, 0, 0))
        producer_runs[3].append((records, batch.epoch, 0))
        txns.append((records, batch.txn_id))
    keyed = any(part.batch.key_lengths is not None for part in parts)
    return Page(
        partition,
        offset,
        count,
        b"".join(map(_values_bytes, parts)),
        _joined([_piece(part, part.batch.value_lengths) for part in parts]),
        _joined([_piece(part, part.batch.timestamps or part.batch.timestamp_ms) for part in parts]),
        b"".join(_keys_bytes(part) for part in parts) if keyed else b"",
        b"\n".join(map(_key_lines, parts)) if keyed else -1,
        [
            (part.batch.first_offset + index, stored)
            for part in parts
            for index, stored in headers(part)
        ],
        (
            _constant_or_runs(producer_runs[0]),
            _constant_or_runs(producer_runs[1]),
            _constant_or_runs(producer_runs[2]),
            _constant_or_runs(producer_runs[3]),
            _txn_column(txns),
        ),
    )


def _values_bytes(part: Part) -> bytes:
    batch, low, high = part
    if low == 0 and high == batch.records:
        return batch.vals
    length = batch.value_lengths
    if isinstance(length, int):
        return batch.vals[low * length : high * length]
    lengths = numbers(length)[:high]
    if b"-" in length:
        lengths = [max(0, n) for n in lengths]
    ends = list(accumulate(lengths, initial=0))
    return batch.vals[ends[low] : ends[high]]


def _keys_bytes(part: Part) -> bytes:
    batch, low, high = part
    if batch.key_lengths is None:
        return b""
    if low == 0 and high == batch.records:
        return batch.keys or b""
    ends = list(accumulate((max(0, n) for n in numbers(batch.key_lengths)[:high]), initial=0))
    return (batch.keys or b"")[ends[low] : ends[high]]


def _key_lines(part: Part) -> bytes:
    batch, low, high = part
    if batch.key_lengths is None:
        return b"\n".join(repeat(b"-1", high - low))
    return _lines(batch.key_lengths, low, high, batch.records)


def _lines(column: bytes, low: int, high: int, count: int) -> bytes:
    if low == 0 and high == count:
        return column
    return b"\n".join(column.split(b"\n")[low:high])


_Piece = tuple[int, int | bytes]  # (records, every record's number, or their text)


def _piece(part: Part, column: int | bytes) -> _Piece:
    batch, low, high = part
    if isinstance(column, int):
        return high - low, column
    return high - low, _lines(column, low, high, batch.records)


def _joined(pieces: list[_Piece]) -> Column:
    """Pieces of a column as a page's column: one number, runs of them, or text."""
    if all(isinstance(column, int) for _, column in pieces):
        return _constant_or_runs([(records, int(column), 0) for records, column in pieces])
    return b"\n".join(
        column if isinstance(column, bytes) else b"\n".join(repeat(b"%d" % column, records))
        for records, column in pieces
    )


def _constant_or_runs(runs: Runs) -> int | Runs:
    first = runs[0][1]
    if all(number == first and (step == 0 or records == 1) for records, number, step in runs):
        return first
    return runs


def _txn_column(txns: list[tuple[int, int | None]]) -> int | Runs | None:
    found = {txn for _, txn in txns}
    if len(found) == 1:
        return found.pop()
    return [(records, NO_TXN if txn is None else txn, 0) for records, txn in txns]


def within(found: list[int], budget: int, at_least_one: bool) -> int:
    """How many of the first sizes fit in budget (at least one when asked)."""
    count = len(list(compress(found, (total <= budget for total in accumulate(found)))))
    # compress keeps a prefix: accumulate only grows
    return max(count, 1 if at_least_one else 0)
