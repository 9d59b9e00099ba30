"""The connector where a user of Spark's own Kafka source and sink expects the same
behaviour: the topic option over a topic column, data loss failing a stream, unknown
options refused, Kafka's option names and offset JSON, subscribe and subscribePattern, a
batch job outliving its transaction timeout, fencelog's message on the first line of the
error, and the topics named in a stream's progress."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import broker.spark
from broker.client.client import Client
from broker.errors import BrokerError, ErrorCode
from broker.types import NewRecord, TopicConfig
from support.spark_jobs import (
    Broker,
    first_line,
    read,
    read_stream,
    run_to_end,
    txns_of,
    values,
    write,
)

STAMP = 1_700_000_000_000  # record i of a partition is stamped STAMP + i * 1000


def refused(action: Callable[[], object]) -> str:
    """The first line of the error a Spark action fails with."""
    with pytest.raises(PySparkException) as excinfo:
        action()
    assert "Traceback" not in str(excinfo.value), str(excinfo.value)
    return first_line(excinfo)


def stamped(client: Client, topic: str, partition: int, count: int) -> None:
    records = [
        NewRecord(f"{topic}-{partition}-{i}".encode(), None, (), partition, STAMP + i * 1000)
        for i in range(count)
    ]
    client.produce(topic, records)


def offsets(df: DataFrame) -> list[tuple[str, int, int]]:
    return sorted(
        (r.topic, r.partition, r.offset)
        for r in df.select("topic", "partition", "offset").collect()
    )


def span(topic: str, partition: int, start: int, end: int) -> list[tuple[str, int, int]]:
    return [(topic, partition, o) for o in range(start, end)]


def copy_stream(
    spark: SparkSession,
    url: str,
    checkpoint: Path,
    sink: str = "out",
    **options: str | int,
) -> StreamingQuery:
    """One availableNow run of the fencelog source (topic, subscribe or subscribePattern
    among options) into the topic sink, value as is."""
    reader = spark.readStream.format("fencelog").option("broker", url)
    reader = reader.option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    writer = reader.load().select("value").writeStream.option("broker", url).option("topic", sink)
    return run_to_end(writer, "fencelog", checkpoint)


def rows_of(query: StreamingQuery) -> list[int]:
    return [int(p["numInputRows"]) for p in query.recentProgress if int(p["numInputRows"]) > 0]


# writing ------------------------------------------------------------------------------------


def test_the_topic_option_overrides_a_topic_column(spark: SparkSession, embedded: Broker) -> None:
    """As Spark's Kafka sink: with .option('topic') every row goes there, whatever its
    topic column says; without it, the column chooses."""
    with embedded.client() as client:
        for topic in ("out", "other"):
            client.create_topic(topic)
    df = spark.createDataFrame([("a", "other"), ("b", "other")], "value string, topic string")
    write(df, embedded.url, "out")
    with embedded.client() as client:
        assert sorted(values(client, "out")[0]) == [b"a", b"b"]
        assert values(client, "other") == {0: []}
    write(df, embedded.url, None)
    with embedded.client() as client:
        assert sorted(values(client, "other")[0]) == [b"a", b"b"]


def test_a_null_value_is_written_and_read_null(spark: SparkSession, embedded: Broker) -> None:
    """As Kafka's sink and source: a row whose value is null is a null record value
    (a tombstone), distinct from an empty one, both ways."""
    with embedded.client() as client:
        client.create_topic("nulls")
    df = spark.createDataFrame([("k1", None), ("k2", "")], "key string, value string")
    write(df, embedded.url, "nulls")
    with embedded.client() as client:
        stored = sorted((r.key, r.value) for r in client.consume("nulls") if r.key is not None)
    assert stored == [(b"k1", None), (b"k2", b"")]
    rows = read(spark, embedded.url, "nulls").select("key", "value").collect()
    assert sorted((bytes(r.key), r.value) for r in rows) == [(b"k1", None), (b"k2", b"")]


# options ------------------------------------------------------------------------------------


def test_unknown_options_are_refused_with_the_known_ones(
    spark: SparkSession, embedded: Broker
) -> None:
    with embedded.client() as client:
        client.create_topic("orders")
        client.produce("orders", [b"x"])
    url = embedded.url
    line = refused(lambda: read(spark, url, "orders", startingOffset="earliest").collect())
    assert (
        "unknown option 'startingoffset' for reading fencelog (did you mean startingOffsets?)"
        in line
    )
    assert "the options are broker, authTokenFile, topic, subscribe, subscribePattern, " in line
    assert "maxOffsetsPerTrigger, minPartitions [INVALID_ARGUMENT]" in line
    line = refused(
        lambda: read(spark, url, "orders", **{"kafka.bootstrap.servers": "h:9092"}).collect()
    )
    assert "fencelog takes the broker's address as .option('broker', URL)" in line
    line = refused(
        lambda: spark.read.format("fencelog").option("topic", "orders").load("orders").collect()
    )
    assert "the fencelog format takes no path" in line
    df = spark.createDataFrame([("v",)], "value string")
    line = refused(lambda: write(df, url, "orders", startingOffsets="earliest"))
    assert "unknown option 'startingoffsets' for writing fencelog" in line
    assert (
        "the options are broker, authTokenFile, topic, transactionalGroup, transactionTimeout"
        in line
    )
    line = refused(
        lambda: read(spark, url, "orders", maxOffsetsPerTrigger=3, maxRecordsPerTrigger=4).collect()
    )
    assert "maxRecordsPerTrigger (4) and maxOffsetsPerTrigger (3) are one option" in line
    with embedded.client() as client:
        assert values(client, "orders") == {0: [b"x"]}


def test_kafka_option_names_and_offsets_by_time(spark: SparkSession, embedded: Broker) -> None:
    """startingTimestamp, startingOffsetsByTimestamp, endingOffsetsByTimestamp (the first
    record at or after the time), Kafka's offset JSON with the topic named, and
    minPartitions splitting the read into at least that many tasks."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        stamped(client, "orders", 0, 10)
        stamped(client, "orders", 1, 6)
    url = embedded.url
    everything = span("orders", 0, 0, 10) + span("orders", 1, 0, 6)

    assert offsets(read(spark, url, "orders", startingTimestamp=STAMP + 4000)) == span(
        "orders", 0, 4, 10
    ) + span("orders", 1, 4, 6)
    by_time = json.dumps({"orders": {"0": STAMP + 7500}})
    assert offsets(read(spark, url, "orders", startingOffsetsByTimestamp=by_time)) == span(
        "orders", 0, 8, 10
    ) + span("orders", 1, 0, 6)
    ending = json.dumps({"orders": {"1": STAMP + 2000}})
    assert offsets(read(spark, url, "orders", endingOffsetsByTimestamp=ending)) == span(
        "orders", 0, 0, 10
    ) + span("orders", 1, 0, 2)
    # the time wins over the offsets, as in Kafka's source
    assert (
        offsets(read(spark, url, "orders", startingTimestamp=STAMP, startingOffsets='{"0": 9}'))
        == everything
    )

    late = STAMP + 60_000
    line = refused(lambda: read(spark, url, "orders", startingTimestamp=late).collect())
    assert f"no record of orders/0 at or after {late} ms" in line
    assert "startingOffsetsByTimestampStrategy=latest" in line
    assert (
        offsets(
            read(
                spark,
                url,
                "orders",
                startingTimestamp=late,
                startingOffsetsByTimestampStrategy="latest",
            )
        )
        == []
    )
    line = refused(lambda: read(spark, url, "orders", startingTimestamp="yesterday").collect())
    assert "startingTimestamp: a time is milliseconds since the epoch, not 'yesterday'" in line
    line = refused(
        lambda: read(spark, url, "orders", startingOffsets=json.dumps({"nope": {"0": 1}})).collect()
    )
    assert "startingOffsets names topic 'nope', which this read does not subscribe to" in line

    split = read(spark, url, "orders", minPartitions=8)
    assert split.rdd.getNumPartitions() >= 8
    assert offsets(split) == everything
    assert read(spark, url, "orders").rdd.getNumPartitions() == 2


def test_max_offsets_per_trigger_caps_each_micro_batch(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    with embedded.client() as client:
        client.create_topic("orders")
        client.create_topic("out")
        client.produce("orders", [f"o{i}".encode() for i in range(10)])
    query = copy_stream(
        spark, embedded.url, tmp_path / "ck", topic="orders", maxOffsetsPerTrigger=4
    )
    assert rows_of(query) == [4, 4, 2]
    with embedded.client() as client:
        assert values(client, "out") == values(client, "orders")


# subscribe ----------------------------------------------------------------------------------


def test_subscribe_and_subscribe_pattern(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """subscribe reads a comma list of topics; subscribePattern every topic whose whole
    name matches, and a stream picks up a matching topic created later, from its start.
    The stream's offsets name the topics (Kafka's form), so its progress does too."""
    url = embedded.url
    with embedded.client() as client:
        for topic in ("orders-eu", "orders-us", "audit", "out"):
            client.create_topic(topic)
        for topic in ("orders-eu", "orders-us", "audit"):
            client.produce(topic, [f"{topic}-{i}".encode() for i in range(3)])

    def topics_read(**options: str) -> list[str]:
        reader = spark.read.format("fencelog").option("broker", url)
        for name, value in options.items():
            reader = reader.option(name, value)
        return sorted({r.topic for r in reader.load().select("topic").collect()})

    assert topics_read(subscribe="orders-eu, audit") == ["audit", "orders-eu"]
    assert topics_read(subscribePattern="orders-.*") == ["orders-eu", "orders-us"]
    assert topics_read(subscribePattern="orders") == []  # the whole name must match
    line = refused(lambda: topics_read(topic="audit", subscribe="audit"))
    assert "one of them, not topic, subscribe" in line
    line = refused(lambda: topics_read(subscribePattern="orders-("))
    assert "subscribePattern 'orders-(' is not a regular expression" in line
    line = refused(lambda: topics_read(subscribe="audit,nope"))
    assert "topic nope does not exist (create it with: fencelog topic create nope)" in line

    checkpoint = tmp_path / "ck"
    first = copy_stream(spark, url, checkpoint, subscribePattern="orders-.*")
    assert sum(rows_of(first)) == 6
    progress = first.lastProgress
    assert progress is not None
    assert json.loads(progress["sources"][0]["endOffset"]) == {
        "orders-eu": {"0": 3},
        "orders-us": {"0": 3},
    }
    assert broker.spark.offsets_behind(progress) == {"orders-eu": {"0": 0}, "orders-us": {"0": 0}}

    with embedded.client() as client:
        client.create_topic("orders-asia")
        client.produce("orders-asia", [b"asia-0", b"asia-1"])
        client.produce("orders-eu", [b"eu-late"])
    second = copy_stream(spark, url, checkpoint, subscribePattern="orders-.*")
    assert sum(rows_of(second)) == 3
    with embedded.client() as client:
        out = sorted(values(client, "out")[0])
        expected = sorted(
            v for t in ("orders-eu", "orders-us", "orders-asia") for v in values(client, t)[0]
        )
        assert out == expected


def test_offsets_behind_latest_from_a_capped_stream(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """With maxRecordsPerTrigger a micro-batch leaves records behind: offsets_behind
    says how many, per topic partition, from the query's progress."""
    with embedded.client() as client:
        client.create_topic("orders", 2)
        client.create_topic("out", 2)
        for p in (0, 1):
            client.produce("orders", [f"{p}-{i}".encode() for i in range(6)], partition=p)
    query = (
        read_stream(spark, embedded.url, "orders", maxRecordsPerTrigger=4)
        .select("value")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    behind = [broker.spark.offsets_behind(p) for p in query.recentProgress if p["numInputRows"]]
    assert behind[0] == {"orders": {"0": 4, "1": 4}}
    assert behind[-1] == {"orders": {"0": 0, "1": 0}}


# data loss ----------------------------------------------------------------------------------


def test_a_recreated_topic_fails_the_stream_unless_told_otherwise(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    """The topic is deleted and created again with fewer records under a checkpointed
    stream: the next run fails naming failOnDataLoss instead of reading nothing; with
    failOnDataLoss false it reads the new topic from its start."""
    url, checkpoint = embedded.url, tmp_path / "ck"
    with embedded.client() as client:
        client.create_topic("orders")
        client.create_topic("out")
        client.produce("orders", [f"old-{i}".encode() for i in range(6)])
    assert sum(rows_of(copy_stream(spark, url, checkpoint, topic="orders"))) == 6
    with embedded.client() as client:
        client.delete_topic("orders")
        client.create_topic("orders")
        client.produce("orders", [b"new-0", b"new-1"])
    line = refused(lambda: copy_stream(spark, url, checkpoint, topic="orders"))
    assert "orders/0 ends at 2, before this query's position 6" in line
    assert "failOnDataLoss" in line
    again = copy_stream(spark, url, checkpoint, topic="orders", failOnDataLoss="false")
    assert sum(rows_of(again)) == 2
    with embedded.client() as client:
        assert values(client, "out")[0][-2:] == [b"new-0", b"new-1"]
        assert len(values(client, "out")[0]) == 8


def test_records_retention_deleted_under_a_stream_fail_it_unless_told_otherwise(
    spark: SparkSession, embedded: Broker, tmp_path: Path
) -> None:
    url, checkpoint = embedded.url, tmp_path / "ck"
    with embedded.client() as client:
        client.create_topic("orders", config=TopicConfig(retention_ms=60_000))
        client.create_topic("out")
        client.produce("orders", [NewRecord(b"old-0", None, (), 0, 1_000)])
    assert sum(rows_of(copy_stream(spark, url, checkpoint, topic="orders"))) == 1
    with embedded.client() as client:  # old records the stream never read, then cleaned
        client.produce("orders", [NewRecord(b"old", None, (), 0, 1_000) for _ in range(3)])
        client.produce("orders", [b"fresh-4"])
        assert client.clean_topic("orders") == 4
    line = refused(lambda: copy_stream(spark, url, checkpoint, topic="orders"))
    assert "orders/0 starts at 4: records 1..3 were deleted" in line
    again = copy_stream(spark, url, checkpoint, topic="orders", failOnDataLoss="false")
    assert sum(rows_of(again)) == 1
    with embedded.client() as client:
        assert values(client, "out") == {0: [b"old-0", b"fresh-4"]}


# a long batch job ---------------------------------------------------------------------------


def slow_rows(seconds: float) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function that takes `seconds` before passing its rows on (shipped
    to the workers by value: a closure)."""

    def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        time.sleep(seconds)
        yield from batches

    return slow


def test_a_batch_job_longer_than_its_transaction_timeout_commits(
    spark: SparkSession, embedded: Broker
) -> None:
    """The driver keeps the job's transaction alive while it runs: a job three times as
    long as transactionTimeout commits whole."""
    with embedded.client() as client:
        client.create_topic("out")
    df = spark.createDataFrame([(f"v{i}",) for i in range(8)], "value string").repartition(2)
    slow = df.mapInArrow(slow_rows(6.0), df.schema)
    write(slow, embedded.url, "out", transactionTimeout=2_000)
    with embedded.client() as client:
        assert sorted(values(client, "out")[0]) == sorted(f"v{i}".encode() for i in range(8))
        [txn] = txns_of(client, "spark-out")
        assert txn.state == "committed"


# option errors that need no Spark ----------------------------------------------------------


def test_option_errors_said_before_any_job(tmp_path: Path) -> None:
    """What the connector refuses when Spark plans a job, each with its message: a token
    file that cannot be read, a subscribe list naming no topic, and a checkpoint of the
    one-topic offset form under a query that reads several topics."""
    missing = tmp_path / "nope"
    with pytest.raises(BrokerError) as excinfo:
        broker.spark.Options.parse({"authTokenFile": str(missing), "topic": "t"})
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert excinfo.value.message == f"authTokenFile {missing}: No such file or directory"
    assert (
        excinfo.value.hint
        == "the driver reads it when Spark plans the job: give a path on the driver"
    )

    with pytest.raises(BrokerError) as excinfo:
        broker.spark.Subscription.of(broker.spark.Options.parse({"subscribe": " , "}))
    assert excinfo.value.message == "option subscribe names no topic: ' , '"

    with pytest.raises(BrokerError) as excinfo:
        broker.spark.from_spark({"0": 5}, ["orders", "audit"])
    assert excinfo.value.message == (
        'the checkpoint\'s offsets {"0": 5} name no topic; this query reads 2 topics'
    )
    assert broker.spark.from_spark({"0": 5}, ["orders"]) == {"orders": {0: 5}}
