"""Kafka record batches (magic v2) in and out of fencelog's records.

In: a Produce request's records field holds one or more record batches; each is checked
(magic 2, its CRC-32C, its length), decompressed with kafka-python's codecs (gzip always;
snappy, lz4 and zstd with their libraries, which the kafka extra installs) and read into
NewRecords with the batch's producer fields.

Out: a Fetch answer holds, per partition, one uncompressed batch of the stored rows,
built here without a Python object per record beyond the row itself (a fetch of many
records is this module's loop, so it is kept tight). Offsets inside a batch are deltas
from its first, so a gap (none today) would cost nothing.

Kafka's null value (a tombstone: value length -1) is stored as a null value and fetched
as one, distinct from an empty value; a null header value likewise. A page holding a
null is never uniform (its value lengths are text), so encode_batch writes it.
"""

from __future__ import annotations

import array
import contextlib
import functools
import operator
import struct
import threading
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, Final, cast

import numpy
from crc32c import crc32c
from kafka import codec as codecs
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from msgspec import Struct

from broker import rows
from broker.limits import INT64_MAX, INT64_MIN
from broker.types import NewRecord, RecordColumns, collector_paused

# BaseOffset int64, Length int32, PartitionLeaderEpoch int32, Magic int8, CRC uint32,
# Attributes int16, LastOffsetDelta int32, BaseTimestamp int64, MaxTimestamp int64,
# ProducerId int64, ProducerEpoch int16, BaseSequence int32, RecordCount int32
_BATCH_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD: Final = 12  # BaseOffset and Length come before what Length counts
_CRC_AT: Final = 17
_CRC_FROM: Final = 21  # the CRC covers Attributes to the end
_MAGIC_AT: Final = 16
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20
_CODEC: Final = 0x07
_LOG_APPEND_TIME: Final = 0x08  # a producer never sets it; the Python reader ignores it
_OVERREAD_PAD: Final = bytes(16)  # zeros after a batch that a varint reader may read
_COLUMNS_MIN: Final = 32  # records: a smaller batch reads as fast in C
_C_DELTA_MAX: Final = 1 << 62  # a timestamp this far from its batch's: the Python loop
_RUNS_MAX: Final = 16  # runs of one record length in a batch read as columns
_FORMAT_RECORDS_MAX: Final = 1024  # records of one struct format (_run_format)
_C_VALUE, _C_KEY, _C_HEADERS, _C_TIMESTAMP = (
    operator.attrgetter(name) for name in ("value", "key", "headers", "timestamp")
)

try:  # aiokafka's C reader where its extension is built; else the Python loop below
    from aiokafka.errors import CorruptRecordException as _CCorruptRecord
    from aiokafka.record._crecords import DefaultRecordBatch as _CRecordBatch
except ImportError:  # pragma: no cover - wheels exist for the platforms we run on
    _CRecordBatch = None
    _CCorruptRecord = CorruptRecordError
NO_PRODUCER_ID: Final = -1


class BadRecords(Exception):
    """Records a Produce cannot append; `code` is the Kafka error to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ProducedBatch(Struct, frozen=True):
    producer_id: int  # -1: none
    producer_epoch: int
    base_sequence: int
    transactional: bool
    records: Sequence[NewRecord]  # a RecordColumns where _read_columns read them


def read_batches(data: bytes | memoryview | None, partition: int) -> list[ProducedBatch]:
    """The record batches of one partition's Produce data, each checked."""
    from broker.kafka import wire  # error codes

    if not data:
        raise BadRecords(wire.CORRUPT_MESSAGE, "a produce with no records")
    view = memoryview(data)
    batches: list[ProducedBatch] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < _BATCH_HEADER.size:
            raise BadRecords(wire.CORRUPT_MESSAGE, "a record batch shorter than its header")
        if view[pos + _MAGIC_AT] != 2:
            raise BadRecords(
                wire.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                f"record batches of magic {view[pos + _MAGIC_AT]} are not accepted (only v2)",
            )
        header = _BATCH_HEADER.unpack_from(view, pos)
        end = pos + _LOG_OVERHEAD + header[1]
        if header[1] < _BATCH_HEADER.size - _LOG_OVERHEAD or end > len(view):
            raise BadRecords(wire.CORRUPT_MESSAGE, "a record batch's length runs past its data")
        if crc32c(view[pos + _CRC_FROM : end]) != header[4]:
            raise BadRecords(wire.CORRUPT_MESSAGE, "a record batch fails its CRC-32C check")
        attributes = header[5]
        if attributes & _CONTROL:
            raise BadRecords(wire.INVALID_REQUEST, "a producer cannot send control batches")
        try:
            records = _records_of(view[pos:end], header, partition)
        except UnsupportedCodecError as exc:
            raise BadRecords(wire.UNSUPPORTED_FOR_MESSAGE_FORMAT, str(exc)) from exc
        except (CorruptRecordError, ValueError, IndexError, OSError, EOFError) as exc:
            raise BadRecords(wire.CORRUPT_MESSAGE, f"a corrupt record batch: {exc}") from exc
        if len(records) != header[12] or not records:
            raise BadRecords(wire.CORRUPT_MESSAGE, "a record batch's count does not match")
        batches.append(
            ProducedBatch(
                header[9], header[10], header[11], bool(attributes & _TRANSACTIONAL), records
            )
        )
        pos = end
    return batches


def _records_of(batch: memoryview, header: tuple[Any, ...], partition: int) -> Sequence[NewRecord]:
    """A checked batch's records, by the fastest reader that reads it: as columns (most
    producers' batches of values), by the C reader, else by the Python loop, which
    reads any batch or says what is wrong with it."""
    attributes, count = header[5], header[12]
    records: Sequence[NewRecord] | None = None
    if not attributes & _CODEC and count >= _COLUMNS_MIN:
        records = _read_columns(batch, count, header[7], partition)
    if (
        records is None
        and _CRecordBatch is not None
        and not attributes & (_CODEC | _LOG_APPEND_TIME)
    ):
        with contextlib.suppress(CorruptRecordError):  # the loop below says why
            records = _read_records_in_c(batch, partition)
    if records is None:
        body = _decompressed(batch[_BATCH_HEADER.size :], attributes & _CODEC)
        records = _read_records(body, count, header[7], partition)
    return records


def _read_columns(
    batch: memoryview, count: int, base_timestamp: int, partition: int
) -> RecordColumns | None:
    """The records of an uncompressed batch (header included) as columns, read with
    numpy a field at a time for all records, where each has no key, no headers and a
    value, and its numbers take at most three bytes: what a producer of values sends
    (a librdkafka batch of 7000 100-byte records: 2.1 us a record by the C reader and
    NewRecords, 0.2 here). None for any other batch, and for one whose fields do not
    add up (the C reader or the Python loop reads it, or says why not): what this
    returns is what _read_records would.

    Records are found a run at a time: a record's length prefix gives where the next
    starts if it is as long, and numpy checks at once how many in a row are (the
    prefixes at those places are the same bytes); a producer's batch has a few such
    runs (its offset and timestamp deltas grow a byte at 64)."""
    size = len(batch) - _BATCH_HEADER.size
    body = numpy.zeros(size + len(_OVERREAD_PAD), numpy.uint8)  # read past the end: 0s
    body[:size] = numpy.frombuffer(batch, numpy.uint8, size, _BATCH_HEADER.size)
    try:
        starts, strides, widths = _record_runs(body, size, count)
        at = starts + widths + 1  # past the attributes byte
        deltas, width = _varints(body, at)
        at += width
        at += _varints(body, at)[1]  # the offset delta: unused, as the Python loop's
        _expect((body[at] == 1).all())  # each key -1 (none), one byte; a key: the C reader
        at += 1
        sizes, width = _varints(body, at)
        _expect(sizes.min() >= 0)  # a null value: the C reader
        at += width
        ends = at + sizes  # where each record's header count is: 0, its last byte
        _expect((ends + 1 == starts + strides).all() and not body[ends].any())
        low, high = int(deltas.min()), int(deltas.max())
        _expect(base_timestamp + low >= INT64_MIN and base_timestamp + high <= INT64_MAX)
    except _Irregular:
        return None
    values = _values(batch, at - starts, sizes, strides)
    # an array of 64-bit numbers: checked by its type, written as text by numpy
    stamps = array.array("q", (deltas.astype(numpy.int64) + base_timestamp).tobytes())
    return RecordColumns(values, None, [partition] * count, stamps, sizes=sizes.tolist())


class _Irregular(Exception):
    """A batch _read_columns leaves to the readers of one record at a time."""


def _expect(holds: object) -> None:
    if not holds:
        raise _Irregular


def _record_runs(body: Any, size: int, count: int) -> tuple[Any, Any, Any]:
    """Where each record starts, its length with its prefix, and its prefix's length,
    as arrays. _Irregular where the records are not a few runs of one length each (at
    most _RUNS_MAX: a producer's batch of values has a run for each width its offset
    and timestamp deltas take), or their lengths do not walk to the end in count
    records. Each run's check looks no further than the records left, so the work is
    bounded by _RUNS_MAX times count."""
    found: list[tuple[int, int, int, int]] = []  # start, records, stride, prefix width
    pos = records = 0
    while pos < size:
        _expect(len(found) < _RUNS_MAX)
        prefix = bytes(body[pos : pos + 3])
        width = 1 if prefix[0] < 0x80 else 2 if prefix[1] < 0x80 else 3
        _expect(width < 3 or prefix[2] < 0x80)
        raw = (prefix[0] & 0x7F) | (prefix[1] & 0x7F) << 7 | prefix[2] << 14
        raw &= (1 << (7 * width)) - 1
        stride = width + ((raw >> 1) ^ -(raw & 1))
        _expect(width < stride and pos + stride <= size and records < count)
        at = numpy.arange(pos, min(size - stride + 1, pos + (count - records) * stride), stride)
        same = body[at] == prefix[0]
        for byte in range(1, width):
            same &= body[at + byte] == prefix[byte]
        run = len(at) if same.all() else int(same.argmin())
        records += run
        found.append((pos, run, stride, width))
        pos += run * stride
    _expect(records == count)
    lengths = [run for _, run, _, _ in found]
    return (
        numpy.concatenate(
            [numpy.arange(start, start + run * stride, stride) for start, run, stride, _ in found]
        ),
        numpy.repeat([stride for _, _, stride, _ in found], lengths),
        numpy.repeat([width for _, _, _, width in found], lengths),
    )


def _varints(body: Any, at: Any) -> tuple[Any, Any]:
    """The zigzag varints at these places, and how many bytes each takes (one number
    where all take as many); _Irregular if one takes more than three (the readers of
    one number at a time read those)."""
    first = body[at]
    more = first >= 0x80
    if not more.any():
        raw = first.astype(numpy.int32)
        return (raw >> 1) ^ -(raw & 1), 1
    second = body[at + 1]
    most = more & (second >= 0x80)
    raw = (first & 0x7F).astype(numpy.int32) | (second & 0x7F).astype(numpy.int32) << 7
    if most.any():
        _expect(not (body[at + 2][most] >= 0x80).any())
        raw[~more] = first[~more]
        raw[most] |= body[at + 2][most].astype(numpy.int32) << 14
        return (raw >> 1) ^ -(raw & 1), 1 + more + most
    if more.all():
        return (raw >> 1) ^ -(raw & 1), 2
    raw[~more] = first[~more]
    return (raw >> 1) ^ -(raw & 1), 1 + more


def _values(batch: memoryview, offsets: Any, sizes: Any, strides: Any) -> list[bytes]:
    """The values, cut out of the batch by one struct format for each run of records
    as long, with values as long and as far into each record."""
    values: list[bytes] = []
    changes = numpy.flatnonzero(
        (strides[1:] != strides[:-1]) | (offsets[1:] != offsets[:-1]) | (sizes[1:] != sizes[:-1])
    )
    first, pos = 0, _BATCH_HEADER.size
    for last in [*(changes + 1).tolist(), len(sizes)]:
        stride, offset, size = int(strides[first]), int(offsets[first]), int(sizes[first])
        count = last - first
        while count:
            piece = min(1 << (count.bit_length() - 1), _FORMAT_RECORDS_MAX)
            values += _run_format(offset, size, stride - offset - size, piece).unpack_from(
                batch, pos
            )
            pos += piece * stride
            count -= piece
        first = last
    return values


@functools.lru_cache(maxsize=128)  # each at most _FORMAT_RECORDS_MAX records: 40 KB
def _run_format(skip: int, size: int, tail: int, count: int) -> struct.Struct:
    """count records' values: skip bytes before each, size of value, tail after."""
    return struct.Struct(f"{skip}x{size}s{tail}x" * count if tail else f"{skip}x{size}s" * count)


def _read_records_in_c(batch: memoryview, partition: int) -> list[NewRecord]:
    """The records of an uncompressed batch (header included) as _read_records reads
    them, by aiokafka's record reader in C (Cython): 1.5 us a record here in all
    (0.2 of it the reader's, 0.35 the NewRecord, 0.5 the walk of
    _attributes_are_bytes) against 3.2 for the Python loop, which was most of a Kafka
    produce's time on the server. Its checks are _read_records' (each record's length
    against its fields, no bytes left after the last, header names UTF-8), but one: it
    reads a record's attributes (an int8, always 0 from a producer) as a varint: a
    batch with one past 0x7F, or one it refuses, goes to the Python loop, which
    accepts or refuses it for good. A varint it reads may run up to 9 bytes past the
    batch's end before its bounds check: the batch is copied with zeros after it, and
    the reader is given the batch alone."""
    padded = bytes(batch) + _OVERREAD_PAD
    if not _attributes_are_bytes(padded, _BATCH_HEADER.size, len(batch)):
        raise CorruptRecordError("a record's attributes the C reader would misread")
    try:
        read = list(_CRecordBatch(memoryview(padded)[: len(batch)]))
    except _CCorruptRecord as exc:
        raise CorruptRecordError(str(exc)) from exc
    count = len(read)
    given: list[int | None] = list(map(_C_TIMESTAMP, read))
    stamps = cast(list[int], given)
    if None in given:  # the reader's None is a timestamp of -1
        stamps = [-1 if stamp is None else stamp for stamp in given]
    base = _BATCH_HEADER.unpack_from(batch)[7]
    if max(stamps) - base > _C_DELTA_MAX or base - min(stamps) > _C_DELTA_MAX:
        # the reader adds in 64 bits: a sum past them wraps to the other end, where
        # the Python loop gives the number that check_records refuses
        raise CorruptRecordError("a timestamp past 64 bits")
    headers: Iterable[Any] = repeat((), count)
    if any(map(_C_HEADERS, read)):
        headers = [tuple(record.headers) for record in read]
    fields = zip(
        map(_C_VALUE, read),
        map(_C_KEY, read),
        headers,
        repeat(partition, count),
        stamps,
        strict=True,
    )
    with collector_paused():
        return list(map(tuple.__new__, repeat(NewRecord), fields))


def _attributes_are_bytes(body: bytes, pos: int, end: int) -> bool:
    """Every record from pos to end has an attributes byte below 0x80, which a varint
    reader reads as the one byte it is (a walk over the records' lengths alone: 0.5
    us a record here, a third of the C path's time, and what keeps it exact). False
    too where the lengths do not walk to end."""
    try:
        while pos < end:
            byte = body[pos]
            if byte < 0x80:
                length, pos = (byte >> 1) ^ -(byte & 1), pos + 1
            elif body[pos + 1] < 0x80:
                length = (byte & 0x7F) | (body[pos + 1] << 7)
                length, pos = (length >> 1) ^ -(length & 1), pos + 2
            else:
                length, pos = _varint(body, pos)
            if length < 1 or body[pos] >= 0x80:
                return False
            pos += length
    except (IndexError, CorruptRecordError):
        return False
    return pos == end


def _decompressed(data: memoryview, codec: int) -> bytes:
    """A batch's record bytes, decompressed with kafka-python's codecs."""
    if codec == 0:
        return bytes(data)
    if codec > 4:
        raise UnsupportedCodecError(f"unknown compression codec {codec}")
    name = ("", "gzip", "snappy", "lz4", "zstd")[codec]
    if not getattr(codecs, f"has_{name}")():
        raise UnsupportedCodecError(f"{name} batches need the {name} library")
    decode = getattr(codecs, f"{name}_decode")
    return bytes(decode(data.tobytes()))


def _read_records(  # noqa: PLR0912, PLR0915 - a branch per field read inline is the point
    body: bytes, count: int, base_timestamp: int, partition: int
) -> list[NewRecord]:
    """count records of a v2 batch body. Each is Length, Attributes, TimestampDelta,
    OffsetDelta, Key, Value and Headers, every number a zigzag varint: the one- and
    two-byte ones (almost all) are read inline, the others by _varint."""
    records: list[NewRecord] = []
    append, new = records.append, tuple.__new__
    pos = 0
    for _ in range(count):
        byte = body[pos]
        if byte < 0x80:
            length, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        elif body[pos + 1] < 0x80:  # two bytes: a record of 64 to 8191 bytes
            length = (byte & 0x7F) | (body[pos + 1] << 7)
            length, pos = (length >> 1) ^ -(length & 1), pos + 2
        else:
            length, pos = _varint(body, pos)
        end = pos + length
        pos += 1  # attributes: unused
        byte = body[pos]
        if byte < 0x80:
            delta, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        elif body[pos + 1] < 0x80:
            delta = (byte & 0x7F) | (body[pos + 1] << 7)
            delta, pos = (delta >> 1) ^ -(delta & 1), pos + 2
        else:
            delta, pos = _varint(body, pos)
        byte = body[pos]  # offset delta: unused (past 63 it takes two bytes)
        if byte < 0x80:
            pos += 1
        elif body[pos + 1] < 0x80:
            pos += 2
        else:
            pos = _varint(body, pos)[1]
        byte = body[pos]
        if byte < 0x80:
            size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            size, pos = _varint(body, pos)
        key = None
        if size >= 0:
            key, pos = body[pos : pos + size], pos + size
        byte = body[pos]
        if byte < 0x80:
            size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        elif body[pos + 1] < 0x80:
            size = (byte & 0x7F) | (body[pos + 1] << 7)
            size, pos = (size >> 1) ^ -(size & 1), pos + 2
        else:
            size, pos = _varint(body, pos)
        value = None  # Kafka's null value, kept null
        if size >= 0:
            value, pos = body[pos : pos + size], pos + size
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if body[pos] == 0:
            pos += 1
        else:
            headers, pos = _headers(body, pos)
        if pos != end:
            raise CorruptRecordError(f"a record's length says {length}, its fields differ")
        # tuple.__new__: a NamedTuple's own __new__ is a Python function, a call more
        append(new(NewRecord, (value, key, headers, partition, base_timestamp + delta)))
    if pos != len(body):
        raise CorruptRecordError(f"{len(body) - pos} bytes after the batch's last record")
    return records


def _headers(body: bytes, pos: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _varint(body, pos)
    if count < 0:
        raise CorruptRecordError(f"a record with {count} headers")
    headers = []
    for _ in range(count):
        size, pos = _varint(body, pos)
        if size < 0:
            raise CorruptRecordError("a header without a name")
        name = body[pos : pos + size].decode()
        pos += size
        size, pos = _varint(body, pos)
        data = None  # Kafka's null header value, kept null
        if size >= 0:
            data, pos = body[pos : pos + size], pos + size
        headers.append((name, data))
    return tuple(headers), pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("a varint longer than 10 bytes")


def _zigzag(value: int) -> bytes:
    """A Kafka varint/varlong (zigzag, then 7 bits a byte, low first)."""
    n = (value << 1) ^ (value >> 63)
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode_headers(stored: bytes) -> bytes:
    decoded = rows.decode_headers(stored)
    out = bytearray(_zigzag(len(decoded)))
    for name, data in decoded:
        encoded = name.encode()
        out += _zigzag(len(encoded))
        out += encoded
        if data is None:
            out += _NULL
        else:
            out += _zigzag(len(data))
            out += data
    return bytes(out)


_SMALL: Final = [bytes([n]) for n in range(0x80)]
_NULL: Final = _zigzag(-1)
_NO_HEADERS: Final = b"\x00"
_ATTRIBUTES: Final = b"\x00"
_TABLE_SIZE: Final = 1 << 14
_VARINTS: Final = [_zigzag(n) for n in range(_TABLE_SIZE)]


def encode_batch(stored: Sequence[rows.KafkaRow]) -> bytes:
    """One uncompressed v2 batch of stored records (offset, timestamp, key, value,
    stored headers; offsets ascending, one partition).

    This loop is a kcat -C's cost per record: every varint a record needs below
    _TABLE_SIZE (lengths, deltas) is a table lookup, and the record's pieces go into one
    list joined once, with no bytes object built per record."""
    first = stored[0]
    base_offset, base_ts = first[0], first[1]
    table, limit, empty_headers = _VARINTS, _TABLE_SIZE, rows.EMPTY_HEADERS
    parts: list[bytes] = []
    extend = parts.extend
    for offset, timestamp, key, stored_value, headers in stored:
        delta = timestamp - base_ts
        stamp = table[delta] if 0 <= delta < limit else _zigzag(delta)
        delta = offset - base_offset
        place = table[delta] if delta < limit else _zigzag(delta)
        if key is None:
            key_size, key_bytes = _NULL, b""
        else:
            key_size, key_bytes = (table[len(key)] if len(key) < limit else _zigzag(len(key))), key
        value = b"" if stored_value is None else stored_value
        size = len(value)
        if stored_value is None:
            value_size = _NULL
        else:
            value_size = table[size] if size < limit else _zigzag(size)
        tail = _NO_HEADERS if headers == empty_headers else _encode_headers(headers)
        size += 1 + len(stamp) + len(place) + len(key_size) + len(key_bytes) + len(value_size)
        size += len(tail)
        extend(
            (
                table[size] if size < limit else _zigzag(size),
                _ATTRIBUTES,
                stamp,
                place,
                key_size,
                key_bytes,
                value_size,
                value,
                tail,
            )
        )
    body = b"".join(parts)
    max_ts = max(row[1] for row in stored)
    return _batch(base_offset, stored[-1][0], base_ts, max_ts, len(stored), body)


def uniform(page: rows.Page) -> bool:
    """A page encode_uniform takes: one value size, no keys or headers, and one timestamp
    for each stored batch (a number, or runs of them: a page across batches)."""
    stamps = page.timestamps
    return (
        isinstance(page.value_lengths, int)
        and (isinstance(stamps, int) or (isinstance(stamps, list) and _steady(stamps)))
        and page.key_lengths == -1
        and not page.headers
    )


def uniform_batches(page: rows.Page) -> list[int]:
    """The records of each v2 batch encode_uniform makes of a uniform page."""
    stamps = page.timestamps
    if isinstance(stamps, int):
        return [page.record_count] if page.record_count else []
    assert isinstance(stamps, list)
    return [records for records, _, _ in stamps]


def _steady(runs: rows.Runs) -> bool:
    return all(step == 0 for _, _, step in runs)


def encode_uniform(page: rows.Page, count: int) -> bytes:
    """encode_batch() of a uniform page's first `count` records, from its columns, a v2
    batch for each run of one timestamp (each stored batch).

    The records of such a batch differ only in their offset delta and value, and a run of
    deltas whose varints have one width gives records of one length: that run is a
    matrix, a row a record (its prefix, its value, the empty header count), filled by
    three numpy copies (_Shape). No Python object per record: a kcat reading a topic
    of 100-byte values cost 0.25 us a record here as a join of slices, 0.03 so."""
    assert isinstance(page.value_lengths, int)
    stamps = page.timestamps
    runs = [(page.record_count, stamps, 0)] if isinstance(stamps, int) else stamps
    assert isinstance(runs, list)
    size = page.value_lengths
    batches: list[tuple[int, int, int]] = []  # first record of the page, records, timestamp
    total = 0
    for records, timestamp, _ in runs:
        taken = min(records, count - total)
        if taken <= 0:
            break
        batches.append((total, taken, timestamp))
        total += taken
    shapes = _shapes(size, max((taken for _, taken, _ in batches), default=0))
    header = _BATCH_HEADER.size
    out = numpy.empty(
        sum(header + _body_bytes(shapes, size, taken) for _, taken, _ in batches), numpy.uint8
    )
    written = out.data  # the array's own memory, for struct and the CRC
    values = numpy.frombuffer(page.values, numpy.uint8, total * size).reshape(total, size)
    at = 0
    for first, taken, timestamp in batches:
        end = _fill_body(out, at + header, shapes, values[first : first + taken])
        offset = page.offset + first
        fields = _header_fields(
            offset, offset + taken - 1, timestamp, timestamp, taken, end - at - header
        )
        _BATCH_HEADER.pack_into(written, at, *fields)
        struct.pack_into(">I", written, at + _CRC_AT, crc32c(written[at + _CRC_FROM : end]))
        at = end
    return out.tobytes()


class _Shape(Struct, frozen=True):
    """The records at offset deltas low..high-1 of a uniform batch: one prefix length
    (the bytes before the value), so one record length; prefixes holds each one's."""

    low: int
    high: int
    prefixes: Any  # numpy uint8 array, (high - low, prefix length)


def _shapes(value_size: int, count: int) -> list[_Shape]:
    """The shapes of the records of value_size bytes at deltas 0..count-1 and maybe
    more, made once per value size (the most recent few kept)."""
    made = _SHAPES.get(value_size)
    if made is None or made[-1].high < count:
        deltas = max(count, _SHAPES_MIN)
        prefixes = [_record_prefix(value_size, delta) for delta in range(deltas)]
        made, low = [], 0
        for delta in range(1, deltas + 1):
            if delta == deltas or len(prefixes[delta]) != len(prefixes[low]):
                joined = numpy.frombuffer(b"".join(prefixes[low:delta]), numpy.uint8)
                made.append(_Shape(low, delta, joined.reshape(delta - low, -1)))
                low = delta
        with _SHAPES_LOCK:  # fetches are read on more than one thread
            while len(_SHAPES) >= _SHAPES_KEPT:
                _SHAPES.pop(next(iter(_SHAPES)))
            _SHAPES[value_size] = made
    return made


def _body_bytes(shapes: list[_Shape], value_size: int, count: int) -> int:
    return sum(
        (min(shape.high, count) - shape.low) * (shape.prefixes.shape[1] + value_size + 1)
        for shape in shapes
        if shape.low < count
    )


def _fill_body(out: Any, at: int, shapes: list[_Shape], values: Any) -> int:
    """Write the records whose values are the rows of `values` from out[at]; the end."""
    count, size = values.shape
    for shape in shapes:
        if shape.low >= count:
            break
        records = min(shape.high, count) - shape.low
        prefix = shape.prefixes.shape[1]
        length = prefix + size + 1
        matrix = out[at : at + records * length].reshape(records, length)
        matrix[:, :prefix] = shape.prefixes[:records]
        matrix[:, prefix : prefix + size] = values[shape.low : shape.low + records]
        matrix[:, -1] = _NO_HEADERS[0]
        at += records * length
    return at


def _record_prefix(value_size: int, delta: int) -> bytes:
    """A record's bytes before its value, for a value of value_size bytes with no key,
    no headers and the batch's timestamp, at offset delta `delta`."""
    after_length = _ATTRIBUTES + _zigzag(0) + _zigzag(delta) + _NULL + _zigzag(value_size)
    length = len(after_length) + value_size + len(_NO_HEADERS)
    return _zigzag(length) + after_length


_SHAPES: dict[int, list[_Shape]] = {}  # by value size, the most recently made few
_SHAPES_LOCK: Final = threading.Lock()
_SHAPES_KEPT: Final = 8
_SHAPES_MIN: Final = 1024


def _batch(
    base_offset: int, last_offset: int, base_ts: int, max_ts: int, count: int, body: bytes
) -> bytes:
    """A v2 batch's header before body, with its CRC-32C."""
    header = bytearray(
        _BATCH_HEADER.pack(
            *_header_fields(base_offset, last_offset, base_ts, max_ts, count, len(body))
        )
    )
    crc = crc32c(body, crc32c(header[_CRC_FROM:]))  # over Attributes to the end
    struct.pack_into(">I", header, _CRC_AT, crc)
    return bytes(header) + body


def _header_fields(
    base_offset: int, last_offset: int, base_ts: int, max_ts: int, count: int, body_bytes: int
) -> tuple[int, ...]:
    """_BATCH_HEADER's fields of a batch fencelog writes, its CRC 0 (filled in after)."""
    return (
        base_offset,
        _BATCH_HEADER.size - _LOG_OVERHEAD + body_bytes,
        0,  # partition leader epoch: one broker, one epoch
        2,
        0,  # the CRC
        0,  # attributes: uncompressed, CreateTime, not transactional
        last_offset - base_offset,
        base_ts,
        max_ts,
        NO_PRODUCER_ID,
        -1,
        -1,
        count,
    )


def next_offset(batches: bytes) -> int:
    """The offset after the last record of one or more batches fencelog encoded."""
    first, delta, _ = _spans(batches)[-1]
    return first + delta + 1


def count_of(batches: bytes) -> int:
    """The records of one or more batches fencelog encoded (a fetch answer's metric)."""
    return sum(count for _, _, count in _spans(batches))


def _spans(batches: bytes) -> list[tuple[int, int, int]]:
    """(BaseOffset, LastOffsetDelta, RecordCount) of each batch, from its header."""
    found, at = [], 0
    while at < len(batches):
        fields = _BATCH_HEADER.unpack_from(batches, at)
        found.append((fields[0], fields[6], fields[12]))
        at += _LOG_OVERHEAD + fields[1]
    return found
