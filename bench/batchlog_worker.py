"""One measurement of bench/batchlog.py, in a process of its own, against the broker/ (and
bench/) of whichever tree is first on PYTHONPATH:

    PYTHONPATH=TREE python AFTER/bench/batchlog_worker.py MEASURE WORK_DIR PARAMETERS_JSON

It prints one JSON object on its last line of stdout: every series it measured, by name
(a list of floats), or {"skipped": why} when what it needs is missing here.

Rules:
- Run as a script, never imported by path from the measured tree: this file comes from
  the after tree, so the before tree needs no copy of it. It drops its own directory
  from sys.path first, so `broker` and `bench` resolve to the measured tree.
- Whatever a tree's bench modules measure the same way in both trees is imported from
  the measured tree, inside the function that needs it (bench.read, bench.served,
  bench.processes, bench.kafka_listener, bench.spark, bench.spark_parquet, bench.txn,
  bench.cli_start), so each version measures with its own code.
- The raw SQLite baseline is kept here, fixed: the records table of the schema before
  the batch log (one row per record), its insert and pragmas (bench/raw.py's at
  a423392), so a change of fencelog's schema cannot move the baseline.
- Everything is written under WORK_DIR, which the caller removes; every server started
  is stopped by the bench module's context manager; 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 1000
IN_FLIGHT: Final = 4  # batches over TCP, as bench/serving.py
WINDOW: Final = 32  # de-duplicated one-record requests in flight, as bench/serving.py
CLIENT_BUSY_POLL_US: Final = 500  # the client polls while it awaits a reply, as bench/serving.py
TOPIC: Final = "bench"
TIMESTAMP_MS: Final = 1_700_000_000_000
EMPTY_HEADERS: Final = b"\x90"  # msgpack's empty array, as the engine stores no headers
VALUE_POOL: Final = 100_000  # distinct values a long produce cycles through
BUSY_TIMEOUT_MS: Final = 5_000
RAW_TABLE: Final = """
CREATE TABLE records (
    topic_id     INTEGER NOT NULL,
    partition    INTEGER NOT NULL,
    offset       INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    key          BLOB,
    value        BLOB    NOT NULL,
    headers      BLOB    NOT NULL,
    producer_id  INTEGER NOT NULL DEFAULT 0,
    generation   INTEGER NOT NULL DEFAULT 0,
    sequence     INTEGER NOT NULL DEFAULT 0,
    epoch        INTEGER NOT NULL DEFAULT 0,
    txn_id       INTEGER,
    PRIMARY KEY (topic_id, partition, offset)
) STRICT, WITHOUT ROWID"""
RAW_INSERT: Final = (
    "INSERT INTO records (topic_id, partition, offset, timestamp_ms, key, value, headers, "
    "producer_id, generation, sequence, epoch, txn_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
RAW_SCAN: Final = "SELECT * FROM records WHERE topic_id = 1 AND partition = 0 ORDER BY offset"

Series = dict[str, list[float]]
RawRow = tuple[int, int, int, int, None, bytes, bytes, int, int, int, int, None]


def values(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(VALUE_BYTES) for _ in range(count)]


def batches_of(items: Sequence[bytes], size: int = BATCH_RECORDS) -> list[Sequence[bytes]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def median(series: Sequence[float]) -> float:
    ordered = sorted(series)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def turns(rounds: int, *sides: Callable[[], float]) -> list[list[float]]:
    """Each side once per round, rotating which goes first; each side's results."""
    found: list[list[float]] = [[] for _ in sides]
    for round_index in range(rounds):
        for step in range(len(sides)):
            which = (round_index + step) % len(sides)
            found[which].append(sides[which]())
    return found


# the raw SQLite baseline ----------------------------------------------------------------


def raw_connect(path: Path, durability: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {durability.upper()}")
    conn.execute(RAW_TABLE)
    return conn


def raw_rows(first_offset: int, batch: Sequence[bytes]) -> list[RawRow]:
    """The rows the one-row-per-record engine stored for a plain append to topic 1."""
    return [
        (1, 0, first_offset + i, TIMESTAMP_MS, None, v, EMPTY_HEADERS, 0, 0, 0, 0, None)
        for i, v in enumerate(batch)
    ]


def raw_insert(conn: sqlite3.Connection, rows: Sequence[RawRow]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(RAW_INSERT, rows)
    conn.execute("COMMIT")


def raw_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])


# measures -------------------------------------------------------------------------------


def produce_embedded(work: Path, parameters: dict[str, int]) -> Series:
    """Batches of 1000 through the embedded client (durability full) against raw
    executemany of the same rows, batch by batch in turns (as bench/append.py)."""
    from broker.client.client import connect

    records = parameters["records"]
    value_batches = batches_of(values(records, seed=2))
    row_batches = [raw_rows(i * BATCH_RECORDS, b) for i, b in enumerate(value_batches)]
    fencelog_s: list[float] = []
    raw_s: list[float] = []
    with (
        connect(work / "produce", durability="full") as client,
        contextlib.closing(raw_connect(work / "raw.db", "full")) as conn,
    ):
        client.create_topic(TOPIC, partitions=1)
        for index, (batch, rows) in enumerate(zip(value_batches, row_batches, strict=True)):
            for side in (0, 1) if index % 2 == 0 else (1, 0):
                start = time.perf_counter()
                if side == 0:
                    client.produce(TOPIC, batch)
                else:
                    raw_insert(conn, rows)
                (fencelog_s, raw_s)[side].append(time.perf_counter() - start)
        assert client.end_offsets(TOPIC) == [records], "fencelog lost or added records"
        assert raw_count(conn) == records, "the raw baseline lost or added rows"
    return {"fencelog": [records / sum(fencelog_s)], "raw": [records / sum(raw_s)]}


def consume_embedded(work: Path, parameters: dict[str, int]) -> Series:
    """bench/read.py's `Engine.read` paging from offset 0, against one raw SELECT
    fetchall of the same values in the fixed raw table; both files checkpointed."""
    from bench import read
    from broker.engine.engine import Engine

    records, rounds = parameters["records"], parameters["rounds"]
    with contextlib.closing(raw_connect(work / "raw.db", "normal")) as conn:
        for index, batch in enumerate(batches_of(values(records, seed=3))):
            raw_insert(conn, raw_rows(index * BATCH_RECORDS, batch))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        def raw_rate() -> float:
            start = time.perf_counter()
            count = len(conn.execute(RAW_SCAN).fetchall())
            elapsed_s = time.perf_counter() - start
            assert count == records
            return records / elapsed_s

        with Engine.open(work / "read", durability="normal") as engine:
            read.fill(engine, records)
        with Engine.open(work / "read", durability="normal") as engine:
            read.fencelog_rate(engine, records), raw_rate()  # unmeasured: warm both caches
            fencelog, raw = turns(rounds, lambda: read.fencelog_rate(engine, records), raw_rate)
    return {"fencelog": fencelog, "raw": raw}


def served(work: Path, parameters: dict[str, int]) -> Series:
    """Over TCP (bench/served.py's patterns against bench/processes.py's `fencelog
    serve`): batches of 1000 (IN_FLIGHT outstanding) and a consume from offset 0 on a
    durability full server; de-duplicated one-record requests WINDOW in flight, and one
    at a time (latency), on a durability normal server."""
    import asyncio

    from bench import served as patterns
    from bench.processes import fencelog_server
    from broker.client.async_client import AsyncClient
    from broker.client.client import connect
    from broker.event_loop import new_event_loop
    from broker.protocol import ops
    from broker.types import NewRecord

    rounds, records = parameters["rounds"], parameters["records"]
    record_batches = [
        [NewRecord(v, None, (), 0) for v in batch] for batch in batches_of(values(records, 41))
    ]
    singles = values(parameters["singles"], seed=31)
    found: Series = {"produce": [], "consume": [], "dedup": [], "latency_us": []}
    names = (f"t{n}" for n in range(1, 10**6))
    with (
        fencelog_server(work, "serve-full", "full") as full,
        fencelog_server(work, "serve-normal", "normal") as normal,
        asyncio.Runner(loop_factory=new_event_loop) as loop,
        connect(full.address) as consumer,
    ):
        full_client = patterns.async_client(full.address, CLIENT_BUSY_POLL_US)
        normal_client = patterns.async_client(normal.address, CLIENT_BUSY_POLL_US)

        def topic(client: AsyncClient) -> str:
            name = next(names)
            loop.run(client.call(ops.CREATE_TOPIC, name, 1))
            return name

        def produce() -> float:
            run = patterns.batches_pipelined(
                full_client, topic(full_client), record_batches, IN_FLIGHT, idempotent=False
            )
            return records / loop.run(run)

        def consume(name: str) -> float:
            start = time.perf_counter()
            count = sum(1 for _ in consumer.consume(name, partition=0))
            elapsed_s = time.perf_counter() - start
            assert count == records, f"consumed {count} of {records}"
            return records / elapsed_s

        def dedup() -> float:
            run = patterns.one_record_requests(
                normal_client, topic(normal_client), singles, WINDOW, idempotent=True
            )
            return len(singles) / loop.run(run)

        try:
            filled = topic(full_client)  # unmeasured, and what the consume reads
            loop.run(
                patterns.batches_pipelined(
                    full_client, filled, record_batches, IN_FLIGHT, idempotent=False
                )
            )
            dedup()  # unmeasured
            found["produce"], found["dedup"] = turns(rounds, produce, dedup)
            consume(filled)  # unmeasured
            found["consume"] = [consume(filled) for _ in range(rounds)]
            run = patterns.one_record_latencies(
                normal_client, topic(normal_client), singles, idempotent=True
            )
            found["latency_us"] = [seconds * 1e6 for seconds in loop.run(run)]
        finally:
            loop.run(full_client.close())
            loop.run(normal_client.close())
    return found


def kafka(work: Path, parameters: dict[str, int]) -> Series | dict[str, str]:
    """confluent-kafka's idempotent producer and a kcat read against `serve
    --kafka-listen` (bench/kafka_listener.py's servers and sides)."""
    if shutil.which("kcat") is None:
        return {"skipped": "kcat is not installed (make kcat)"}
    try:
        from bench import kafka_listener as kl
    except ImportError as missing:
        return {"skipped": f"{missing.name} is not installed"}

    rounds, produced = parameters["rounds"], values(parameters["records"], seed=11)
    records = parameters["read_records"]
    errors: list[str] = []
    found: Series = {"produce": [], "kcat": []}
    for round_index in range(rounds):
        with kl.kafka_server(work, f"produce-{round_index}") as server:
            kl._create_topics(server.url, kl.TOPIC, kl.WARM_TOPIC)
            sample = kl._produce_kafka(server, produced, errors)
            written = kl._end_offset(server.url, kl.TOPIC)
        shutil.rmtree(server.data_dir)
        assert written == len(produced), f"{written} records in the log, not {len(produced)}"
        found["produce"].append(len(produced) / sample.wall_s)
    kl._fill(work / "consume", records)
    with kl.kafka_server(work, "consume") as server:
        # -c: kcat stops at the last record instead of asking past it; an answer that
        # the partition ended comes only after fetch.wait.max.ms (500 ms), from Kafka
        # as from fencelog: a constant, not a rate (it was a third of a 1M read).
        read = kl.kcat_argv(server.kafka, "-c", str(records))
        kl._run_child(read)  # unmeasured
        for _ in range(rounds):
            start = time.perf_counter()
            kl._run_child(read)
            found["kcat"].append(records / (time.perf_counter() - start))
        kl._check_kcat_read_all(work, server, records)
    return found


def spark(work: Path, parameters: dict[str, int]) -> Series | dict[str, str]:
    """bench/spark_parquet.py's reads and writes: the connector embedded, Parquet, and
    PySpark's Python data source ceiling (bench/spark.py's), in one session."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return {"skipped": "no Java (the spark extra needs a JRE)"}
    try:
        from bench import spark as base
        from bench import spark_parquet as sp
    except ImportError as missing:
        return {"skipped": f"{missing.name} is not installed"}
    from broker.client.client import connect

    rows, rounds = parameters["records"], parameters["rounds"]
    embedded, scratch = work / "embedded", work / "scratch"
    scratch.mkdir()
    sizes = base.SparkSizes(rows, 10_000, rounds, 0, rows < 1_000_000)
    with base.spark_session() as session:
        jobs = base.Jobs(session, str(embedded), scratch, sizes)
        with connect(embedded) as client:
            client.create_topic("input-rows", 2)
        jobs.values().write.format("fencelog").option("broker", str(embedded)).option(
            "topic", "input-rows"
        ).mode("append").save()
        parquet = scratch / "input.parquet"
        sp._fencelog(session, str(embedded), "input-rows").write.parquet(str(parquet))

        def read_parquet() -> float:
            return sp._timed_rate(rows, lambda: base._noop(session.read.parquet(str(parquet))))

        def read_fencelog() -> float:
            frame = sp._fencelog(session, str(embedded), "input-rows")
            return sp._timed_rate(rows, lambda: base._noop(frame))

        read_parquet(), read_fencelog(), base.read_memory(jobs, "fencelog")  # warm
        sp._write_parquet(jobs), base.write_fencelog(jobs), base.write_count(jobs)
        reads = turns(
            rounds, read_parquet, read_fencelog, lambda: base.read_memory(jobs, "fencelog")
        )
        writes = turns(
            rounds,
            lambda: sp._write_parquet(jobs),
            lambda: base.write_fencelog(jobs),
            lambda: base.write_count(jobs),
        )
    names = ("parquet_read", "fencelog_read", "ceiling_read")
    found = dict(zip(names, reads, strict=True))
    return found | dict(
        zip(("parquet_write", "fencelog_write", "ceiling_write"), writes, strict=True)
    )


def dd_bytes_per_s(path: Path, megabytes: int) -> float:
    """`dd if=/dev/zero of=PATH bs=1M count=N conv=fdatasync`, timed whole."""
    argv = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}", "conv=fdatasync"]
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    elapsed_s = time.perf_counter() - start
    path.unlink()
    return megabytes * 2**20 / elapsed_s


def disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def disk(work: Path, parameters: dict[str, int]) -> Series:
    """The disk's sequential write bandwidth (dd with fdatasync), then a long embedded
    produce (batches of 1000, durability full) into the same filesystem: records/s,
    value bytes/s, and the data directory's bytes per record once it is closed."""
    from broker.client.client import connect

    records = parameters["records"]
    dd_rate = dd_bytes_per_s(work / "dd.bin", parameters["dd_megabytes"])
    pool = batches_of(values(min(records, VALUE_POOL), seed=5))
    data_dir = work / "long"

    def cycled() -> Iterator[Sequence[bytes]]:
        for index in range(0, records, BATCH_RECORDS):
            batch = pool[(index // BATCH_RECORDS) % len(pool)]
            yield batch[: records - index]

    with connect(data_dir, durability="full") as client:
        client.create_topic(TOPIC, partitions=1)
        start = time.perf_counter()
        for batch in cycled():
            client.produce(TOPIC, batch)
        elapsed_s = time.perf_counter() - start
        assert client.end_offsets(TOPIC) == [records], "fencelog lost or added records"
    found = {
        "dd_bytes_per_s": [dd_rate],
        "records_per_s": [records / elapsed_s],
        "value_bytes_per_s": [records * VALUE_BYTES / elapsed_s],
        "bytes_per_record": [disk_bytes(data_dir) / records],
    }
    shutil.rmtree(data_dir)
    found["sqlite_blob_bytes_per_s"] = [sqlite_blob_bytes_per_s(work / "blobs.db", pool, records)]
    return found


def sqlite_blob_bytes_per_s(path: Path, pool: Sequence[Sequence[bytes]], records: int) -> float:
    """SQLite's own rate for the long produce's bytes, with no fencelog at all: each
    batch's values joined into one blob, a row and a commit each (WAL, synchronous FULL,
    the checkpoint SQLite makes every 1000 pages), bytes/s. What a log of batches in
    SQLite can reach at most on this disk."""
    batches = records // BATCH_RECORDS
    with contextlib.closing(raw_connect(path, "full")) as conn:
        conn.execute("CREATE TABLE blobs (n INTEGER PRIMARY KEY, data BLOB NOT NULL) STRICT")
        joined = [b"".join(batch) for batch in pool]
        written = 0
        start = time.perf_counter()
        for index in range(batches):
            blob = joined[index % len(joined)]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO blobs (n, data) VALUES (?, ?)", (index, blob))
            conn.execute("COMMIT")
            written += len(blob)
        elapsed_s = time.perf_counter() - start
    return written / elapsed_s


def txn(work: Path, parameters: dict[str, int]) -> Series:
    """1000-record transactions against plain produce of the same batches, embedded,
    durability full, batch by batch in turns (bench/txn.py's steps), each side in a data
    directory of its own. In one directory, SQLite's checkpoint every 1000 WAL pages
    lands in whichever side's commit crosses the mark, and the two sides' turns repeat
    in step: one version had every checkpoint in the plain side (0.95 of plain), the next
    every one in the transactions' (0.57), with each side's median unchanged. Apart,
    each side pays for the checkpoints of its own WAL."""
    from bench import txn as bench_txn
    from broker.client.client import connect

    records = values(parameters["records"], seed=17)
    units = bench_txn._units(records, BATCH_RECORDS, 1)
    found: Series = {"txn": [], "plain": [], "extra_ms": []}
    with (
        connect(work / "txn", durability="full") as txn_client,
        connect(work / "plain", durability="full") as plain_client,
    ):
        for client in (txn_client, plain_client):
            bench_txn._warm_up(client, records)
        for round_index in range(parameters["rounds"]):
            name = f"round-{round_index}"
            for client in (txn_client, plain_client):
                client.create_topic(name, 1)
                bench_txn._tail(client, name)
            txn_s, plain_s = turns(
                len(units),
                bench_txn._txn_step(txn_client, name, units),
                bench_txn._plain_step(plain_client, name, units),
            )
            for client in (txn_client, plain_client):
                assert client.end_offsets(name) == [len(records)], "lost or added records"
            found["txn"].append(len(records) / sum(txn_s))
            found["plain"].append(len(records) / sum(plain_s))
            # what a transaction costs beyond the plain produce of its batch
            found["extra_ms"].append((sum(txn_s) - sum(plain_s)) / len(units) * 1e3)
    return found


def cli_start(work: Path, parameters: dict[str, int]) -> Series:
    """bench/cli_start.py: the CPU ms of `fencelog produce` (embedded) as a process."""
    from bench import cli_start as start

    found = start.measure(work, start.Sizes(parameters["runs"], parameters["runs"] < 25))
    return {
        "produce_cpu_ms": list(found.commands["embedded: produce"]),
        "python_cpu_ms": list(found.interpreter_ms),
    }


MEASURES: Final[dict[str, Callable[[Path, dict[str, int]], Series | dict[str, str]]]] = {
    "produce_embedded": produce_embedded,
    "consume_embedded": consume_embedded,
    "served": served,
    "kafka": kafka,
    "spark": spark,
    "disk": disk,
    "txn": txn,
    "cli_start": cli_start,
}


def main(argv: Sequence[str]) -> int:
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != here]
    name, work, parameters = argv[0], Path(argv[1]), json.loads(argv[2])
    found = MEASURES[name](work, parameters)
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
