"""A partition's records as Arrow record batches, never built row by row.

For bulk readers (the Spark connector). broker/storage/pages.py reads a page as its
stored batches' columns joined (the values concatenated, a column that varies as text,
one number a line); here they become Arrow arrays: buffers wrapped as they are, the text
parsed in C by Arrow's CSV reader, headers (msgpack) decoded in Python only for the
records that have some. Columns and types are ARROW_SCHEMA, as rows_to_arrow makes
them from rows, and a page has the rows of logs.read_rows (pages.py keeps the rules).

The engine's own SQLite connection is read. An Arrow-native driver (ADBC's SQLite
driver) links a second copy of SQLite into the process, and two copies of SQLite in one
process release each other's POSIX locks on the database (SQLite's "How To Corrupt",
section 2.2.1): a writer in the same process, or a WAL another process deletes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as pa_ipc

from broker import rows
from broker.errors import BrokerError, ErrorCode
from broker.rows import EMPTY_HEADERS, Row, decode_headers
from broker.types import RecordColumns, ResultColumns

ARROW_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("producer_id", pa.int64()),
        ("generation", pa.int32()),
        ("sequence", pa.int32()),
        ("epoch", pa.int32()),
        ("txn_id", pa.int64()),
    ]
)
_TIMESTAMP: Final = ARROW_SCHEMA.field("timestamp").type
_HEADERS: Final = ARROW_SCHEMA.field("headers").type
_INTS: Final = pa_csv.ConvertOptions(column_types={"n": pa.int64()})
_PARSE_BLOCK_BYTES_MIN: Final = 1 << 20


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], field.type) for field in ARROW_SCHEMA], schema=ARROW_SCHEMA
    )


def chunks_to_arrow(topic: str, chunks: Sequence[rows.Chunk]) -> pa.RecordBatch:
    """A fetch of one partition (its page, or its rows where SQLite could not page it)
    as one batch; an empty fetch as an empty batch."""
    if not chunks:
        return empty_batch()
    if len(chunks) > 1:
        raise ValueError(f"a fetch of one partition gave {len(chunks)} pages")
    (chunk,) = chunks
    if isinstance(chunk, rows.Page):
        return page_to_arrow(topic, chunk)
    return rows_to_arrow(topic, chunk)


def page_to_arrow(topic: str, page: rows.Page) -> pa.RecordBatch:
    """A page (broker/storage/pages.py) as one batch, column by column. A column of one
    value for the whole page (the topic, the partition, no keys, no headers, a plain
    producer's fields) is an array kept for the next page of as many records: Arrow
    arrays do not change, and making them again was half of a Spark task's read."""
    count = page.record_count
    if count == 0:
        return empty_batch()
    values = _nullable_binary(page.value_lengths, page.values, count)
    if page.key_lengths == -1:
        keys = _repeated(None, pa.binary(), count)
    else:
        lengths = _ints(page.key_lengths, count)
        present = pc.greater_equal(lengths, 0)
        keys = pc.if_else(
            present,
            _binary(pc.max_element_wise(lengths, 0), page.keys, count),
            pa.scalar(None, pa.binary()),
        )
    if page.headers:
        headers: list[tuple[tuple[str, bytes | None], ...]] = [()] * count
        for record_offset, stored in page.headers:
            headers[record_offset - page.offset] = decode_headers(stored)
        header_array = _headers_array(headers)
    else:
        header_array = _no_headers(count)
    kinds = (pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.int64())
    producer = [
        _repeated(column, kind, count)
        if column is None or isinstance(column, int)
        else _ints(column, count).cast(kind)
        for column, kind in zip(page.producer, kinds, strict=True)
    ]
    txn = page.producer[-1]
    if txn == rows.NO_TXN:
        producer[-1] = _repeated(None, pa.int64(), count)
    elif not isinstance(txn, int | None):
        producer[-1] = pc.if_else(
            pc.equal(producer[-1], rows.NO_TXN), pa.scalar(None, pa.int64()), producer[-1]
        )
    stamps = page.timestamps
    columns = [
        _repeated(topic, pa.string(), count),
        _repeated(page.partition, pa.int32(), count),
        pa.arange(page.offset, page.offset + count),
        pa.repeat(pa.scalar(stamps * 1000, _TIMESTAMP), count)
        if isinstance(stamps, int)
        else pc.multiply(_ints(stamps, count), 1000).cast(_TIMESTAMP),
        keys,
        values,
        header_array,
        *producer,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


@lru_cache(maxsize=64)
def _repeated(value: str | int | None, kind: pa.DataType, count: int) -> pa.Array:
    """`count` times one value (None: nulls), made once for a few recent values."""
    if value is None:
        return pa.nulls(count, kind)
    return pa.repeat(pa.scalar(value, kind), count)


@lru_cache(maxsize=8)
def _no_headers(count: int) -> pa.Array:
    zeros = pa.nulls(count + 1, pa.int32()).fill_null(0)
    return pa.ListArray.from_arrays(zeros, pa.array([], _HEADERS.value_type))


def _ints(column: rows.Column, count: int) -> pa.Array:
    """A page's column as int64: every record's number, runs of them, or one a line
    (parsed in C by Arrow's CSV reader)."""
    if isinstance(column, int):
        return pa.repeat(pa.scalar(column, pa.int64()), count)
    if isinstance(column, list):
        return _runs(column, count)
    table = pa_csv.read_csv(
        pa.py_buffer(column),
        read_options=pa_csv.ReadOptions(
            column_names=["n"],
            use_threads=False,
            block_size=max(len(column) + 1, _PARSE_BLOCK_BYTES_MIN),
        ),
        convert_options=_INTS,
    )
    numbers = table.column(0).combine_chunks()
    if len(numbers) != count:
        raise ValueError(f"a page column has {len(numbers)} numbers for {count} records")
    return numbers


def _runs(runs: rows.Runs, count: int) -> pa.Array:
    if sum(records for records, _, _ in runs) != count or min(r for r, _, _ in runs) < 1:
        raise ValueError(f"a page column's runs do not hold its {count} records")
    parts = [
        pa.arange(first, first + records * step, step)
        if step
        else pa.repeat(pa.scalar(first, pa.int64()), records)
        for records, first, step in runs
    ]
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def _nullable_binary(lengths: rows.Column, data: bytes, count: int) -> pa.Array:
    """The values of a page: null where the text of lengths says -1 (a null value)."""
    if isinstance(lengths, int) and lengths >= 0:
        return _binary(lengths, data, count)
    numbers = _ints(lengths, count)
    if not (isinstance(lengths, bytes) and b"-" in lengths):
        return _binary(numbers, data, count)
    present = pc.greater_equal(numbers, 0)
    return pc.if_else(
        present,
        _binary(pc.max_element_wise(numbers, 0), data, count),
        pa.scalar(None, pa.binary()),
    )


def without_nulls(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with null values given as empty, for a reader that did not say it
    reads nulls (FETCH_ARROW's "nulls"; rows.without_nulls)."""
    index = ARROW_SCHEMA.get_field_index("value")
    column = batch.column(index)
    if column.null_count == 0:
        return batch
    return batch.set_column(index, ARROW_SCHEMA.field(index), column.fill_null(b""))


def _binary(lengths: pa.Array | int, data: bytes, count: int) -> pa.Array:
    """A binary array of `count` items of `lengths` (or each of one length) over the
    concatenated `data`."""
    if isinstance(lengths, int):
        offsets = _equal_offsets(lengths, count)
    else:
        ends = pc.cumulative_sum(lengths)
        offsets = pa.concat_arrays([pa.array([0], pa.int64()), ends]).cast(pa.int32())
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, offsets.buffers()[1], pa.py_buffer(data)]
    )


@lru_cache(maxsize=16)
def _equal_offsets(length: int, count: int) -> pa.Array:
    """The int32 offsets of `count` values of `length` bytes each."""
    if not length:  # arange takes no step of 0
        return _repeated(0, pa.int32(), count + 1)
    return pa.arange(0, (count + 1) * length, length).cast(pa.int32())


def _headers_array(headers: Sequence[tuple[tuple[str, bytes | None], ...]]) -> pa.Array:
    if not any(headers):  # the common case: no record has headers, built without a loop
        return _no_headers(len(headers))
    return pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], _HEADERS)


def rows_to_arrow(topic: str, rows: Sequence[Row]) -> pa.RecordBatch:
    """Stored rows (broker/storage/logs.py Row) as one record batch, column by column:
    what a page SQLite cannot aggregate, or a server without pyarrow, gives."""
    if not rows:
        return empty_batch()
    (partition, offset, ts, key, value, headers, pid, gen, seq, epoch, txn) = zip(
        *rows, strict=True
    )
    millis = pa.array(ts, pa.int64())
    arrays = [
        pa.repeat(pa.scalar(topic, pa.string()), len(rows)),
        pa.array(partition, pa.int32()),
        pa.array(offset, pa.int64()),
        pc.multiply(millis, 1000).cast(_TIMESTAMP),
        pa.array(key, pa.binary()),
        pa.array(value, pa.binary()),
        _headers_array(
            [()] * len(rows)  # the common case, found without a loop in Python
            if headers.count(EMPTY_HEADERS) == len(rows)
            else [() if h == EMPTY_HEADERS else decode_headers(h) for h in headers]
        ),
        pa.array(pid, pa.int64()),
        pa.array(gen, pa.int32()),
        pa.array(seq, pa.int32()),
        pa.array(epoch, pa.int32()),
        pa.array(txn, pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    """One batch as an Arrow IPC stream (how FETCH_ARROW carries it; no compression:
    the broker is reached over loopback or a LAN, and the values are the user's)."""
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def batch_from_ipc(data: bytes) -> pa.RecordBatch:
    """The batch of a FETCH_ARROW reply: exactly one batch of ARROW_SCHEMA, or
    ValueError (the caller turns it into a protocol error)."""
    try:
        reader = pa_ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not an Arrow IPC stream: {exc}") from exc
    if not reader.schema.equals(ARROW_SCHEMA):
        raise ValueError(f"an Arrow batch of another schema: {reader.schema}")
    if len(batches) != 1:
        raise ValueError(f"{len(batches)} Arrow batches where one was expected")
    return batches[0]


# produce -----------------------------------------------------------------------------

PRODUCE_COLUMNS: Final = ("value", "key", "partition")
RESULT_SCHEMA: Final = pa.schema(
    [("partition", pa.int32()), ("offset", pa.int64()), ("duplicate", pa.bool_())]
)


def record_columns(batch: pa.RecordBatch | pa.Table) -> RecordColumns:
    """A batch's rows as records to append: its `value` column (binary or string, no
    nulls), and `key` (binary or string, null: no key) and `partition` (integers, null:
    the broker chooses) where it has them; each column converted in C (dictionary and
    view columns decoded first; a key or partition column of nulls only, as pyarrow
    types one, is one the batch does not have). A null value is a null record value
    (Kafka's tombstone), kept distinct from an empty one. Anything else is
    INVALID_ARGUMENT, saying what is wrong."""
    names = batch.schema.names
    unknown = [name for name in names if name not in PRODUCE_COLUMNS]
    if unknown or "value" not in names:
        wrong = f"it has {', '.join(map(repr, unknown))}" if unknown else "it has no value"
        raise _refused(
            f"a batch to produce has the columns value, and key and partition if it likes: {wrong}"
        )
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise _refused(f"a batch to produce has each column once: {', '.join(twice)} twice")
    values = _bytes_column(batch, "value")
    if values is None:  # a column of nulls only: every value null
        values = [None] * len(batch)
    keys = _bytes_column(batch, "key") if "key" in names else None
    partitions = _partition_column(batch) if "partition" in names else None
    return RecordColumns(values, keys, partitions)


def _bytes_column(batch: pa.RecordBatch | pa.Table, name: str) -> list[bytes | None] | None:
    """A binary or string column's items as bytes (strings: their UTF-8); None for a
    column of nulls only."""
    column = _decoded(batch.column(name))
    kind = column.type
    if pa.types.is_null(kind):
        return None
    if pa.types.is_large_string(kind):
        column = column.cast(pa.large_binary())
    elif pa.types.is_string(kind) or pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        column = column.cast(pa.binary())
    elif not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise _refused(f"the {name} column must be binary or string, not {kind}")
    items: list[bytes | None] = column.to_pylist()
    return items


def _partition_column(batch: pa.RecordBatch | pa.Table) -> list[int | None] | None:
    """The partition column's items; None for a column of nulls only."""
    column = _decoded(batch.column("partition"))
    if pa.types.is_null(column.type):
        return None
    if not pa.types.is_integer(column.type):
        raise _refused(f"the partition column must be integers, not {column.type}")
    items: list[int | None] = column.to_pylist()
    return items


def _decoded(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A dictionary-encoded column (a pandas categorical) as the values it stands for."""
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def _refused(message: str) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        message,
        hint="select or rename the columns: batch.select(['value', ...])",
    )


def results_to_arrow(parts: Sequence[ResultColumns]) -> pa.RecordBatch:
    """Produce results given as columns (each a value per record, or one for all) as one
    batch of RESULT_SCHEMA, in order."""
    arrays = [
        pa.concat_arrays(
            [_result_array(part[0], part[column], field.type) for part in parts]
            or [pa.array([], field.type)]
        )
        for column, field in enumerate(RESULT_SCHEMA, start=1)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RESULT_SCHEMA)


def _result_array(count: int, column: object, kind: pa.DataType) -> pa.Array:
    if isinstance(column, list | tuple | range):
        return pa.array(column, kind)
    return pa.repeat(pa.scalar(column, kind), count)
