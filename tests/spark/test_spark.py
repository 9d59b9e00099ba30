"""The PySpark connector (broker/spark.py, DESIGN.md section 10) through a real Spark.

What a user sees: spark.read / readStream .format("fencelog") return a topic's committed
records with every field, within the offsets asked for; df.write and writeStream append
to a topic exactly once: a batch job is one transaction (all or nothing, a retried task
never duplicates a row), a streaming micro-batch is one transaction that a replay after a
crash or a lost checkpoint commit finds again instead of writing twice. Bad options and
bad DataFrames fail with a message that says what is wrong, and write nothing.

The SparkSession and the brokers are conftest.py's; the jobs are support/spark_jobs.py's.

Functions shipped to Spark (mapInArrow) are closures made by module-level factories:
cloudpickle sends a closure by value, while this module itself is not importable in
the workers. The kill -9 test runs tests/support/spark_driver.py in its own process group and
restarts from its checkpoint with examples/spark_pipeline.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

import broker.spark
from broker import testing
from broker.client.client import connect
from broker.errors import BrokerError, ErrorCode
from broker.types import NewRecord, TopicConfig, TxnInfo
from support import EXAMPLES, SCRIPTS
from support.helpers import user_env
from support.servers import served
from support.spark_jobs import (
    ACTION_TIMEOUT_S,
    Broker,
    StreamRun,
    by_partition,
    duplicates,
    error_text,
    first_line,
    produce_spread,
    read,
    read_stream,
    row_record,
    run_to_end,
    stream,
    txns_of,
    upper,
    upper_values,
    values,
    write,
)
from support.values import present
from support.waiting import wait_until

DRIVER_TIMEOUT_S = 240.0  # one run of the subprocess driver (session start included)
DRIVER = SCRIPTS / "spark_driver.py"
EXAMPLE = EXAMPLES / "spark_pipeline.py"
MAX_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"

SCHEMA_TYPES = [
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "array<struct<key:string,value:binary>>"),
    ("producer_id", "bigint"),
    ("generation", "int"),
    ("sequence", "int"),
    ("epoch", "int"),
    ("txn_id", "bigint"),
]


# batch --------------------------------------------------------------------------------------


def test_batch_round_trip(spark: SparkSession, any_broker: Broker) -> None:
    """Every field of every committed record; an open transaction's records are not read;
    upper-cased and written back in one committed transaction, partition order kept."""
    url = any_broker.url
    with any_broker.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("orders_upper", 2)
        client.produce(
            "orders",
            [
                NewRecord(
                    f"order-{i}".encode(),
                    None if i % 3 == 0 else f"k{i}".encode(),
                    (("n", str(i).encode()), ("h", b"\x00\xff")) if i % 2 else (),
                    i % 2,
                )
                for i in range(30)
            ],
        )
        with client.transaction("loader") as txn:
            txn.produce("orders", [f"committed-{i}" for i in range(6)], partition=1)
        committed_id = txn.txn_id
        pending = client.transaction("loader")
        pending.produce("orders", [f"pending-{i}" for i in range(5)], partition=0)
        expected = by_partition(client, "orders")
        assert sum(len(rs) for rs in expected.values()) == 36

        df = read(spark, url, "orders")
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == SCHEMA_TYPES
        rows = df.selectExpr("*", "unix_millis(timestamp) as ts").collect()
        got = sorted((row_record(r) for r in rows), key=lambda r: (r.partition, r.offset))
        assert got == [r for p in (0, 1) for r in expected[p]]
        assert not any(present(r.value).startswith(b"pending") for r in got)
        assert {r.txn_id for r in got if present(r.value).startswith(b"committed")} == {
            committed_id
        }

        write(
            df.selectExpr("key", "upper(cast(value as string)) as value", "partition", "headers"),
            url,
            "orders_upper",
        )
        output = by_partition(client, "orders_upper")
        for p in (0, 1):
            assert [(r.key, present(r.value).upper(), r.headers) for r in expected[p]] == [
                (r.key, r.value, r.headers) for r in output[p]
            ]
        jobs = txns_of(client, "spark-orders_upper")
        assert [(t.state, t.records) for t in jobs] == [("committed", 36)]
        assert testing.assert_exactly_once(client, "orders_upper").records == 36
        # the job left nothing pending: only the loader's transaction is open
        assert [t.txn_id for t in client.txn_list()] == [pending.txn_id]

        # the pending records appear once committed, and only then
        pending.commit()
        assert read(spark, url, "orders").where("value like 'pending%'").count() == 5
        assert client.txn_list() == []


def test_served_broker_with_auth_token(spark: SparkSession, tmp_path: Path) -> None:
    """A served broker that wants a token: authTokenFile lets the job in, and without it
    the job fails with the broker's answer (and the token appears nowhere)."""
    token = "s3cret-token-for-spark"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    with (
        served(tmp_path / "data", auth_token=token) as server,
        connect(server.address, token=token) as client,
    ):
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(10)])
        with pytest.raises(PySparkException) as excinfo:
            read(spark, server.address, "orders").collect()
        assert "authentication failed" in error_text(excinfo)
        assert token not in error_text(excinfo)

        df = read(spark, server.address, "orders", authTokenFile=str(token_file))
        write(upper(df), server.address, "out", authTokenFile=str(token_file))
        assert values(client, "out") == upper_values(client, "orders")
        assert client.txn_list() == []


def test_records_retention_deleted_fail_the_query_unless_told_otherwise(
    spark: SparkSession, embedded: Broker
) -> None:
    """As Spark's Kafka source: earliest is the log start; an offset below it is data loss,
    which fails the query (failOnDataLoss, default true) or is skipped (false)."""
    old = 1_000
    with embedded.client() as client:
        client.create_topic("orders", config=TopicConfig(retention_ms=60_000))
        client.produce("orders", [NewRecord(b"old", None, (), 0, old) for _ in range(4)])
        client.produce("orders", [b"kept"])
        assert client.clean_topic("orders") == 4

    def offsets(**options: str | int) -> list[int]:
        df = read(spark, embedded.url, "orders", **options)
        return sorted(r.offset for r in df.select("offset").collect())

    assert offsets() == [4]
    with pytest.raises(PySparkException) as excinfo:
        offsets(startingOffsets=json.dumps({"0": 1}))
    assert "failOnDataLoss" in error_text(excinfo)
    assert "OFFSET_OUT_OF_RANGE" in error_text(excinfo) or "log start offset 4" in error_text(
        excinfo
    )
    assert offsets(startingOffsets=json.dumps({"0": 1}), failOnDataLoss="false") == [4]


def test_batch_offsets_options(spark: SparkSession, embedded: Broker) -> None:
    """startingOffsets / endingOffsets as earliest, latest or JSON per partition (-2, -1,
    past the end), and maxRecordsPerPartition splitting a range into several tasks."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.produce("orders", [f"a{i}" for i in range(10)], partition=0)
        client.produce("orders", [f"b{i}" for i in range(6)], partition=1)

    def offsets(**options: str | int) -> list[tuple[int, int]]:
        df = read(spark, embedded.url, "orders", **options)
        return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    def span(partition: int, start: int, end: int) -> list[tuple[int, int]]:
        return [(partition, o) for o in range(start, end)]

    everything = span(0, 0, 10) + span(1, 0, 6)
    assert offsets() == everything
    assert offsets(startingOffsets="earliest", endingOffsets="latest") == everything
    # reading nothing of a partition is refused, as Kafka's source refuses it in a batch
    for option, bound in (("startingOffsets", "latest"), ("endingOffsets", "earliest")):
        for given in (bound, json.dumps({"orders": {"1": -1 if bound == "latest" else -2}})):
            with pytest.raises(PySparkException) as excinfo:
                offsets(**{option: given})
            assert f"{option} {bound} " in first_line(excinfo)
            assert "is not allowed in a batch read" in first_line(excinfo)
    assert offsets(
        startingOffsets=json.dumps({"0": 3, "1": -2}), endingOffsets=json.dumps({"0": 8, "1": -1})
    ) == span(0, 3, 8) + span(1, 0, 6)
    # a partition the JSON leaves out starts at earliest and ends at latest
    assert offsets(startingOffsets=json.dumps({"1": 4})) == span(0, 0, 10) + span(1, 4, 6)
    assert offsets(endingOffsets=json.dumps({"0": 2})) == span(0, 0, 2) + span(1, 0, 6)
    # Kafka's form, the topic named, reads the same
    assert offsets(startingOffsets=json.dumps({"orders": {"0": 3}})) == span(0, 3, 10) + span(
        1, 0, 6
    )
    # past the end fails, as Kafka's source does, naming the end
    for option in ("startingOffsets", "endingOffsets"):
        with pytest.raises(PySparkException) as excinfo:
            offsets(**{option: json.dumps({"0": 100})})
        assert f"{option}: offset 100 of orders/0 is past its end (10)" in first_line(excinfo)

    split = read(spark, embedded.url, "orders", maxRecordsPerPartition=3)
    assert split.rdd.getNumPartitions() == 4 + 2  # 10 records in 3s, 6 in 3s
    assert sorted((r.partition, r.offset) for r in split.collect()) == everything
    ranged = read(
        spark,
        embedded.url,
        "orders",
        maxRecordsPerPartition=4,
        startingOffsets=json.dumps({"0": 1, "1": 5}),
    )
    assert ranged.rdd.getNumPartitions() == 3 + 1
    assert sorted((r.partition, r.offset) for r in ranged.collect()) == span(0, 1, 10) + span(
        1, 5, 6
    )


def test_batch_read_past_the_fetch_limits(spark: SparkSession, embedded: Broker) -> None:
    """A partition of more records than one fetch returns (read_records_max) and one of
    more bytes (read_bytes_max): each task reads its whole range, in order."""
    small, large, size = 25_000, 3_000, 3_500
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.produce("orders", [f"s{i}" for i in range(small)], partition=0)
        for _ in range(3):  # 3 x 10.5 MB: one append each
            client.produce("orders", [b"L" * size] * large, partition=1)
    summary = (
        read(spark, embedded.url, "orders")
        .groupBy("partition")
        .agg({"offset": "max", "value": "count", "*": "count"})
        .collect()
    )
    stats = {r.partition: (r["count(value)"], r["max(offset)"], r["count(1)"]) for r in summary}
    assert stats == {0: (small, small - 1, small), 1: (3 * large, 3 * large - 1, 3 * large)}
    total_bytes = read(spark, embedded.url, "orders").selectExpr("sum(length(value))").first()
    assert total_bytes is not None
    assert total_bytes[0] == sum(len(f"s{i}") for i in range(small)) + 3 * large * size


def test_empty_reads_and_writes(spark: SparkSession, embedded: Broker, tmp_path: Path) -> None:
    """An empty topic reads as no rows (batch and stream); an empty DataFrame writes
    nothing and leaves no transaction pending."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        df = read(spark, embedded.url, "orders")
        assert df.count() == 0
        write(df.select("key", "value"), embedded.url, "out")
        assert client.describe_topic("out").records == 0
        assert stream(spark, embedded.url, tmp_path / "checkpoint").batches == []
        assert client.describe_topic("out").records == 0
        assert client.txn_list() == []


# task failures ------------------------------------------------------------------------------


LARGE_ORDERS = 400


def large_orders() -> list[str]:
    """Values of 8 KiB: ten of them outgrow the 64 KiB stream buffer between a Python
    worker and the JVM, so every batch a mapInArrow function yields goes on to the
    writer at once instead of waiting in the buffer for the function to return."""
    return [f"order-{i:04}" + "." * 8192 for i in range(LARGE_ORDERS)]


def fail_in_partition_0(
    url: str, group: str, marker: Path, *, every_attempt: bool
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function that passes rows through in batches of 10, but in Spark
    partition 0 (topic partition 0: its rows keep their partition) raises in attempt 0,
    or in every attempt, once the writer has journaled some of them to partition 0 in the
    open transaction of `group`. Attempt 0 notes in `marker` how many that was."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        attempt = context.attemptNumber()
        if context.partitionId() != 0 or not (every_attempt or attempt == 0):
            yield from batches
            return
        with connect(url) as client:

            def journaled() -> int:
                open_txns = [t for t in client.txn_list() if t.group == group]
                return sum(p.records for t in open_txns for p in t.partitions if p.partition == 0)

            def fail(count: int) -> RuntimeError:
                if attempt == 0:
                    marker.write_text(str(count))
                return RuntimeError(f"injected failure, attempt {attempt}")

            for batch in batches:
                for start in range(0, batch.num_rows, 10):
                    yield batch.slice(start, 10)
                    if count := journaled():
                        raise fail(count)
            # the last rows may still be on their way to the writer. (A loop of its own,
            # not support.waiting: this runs in a Spark worker, where tests/ is not
            # importable.)
            deadline = time.monotonic() + 60
            while not (count := journaled()):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"attempt {attempt}: the writer journaled nothing within 60s; "
                        f"transactions: {client.txn_list()}"
                    )
                time.sleep(0.05)
            raise fail(count)

    return run


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Arrow batches of 10 rows, so a writer journals rows while its input still flows."""
    before = spark.conf.get(MAX_BATCH_ROWS)
    assert before is not None
    spark.conf.set(MAX_BATCH_ROWS, "10")
    try:
        yield
    finally:
        spark.conf.set(MAX_BATCH_ROWS, before)


@pytest.mark.usefixtures("small_arrow_batches")
def test_batch_task_retry_writes_each_row_once(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """Attempt 0 of partition 0's task fails after its rows reached the transaction; the
    retry joins again as the same member, so the job commits every row exactly once."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", large_orders())
    marker = tmp_path / "attempt-0-failed"
    df = read(spark, embedded.url, "orders").select("key", "value", "partition")
    failing = df.mapInArrow(
        fail_in_partition_0(embedded.url, "spark-out", marker, every_attempt=False), df.schema
    )
    write(failing, embedded.url, "out")

    assert int(marker.read_text()) > 0  # attempt 0 failed after rows were journaled
    with embedded.client() as client:
        assert values(client, "out") == values(client, "orders")
        assert [(t.state, t.records) for t in txns_of(client, "spark-out")] == [
            ("committed", LARGE_ORDERS)
        ]
        assert client.txn_list() == []
        # the retried member's records are the transaction's: verify finds them clean
        assert testing.assert_exactly_once(client, "out").records == LARGE_ORDERS


@pytest.mark.usefixtures("small_arrow_batches")
def test_batch_job_that_fails_leaves_nothing(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """Every attempt of one task fails (after rows were journaled): the job fails, its
    transaction is aborted, not left open, and the topic holds nothing."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", large_orders())
    marker = tmp_path / "attempt-0-failed"
    df = read(spark, embedded.url, "orders").select("key", "value", "partition")
    failing = df.mapInArrow(
        fail_in_partition_0(embedded.url, "spark-out", marker, every_attempt=True), df.schema
    )
    with pytest.raises(PySparkException) as excinfo:
        write(failing, embedded.url, "out")
    assert "injected failure, attempt 2" in error_text(excinfo)

    assert int(marker.read_text()) > 0
    with embedded.client() as client:
        assert client.describe_topic("out").records == 0
        assert client.txn_list() == []
        assert [t.state for t in txns_of(client, "spark-out")] == ["aborted"]


@pytest.mark.usefixtures("small_arrow_batches")
def test_stream_task_retry_writes_each_row_once(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """The same failure in a micro-batch: the retried task finds the batch's transaction
    by its key and joins it again, so the batch is committed once with every row once."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", large_orders())
    marker = tmp_path / "attempt-0-failed"

    def failing(df: DataFrame) -> DataFrame:
        picked = df.select("key", "value", "partition")
        run = fail_in_partition_0(embedded.url, "spark-out", marker, every_attempt=False)
        return picked.mapInArrow(run, picked.schema)

    run = stream(spark, embedded.url, tmp_path / "checkpoint", transform=failing)
    assert run.batches == [(0, LARGE_ORDERS)]
    assert int(marker.read_text()) > 0
    with embedded.client() as client:
        assert values(client, "out") == values(client, "orders")
        assert [(t.key, t.state, t.records) for t in txns_of(client, "spark-out")] == [
            (f"{run.query_id}:0", "committed", LARGE_ORDERS)
        ]
        assert client.txn_list() == []


# streaming ----------------------------------------------------------------------------------


def test_stream_available_now_runs_pick_up_only_new_records(
    spark: SparkSession, any_broker: Broker, tmp_path: Path
) -> None:
    """maxRecordsPerTrigger splits a run into micro-batches, one committed transaction
    each; a second run from the same checkpoint reads only what was produced since."""
    checkpoint = tmp_path / "checkpoint"
    with any_broker.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(25)])

        first = stream(spark, any_broker.url, checkpoint, per_trigger=10)
        assert first.batches == [(0, 10), (1, 10), (2, 5)]
        assert values(client, "out") == upper_values(client, "orders")
        assert [(t.key, t.state, t.records) for t in txns_of(client, "spark-out")] == [
            (f"{first.query_id}:{b}", "committed", n) for b, n in first.batches
        ]

        produce_spread(client, "orders", [f"later-{i}" for i in range(7)])
        second = stream(spark, any_broker.url, checkpoint, per_trigger=10)
        assert second.query_id == first.query_id
        assert second.batches == [(3, 7)]
        assert values(client, "out") == upper_values(client, "orders")

        third = stream(spark, any_broker.url, checkpoint, per_trigger=10)
        assert third.batches == []
        output = values(client, "out")
        assert output == upper_values(client, "orders")
        assert sum(len(vs) for vs in output.values()) == 32
        assert duplicates(output) == []
        assert client.txn_list() == []
        assert testing.assert_exactly_once(client, "out").records == 32


def test_stream_replay_writes_nothing_twice(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """The checkpoint's last commit file is lost: Spark replays that batch, whose
    transaction is found committed, so nothing is written again. The next batch's key
    already has an open transaction (as a crashed run leaves it, with records of task
    attempts that no longer count): the batch joins it and only its own rows commit."""
    checkpoint = tmp_path / "checkpoint"
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(25)])
        first = stream(spark, embedded.url, checkpoint, per_trigger=10)
        assert first.batches == [(0, 10), (1, 10), (2, 5)]

        (checkpoint / "commits" / "2").unlink()  # and Hadoop's checksum of it
        (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
        produce_spread(client, "orders", [f"later-{i}" for i in range(6)])
        crashed = client.transaction("spark-out", key=f"{first.query_id}:3")
        for member in ("partition-0", "partition-1", "partition-7"):
            joined = client.join_transaction(crashed.txn_id, member)
            joined.produce("out", [f"STALE-{member}"] * 3, partition=1)

        second = stream(spark, embedded.url, checkpoint, per_trigger=10)
        assert second.batches == [(2, 5), (3, 6)]
        output = values(client, "out")
        assert output == upper_values(client, "orders")
        assert duplicates(output) == []
        committed = [(t.key, t.state) for t in txns_of(client, "spark-out")]
        assert sorted(committed) == [(f"{first.query_id}:{b}", "committed") for b in range(4)]
        reused = [t for t in txns_of(client, "spark-out") if t.key == f"{first.query_id}:3"]
        assert [(t.txn_id, t.state, t.records) for t in reused] == [
            (crashed.txn_id, "committed", 6)
        ]
        assert client.txn_list() == []


def test_stream_batch_that_fails_leaves_nothing(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """A micro-batch whose task fails on every attempt (a row naming a partition the
    topic does not have) fails the query with that message; none of the batch is
    visible, and its transaction ends aborted (by the driver, or by its
    transactionTimeout), not pending."""
    timeout_ms = 3_000
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(20)])
        df = read_stream(spark, embedded.url, "orders").selectExpr(
            "key", "value", "if(partition = 0 and offset = 3, 7, partition) as partition"
        )
        writer = (
            df.writeStream.option("broker", embedded.url)
            .option("topic", "out")
            .option("transactionTimeout", timeout_ms)
        )
        with pytest.raises(PySparkException) as excinfo:
            run_to_end(writer, "fencelog", tmp_path / "checkpoint")
        assert "there is no partition 7" in error_text(excinfo)

        wait_until(
            lambda: not client.txn_list(),
            timeout_ms / 1000 + 30,
            interval_s=0.2,
            message=lambda: f"nothing pending; still {client.txn_list()}",
        )
        # A retry that outlives the 3 s timeout begins the batch's transaction anew.
        states = [t.state for t in txns_of(client, "spark-out")]
        assert states and set(states) == {"aborted"}, states
        assert client.describe_topic("out").records == 0


def test_stream_starts_at_latest_by_default(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """Without startingOffsets a new query starts at the end, as Spark's Kafka source
    does: the records already there are never read, the ones produced later are."""
    checkpoint = tmp_path / "checkpoint"
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"old-{i}" for i in range(5)])

        def run() -> StreamRun:
            df = upper(
                spark.readStream.format("fencelog")
                .option("broker", embedded.url)
                .option("topic", "orders")
                .load()
            )
            writer = df.writeStream.option("broker", embedded.url).option("topic", "out")
            query = run_to_end(writer, "fencelog", checkpoint)
            sizes = [(int(p["batchId"]), int(p["numInputRows"])) for p in query.recentProgress]
            return StreamRun(str(query.id), [b for b in sizes if b[1] > 0])

        assert run().batches == []
        produce_spread(client, "orders", [f"new-{i}" for i in range(3)])
        assert [rows for _, rows in run().batches] == [3]
        assert sorted(v for vs in values(client, "out").values() for v in vs) == [
            b"NEW-0",
            b"NEW-1",
            b"NEW-2",
        ]
        assert client.txn_list() == []


def test_stream_processing_time_trigger_follows_new_records(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """A query that keeps running (processingTime trigger) picks up records as they are
    produced, maxRecordsPerTrigger at a time, each exactly once."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(20)])
        query = (
            upper(read_stream(spark, embedded.url, "orders", maxRecordsPerTrigger=8))
            .writeStream.format("fencelog")
            .option("broker", embedded.url)
            .option("topic", "out")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:

            def wait_for(count: int) -> None:
                def landed() -> bool:
                    assert query.isActive, f"the query ended: {query.exception()}"
                    return client.describe_topic("out").records >= count

                wait_until(landed, ACTION_TIMEOUT_S, interval_s=0.1, message=f"{count} in out")

            wait_for(20)
            produce_spread(client, "orders", [f"later-{i}" for i in range(10)])
            wait_for(30)
            time.sleep(0.5)  # on purpose: a batch too many would land now
        finally:
            query.stop()
        sizes = [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
        assert sum(sizes) == 30
        assert max(sizes) <= 8
        output = values(client, "out")
        assert output == upper_values(client, "orders")
        assert duplicates(output) == []
        assert client.txn_list() == []


def test_batch_write_of_large_records(spark: SparkSession, embedded: Broker) -> None:
    """10,000 records of 3.5 KB in one partition: Spark hands the writer one Arrow batch
    of 35 MB, more than one append may hold (append_bytes_max, 32 MB); each record is
    far below the record limit, so the job must still write them all."""
    with embedded.client() as client:
        client.create_topic("big", 1)
    df = spark.range(0, 10_000, 1, 1).selectExpr(
        "concat(lpad(cast(id as string), 5, '0'), repeat('x', 3500)) as value"
    )
    write(df, embedded.url, "big")
    with embedded.client() as client:
        found = [present(r.value)[:5] for r in client.consume("big")]
        assert found == [f"{i:05}".encode() for i in range(10_000)]
        assert client.txn_list() == []


# bad input ----------------------------------------------------------------------------------


def test_bad_input_fails_clearly_and_writes_nothing(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    url = embedded.url
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        produce_spread(client, "orders", [f"order-{i}" for i in range(6)])
    good = read(spark, url, "orders").select("key", "value", "partition")

    def fails(action: Callable[[], Any], fragment: str) -> None:
        """fencelog's message, alone, on the first line of the error: no traceback."""
        with pytest.raises(PySparkException) as excinfo:
            action()
        assert fragment in first_line(excinfo), error_text(excinfo)
        assert "Traceback" not in error_text(excinfo)

    def write_save(df: DataFrame, **options: str | int) -> Callable[[], None]:
        return lambda: write(df, url, "out", **options)

    # reads
    fails(
        lambda: spark.read.format("fencelog").option("broker", url).load().collect(),
        "the fencelog format needs .option('topic', NAME)",
    )
    fails(lambda: read(spark, url, "nope").collect(), "topic nope does not exist")
    fails(
        lambda: read(spark, url, "orders", startingOffsets='{"0": 1').collect(),
        'startingOffsets is "earliest", "latest" or JSON',
    )
    fails(
        lambda: read(spark, url, "orders", endingOffsets="[1]").collect(),
        "endingOffsets JSON maps partitions to offsets",
    )
    fails(
        lambda: read(spark, url, "orders", startingOffsets='{"5": 0}').collect(),
        "startingOffsets names partition '5' of orders; it has 2",
    )
    fails(
        lambda: read(spark, url, "orders", startingOffsets='{"0": "x"}').collect(),
        "startingOffsets: partition 0 offset must be >= -2",
    )
    fails(
        lambda: read(spark, url, "orders", maxRecordsPerPartition=0).collect(),
        "option maxRecordsPerPartition is a positive integer",
    )
    fails(
        lambda: run_to_end(
            spark.readStream.format("fencelog").option("broker", url).load().writeStream,
            "noop",
            tmp_path / "checkpoint-read",
        ),
        "the fencelog format needs .option('topic', NAME)",
    )

    # writes
    fails(
        lambda: write(good, url, None),
        "set .option('topic', NAME) or write a topic column",
    )
    fails(lambda: write(good, url, "nope"), "topic nope does not exist")
    fails(write_save(good.select("key")), "writing to fencelog needs a value column")
    fails(
        write_save(good.selectExpr("key", "length(value) as value")),
        "column 'value' is int; fencelog takes binary or string",
    )
    fails(
        write_save(good.selectExpr("value", "cast(partition as string) as partition")),
        "column 'partition' is string; fencelog takes int or bigint",
    )
    fails(
        write_save(read(spark, url, "orders").select("value", "offset")),
        "column 'offset' cannot be written to fencelog",
    )
    fails(
        write_save(good, transactionTimeout="soon"),
        "option transactionTimeout is a positive integer, not 'soon'",
    )
    fails(
        write_save(good, transactionTimeout=10**10),
        "a transaction timeout is 1..86400000 ms, not 10000000000",
    )
    # a job that outlives its transaction's timeout fails whole
    fails(
        write_save(good, transactionTimeout=1),
        "was aborted (timed out): the write outlived its transactionTimeout (1 ms)",
    )
    fails(
        lambda: (
            good.write.format("fencelog")
            .option("broker", url)
            .option("topic", "out")
            .mode("overwrite")
            .save()
        ),
        "fencelog topics are append-only",
    )
    fails(
        lambda: write(good.selectExpr("value", "'nope' as topic"), url, None),
        "topic nope does not exist",
    )
    fails(
        lambda: run_to_end(
            read_stream(spark, url, "orders")
            .select("key")
            .writeStream.option("broker", url)
            .option("topic", "out"),
            "fencelog",
            tmp_path / "checkpoint-write",
        ),
        "writing to fencelog needs a value column",
    )

    with embedded.client() as client:
        assert client.describe_topic("out").records == 0
        assert client.txn_list() == []
        assert {t.state for t in client.txn_list(include_ended=True)} <= {"aborted"}


# kill -9 of the driver ------------------------------------------------------------------------


def group_alive(pgid: int) -> list[int]:
    """The processes of a process group that are not zombies."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(stat.parent.name))
    return alive


@contextlib.contextmanager
def driver_group(
    script: Path, args: Sequence[str], log: Path, cwd: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A Spark driver program in its own process group (its JVM and Python workers join
    it), which is killed with SIGKILL on the way out whatever happened."""
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=user_env(SPARK_LOCAL_IP="127.0.0.1"),
            start_new_session=True,
        )
    try:
        yield popen
    finally:
        kill_group(popen)


def kill_group(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait(timeout=30)
    wait_until(
        lambda: not group_alive(popen.pid),
        30,
        interval_s=0.1,
        message=lambda: f"the group gone; still alive: {group_alive(popen.pid)}",
    )


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(2 * DRIVER_TIMEOUT_S + 120)
def test_kill_9_driver_mid_stream_then_restart(embedded: Broker, tmp_path: Path) -> None:
    """The driver's process group is killed while a micro-batch is being written: none
    of that batch is visible, and its transaction is aborted by its (short) timeout. The
    example pipeline, run on the same checkpoint, replays the batch and finishes: every
    input record once in the output, in order per partition, nothing pending."""
    total, per_trigger, timeout_ms = 3000, 150, 15_000
    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "driver.log"
    common = ["--broker", embedded.url, "--checkpoint", str(checkpoint)]
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("orders_upper", 2)
        produce_spread(client, "orders", [f"order-{i:05}" for i in range(total)])

        killed_open: list[TxnInfo] = []
        args = [*common, "--per-trigger", str(per_trigger)]
        args += ["--transaction-timeout", str(timeout_ms)]
        with driver_group(DRIVER, args, log, tmp_path) as driver:

            def mid_batch() -> bool:
                """Some batches written and a transaction holding journaled records."""
                assert driver.poll() is None, f"the driver ended early:\n{log_tail(log)}"
                written = client.describe_topic("orders_upper").records
                assert written < total, "the run ended before it could be killed"
                return written > 0 and any(t.records > 0 for t in client.txn_list())

            wait_until(
                mid_batch,
                DRIVER_TIMEOUT_S,
                message=lambda: f"a batch in the middle of its write:\n{log_tail(log)}",
            )
            kill_group(driver)  # mid-batch: a transaction holds journaled records
            killed_open = client.txn_list()
        partial = client.describe_topic("orders_upper").records
        assert 0 < partial < total
        assert partial % per_trigger == 0  # whole micro-batches only

        # the killed run's transaction is aborted by its timeout, not left pending
        wait_until(
            lambda: not client.txn_list(),
            timeout_ms / 1000 + 30,
            interval_s=0.2,
            message=lambda: f"nothing pending; still {client.txn_list()}",
        )
        ended = {t.txn_id: t for t in txns_of(client, "spark-orders_upper")}
        for txn in killed_open:
            assert (ended[txn.txn_id].state, ended[txn.txn_id].reason) == ("aborted", "timed out")
        assert client.describe_topic("orders_upper").records == partial

        # The replayed batch keeps its logged range; the rest come 1000 at a time.
        args = [*common, "--records", str(total), "--per-trigger", "1000"]
        with driver_group(EXAMPLE, args, log, tmp_path) as example:
            try:
                status = example.wait(timeout=DRIVER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the restart did not end in time:\n{log_tail(log)}")
        assert status == 0, log_tail(log)
        summary = f"input {total}, output {total}, duplicates 0, missing 0"
        assert summary in log.read_text(), log_tail(log)

        output = values(client, "orders_upper")
        assert output == upper_values(client, "orders")
        assert sum(len(vs) for vs in output.values()) == total
        assert duplicates(output) == []
        assert client.txn_list() == []


@pytest.mark.parametrize("as_text", [False, True], ids=["binary", "string"])
def test_write_rows_become_records_column_by_column(as_text: bool) -> None:
    """What a write task journals for value / key / partition columns (no Spark needed):
    strings as their UTF-8 bytes, null keys and partitions as none, a null value a null
    value (Kafka's tombstone, as Kafka's sink writes it)."""
    kind = pa.string() if as_text else pa.binary()
    values: list[Any] = ["é", "b", ""] if as_text else [b"\xff", b"b", b""]
    keys: list[Any] = ["k", None, ""] if as_text else [b"k", None, b""]
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array(values, kind),
            "key": pa.array(keys, kind),
            "partition": pa.array([1, None, 0], pa.int32()),
        }
    )
    assert broker.spark.records_of(batch, "t") == {
        "t": [
            NewRecord("é".encode() if as_text else b"\xff", b"k", (), 1),
            NewRecord(b"b", None, (), None),
            NewRecord(b"", b"", (), 0),
        ]
    }
    only_values = batch.select(["value"])
    assert broker.spark.records_of(only_values, "t")["t"][0] == NewRecord(
        "é".encode() if as_text else b"\xff"
    )
    nulls = pa.RecordBatch.from_pydict({"value": pa.array([b"a", None], pa.binary())})
    assert broker.spark.records_of(nulls, "t") == {"t": [NewRecord(b"a"), NewRecord(None)]}


def test_a_null_header_value_is_written_null_and_a_null_header_key_refused() -> None:
    """Kafka's sink writes a header whose value is null; the write failed with a
    TypeError deep in the broker. It is stored null, as the Kafka listener keeps one."""
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

    def rows(header: dict[str, object]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {"value": pa.array([b"v"]), "headers": pa.array([[header]], headers_type)}
        )

    written = broker.spark.records_of(rows({"key": "trace", "value": None}), "t")
    assert written == {"t": [NewRecord(b"v", None, (("trace", None),), None)]}
    with pytest.raises(BrokerError, match="a header with a null key") as refused:
        broker.spark.records_of(rows({"key": None, "value": b"x"}), "t")
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT


def test_a_task_journals_rows_by_topic_as_columns_and_headers_as_records(
    data_dir: Path,
) -> None:
    """What a write task journals (no Spark needed): rows of a topic column go to their
    topics in row order, a headers column whose rows have none (a DataFrame read from
    fencelog carries one) is dropped, and rows with headers keep them; a row without a
    topic is refused before anything of its batch is journaled."""
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    routed = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"a1", b"b1", b"a2", b"b2"]),
            "topic": pa.array(["a", "b", "a", "b"]),
            "headers": pa.array([[], None, [], []], headers_type),
        }
    )
    headed = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"a3", b"b3"]),
            "topic": pa.array(["a", "b"]),
            "headers": pa.array([[{"key": "h", "value": b"1"}], []], headers_type),
        }
    )
    with connect(data_dir) as client:
        for topic in ("a", "b"):
            client.create_topic(topic)
        txn = client.txn_begin("g")
        written = broker.spark.journal_rows(client, txn.txn_id, "p0", iter([routed, headed]), None)
        assert written.records == 6
        client.txn_commit(txn.txn_id, members={"p0": written.generation})
        got = {t: client.fetch(t, {0: 0}, max_records=10) for t in ("a", "b")}
        assert [(r.value, r.headers) for r in got["a"]] == [
            (b"a1", ()),
            (b"a2", ()),
            (b"a3", (("h", b"1"),)),
        ]
        assert [(r.value, r.headers) for r in got["b"]] == [(b"b1", ()), (b"b2", ()), (b"b3", ())]
        lost = routed.set_column(1, "topic", pa.array(["a", None, "a", "b"]))
        txn = client.txn_begin("g")
        with pytest.raises(BrokerError, match="a row has no topic"):
            broker.spark.journal_rows(client, txn.txn_id, "p0", iter([lost]), None)
        assert client.txn_show(txn.txn_id).info.records == 0
