"""The PySpark connector (issue 8): broker/spark.py's batch and streaming rates in one
warm SparkSession, next to the ceiling of PySpark's Python data source path.

    python -m bench.run --only spark [--quick]

Rules:
- One SparkSession for the whole group: local[2], UI off, shuffle partitions 1,
  PYSPARK_PYTHON (and the driver's) set to this interpreter and the repository root put
  on PYTHONPATH before it starts, so Spark's Python workers import broker.spark and this
  module (the ceiling's data sources). Stopping it ends the JVM this process started.
- Two deployments, one after the other: an embedded data directory (every Spark task
  opens it itself) and a `fencelog serve` process (durability full) on 127.0.0.1,
  reached over TCP (bench/processes.py starts and stops it). The input topic has 2
  partitions (one Spark task each) of 100-byte records, seeded once through the Python
  client in batches of 10,000; the served broker gets a copy of the seeded directory.
- Batch read: `spark.read.format("fencelog")` from earliest -> `.write.format("noop")`.
  Batch write: `spark.range(N, 2 partitions)` -> a distinct 100-byte binary `value`
  -> `.write.format("fencelog")` into a fresh 2-partition topic: one transaction.
  Streaming: `readStream.format("fencelog")` with maxRecordsPerTrigger and
  trigger(availableNow=True) -> noop, and -> `writeStream.format("fencelog")` (key,
  value, partition; one transaction per micro-batch); the steady rate is the rows of
  every micro-batch after the first over the sum of their triggerExecution times.
- Ceilings, in the same rounds: `bench_memory`, a Python data source that re-yields one
  pre-built Arrow batch of 10,000 rows shaped exactly like the connector's (the same
  12 columns, built by broker.columnar.rows_to_arrow) -> noop, and the same as
  a stream with the same cap; `bench_count`, a Python Arrow sink that only counts rows
  (batch and stream). In each round the ceiling and fencelog take turns, rotating which
  goes first; a figure is the median of the rounds, the ratio median over median.
- Every run is checked: the read counted once in the warm-up, the written topics' end
  offsets, the streams' input rows, the counting sinks' totals.
- Profile, without Spark: the connector's own functions (read_range, fetch_arrow,
  records_of, journal_rows) in this process, against the same broker, each stage timed
  alone, then under cProfile, as one Spark task would run them.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import broker.spark as connector
from bench.measures import interleaved, median
from bench.processes import ServerProcess, fencelog_server
from bench.sections import Row, Section, rate, series, verdict
from broker import columnar
from broker.client.client import Client, connect
from broker.rows import EMPTY_HEADERS
from broker.rows import Row as StoredRow
from broker.types import NewRecord

TITLE: Final = "PySpark connector (issue 8)"
VALUE_BYTES: Final = 100
PARTITIONS: Final = 2  # of every topic, and of every Spark job: local[2]
SEED_BATCH: Final = 10_000
MEMORY_BATCH: Final = 10_000  # rows of the ceiling source's Arrow batch
READ_RATIO_MIN: Final = 0.50
WRITE_RATE_MIN: Final = 80_000.0
TXN_TIMEOUT_MS: Final = 900_000  # a loaded machine must not expire a 1M-row write
INPUT: Final = "input"
MEMORY: Final = "bench_memory"
COUNT: Final = "bench_count"
_REPOSITORY: Final = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class SparkSizes:
    records: int  # in the input topic; rows of every batch job and stream
    per_trigger: int  # maxRecordsPerTrigger of the streams
    rounds: int
    profile_records: int  # of one partition, read and written by the profile
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} rounds of each job over {self.records:,} records of "
            f"{VALUE_BYTES} bytes in {PARTITIONS} partitions (streams capped at "
            f"{self.per_trigger:,} per trigger), embedded and served, local[{PARTITIONS}] in "
            f"one warm SparkSession; a profile of {self.profile_records:,} records without "
            "Spark" + (" (--quick)" if self.quick else "")
        )


FULL: Final = SparkSizes(
    records=1_000_000, per_trigger=250_000, rounds=3, profile_records=200_000, quick=False
)
QUICK: Final = SparkSizes(
    records=200_000, per_trigger=50_000, rounds=1, profile_records=50_000, quick=True
)


# the ceiling: an in-memory Arrow source and a counting sink ---------------------------
# Spark's Python workers import these classes from this module (PYTHONPATH).


@cache
def memory_batch(shape: str) -> pa.RecordBatch:
    """MEMORY_BATCH rows shaped like the connector's batches ("fencelog": all 12
    columns, built by its own rows_to_arrow) or only a value column ("value")."""
    rng = random.Random(83)
    rows: list[StoredRow] = [
        (
            0,
            i,
            1_700_000_000_000 + i,
            None,
            rng.randbytes(VALUE_BYTES),
            EMPTY_HEADERS,
            0,
            0,
            0,
            0,
            None,
        )
        for i in range(MEMORY_BATCH)
    ]
    batch = columnar.rows_to_arrow(INPUT, rows)
    return batch if shape == "fencelog" else batch.select(["value"])


def _schema_of(shape: str) -> str:
    return connector.SCHEMA if shape == "fencelog" else "value binary"


class RowsRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


def _split(start: int, end: int) -> list[RowsRange]:
    step = -(-(end - start) // PARTITIONS)
    return [RowsRange(low, min(low + step, end)) for low in range(start, end, max(step, 1))]


def _memory_rows(shape: str, rows: int) -> Iterator[pa.RecordBatch]:
    batch = memory_batch(shape)
    full, rest = divmod(rows, MEMORY_BATCH)
    for _ in range(full):
        yield batch
    if rest:
        yield batch.slice(0, rest)


class MemoryReader(DataSourceReader):
    def __init__(self, shape: str, rows: int) -> None:
        self.shape = shape
        self.rows = rows

    def partitions(self) -> Sequence[InputPartition]:
        return _split(0, self.rows)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowsRange)
        yield from _memory_rows(self.shape, partition.end - partition.start)


class MemoryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"0": rows so far}; `rows` in all, at most `per_trigger` a micro-batch."""

    def __init__(self, shape: str, rows: int, per_trigger: int) -> None:
        self.shape = shape
        self.rows = rows
        self.per_trigger = per_trigger

    def initialOffset(self) -> dict[str, int]:
        return {"0": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the end never moves

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self.rows
        return {"0": min(self.rows, int(start["0"]) + cap)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return _split(int(start["0"]), int(end["0"]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowsRange)
        yield from _memory_rows(self.shape, partition.end - partition.start)

    def commit(self, end: dict[str, int]) -> None:
        pass


@dataclass(frozen=True)
class Counted(WriterCommitMessage):
    rows: int


class CountWriter(DataSourceArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Counted:
        return Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        total = sum(m.rows for m in messages if isinstance(m, Counted))
        Path(self.path).write_text(f"{total}\n", encoding="utf-8")


class CountStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Counted:
        return Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.rows for m in messages if isinstance(m, Counted))
        with Path(self.path).open("a", encoding="utf-8") as out:
            out.write(f"{total}\n")


class MemorySource(DataSource):
    """bench_memory: options shape ("fencelog" or "value"), rows, perTrigger."""

    @classmethod
    def name(cls) -> str:
        return MEMORY

    def schema(self) -> str:
        return _schema_of(self.options.get("shape", "fencelog"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return MemoryReader(self.options.get("shape", "fencelog"), int(self.options["rows"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemoryStreamReader(
            self.options.get("shape", "fencelog"),
            int(self.options["rows"]),
            int(self.options["pertrigger"]),
        )


class CountSink(DataSource):
    """bench_count: option path, the file the row count goes to (a line per batch)."""

    @classmethod
    def name(cls) -> str:
        return COUNT

    def writer(self, schema: StructType, overwrite: bool) -> CountWriter:
        return CountWriter(self.options["path"])

    def streamWriter(self, schema: StructType, overwrite: bool) -> CountStreamWriter:
        return CountStreamWriter(self.options["path"])


# the session ----------------------------------------------------------------------------


@contextlib.contextmanager
def spark_session() -> Iterator[SparkSession]:
    """A local[2] session; at the end the session stops and so does its JVM."""
    saved = {name: os.environ.get(name) for name in _SPARK_ENVIRONMENT}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(_REPOSITORY), *filter(None, [saved["PYTHONPATH"]])]
    )
    try:
        spark = (
            SparkSession.builder.master(f"local[{PARTITIONS}]")
            .appName("fencelog-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.default.parallelism", str(PARTITIONS))
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            connector.register(spark)
            spark.dataSource.register(MemorySource)
            spark.dataSource.register(CountSink)
            yield spark
        finally:
            spark.stop()
            _stop_jvm()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_SPARK_ENVIRONMENT: Final = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")


def _stop_jvm() -> None:
    """End the JVM that pyspark launched for this process (it outlives spark.stop()):
    close the gateway, then its stdin, on which the JVM waits; kill it after 20 s."""
    from pyspark import SparkContext

    gateway: Any = getattr(SparkContext, "_gateway", None)
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is None:
        return
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=20)
    except Exception:
        process.kill()
        process.wait(timeout=20)


# jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Jobs:
    """What one deployment's jobs need: the session, the broker, a scratch directory."""

    spark: SparkSession
    broker: str
    scratch: Path
    sizes: SparkSizes

    def client(self) -> Client:
        return connect(self.broker)

    def fencelog(self, topic: str = INPUT) -> DataFrame:
        return (
            self.spark.read.format("fencelog")
            .option("broker", self.broker)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
        )

    def memory(self, shape: str = "fencelog") -> DataFrame:
        return (
            self.spark.read.format(MEMORY)
            .option("shape", shape)
            .option("rows", str(self.sizes.records))
            .load()
        )

    def values(self) -> DataFrame:
        """N rows of distinct 100-byte binary values, in PARTITIONS partitions."""
        padded = F.lpad(F.col("id").cast("string"), VALUE_BYTES, "v").cast("binary")
        return self.spark.range(self.sizes.records, numPartitions=PARTITIONS).select(
            padded.alias("value")
        )

    def fencelog_stream(self) -> DataFrame:
        return (
            self.spark.readStream.format("fencelog")
            .option("broker", self.broker)
            .option("topic", INPUT)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", str(self.sizes.per_trigger))
            .load()
        )

    def memory_stream(self) -> DataFrame:
        return (
            self.spark.readStream.format(MEMORY)
            .option("shape", "fencelog")
            .option("rows", str(self.sizes.records))
            .option("perTrigger", str(self.sizes.per_trigger))
            .load()
        )

    def path(self, name: str) -> Path:
        return self.scratch / f"{name}-{time.monotonic_ns()}"


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _noop(frame: DataFrame) -> None:
    frame.write.format("noop").mode("overwrite").save()


def _counted(path: Path) -> int:
    return sum(int(line) for line in path.read_text(encoding="utf-8").split())


def read_fencelog(jobs: Jobs) -> float:
    return jobs.sizes.records / _timed(lambda: _noop(jobs.fencelog()))


def read_memory(jobs: Jobs, shape: str) -> float:
    return jobs.sizes.records / _timed(lambda: _noop(jobs.memory(shape)))


def write_fencelog(jobs: Jobs) -> float:
    topic = f"written-{time.monotonic_ns()}"
    with jobs.client() as client:
        client.create_topic(topic, PARTITIONS)
    writer = (
        jobs.values()
        .write.format("fencelog")
        .option("broker", jobs.broker)
        .option("topic", topic)
        .option("transactionTimeout", str(TXN_TIMEOUT_MS))
        .mode("append")
    )
    seconds = _timed(writer.save)
    with jobs.client() as client:
        written = sum(client.end_offsets(topic))
    assert written == jobs.sizes.records, f"{topic}: {written} records written"
    return jobs.sizes.records / seconds


def write_count(jobs: Jobs) -> float:
    path = jobs.path("count")
    writer = jobs.values().write.format(COUNT).option("path", str(path)).mode("append")
    seconds = _timed(writer.save)
    assert _counted(path) == jobs.sizes.records, f"the counting sink saw {_counted(path)} rows"
    return jobs.sizes.records / seconds


@dataclass(frozen=True, slots=True)
class Streamed:
    """One availableNow run: rows and triggerExecution seconds of each micro-batch."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]
    wall_s: float

    @property
    def steady(self) -> float:
        """Rows/s of the micro-batches after the first."""
        return sum(self.rows[1:]) / sum(self.seconds[1:])


def _stream(jobs: Jobs, frame: DataFrame, sink: str, options: dict[str, str]) -> Streamed:
    writer = frame.writeStream.format(sink).option("checkpointLocation", str(jobs.path("ck")))
    for name, value in options.items():
        writer = writer.option(name, value)
    start = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    wall_s = time.perf_counter() - start
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    rows = tuple(int(p.numInputRows) for p in progress)
    seconds = tuple(p.durationMs["triggerExecution"] / 1000 for p in progress)
    assert sum(rows) == jobs.sizes.records, f"the stream read {sum(rows)} rows"
    assert len(rows) >= 2, "a steady rate needs two micro-batches or more"
    return Streamed(rows, seconds, wall_s)


def stream_fencelog_noop(jobs: Jobs) -> Streamed:
    return _stream(jobs, jobs.fencelog_stream(), "noop", {})


def stream_memory_noop(jobs: Jobs) -> Streamed:
    return _stream(jobs, jobs.memory_stream(), "noop", {})


def stream_fencelog_fencelog(jobs: Jobs) -> Streamed:
    topic = f"streamed-{time.monotonic_ns()}"
    with jobs.client() as client:
        client.create_topic(topic, PARTITIONS)
    options = {"broker": jobs.broker, "topic": topic, "transactionTimeout": str(TXN_TIMEOUT_MS)}
    frame = jobs.fencelog_stream().select("key", "value", "partition")
    streamed = _stream(jobs, frame, "fencelog", options)
    with jobs.client() as client:
        written = sum(client.end_offsets(topic))
    assert written == jobs.sizes.records, f"{topic}: {written} records written"
    return streamed


def stream_memory_count(jobs: Jobs) -> Streamed:
    path = jobs.path("stream-count")
    frame = jobs.memory_stream().select("key", "value", "partition")
    streamed = _stream(jobs, frame, COUNT, {"path": str(path)})
    assert _counted(path) == jobs.sizes.records, f"the counting sink saw {_counted(path)} rows"
    return streamed


# the profile: the connector's functions without Spark ----------------------------------


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a task's work, timed alone: rows/s, and CPU microseconds per row
    of this process (all its threads) and of the served broker's process (0 embedded)."""

    rows_per_s: float
    client_us: float
    server_us: float


@dataclass(frozen=True, slots=True)
class Profile:
    """One deployment's connector functions as one Spark task runs them, and the
    driver's commit: each stage alone, then cProfile ms per 10,000 rows by function."""

    deployment: str
    records: int
    stages: dict[str, Stage]
    parts: dict[str, float]


TO_ARROW_COMPS: Final = "rows_to_arrow's per-row list comps"
CHECK_RECORDS: Final = "check_records (client or engine)"
# (file under the repository, qualified name) -> what the profile calls it
_PARTS: Final = {
    ("broker/spark.py", "read_range"): "read_range",
    ("broker/client/client.py", "Client.fetch_rows"): "client.fetch_rows",
    ("broker/storage/logs.py", "read_rows"): "SQLite SELECT",
    ("broker/client/client.py", "Client.fetch_arrow"): "client.fetch_arrow",
    ("broker/columnar.py", "read_page"): "columnar read_page",
    ("broker/columnar.py", "rows_to_arrow"): "rows_to_arrow",
    ("broker/columnar.py", "rows_to_arrow.<locals>.<listcomp>"): TO_ARROW_COMPS,
    ("broker/spark.py", "journal_rows"): "journal_rows",
    ("broker/spark.py", "records_of"): "records_of",
    ("broker/client/client.py", "Client.produce"): "client.produce",
    ("broker/core/records.py", "check_records"): CHECK_RECORDS,
    ("broker/storage/txns.py", "journal_records"): "journal batch insert",
    ("broker/client/client.py", "Client.txn_commit"): "txn_commit",
    ("broker/storage/txns.py", "copy_partition"): "copy into the log",
    ("broker/storage/txns.py", "mark_applied"): "mark_applied (drop journal batches)",
    ("broker/storage/database.py", "Database.write"): "BEGIN IMMEDIATE/COMMIT",
}
_PER_ROWS: Final = 10_000


def _entries(profile: cProfile.Profile) -> dict[tuple[str, str], float]:
    """(file under the repository, qualified name) -> cumulative seconds."""
    found: dict[tuple[str, str], float] = {}
    for entry in profile.getstats():
        if isinstance(entry.code, str):
            continue
        path = Path(entry.code.co_filename)
        if not path.is_relative_to(_REPOSITORY):
            continue
        key = (path.relative_to(_REPOSITORY).as_posix(), entry.code.co_qualname)
        found[key] = found.get(key, 0.0) + entry.totaltime
    return found


def _value_batches(rows: int, seed: int) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    values = [rng.randbytes(VALUE_BYTES) for _ in range(min(rows, MEMORY_BATCH))]
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])
    return [batch.slice(0, min(MEMORY_BATCH, rows - low)) for low in range(0, rows, MEMORY_BATCH)]


class _Cpu:
    """CPU seconds of the served broker's process per stage (nothing when embedded)."""

    def __init__(self, server: ServerProcess | None) -> None:
        self.server = server
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        before = self.server.cpu_s() if self.server else 0.0
        yield
        if self.server is not None:
            self.seconds[name] = self.server.cpu_s() - before


class _Stages:
    """Times stages, a stage's time summed over its calls: wall clock, this process's
    CPU (all threads), the served broker's CPU."""

    def __init__(self, rows: int, server: ServerProcess | None) -> None:
        self.rows = rows
        self.server = server
        self.sums: dict[str, tuple[float, float, float]] = {}

    @contextlib.contextmanager
    def clock(self, name: str) -> Iterator[None]:
        server_before = self.server.cpu_s() if self.server else 0.0
        cpu_before = time.process_time()
        start = time.perf_counter()
        yield
        wall_s = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_before
        server_s = (self.server.cpu_s() - server_before) if self.server else 0.0
        before = self.sums.get(name, (0.0, 0.0, 0.0))
        self.sums[name] = (before[0] + wall_s, before[1] + cpu_s, before[2] + server_s)

    def run(self, name: str, action: Callable[[], object]) -> None:
        with self.clock(name):
            action()

    @property
    def stages(self) -> dict[str, Stage]:
        return {
            name: Stage(self.rows / wall_s, cpu_s * 1e6 / self.rows, server_s * 1e6 / self.rows)
            for name, (wall_s, cpu_s, server_s) in self.sums.items()
        }


PROFILE_PASSES: Final = 3  # each stage's figure is its fastest pass


def _read_pages(client: Client, part: connector.OffsetRange, stages: _Stages) -> None:
    """A range page by page: the columnar fetch, then the row path in its two parts."""
    for low in range(part.start, part.end, connector.FETCH_RECORDS):
        with stages.clock("client.fetch_arrow"):
            client.fetch_arrow(INPUT, part.partition, low, max_records=connector.FETCH_RECORDS)
    position = part.start
    while position < part.end:
        with stages.clock("client.fetch_rows"):
            page = client.fetch_rows(
                INPUT, {part.partition: position}, max_records=connector.FETCH_RECORDS
            )
        with stages.clock("rows_to_arrow"):
            columnar.rows_to_arrow(INPUT, page)
        position = page[-1][1] + 1


def profile_connector(
    deployment: str, target: str, records: int, server: ServerProcess | None
) -> Profile:
    """One task's read of `records` records of partition 0 and write of as many rows,
    and the commit of those rows: each stage timed in PROFILE_PASSES passes (the
    fastest counts), then once more under cProfile. A stage split in parts (fetch_arrow;
    fetch_rows / rows_to_arrow; records_of / produce) is timed page by page."""
    options = connector.Options.parse({"broker": target, "topic": INPUT})
    part = connector.OffsetRange(INPUT, 0, 0, records)
    batches = _value_batches(records, seed=89)
    group = "bench-profile"

    def read_range() -> int:
        return sum(batch.num_rows for batch in connector.read_range(options, part))

    def journaled(client: Client, topic: str, member: str) -> int:
        """A transaction (left open) holding `member`'s journal_rows of the batches."""
        client.create_topic(topic, PARTITIONS)
        txn_id = client.txn_begin(group, timeout_ms=TXN_TIMEOUT_MS).txn_id
        written = connector.journal_rows(client, txn_id, member, iter(batches), topic)
        assert written.records == records
        return txn_id

    def timed_pass(client: Client, index: int) -> dict[str, Stage]:
        stages = _Stages(records, server)
        stages.run("read_range", read_range)
        _read_pages(client, part, stages)
        # records_of, then produce into a joined transaction (aborted afterwards)
        topic = f"profile-produce-{index}"
        client.create_topic(topic, PARTITIONS)
        txn_id = client.txn_begin(group, timeout_ms=TXN_TIMEOUT_MS).txn_id
        joined = client.join_transaction(txn_id, "produce")
        for batch in batches:
            with stages.clock("records_of"):
                new_records = connector.records_of(batch, topic)[topic]
            with stages.clock("produce"):
                joined.produce(topic, new_records)
        client.txn_abort(txn_id, group=group)
        # a task's write whole, then the driver's commit of it
        topic = f"profile-timed-{index}"
        txn_ids: list[int] = []
        stages.run("journal_rows", lambda: txn_ids.append(journaled(client, topic, "task")))
        stages.run(
            "txn_commit", lambda: client.txn_commit(txn_ids[0], group=group, members={"task": 1})
        )
        assert sum(client.end_offsets(topic)) == records, f"{topic}: the commit lost rows"
        return stages.stages

    with connect(target) as client:
        read_range()  # warm: the pages in SQLite's and the OS's caches
        passes = [timed_pass(client, index) for index in range(PROFILE_PASSES)]
        profile = cProfile.Profile()
        profile.enable()
        read_range()
        profiled = journaled(client, "profile-profiled", "task")
        client.txn_commit(profiled, group=group, members={"task": 1})
        profile.disable()
        assert sum(client.end_offsets("profile-profiled")) == records
    fastest = {
        name: max((stages[name] for stages in passes), key=lambda stage: stage.rows_per_s)
        for name in passes[0]
    }
    entries = _entries(profile)
    scale = 1000 * _PER_ROWS / records
    parts = {name: entries[key] * scale for key, name in _PARTS.items() if key in entries}
    return Profile(deployment, records, fastest, parts)


# measuring -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pair:
    """fencelog against its ceiling, rows/s per round, same rounds."""

    fencelog: tuple[float, ...]
    ceiling: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return median(self.fencelog) / median(self.ceiling)


@dataclass(frozen=True, slots=True)
class DeploymentResults:
    name: str
    read: Pair
    value_ceiling: tuple[float, ...]  # the ceiling source with the value column only
    write: Pair
    stream_read: Pair
    stream_write: Pair
    stream_runs: dict[str, tuple[Streamed, ...]]
    server_cpu: dict[str, float]  # served: server CPU seconds per job kind, per round
    profile: Profile


@dataclass(frozen=True, slots=True)
class SparkResults:
    sizes: SparkSizes
    versions: str
    deployments: tuple[DeploymentResults, ...]
    warm_up_s: float
    loads: tuple[float, ...]  # the 1-minute load average at each step
    others: tuple[Interval, ...]  # what other processes used during each step


def _seed(data_dir: Path, records: int) -> None:
    rng = random.Random(97)
    with connect(data_dir, durability="normal") as client:
        client.create_topic(INPUT, PARTITIONS)
        for index, low in enumerate(range(0, records, SEED_BATCH)):
            count = min(SEED_BATCH, records - low)
            batch = [
                NewRecord(rng.randbytes(VALUE_BYTES), None, (), index % PARTITIONS)
                for _ in range(count)
            ]
            client.produce(INPUT, batch)
        assert sum(client.end_offsets(INPUT)) == records


QUIET_LOAD: Final = 1.5  # 1-minute load average at the start, on 2 CPUs
QUIET_OTHERS: Final = 0.25  # CPUs other processes may use on average during a quiet run
_BUSY_FIELDS: Final = (0, 1, 2, 5, 6, 7)  # /proc/stat cpu: user nice system irq softirq steal


@dataclass(frozen=True, slots=True)
class Interval:
    """One step of the run: its name, seconds, and the CPUs other processes used."""

    step: str
    seconds: float
    cpus: float


class _Others:
    """How much CPU processes outside this run used: the machine's busy time (/proc/stat)
    less that of this process and its descendants (the JVM, Spark's Python workers, the
    server), each with its reaped children's time. The 1-minute load average cannot
    tell them apart: this run alone keeps about 2 CPUs busy."""

    def __init__(self) -> None:
        self.loads: list[float] = []
        self.others: list[Interval] = []
        self._last = self._sample()
        self._current = "start"

    @staticmethod
    def _sample() -> tuple[float, int, int]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        busy = sum(int(fields[i]) for i in _BUSY_FIELDS)
        return time.monotonic(), busy, _tree_ticks(os.getpid())

    def step(self, name: str) -> None:
        """End the running step (what others used during it) and begin `name`."""
        now = self._sample()
        elapsed = now[0] - self._last[0]
        others = (now[1] - self._last[1]) - (now[2] - self._last[2])
        self.loads.append(os.getloadavg()[0])
        if elapsed > 0.5:
            cpus = max(0.0, others / os.sysconf("SC_CLK_TCK") / elapsed)
            self.others.append(Interval(self._current, elapsed, cpus))
        self._last = now
        self._current = name


def _tree_ticks(root: int) -> int:
    """utime + stime + cutime + cstime of `root` and every living descendant."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = sum(int(f) for f in fields[11:15])
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += ticks.get(pid, 0)
        pending += children.get(pid, [])
    return total


_MONITOR: list[_Others] = []  # the running measure()'s


def _step(text: str) -> None:
    if _MONITOR:
        monitor = _MONITOR[0]
        monitor.step(text)
        load = f"load {monitor.loads[-1]:.2f}"
        others = f", others {monitor.others[-1].cpus:.2f} CPUs before" if monitor.others else ""
        text += f" ({load}{others})"
    sys.stderr.write(f"bench: spark, {text}\n")
    sys.stderr.flush()


def _warm_up(jobs: Jobs) -> None:
    """Every job once, small or unmeasured; the read also checks the input's count."""
    counted = jobs.fencelog().count()
    assert counted == jobs.sizes.records, f"the batch read counted {counted} rows"
    _noop(jobs.memory())
    small = Jobs(jobs.spark, jobs.broker, jobs.scratch, _small(jobs.sizes))
    write_count(small)
    write_fencelog(small)
    stream_memory_noop(small)
    stream_memory_count(small)


def _small(sizes: SparkSizes) -> SparkSizes:
    return SparkSizes(
        records=min(sizes.records, 20_000),
        per_trigger=min(sizes.per_trigger, 10_000),
        rounds=1,
        profile_records=sizes.profile_records,
        quick=sizes.quick,
    )


def _deployment(
    name: str, jobs: Jobs, server: ServerProcess | None, profile: Profile
) -> DeploymentResults:
    sizes = jobs.sizes
    cpu = _Cpu(server)
    runs: dict[str, list[Streamed]] = {key: [] for key in ("fencelog", "ceiling", "fl-fl", "ct")}
    read_value: list[float] = []

    def measured(kind: str, job: Callable[[], float]) -> Callable[[], float]:
        """job, adding the served broker's CPU seconds during it to totals[kind]."""

        def run() -> float:
            with cpu.stage(kind):
                figure = job()
            if kind in cpu.seconds:
                totals[kind] = totals.get(kind, 0.0) + cpu.seconds[kind]
            return figure

        return run

    def streamed(key: str, job: Callable[[Jobs], Streamed]) -> Callable[[], float]:
        def run() -> float:
            done = job(jobs)
            runs[key].append(done)
            return done.steady

        return run

    totals: dict[str, float] = {}
    _step(f"{name}: batch read, {sizes.rounds} rounds")
    read_fl, read_ceiling, read_value_t = interleaved(
        sizes.rounds,
        measured("batch read", lambda: read_fencelog(jobs)),
        lambda: read_memory(jobs, "fencelog"),
        lambda: read_memory(jobs, "value"),
    )
    read_value += read_value_t
    _step(f"{name}: batch write")
    write_fl, write_ceiling = interleaved(
        sizes.rounds,
        measured("batch write", lambda: write_fencelog(jobs)),
        lambda: write_count(jobs),
    )
    _step(f"{name}: stream -> noop")
    stream_fl, stream_ceiling = interleaved(
        sizes.rounds,
        measured("stream -> noop", streamed("fencelog", stream_fencelog_noop)),
        streamed("ceiling", stream_memory_noop),
    )
    _step(f"{name}: stream -> fencelog")
    pipe_fl, pipe_ceiling = interleaved(
        sizes.rounds,
        measured("stream -> fencelog", streamed("fl-fl", stream_fencelog_fencelog)),
        streamed("ct", stream_memory_count),
    )
    return DeploymentResults(
        name,
        Pair(read_fl, read_ceiling),
        tuple(read_value),
        Pair(write_fl, write_ceiling),
        Pair(stream_fl, stream_ceiling),
        Pair(pipe_fl, pipe_ceiling),
        {
            "fencelog -> noop": tuple(runs["fencelog"]),
            "ceiling -> noop": tuple(runs["ceiling"]),
            "fencelog -> fencelog": tuple(runs["fl-fl"]),
            "ceiling -> counting sink": tuple(runs["ct"]),
        },
        {kind: seconds / sizes.rounds for kind, seconds in totals.items()},
        profile,
    )


def _versions(spark: SparkSession) -> str:
    java = spark.sparkContext._jvm
    java_version = str(java.System.getProperty("java.version")) if java is not None else "?"
    return f"PySpark {spark.version}, pyarrow {pa.__version__}, Java {java_version}"


def measure(work_dir: Path, sizes: SparkSizes) -> SparkResults:
    monitor = _Others()
    _MONITOR[:] = [monitor]
    try:
        return _measure(work_dir, sizes, monitor)
    finally:
        _MONITOR.clear()


def _measure(work_dir: Path, sizes: SparkSizes, monitor: _Others) -> SparkResults:
    embedded_dir = work_dir / "spark-embedded"
    served_name = "spark-served"
    _step(f"seeding {sizes.records:,} records")
    _seed(embedded_dir, sizes.records)
    shutil.copytree(embedded_dir, work_dir / served_name)
    scratch = work_dir / "spark-scratch"
    scratch.mkdir()
    results = []
    _step("starting the SparkSession")
    with spark_session() as spark:
        versions = _versions(spark)
        _step("profile, embedded")
        profile = profile_connector("embedded", str(embedded_dir), sizes.profile_records, None)
        jobs = Jobs(spark, str(embedded_dir), scratch, sizes)
        _step("warm-up, embedded")
        warm_up_s = _timed(lambda: _warm_up(jobs))
        results.append(_deployment("embedded", jobs, None, profile))
        with fencelog_server(work_dir, served_name, "full") as server:
            _step("profile, served")
            profile = profile_connector("served", server.address, sizes.profile_records, server)
            jobs = Jobs(spark, server.address, scratch, sizes)
            _step("warm-up, served")
            _warm_up(jobs)
            results.append(_deployment("served", jobs, server, profile))
            # the last sample before anything stops: Spark's Python workers, orphaned
            # when the JVM ends, take their CPU time out of this process's tree
            _step("measured; stopping the server and the SparkSession")
    return SparkResults(
        sizes, versions, tuple(results), warm_up_s, tuple(monitor.loads), tuple(monitor.others)
    )


# the section ---------------------------------------------------------------------------


def _read_row(label: str, pair: Pair) -> Row:
    return Row(
        label,
        rate(median(pair.fencelog), "rows/s"),
        f"ceiling {rate(median(pair.ceiling), 'rows/s')}",
        f"{pair.ratio:.2f}",
        f"ratio >= {READ_RATIO_MIN:.2f}",
        verdict(pair.ratio >= READ_RATIO_MIN),
    )


def _write_row(label: str, pair: Pair) -> Row:
    figure = median(pair.fencelog)
    return Row(
        label,
        rate(figure, "rows/s"),
        f"ceiling {rate(median(pair.ceiling), 'rows/s')}",
        f"{pair.ratio:.2f}",
        f">= {WRITE_RATE_MIN:,.0f} rows/s",
        verdict(figure >= WRITE_RATE_MIN),
    )


def _rows(results: SparkResults) -> list[Row]:
    n = f"{results.sizes.records:,}"
    rows = []
    for d in results.deployments:
        rows += [
            _read_row(f"{d.name}: batch read of {n} -> noop", d.read),
            _write_row(f"{d.name}: batch write of {n} rows, one txn", d.write),
            _read_row(f"{d.name}: stream -> noop, steady", d.stream_read),
            _write_row(f"{d.name}: stream -> fencelog, steady", d.stream_write),
        ]
    first = results.deployments[0]
    rows.append(
        Row(
            "ceiling source with only the value column -> noop",
            rate(median(first.value_ceiling), "rows/s"),
            f"12 columns {rate(median(first.read.ceiling), 'rows/s')}",
            f"{median(first.value_ceiling) / median(first.read.ceiling):.2f}",
        )
    )
    return rows


def _method(results: SparkResults) -> list[str]:
    sizes = results.sizes
    return [
        "How it is measured (bench/spark.py, bench/processes.py):",
        "",
        f"- One SparkSession (local[{PARTITIONS}], UI off, `spark.sql.shuffle.partitions=1`,",
        "  PYSPARK_PYTHON this interpreter), warmed by every job once before the rounds",
        "  (the batch read's warm-up is a `count()` that checks the input). Embedded: the",
        "  `broker` option is the data directory, which each Spark task opens itself.",
        "  Served: `fencelog --durability full serve --listen 127.0.0.1:0` on a copy of",
        "  it, `broker` its tcp:// address. Input: topic of "
        f"{PARTITIONS} partitions, {sizes.records:,}",
        f"  records of {VALUE_BYTES} random bytes, seeded by `client.produce` in batches of"
        f" {SEED_BATCH:,}.",
        "- Batch read: `spark.read.format('fencelog')...load().write.format('noop')`;",
        "  the clock is perf_counter around save(), planning included (as on the ceiling).",
        "- Batch write: `spark.range(N, numPartitions=2)` -> `lpad(id, 100)` as binary",
        "  `value` -> `.write.format('fencelog')` into a fresh 2-partition topic (one",
        "  transaction: begun at planning, journaled by both tasks, committed by the",
        "  driver); the topic's end offsets are checked.",
        f"- Streams: trigger(availableNow=True), maxRecordsPerTrigger {sizes.per_trigger:,}, fresh",
        "  checkpoint per run; -> noop, or `.select('key', 'value', 'partition')` ->",
        "  `writeStream.format('fencelog')` (one transaction per micro-batch). Steady: the",
        "  rows of the micro-batches after the first over the sum of their",
        "  `durationMs.triggerExecution`.",
        "- Ceilings: `bench_memory` (bench/spark.py), a Python data source of 2 partitions",
        f"  re-yielding one pre-built {MEMORY_BATCH:,}-row Arrow batch with the connector's",
        "  12 columns (built by `columnar.rows_to_arrow`), -> noop, batch and stream (same",
        "  cap); `bench_count`, a `DataSourceArrowWriter` / `DataSourceStreamArrowWriter`",
        "  that only counts rows, fed the same `spark.range` values (batch) or the",
        "  memory stream's key, value, partition (stream). Ratio: fencelog's median over",
        f"  the ceiling's median, {sizes.rounds} rounds, turns rotating which goes first.",
        "- Profile (no Spark), one task's work in this process: `read_range` over one",
        f"  partition's first {sizes.profile_records:,} records whole, then page by page",
        "  `client.fetch_arrow` (what read_range calls), and the row path `client.fetch_rows`",
        "  and `rows_to_arrow` (a served broker's, for now); `records_of` and the",
        "  produce of its records into a joined transaction, timed batch by batch (10,000-row",
        "  Arrow batches of 100-byte values); `journal_rows` whole into a fresh",
        f"  transaction and its `txn_commit` (the copy into the log). {PROFILE_PASSES} passes,",
        "  the fastest counting per stage; then cProfile of one read_range, journal_rows",
        "  and commit. Stage rates are wall clock (per-row costs in the findings are their",
        "  inverses, so the split stages need not add up exactly to the whole); CPU is",
        "  `time.process_time` (every thread of this process) and, served, the server's",
        "  (from /proc).",
    ]


def _us(stage: Stage) -> float:
    """Wall microseconds per row."""
    return 1e6 / stage.rows_per_s


def _read_finding(d: DeploymentResults) -> str:
    st, parts = d.profile.stages, d.profile.parts
    connector_us = _us(st["read_range"])
    spark_us = PARTITIONS * 1e6 / median(d.read.ceiling)  # 2 cores busy in the ceiling
    comps = (
        f" (per-row Python list comps {parts[TO_ARROW_COMPS]:.0f} of its "
        f"{parts.get('rows_to_arrow', 0):.0f} ms per 10,000 under cProfile)"
        if parts.get(TO_ARROW_COMPS, 0.0) >= 0.5
        else ""
    )
    return (
        f"- Read, per row ({d.name}, one task's work without Spark): read_range "
        f"{connector_us:.1f} us; page by page, client.fetch_arrow (what read_range "
        f"calls) {_us(st['client.fetch_arrow']):.1f} us, against the row path's "
        f"client.fetch_rows {_us(st['client.fetch_rows']):.1f} us and rows_to_arrow "
        f"{_us(st['rows_to_arrow']):.1f} us{comps}. Spark's own cost, from the "
        f"ceiling, is {spark_us:.1f} us per row per core; as the two add up, the ratio "
        f"reaches {READ_RATIO_MIN:.0%} only if the connector costs no more per row than "
        f"Spark itself: it costs {connector_us / spark_us:.1f}x as much (measured ratio "
        f"{d.read.ratio:.0%})."
    )


def _served_finding(d: DeploymentResults) -> str:
    st = d.profile.stages
    return (
        f"- Served, CPU per row: fetch_arrow {st['client.fetch_arrow'].client_us:.1f} us in "
        f"the client (decoding on its event loop thread included) and "
        f"{st['client.fetch_arrow'].server_us:.1f} us in the server (the row path: "
        f"{st['client.fetch_rows'].client_us:.1f} and {st['client.fetch_rows'].server_us:.1f}"
        f" us); the write's produce {st['produce'].client_us:.1f} us client, "
        f"{st['produce'].server_us:.1f} us server, and the commit "
        f"{st['txn_commit'].server_us:.1f} us server: the one server process does every "
        "task's SQLite work (the Spark jobs' server CPU per run is in the raw numbers)."
    )


def _write_finding(d: DeploymentResults, records: int) -> str:
    st, parts = d.profile.stages, d.profile.parts
    commit_s = records / st["txn_commit"].rows_per_s
    job_s = records / median(d.write.fencelog)
    return (
        f"- Write, per row ({d.name}): journal_rows {_us(st['journal_rows']):.1f} us; batch "
        f"by batch, records_of {_us(st['records_of']):.1f} us and produce "
        f"{_us(st['produce']):.1f} us "
        f"(per 10,000 rows under cProfile, client.produce "
        f"{parts.get('client.produce', 0):.0f} ms, of which check_records "
        f"{parts.get(CHECK_RECORDS, 0):.0f} ms and "
        f"the journal's batch insert {parts.get('journal batch insert', 0):.0f} ms); "
        f"then the commit copies every row again, {_us(st['txn_commit']):.1f} us per row "
        f"(the copy {parts.get('copy into the log', 0):.0f} ms, dropping the journal "
        f"{parts.get('mark_applied (drop journal batches)', 0):.0f} ms per 10,000), "
        f"one call after all tasks: about {commit_s:.1f} s of the {job_s:.1f} s batch write "
        f"of {records:,} rows."
    )


def _findings(results: SparkResults) -> list[str]:
    summary = "; ".join(
        f"{d.name}: batch read {d.read.ratio:.0%} of its ceiling, stream read "
        f"{d.stream_read.ratio:.0%}, batch write {median(d.write.fencelog):,.0f} rows/s, "
        f"stream -> fencelog {median(d.stream_write.fencelog):,.0f} rows/s"
        for d in results.deployments
    )
    embedded = results.deployments[0]
    lines = ["What the figures say:", "", f"- {summary}.", _read_finding(embedded)]
    lines.append(_write_finding(embedded, results.sizes.records))
    lines += [_served_finding(d) for d in results.deployments if d.name == "served"]
    return lines


def _streamed_lines(label: str, runs: Sequence[Streamed]) -> list[str]:
    lines = []
    for index, run in enumerate(runs):
        lines.append(
            f"  {label} run {index + 1}: wall {run.wall_s:.2f} s, steady {run.steady:,.0f} "
            "rows/s; micro-batches rows@s "
            + " ".join(f"{r}@{s:.2f}" for r, s in zip(run.rows, run.seconds, strict=True))
        )
    return lines


def _raw(results: SparkResults) -> list[str]:
    lines = [
        f"warm-up of the session's jobs (embedded): {results.warm_up_s:.1f} s",
        series("1-minute load average per step", results.loads, 2),
        "CPUs used by other processes during each step:",
        *(f"  {i.step:<50} {i.cpus:.2f} over {i.seconds:.0f} s" for i in results.others),
    ]
    for d in results.deployments:
        lines += [
            f"{d.name}: rows/s per round",
            series("batch read, fencelog", d.read.fencelog),
            series("batch read, ceiling (12 columns)", d.read.ceiling),
            series("batch read, ceiling (value only)", d.value_ceiling),
            series("batch write, fencelog", d.write.fencelog),
            series("batch write, ceiling (counting sink)", d.write.ceiling),
            series("stream -> noop steady, fencelog", d.stream_read.fencelog),
            series("stream -> noop steady, ceiling", d.stream_read.ceiling),
            series("stream -> fencelog steady, fencelog", d.stream_write.fencelog),
            series("stream -> counting sink steady, ceiling", d.stream_write.ceiling),
        ]
        for label, runs in d.stream_runs.items():
            lines += _streamed_lines(label, runs)
        if d.server_cpu:
            lines.append(
                "  server CPU s per run: "
                + ", ".join(f"{kind} {s:.1f}" for kind, s in d.server_cpu.items())
            )
        p = d.profile
        lines.append(
            f"  profile ({p.records:,} rows): rows/s, client CPU us/row, server CPU us/row"
        )
        lines += [
            f"    {name:<14} {st.rows_per_s:>10,.0f} {st.client_us:8.2f} {st.server_us:8.2f}"
            for name, st in p.stages.items()
        ]
        lines += [f"    cProfile ms per 10,000 rows  {k:<34} {v:.1f}" for k, v in p.parts.items()]
    return lines


def _quiet(results: SparkResults) -> str:
    start = results.loads[0]
    seconds = sum(i.seconds for i in results.others)
    others = sum(i.cpus * i.seconds for i in results.others) / max(seconds, 1e-9)
    seen = (
        f"1-minute load average {start:.2f} when the group started; during the run other "
        f"processes used {others:.2f} of the 2 CPUs on average"
    )
    if start < QUIET_LOAD and others < QUIET_OTHERS:
        return f"- The machine was quiet: {seen}."
    busy = [i for i in results.others if i.cpus >= QUIET_OTHERS]
    quiet = [i.step for i in results.others if i.cpus < QUIET_OTHERS]
    return (
        f"- The machine was NOT quiet: {seen}; {QUIET_OTHERS} CPUs or more during: "
        + "; ".join(f"{i.step} ({i.cpus:.2f})" for i in busy)
        + (f"; less during: {'; '.join(quiet)}" if quiet else "")
        + ". Rates measured beside other work are low and noisy; the ratios, fencelog and"
        " ceiling taking turns in the same rounds, hold better."
    )


def section(results: SparkResults) -> Section:
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=tuple(_rows(results)),
        method=tuple(_method(results)),
        findings=tuple([*_findings(results), _quiet(results)]),
        raw=tuple(_raw(results)),
        software=f"Software: {results.versions}.",
    )
