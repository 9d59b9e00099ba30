"""Spark jobs over fencelog as the tests under tests/spark run them: a broker the Spark
workers reach, batch and streaming reads and writes with the connector's options, and
what a topic holds afterwards."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from broker.client.client import Client, connect
from broker.types import NewRecord, Record, TxnInfo
from support.values import present

ACTION_TIMEOUT_S = 120  # one streaming run; a batch action has pytest's timeout


@dataclass
class Broker:
    """A broker the Spark workers reach: `url` is what the connector's broker option gets
    (a data directory's path, or tcp://127.0.0.1:PORT)."""

    url: str

    def client(self) -> Client:
        return connect(self.url)


# reading and writing through Spark ---------------------------------------------------------


def read(spark: SparkSession, url: str, topic: str, **options: str | int) -> DataFrame:
    reader = spark.read.format("fencelog").option("broker", url).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def write(df: DataFrame, url: str, topic: str | None, **options: str | int) -> None:
    writer = df.write.format("fencelog").option("broker", url).mode("append")
    if topic is not None:
        writer = writer.option("topic", topic)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def upper(df: DataFrame) -> DataFrame:
    return df.selectExpr("key", "upper(cast(value as string)) as value", "partition")


@dataclass
class StreamRun:
    query_id: str
    batches: list[tuple[int, int]]  # (batch id, input rows) of every micro-batch that ran


def read_stream(spark: SparkSession, url: str, topic: str, **options: str | int) -> DataFrame:
    reader = (
        spark.readStream.format("fencelog")
        .option("broker", url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_to_end(writer: DataStreamWriter, sink: str, checkpoint: Path) -> StreamingQuery:
    """Start a trigger(availableNow=True) query and wait for its end (its error raised)."""
    query = (
        writer.format(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        ended = query.awaitTermination(ACTION_TIMEOUT_S)
        assert ended, f"the availableNow query did not end within {ACTION_TIMEOUT_S}s"
    finally:
        query.stop()
    return query


def stream(
    spark: SparkSession,
    url: str,
    checkpoint: Path,
    *,
    source: str = "orders",
    sink: str = "out",
    per_trigger: int | None = None,
    transform: Callable[[DataFrame], DataFrame] = upper,
) -> StreamRun:
    """One availableNow run of source -> transform -> sink: its micro-batches."""
    options = {} if per_trigger is None else {"maxRecordsPerTrigger": per_trigger}
    df = transform(read_stream(spark, url, source, **options))
    writer = df.writeStream.option("broker", url).option("topic", sink)
    query = run_to_end(writer, "fencelog", checkpoint)
    batches = [(int(p["batchId"]), int(p["numInputRows"])) for p in query.recentProgress]
    return StreamRun(str(query.id), [b for b in batches if b[1] > 0])


# what the broker holds ---------------------------------------------------------------------


def by_partition(client: Client, topic: str) -> dict[int, list[Record]]:
    found: dict[int, list[Record]] = collections.defaultdict(list)
    for record in client.consume(topic):
        found[record.partition].append(record)
    return {p: found[p] for p in range(client.describe_topic(topic).partitions)}


def values(client: Client, topic: str) -> dict[int, list[bytes]]:
    return {
        p: [present(r.value) for r in records] for p, records in by_partition(client, topic).items()
    }


def upper_values(client: Client, topic: str) -> dict[int, list[bytes]]:
    return {p: [v.upper() for v in vs] for p, vs in values(client, topic).items()}


def duplicates(found: dict[int, list[bytes]]) -> list[bytes]:
    counts = collections.Counter(v for vs in found.values() for v in vs)
    return [v for v, n in counts.items() if n > 1]


def txns_of(client: Client, group: str) -> list[TxnInfo]:
    """Every transaction of group, open or ended, by key (streaming: by batch id)."""
    found = [t for t in client.txn_list(include_ended=True, limit=1000) if t.group == group]
    return sorted(found, key=lambda t: (len(t.key or ""), t.key or "", t.began_ms))


def produce_spread(client: Client, topic: str, texts: Sequence[str], partitions: int = 2) -> None:
    """Values to partitions in turn: text i to partition i % partitions."""
    client.produce(
        topic, [NewRecord(t.encode(), partition=i % partitions) for i, t in enumerate(texts)]
    )


def row_record(row: Row) -> Record:
    """A row of `SELECT *` with unix_millis(timestamp) as ts, as the Record it came from."""
    return Record(
        row.topic,
        row.partition,
        row.offset,
        row.ts,
        None if row.key is None else bytes(row.key),
        bytes(row.value),
        tuple((h.key, bytes(h.value)) for h in row.headers),
        row.producer_id,
        row.generation,
        row.sequence,
        row.epoch,
        row.txn_id,
    )


def error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


def first_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The line a Spark user reads first: fencelog's message must be on it. A task's
    error (PythonException) opens with PySpark's own line, "An exception was thrown
    from the Python worker:"; the message is the one after it."""
    lines = str(excinfo.value).splitlines()
    if lines[0].startswith("An exception was thrown from the Python worker") and len(lines) > 1:
        return lines[1].strip()
    return lines[0]
