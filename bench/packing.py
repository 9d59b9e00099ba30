"""Which packing a log of batches should store (issue 36): the candidates measured side by
side, and a batch a row against a record a row in SQLite.

    python -m bench.packing [--batches 200] [--records 1000] [--value-bytes 100]

What it measures, per record of 100-byte values in batches of 1000 (no keys, no headers:
the issue's shape), on the same values in one process:
- encode and decode of one batch's values in each packing: msgpack (what txn_batches
  stores), Arrow IPC (what Spark and `produce --arrow` move), and Kafka's RecordBatch v2
  (what the Kafka listener receives and serves; aiokafka's C codec);
- decoding as each reader needs it: Python bytes (the native client), Arrow columns
  (Spark), and for RecordBatch v2 nothing at all (a Kafka fetch can send it as stored,
  its base offset patched: the CRC-32C does not cover it);
- SQLite, WAL, synchronous=NORMAL: inserting and reading back the same records a row
  each (fencelog's layout today, without its indexes) and a batch a row (msgpack body),
  each insert its own transaction, and the bytes on disk per record.
It prints the numbers; docs/design.md ("A log of batches") says what follows from them.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder
from pyarrow import ipc

Encoder = Callable[[Sequence[bytes]], bytes]


def per_record_ns(work: Callable[[], object], repeats: int, records: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - started) / (repeats * records) * 1e9


def msgpack_batch(values: Sequence[bytes]) -> bytes:
    return bytes(msgpack.packb([None, list(values), None]))


def arrow_batch(values: Sequence[bytes]) -> bytes:
    batch = pa.record_batch([pa.array(values, pa.binary())], names=["value"])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def kafka_batch(values: Sequence[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=1, key=None, value=value, headers=[])
    return bytes(builder.build())


def _bound(
    encode: Callable[[Sequence[bytes]], bytes], values: Sequence[bytes]
) -> Callable[[], bytes]:
    return lambda: encode(values)


def codecs(values: Sequence[bytes], repeats: int) -> list[tuple[str, float, str]]:
    """(what, ns a record, note) of each packing's encode and decodes."""
    count = len(values)
    packed = {
        "msgpack": msgpack_batch(values),
        "Arrow IPC": arrow_batch(values),
        "RecordBatch v2": kafka_batch(values),
    }
    encoders: dict[str, Encoder] = {
        "msgpack": msgpack_batch,
        "Arrow IPC": arrow_batch,
        "RecordBatch v2": kafka_batch,
    }
    rows = []
    for name, encode in encoders.items():
        size = len(packed[name]) / count
        ns = per_record_ns(_bound(encode, values), repeats, count)
        rows.append((f"{name}: encode", ns, f"{size:.1f} bytes a record"))
    rows.append(
        (
            "msgpack: decode to Python bytes",
            per_record_ns(lambda: msgpack.unpackb(packed["msgpack"]), repeats, count),
            "",
        )
    )
    arrow = packed["Arrow IPC"]
    rows.append(
        (
            "Arrow IPC: decode to columns",
            per_record_ns(lambda: ipc.open_stream(arrow).read_next_batch(), repeats, count),
            "zero-copy",
        )
    )
    rows.append(
        (
            "Arrow IPC: decode to Python bytes",
            per_record_ns(
                lambda: ipc.open_stream(arrow).read_next_batch().column(0).to_pylist(),
                repeats,
                count,
            ),
            "",
        )
    )
    kafka = packed["RecordBatch v2"]
    rows.append(
        (
            "RecordBatch v2: decode to Python bytes",
            per_record_ns(lambda: [r.value for r in DefaultRecordBatch(kafka)], repeats, count),
            "a Kafka fetch needs no decode",
        )
    )
    return rows


def sqlite_layouts(values: Sequence[bytes], batches: int, work_dir: Path) -> list[Any]:
    """(layout, insert ns a record, read ns a record, bytes on disk a record)."""
    count = len(values)
    found = []
    for layout in ("a record a row", "a batch a row"):
        path = work_dir / f"{layout.replace(' ', '-')}.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        started = time.perf_counter()
        if layout == "a record a row":
            conn.execute(
                "CREATE TABLE log (topic, partition, offset, ts, key, value, "
                "PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
            )
            for batch in range(batches):
                base = batch * count
                rows = [(base + i, value) for i, value in enumerate(values)]
                conn.execute("BEGIN")
                conn.executemany("INSERT INTO log VALUES (1, 0, ?, 1, NULL, ?)", rows)
                conn.execute("COMMIT")
        else:
            conn.execute(
                "CREATE TABLE log (topic, partition, offset, last_offset, body, "
                "PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
            )
            for batch in range(batches):
                base = batch * count
                conn.execute("BEGIN")
                conn.execute(
                    "INSERT INTO log VALUES (1, 0, ?, ?, ?)",
                    (base, base + count - 1, msgpack_batch(values)),
                )
                conn.execute("COMMIT")
        insert_ns = (time.perf_counter() - started) / (batches * count) * 1e9
        started = time.perf_counter()
        read = 0
        if layout == "a record a row":
            for _offset, _ts, _key, _value in conn.execute(
                "SELECT offset, ts, key, value FROM log WHERE topic = 1 AND partition = 0 "
                "ORDER BY offset"
            ):
                read += 1
        else:
            for (body,) in conn.execute(
                "SELECT body FROM log WHERE topic = 1 AND partition = 0 ORDER BY offset"
            ):
                read += len(msgpack.unpackb(body)[1])
        read_ns = (time.perf_counter() - started) / read * 1e9
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        found.append((layout, insert_ns, read_ns, path.stat().st_size / (batches * count)))
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.packing")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--value-bytes", type=int, default=100)
    arguments = parser.parse_args(argv)
    values = [os.urandom(arguments.value_bytes) for _ in range(arguments.records)]
    print(f"{arguments.records} records of {arguments.value_bytes} bytes a batch")
    for what, ns, note in codecs(values, max(arguments.batches // 4, 10)):
        print(f"  {what:<40} {ns:8.0f} ns a record  {note}")
    with tempfile.TemporaryDirectory() as scratch:
        for layout, insert_ns, read_ns, size in sqlite_layouts(
            values, arguments.batches, Path(scratch)
        ):
            print(
                f"  SQLite, {layout:<15} insert {insert_ns:6.0f} ns, read {read_ns:5.0f} ns "
                f"a record; {size:5.1f} bytes a record on disk"
            )


if __name__ == "__main__":
    main()
