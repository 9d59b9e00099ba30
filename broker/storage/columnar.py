"""A partition's records as Arrow record batches, built by SQLite, never row by row.

For bulk readers (the Spark connector): reading a page of records through Python's
sqlite3 costs a tuple and eleven objects per record, then a pass to turn them into
columns. Here one aggregate query returns a whole page as a few values: every value
concatenated into one buffer, the page's sizes, and how many records differ from the
page's first record in each column. Arrow arrays are made from those buffers. A column
that does vary (timestamps, value sizes, keys, producer fields) comes from one more
aggregate as text, one number a line, which Arrow's CSV reader parses in C; headers are
msgpack and are decoded in Python only for the records that have some.

Rules it keeps:
- The rows of logs.read_rows cut as the engine cuts them: committed records only (a
  transaction's records enter the log at commit), offsets from `offset`, at most
  max_records, then the first records within bytes_max of keys and values (at least
  one). Columns and types are ARROW_SCHEMA, as rows_to_arrow makes them from rows.
- One snapshot: every query of a page runs inside the caller's read transaction.
- The engine's own SQLite connection. An Arrow-native driver (ADBC's SQLite driver)
  links a second copy of SQLite into the process, and two copies of SQLite in one
  process release each other's POSIX locks on the database (SQLite's "How To Corrupt",
  section 2.2.1): a writer in the same process, or a WAL another process deletes.
- Order: an aggregate over a range of the records' primary key walks it in key order.
  The offsets must be contiguous and the page's first and last values must be where
  that order puts them, or read_page answers None and the caller reads the page as rows.
- Memory: SQLite's length limit is lowered to concat_bytes_max while a page is read, so
  a page of large records is never concatenated whole; it too answers None.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as pa_ipc

from broker.storage.database import EMPTY_HEADERS, decode_headers
from broker.storage.logs import Row, TopicRow
from broker.storage.queries import Q

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
_NO_TXN: Final = -1  # txn_id in the producer text of a record outside transactions
_INTS: Final = pa_csv.ConvertOptions(column_types={"n": pa.int64()})
_PARSE_BLOCK_BYTES_MIN: Final = 1 << 20


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], field.type) for field in ARROW_SCHEMA], schema=ARROW_SCHEMA
    )


def read_page(
    conn: sqlite3.Connection,
    topic: TopicRow,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
    concat_bytes_max: int,
) -> pa.RecordBatch | None:
    """Records of a partition from offset, as the engine's fetch_rows would give them,
    as one batch (no rows: nothing there). None: read this page as rows instead."""
    with _length_limit(conn, concat_bytes_max):
        try:
            return _read_page(conn, topic, partition, offset, max_records, bytes_max)
        except sqlite3.DataError:  # "string or blob too big": past concat_bytes_max
            return None


def _read_page(
    conn: sqlite3.Connection,
    topic: TopicRow,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int,
) -> pa.RecordBatch | None:
    first = conn.execute(Q["records_page_first"], (topic.topic_id, partition, offset)).fetchone()
    if first is None:
        return empty_batch()
    timestamp_ms, length, pid, generation, sequence, epoch, txn_id, first_value = first
    end = offset + max_records
    like_first = (timestamp_ms, length, pid, generation, sequence, epoch, txn_id)
    summary = conn.execute(
        Q["records_page_summary"], (topic.topic_id, partition, offset, end, *like_first)
    ).fetchone()
    count, last, values, size, keys, headed, times_vary, lengths_vary, producers_vary = summary
    values = values or b""
    if last - offset + 1 != count:  # offsets with a gap: not a log this module knows
        return None
    page = (topic.topic_id, partition, offset, last)
    lengths = (
        _ints(_text(conn, "records_page_value_lengths", page), count)
        if lengths_vary
        else pa.repeat(pa.scalar(length, pa.int64()), count)
    )
    value_array = _binary(lengths, values, count)
    if value_array is None or not _in_key_order(conn, page, value_array, first_value):
        return None
    key_lengths, key_array = (
        _keys(conn, page, count) if keys else (None, pa.nulls(count, pa.binary()))
    )
    columns = [
        pa.repeat(pa.scalar(topic.name, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.arange(offset, offset + count),
        _timestamps(conn, page, count, timestamp_ms if not times_vary else None),
        key_array,
        value_array,
        _headers(conn, page, count) if headed else _headers_array([()] * count),
        *_producers(conn, page, count, None if producers_vary else first[2:7]),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    if size <= bytes_max:
        return batch
    sizes = lengths if key_lengths is None else pc.add(lengths, pc.max_element_wise(key_lengths, 0))
    within = pc.sum(pc.less_equal(pc.cumulative_sum(sizes), bytes_max)).as_py()
    return batch.slice(0, max(1, within))


@contextlib.contextmanager
def _length_limit(conn: sqlite3.Connection, bytes_max: int) -> Iterator[None]:
    previous = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bytes_max)
    try:
        yield
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, previous)


def _text(conn: sqlite3.Connection, query: str, page: tuple[int, int, int, int]) -> bytes:
    found: bytes | None = conn.execute(Q[query], page).fetchone()[0]
    return found or b""


def _ints(text: bytes, count: int) -> pa.Array:
    """One integer a line, as int64 (parsed in C by Arrow's CSV reader)."""
    table = pa_csv.read_csv(
        pa.py_buffer(text),
        read_options=pa_csv.ReadOptions(
            column_names=["n"],
            use_threads=False,
            block_size=max(len(text) + 1, _PARSE_BLOCK_BYTES_MIN),
        ),
        convert_options=_INTS,
    )
    column = table.column(0).combine_chunks()
    assert len(column) == count, "one line per record of the page"
    return column


def _binary(lengths: pa.Array, data: bytes, count: int) -> pa.Array | None:
    """A binary array of `count` items of `lengths` over the concatenated `data`."""
    ends = pc.cumulative_sum(lengths)
    if count and ends[-1].as_py() != len(data):
        return None
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), ends]).cast(pa.int32())
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, offsets.buffers()[1], pa.py_buffer(data)]
    )


def _in_key_order(
    conn: sqlite3.Connection,
    page: tuple[int, int, int, int],
    values: pa.Array,
    first_value: bytes,
) -> bool:
    """The concatenation put the page's first and last records first and last."""
    topic_id, partition, _, last = page
    last_value = conn.execute(Q["records_page_last_value"], (topic_id, partition, last)).fetchone()
    return bool(values[0].as_py() == first_value and values[-1].as_py() == last_value[0])


def _keys(
    conn: sqlite3.Connection, page: tuple[int, int, int, int], count: int
) -> tuple[pa.Array, pa.Array]:
    """The key lengths (-1: no key) and the keys."""
    lengths_text, data = conn.execute(Q["records_page_keys"], page).fetchone()
    lengths = _ints(lengths_text, count)
    present = pc.greater_equal(lengths, 0)
    keys = _binary(pc.max_element_wise(lengths, 0), data or b"", count)
    assert keys is not None, "the keys' lengths add up to their concatenation"
    return lengths, pc.if_else(present, keys, pa.scalar(None, pa.binary()))


def _timestamps(
    conn: sqlite3.Connection, page: tuple[int, int, int, int], count: int, every_ms: int | None
) -> pa.Array:
    millis = (
        pa.repeat(pa.scalar(every_ms, pa.int64()), count)
        if every_ms is not None
        else _ints(_text(conn, "records_page_timestamps", page), count)
    )
    return pc.multiply(millis, 1000).cast(_TIMESTAMP)


def _producers(
    conn: sqlite3.Connection,
    page: tuple[int, int, int, int],
    count: int,
    every: Sequence[int | None] | None,
) -> list[pa.Array]:
    """producer_id, generation, sequence, epoch, txn_id: the first record's for every
    record (`every`), or read per record."""
    kinds = (pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.int64())
    if every is not None:
        return [
            pa.nulls(count, kind) if value is None else pa.repeat(pa.scalar(value, kind), count)
            for value, kind in zip(every, kinds, strict=True)
        ]
    texts = conn.execute(Q["records_page_producers"], page).fetchone()
    columns = [_ints(text, count).cast(kind) for text, kind in zip(texts, kinds, strict=True)]
    txn = columns[-1]
    columns[-1] = pc.if_else(pc.equal(txn, _NO_TXN), pa.scalar(None, pa.int64()), txn)
    return columns


def _headers(conn: sqlite3.Connection, page: tuple[int, int, int, int], count: int) -> pa.Array:
    offset = page[2]
    headers: list[tuple[tuple[str, bytes], ...]] = [()] * count
    for record_offset, stored in conn.execute(Q["records_page_headers"], page):
        headers[record_offset - offset] = decode_headers(stored)
    return _headers_array(headers)


def _headers_array(headers: Sequence[tuple[tuple[str, bytes], ...]]) -> pa.Array:
    if not any(headers):  # the common case: no record has headers, built without a loop
        zeros = pa.nulls(len(headers) + 1, pa.int32()).fill_null(0)
        return pa.ListArray.from_arrays(zeros, pa.array([], _HEADERS.value_type))
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
