"""The readers driven directly, without a SparkSession: a stream while its topics change
under a running query (deleted, created again, failOnDataLoss true and false), Spark's
micro-batch calls (latestOffset, partitions, read, commit) made here in Spark's order so
that each change lands exactly between two micro-batches; and the options a batch or a
stream refuses where Spark's Kafka source does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.spark import BatchReader, Options, StreamReader

Offsets = dict[str, dict[str, int]]


def stream(data_dir: Path, **options: str) -> StreamReader:
    return StreamReader(Options.parse({"broker": str(data_dir), **options}))


def micro_batch(reader: StreamReader, start: Offsets) -> tuple[Offsets, list[bytes]]:
    """One micro-batch from start, as Spark runs it: its end offsets and the values read."""
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    values: list[bytes] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            values += batch.column("value").to_pylist()
    reader.commit(end)
    return end, values


@pytest.fixture
def client(data_dir: Path) -> Any:
    with connect(data_dir) as opened:
        yield opened


def recreate(client: Client, topic: str, values: list[bytes]) -> None:
    client.delete_topic(topic)
    client.create_topic(topic)
    client.produce(topic, values)


def numbered(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


def test_a_topic_created_again_with_more_records_is_read_from_its_start(
    client: Client, data_dir: Path
) -> None:
    """failOnDataLoss false: the new topic's offsets 0..9 used to be skipped, the old
    position (10) standing in the new topic of 15 records."""
    client.create_topic("r")
    client.produce("r", numbered("old", 10))
    reader = stream(data_dir, topic="r", startingOffsets="earliest", failOnDataLoss="false")
    end, first = micro_batch(reader, reader.initialOffset())
    assert first == numbered("old", 10)
    recreate(client, "r", numbered("new", 15))
    end, second = micro_batch(reader, end)
    assert second == numbered("new", 15)
    assert end == {"r": {"0": 15}}
    client.produce("r", [b"later"])
    assert micro_batch(reader, end)[1] == [b"later"]


def test_a_topic_created_again_fails_the_stream_by_default(client: Client, data_dir: Path) -> None:
    client.create_topic("r")
    client.produce("r", numbered("old", 10))
    reader = stream(data_dir, topic="r", startingOffsets="earliest")
    end, _ = micro_batch(reader, reader.initialOffset())
    recreate(client, "r", numbered("new", 15))
    with pytest.raises(BrokerError) as failed:
        micro_batch(reader, end)
    assert failed.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert "topic r was deleted and created again" in failed.value.message
    assert "failOnDataLoss" in failed.value.message


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_a_deleted_topic_is_data_loss_not_an_unknown_topic(
    client: Client, data_dir: Path, restarted: bool
) -> None:
    """A topic the query read, deleted: data loss naming failOnDataLoss, whether the
    query runs on or starts again from its checkpoint (it was UNKNOWN_TOPIC)."""
    client.create_topic("d")
    client.produce("d", numbered("v", 3))
    reader = stream(data_dir, subscribe="d", startingOffsets="earliest")
    end, _ = micro_batch(reader, reader.initialOffset())
    client.delete_topic("d")
    if restarted:
        reader = stream(data_dir, subscribe="d", startingOffsets="earliest")
    with pytest.raises(BrokerError) as failed:
        micro_batch(reader, end)
    assert failed.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert "topic d was deleted" in failed.value.message


def test_without_failing_a_deleted_topic_is_waited_for_and_read_when_back(
    client: Client, data_dir: Path
) -> None:
    client.create_topic("d")
    client.create_topic("e")
    client.produce("d", numbered("d", 3))
    reader = stream(data_dir, subscribe="d,e", startingOffsets="earliest", failOnDataLoss="false")
    end, first = micro_batch(reader, reader.initialOffset())
    assert first == numbered("d", 3)
    client.delete_topic("d")
    client.produce("e", [b"e0"])
    end, second = micro_batch(reader, end)
    assert second == [b"e0"]
    assert end == {"e": {"0": 1}}
    client.create_topic("d")
    client.produce("d", [b"back"])
    assert micro_batch(reader, end)[1] == [b"back"]


def test_a_topic_that_never_existed_is_still_unknown(client: Client, data_dir: Path) -> None:
    reader = stream(data_dir, subscribe="nosuch", failOnDataLoss="false")
    with pytest.raises(BrokerError) as failed:
        reader.initialOffset()
    assert failed.value.code is ErrorCode.UNKNOWN_TOPIC


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("endingOffsets", '{"t": {"0": 5}}'),
        ("endingTimestamp", "1700000000000"),
        ("endingOffsetsByTimestamp", '{"t": {"0": 1700000000000}}'),
    ],
)
def test_a_stream_refuses_ending_options(data_dir: Path, name: str, value: str) -> None:
    """Spark's Kafka source refuses them in a streaming query; they were ignored."""
    with pytest.raises(BrokerError) as refused:
        stream(data_dir, topic="t", **{name: value})
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert f"option {name} is for a batch read" in refused.value.message


@pytest.mark.parametrize(
    ("name", "value", "word"),
    [
        ("startingOffsets", "latest", "latest"),
        ("startingOffsets", '{"t": {"0": -1}}', "latest"),
        ("endingOffsets", "earliest", "earliest"),
        ("endingOffsets", '{"0": -2}', "earliest"),
    ],
)
def test_a_batch_read_refuses_bounds_that_read_nothing(
    client: Client, data_dir: Path, name: str, value: str, word: str
) -> None:
    """They read nothing of a partition (the read was empty); Kafka's source refuses them
    in a batch query."""
    client.create_topic("t")
    with pytest.raises(BrokerError) as refused:
        BatchReader(Options.parse({"broker": str(data_dir), "topic": "t", name: value}))
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert f"{name} {word} " in refused.value.message
    assert "not allowed in a batch read" in refused.value.message
