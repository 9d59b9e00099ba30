"""broker/engine/engine.py: topics, contiguous offsets, atomic batches, reads, the clock and
durability, through the public Engine API on a real SQLite file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import broker
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.types import DURABILITIES, NewRecord, ProducerFields, check_durability
from support.stored import stored_records


def values(records: list[broker.Record]) -> list[bytes | None]:
    return [r.value for r in records]


# topics -------------------------------------------------------------------------------


def test_create_and_describe_topic(engine: broker.Engine) -> None:
    info = engine.create_topic("orders", partitions=4)
    assert (info.name, info.partitions, info.records) == ("orders", 4, 0)
    described = engine.describe_topic("orders")
    assert [p.partition for p in described.partition_details] == [0, 1, 2, 3]
    assert engine.end_offsets("orders") == [0, 0, 0, 0]


def test_list_topics_is_sorted_by_name(engine: broker.Engine) -> None:
    for name in ("b", "c", "a"):
        engine.create_topic(name)
    assert [t.name for t in engine.list_topics()] == ["a", "b", "c"]


def test_creating_an_existing_topic_fails_and_keeps_it(engine: broker.Engine) -> None:
    engine.create_topic("orders", partitions=2)
    engine.produce("orders", [NewRecord(b"x", partition=1)])
    with pytest.raises(BrokerError) as excinfo:
        engine.create_topic("orders", partitions=5)
    assert excinfo.value.code is ErrorCode.TOPIC_EXISTS
    assert engine.describe_topic("orders").partitions == 2
    assert engine.end_offsets("orders") == [0, 1]


@pytest.mark.parametrize("name", ["", "x" * 250, "a b", ".."])
def test_create_topic_with_invalid_name_creates_nothing(engine: broker.Engine, name: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        engine.create_topic(name)
    assert excinfo.value.code is ErrorCode.INVALID_TOPIC_NAME
    assert engine.list_topics() == []


def test_create_topic_with_zero_partitions_is_invalid(engine: broker.Engine) -> None:
    with pytest.raises(BrokerError) as excinfo:
        engine.create_topic("orders", partitions=0)
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert engine.list_topics() == []


@pytest.mark.parametrize(
    "operation",
    [
        lambda e: e.describe_topic("nope"),
        lambda e: e.delete_topic("nope"),
        lambda e: e.produce("nope", [NewRecord(b"x")]),
        lambda e: e.read("nope", 0, 0),
    ],
    ids=["describe", "delete", "produce", "read"],
)
def test_unknown_topic(engine: broker.Engine, operation: Callable[[broker.Engine], object]) -> None:
    with pytest.raises(BrokerError) as excinfo:
        operation(engine)
    assert excinfo.value.code is ErrorCode.UNKNOWN_TOPIC
    assert excinfo.value.details["topic"] == "nope"


def test_delete_then_recreate_starts_at_offset_zero(engine: broker.Engine, data_dir: Path) -> None:
    engine.create_topic("orders", partitions=2)
    engine.produce("orders", [NewRecord(b"old", partition=p) for p in (0, 0, 1)])
    engine.delete_topic("orders")
    assert engine.list_topics() == []

    engine.create_topic("orders", partitions=2)
    assert engine.end_offsets("orders") == [0, 0]
    assert engine.read("orders", 0, 0) == []
    [result] = engine.produce("orders", [NewRecord(b"new", partition=0)])
    assert result.offset == 0
    assert values(engine.read("orders", 0, 0)) == [b"new"]
    assert [r["value"] for r in stored_records(data_dir / DB_FILE)] == [b"new"]


def test_deleting_one_topic_keeps_the_others(engine: broker.Engine) -> None:
    engine.create_topic("a")
    engine.create_topic("b")
    engine.produce("a", [NewRecord(b"in a")])
    engine.produce("b", [NewRecord(b"in b")])
    engine.delete_topic("a")
    assert [t.name for t in engine.list_topics()] == ["b"]
    assert values(engine.read("b", 0, 0)) == [b"in b"]


# offsets and batches ------------------------------------------------------------------


def test_offsets_are_contiguous_from_zero_per_partition(engine: broker.Engine) -> None:
    engine.create_topic("orders", partitions=3)
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for batch in range(5):
        records = [NewRecord(f"{batch}-{i}".encode(), partition=i % 3) for i in range(batch + 1)]
        for result in engine.produce("orders", records):
            seen[result.partition].append(result.offset)
    for partition, offsets in seen.items():
        assert offsets == list(range(len(offsets))), partition
        assert [r.offset for r in engine.read("orders", partition, 0)] == offsets
    assert engine.end_offsets("orders") == [len(seen[p]) for p in range(3)]


def test_results_come_back_in_input_order_across_partitions(engine: broker.Engine) -> None:
    engine.create_topic("orders", partitions=3)
    engine.produce("orders", [NewRecord(b"first", partition=1)])
    chosen = [2, 0, 1, 0, 2, 1]
    results = engine.produce(
        "orders", [NewRecord(f"v{i}".encode(), partition=p) for i, p in enumerate(chosen)]
    )
    assert [(r.topic, r.partition, r.offset) for r in results] == [
        ("orders", 2, 0),
        ("orders", 0, 0),
        ("orders", 1, 1),
        ("orders", 0, 1),
        ("orders", 2, 1),
        ("orders", 1, 2),
    ]
    for i, result in enumerate(results):
        [stored] = engine.read("orders", result.partition, result.offset, 1)
        assert stored.value == f"v{i}".encode()


def test_same_key_lands_in_one_partition(engine: broker.Engine) -> None:
    engine.create_topic("orders", partitions=4)
    results = engine.produce("orders", [NewRecord(b"v", key=b"k1")] * 3)
    results += engine.produce("orders", [NewRecord(b"w", key=b"k1")])
    assert len({r.partition for r in results}) == 1
    assert [r.offset for r in results] == [0, 1, 2, 3]


def test_records_without_key_spread_round_robin(engine: broker.Engine) -> None:
    engine.create_topic("orders", partitions=4)
    results = engine.produce("orders", [NewRecord(b"v")] * 8)
    assert sorted(engine.end_offsets("orders")) == [2, 2, 2, 2]
    assert len({r.partition for r in results[:4]}) == 4


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "in-a-transaction"])
def test_each_record_without_key_goes_to_the_next_partition(
    engine: broker.Engine, transactional: bool
) -> None:
    """Record by record in turn, across batches, and in each partition in batch order."""
    engine.create_topic("orders", partitions=3)
    values = [b"%d" % i for i in range(11)]
    if transactional:
        txn_id = engine.txn_begin("g").txn_id
        for chunk in (values[:5], values[5:]):
            engine.produce(
                "orders", [NewRecord(v) for v in chunk], producer=ProducerFields(txn_id=txn_id)
            )
        engine.txn_commit(txn_id)
    else:
        engine.produce("orders", [NewRecord(v) for v in values[:5]])
        engine.produce("orders", [NewRecord(v) for v in values[5:]])
    where = {
        record.value: record.partition
        for partition in range(3)
        for record in engine.read("orders", partition=partition, offset=0)
    }
    first = where[b"0"]
    assert [where[v] for v in values] == [(first + i) % 3 for i in range(11)]
    for partition in range(3):
        stored = [r.value for r in engine.read("orders", partition=partition, offset=0)]
        assert stored == [v for v in values if where[v] == partition]


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (NewRecord(b"x", partition=4), ErrorCode.UNKNOWN_PARTITION),
        (NewRecord(b"x", partition=-1), ErrorCode.UNKNOWN_PARTITION),
        (NewRecord(b"x" * 65), ErrorCode.RECORD_TOO_LARGE),
    ],
    ids=["partition-4", "partition-minus-1", "value-too-large"],
)
def test_a_failed_batch_appends_nothing(data_dir: Path, bad: NewRecord, code: ErrorCode) -> None:
    with broker.open(data_dir, limits=Limits(record_value_bytes_max=64)) as engine:
        engine.create_topic("orders", partitions=4)
        engine.produce("orders", [NewRecord(b"before", partition=p) for p in range(4)])
        batch = [NewRecord(b"a", partition=0), NewRecord(b"b", partition=3), bad]
        with pytest.raises(BrokerError) as excinfo:
            engine.produce("orders", batch)
        assert excinfo.value.code is code
        assert engine.end_offsets("orders") == [1, 1, 1, 1]
        for partition in range(4):
            assert values(engine.read("orders", partition, 0)) == [b"before"]
        # and the log goes on from where it was
        [result] = engine.produce("orders", [NewRecord(b"after", partition=0)])
        assert result.offset == 1
    assert sorted(r["value"] for r in stored_records(data_dir / DB_FILE)) == [
        b"after",
        *[b"before"] * 4,
    ]


# reads --------------------------------------------------------------------------------


@pytest.fixture
def ten(engine: broker.Engine) -> broker.Engine:
    engine.create_topic("orders", partitions=2)
    engine.produce("orders", [NewRecord(f"v{i}".encode(), partition=0) for i in range(10)])
    return engine


def test_read_from_an_offset(ten: broker.Engine) -> None:
    records = ten.read("orders", 0, 7)
    assert [(r.offset, r.value) for r in records] == [(7, b"v7"), (8, b"v8"), (9, b"v9")]
    assert {(r.topic, r.partition) for r in records} == {("orders", 0)}


def test_read_at_most_max_records(ten: broker.Engine) -> None:
    assert [r.offset for r in ten.read("orders", 0, 2, max_records=3)] == [2, 3, 4]
    assert [r.offset for r in ten.read("orders", 0, 8, max_records=5)] == [8, 9]
    assert [r.offset for r in ten.read("orders", 0, 0, max_records=1)] == [0]


def test_read_max_records_zero_returns_nothing(ten: broker.Engine) -> None:
    # the docstring promises "at most max_records"
    assert ten.read("orders", 0, 0, max_records=0) == []


def test_read_at_or_past_the_end_is_empty(ten: broker.Engine) -> None:
    assert ten.read("orders", 0, 10) == []
    assert ten.read("orders", 0, 1000) == []
    assert ten.read("orders", 1, 0) == []


def test_read_negative_offset_is_invalid(ten: broker.Engine) -> None:
    with pytest.raises(BrokerError) as excinfo:
        ten.read("orders", 0, -1)
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("partition", [2, -1])
def test_read_unknown_partition(ten: broker.Engine, partition: int) -> None:
    with pytest.raises(BrokerError) as excinfo:
        ten.read("orders", partition, 0)
    assert excinfo.value.code is ErrorCode.UNKNOWN_PARTITION


def test_read_stops_near_read_bytes_max_but_returns_at_least_one(data_dir: Path) -> None:
    with broker.open(data_dir, limits=Limits(read_bytes_max=25)) as engine:
        engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"x" * 10)] * 5)
        assert [r.offset for r in engine.read("orders", 0, 0)] == [0, 1]
        engine.produce("orders", [NewRecord(b"y" * 100)])
        assert [r.offset for r in engine.read("orders", 0, 5)] == [5]


# what a record carries ----------------------------------------------------------------


def test_headers_round_trip(engine: broker.Engine) -> None:
    engine.create_topic("orders")
    headers = (("trace", b"abc"), ("bin", b"\x00\xff\n"), ("trace", b"again"), ("empty", b""))
    engine.produce("orders", [NewRecord(b"v", headers=headers), NewRecord(b"w")])
    first, second = engine.read("orders", 0, 0)
    assert first.headers == headers
    assert second.headers == ()


def test_key_none_and_empty_key_are_distinct(engine: broker.Engine) -> None:
    engine.create_topic("orders")
    engine.produce(
        "orders",
        [NewRecord(b"v", key=None), NewRecord(b"v", key=b""), NewRecord(b"", key=b"\x00")],
    )
    assert [(r.key, r.value) for r in engine.read("orders", 0, 0)] == [
        (None, b"v"),
        (b"", b"v"),
        (b"\x00", b""),
    ]


def test_arbitrary_bytes_round_trip(engine: broker.Engine) -> None:
    engine.create_topic("orders")
    every_byte = bytes(range(256))
    engine.produce("orders", [NewRecord(every_byte, key=every_byte[::-1])])
    [record] = engine.read("orders", 0, 0)
    assert (record.key, record.value) == (every_byte[::-1], every_byte)


def test_records_carry_no_producer_fields_when_plain(engine: broker.Engine) -> None:
    engine.create_topic("orders")
    engine.produce("orders", [NewRecord(b"v")])
    [record] = engine.read("orders", 0, 0)
    assert (record.producer_id, record.generation, record.sequence, record.epoch) == (0, 0, 0, 0)
    assert record.txn_id is None


def test_injected_clock_sets_timestamps(data_dir: Path) -> None:
    with broker.open(data_dir, clock=lambda: 1234) as engine:
        info = engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"a"), NewRecord(b"b", timestamp_ms=99)])
        assert info.created_ms == 1234
        assert [r.timestamp_ms for r in engine.read("orders", 0, 0)] == [1234, 99]


# durability ---------------------------------------------------------------------------


def synchronous(engine: broker.Engine) -> int:
    return int(engine.database.conn.execute("PRAGMA synchronous").fetchone()[0])


def test_default_durability_is_full(engine: broker.Engine) -> None:
    assert engine.status().durability == "full"
    assert synchronous(engine) == 2  # FULL


def test_durability_normal_is_accepted(data_dir: Path) -> None:
    with broker.open(data_dir, durability="normal") as engine:
        assert engine.status().durability == "normal"
        assert synchronous(engine) == 1  # NORMAL
        engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"v")])
    with broker.open(data_dir) as engine:
        assert values(engine.read("orders", 0, 0)) == [b"v"]


def test_unknown_durability_is_invalid(data_dir: Path) -> None:
    with pytest.raises(BrokerError) as excinfo:
        broker.open(data_dir, durability="sometimes")  # type: ignore[arg-type]
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert "sometimes" in excinfo.value.message


def test_check_durability_returns_each_level_and_refuses_anything_else() -> None:
    """The one check every entry point (CLI, connect, Engine.open, Server) calls."""
    assert DURABILITIES == ("full", "normal")
    assert [check_durability(d) for d in DURABILITIES] == ["full", "normal"]
    for unknown in ("sometimes", "FULL", "", " full", None, 1):
        with pytest.raises(BrokerError) as excinfo:
            check_durability(unknown)
        assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
        assert excinfo.value.message == f"unknown durability {unknown!r}"
        assert excinfo.value.hint == "use full or normal"


def test_status_reports_every_partitions_end_offset(engine: broker.Engine, data_dir: Path) -> None:
    engine.create_topic("b", partitions=2)
    engine.create_topic("a")
    engine.produce("b", [NewRecord(b"x", partition=1)] * 3)
    status = engine.status()
    assert status.data_dir == str(data_dir.resolve())
    assert [(t.name, [p.end_offset for p in t.partition_details]) for t in status.topics] == [
        ("a", [0]),
        ("b", [0, 3]),
    ]
