"""Retention and compaction (broker/engine/cleaner.py): what is deleted, what the log
start offset says, and what the seeds' rules keep relying on afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.types import NewRecord, ProducerFields, TopicConfig

DAY_MS = 24 * 3600 * 1000
NOW_MS = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(data_dir: Path, clock: Clock) -> Iterator[Engine]:
    limits = replace(DEFAULT_LIMITS, clean_step_records=7, tombstone_retention_ms=DAY_MS)
    opened = Engine.open(data_dir, durability="normal", limits=limits, clock=clock)
    yield opened
    opened.close()


def stamped(values: list[bytes], at_ms: int, key: bytes | None = None) -> list[NewRecord]:
    return [NewRecord(v, key, (), 0, at_ms) for v in values]


def offsets(engine: Engine, topic: str, start: int = 0) -> list[int]:
    return [r.offset for r in engine.fetch(topic, {0: start}, None)]


def test_retention_by_time_deletes_the_front_and_moves_the_log_start(engine: Engine) -> None:
    engine.create_topic("events", config=TopicConfig(retention_ms=DAY_MS))
    engine.produce("events", stamped([b"old"] * 20, NOW_MS - 2 * DAY_MS))
    engine.produce("events", stamped([b"new"] * 3, NOW_MS - 1000))
    assert engine.clean_topic("events") == 20  # in steps of 7: several transactions
    (part,) = engine.describe_topic("events").partition_details
    assert (part.start_offset, part.end_offset, part.records, part.bytes) == (20, 23, 3, 9)
    assert offsets(engine, "events", 20) == [20, 21, 22]
    with pytest.raises(BrokerError) as gone:
        engine.fetch("events", {0: 5}, None)
    assert gone.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert gone.value.details["start_offset"] == 20
    assert engine.clean_topic("events") == 0  # nothing more is old enough


def test_a_newer_record_stops_retention_even_before_older_ones(engine: Engine) -> None:
    """The front is cut, never a record behind a newer one (timestamps out of order)."""
    engine.create_topic("events", config=TopicConfig(retention_ms=DAY_MS))
    engine.produce("events", stamped([b"a"], NOW_MS - 2 * DAY_MS))
    engine.produce("events", stamped([b"b"], NOW_MS))
    engine.produce("events", stamped([b"c"], NOW_MS - 3 * DAY_MS))
    assert engine.clean_topic("events") == 1
    assert offsets(engine, "events", 1) == [1, 2]


def test_retention_by_bytes_keeps_each_partition_under_its_size(engine: Engine) -> None:
    engine.create_topic("sized", config=TopicConfig(retention_bytes=50))
    for _ in range(12):  # a batch each: retention deletes whole batches
        engine.produce("sized", stamped([b"x" * 10], NOW_MS))
    engine.produce("sized", stamped([b"y" * 10] * 3, NOW_MS))
    assert engine.clean_topic("sized") == 10
    (part,) = engine.describe_topic("sized").partition_details
    assert (part.start_offset, part.bytes) == (10, 50)
    # 30 bytes too many: two batches of 10 free 20, so the batch of 3 goes whole
    engine.produce("sized", stamped([b"z" * 10] * 3, NOW_MS))
    assert engine.clean_topic("sized") == 5
    (part,) = engine.describe_topic("sized").partition_details
    assert (part.start_offset, part.bytes) == (15, 30)


def test_compaction_keeps_the_newest_of_each_key_with_offsets_unchanged(
    engine: Engine,
) -> None:
    engine.create_topic("state", config=TopicConfig(cleanup="compact"))
    for round_ in range(5):
        engine.produce(
            "state",
            [NewRecord(b"v%d-%d" % (round_, k), b"k%d" % k) for k in range(4)],
        )
    expected = [(r.offset, r.key, r.value) for r in engine.read_compacted("state", 0)]
    assert engine.clean_topic("state") == 16
    after = [(r.offset, r.key, r.value) for r in engine.fetch("state", {0: 0}, None)]
    assert after == expected == [(16 + k, b"k%d" % k, b"v4-%d" % k) for k in range(4)]
    assert offsets(engine, "state", 3) == [16, 17, 18, 19]  # a read inside a gap goes on
    assert engine.describe_topic("state").partition_details[0].end_offset == 20


def test_a_tombstone_goes_once_it_is_old_enough(engine: Engine, clock: Clock) -> None:
    engine.create_topic("state", config=TopicConfig(cleanup="compact"))
    engine.produce("state", [NewRecord(b"v", b"gone"), NewRecord(b"w", b"kept")])
    engine.produce("state", [NewRecord(b"", b"gone")])  # the tombstone
    assert engine.clean_topic("state") == 1
    assert [(r.key, r.value) for r in engine.fetch("state", {0: 0}, None)] == [
        (b"kept", b"w"),
        (b"gone", b""),
    ]
    clock.now_ms += DAY_MS + 1
    assert engine.clean_topic("state") == 1
    assert [r.key for r in engine.fetch("state", {0: 0}, None)] == [b"kept"]


def test_a_null_value_is_the_tombstone_and_goes_once_old_enough_with_its_batch_kept(
    engine: Engine, clock: Clock
) -> None:
    """Kafka's tombstone, a null value: kept as null (not empty) while it is young,
    removed from inside its batch once old enough; an empty value beside it stays a
    tombstone too (fencelog's rule before nulls); a null that a later record of its key
    supersedes goes at once, as any superseded record does."""
    engine.create_topic("state", config=TopicConfig(cleanup="compact"))
    engine.produce("state", [NewRecord(b"v", b"gone"), NewRecord(b"w", b"kept")])
    engine.produce("state", [NewRecord(None, b"back"), NewRecord(b"x", b"back")])
    engine.produce(
        "state",
        [NewRecord(None, b"gone"), NewRecord(b"y", b"live"), NewRecord(b"", b"kept")],
    )
    assert engine.clean_topic("state") == 3  # superseded: gone's v, kept's w, back's null
    young = [(r.offset, r.key, r.value) for r in engine.fetch("state", {0: 0}, None)]
    assert young == [(3, b"back", b"x"), (4, b"gone", None), (5, b"live", b"y"), (6, b"kept", b"")]
    clock.now_ms += DAY_MS + 1
    assert engine.clean_topic("state") == 2
    old = [(r.offset, r.key, r.value) for r in engine.fetch("state", {0: 0}, None)]
    assert old == [(3, b"back", b"x"), (5, b"live", b"y")]


def test_a_compacted_topic_refuses_records_without_a_key(engine: Engine) -> None:
    engine.create_topic("state", config=TopicConfig(cleanup="compact"))
    with pytest.raises(BrokerError, match="every record needs a key") as refused:
        engine.produce("state", [NewRecord(b"k", b"key"), NewRecord(b"no key")])
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert engine.describe_topic("state").partition_details[0].end_offset == 0


def test_an_idempotent_retry_of_deleted_records_is_still_a_duplicate(
    engine: Engine, data_dir: Path, clock: Clock
) -> None:
    engine.create_topic("events", config=TopicConfig(retention_ms=DAY_MS))
    lease = engine.lease_pid("events", 0)
    fields = ProducerFields(lease.producer_id, lease.generation, 1)
    first = engine.produce("events", stamped([b"a", b"b"], NOW_MS - 2 * DAY_MS), producer=fields)
    assert [r.offset for r in first] == [0, 1]
    assert engine.clean_topic("events") == 2
    retried = engine.produce("events", stamped([b"a", b"b"], NOW_MS), producer=fields)
    assert [(r.offset, r.duplicate) for r in retried] == [(-1, True), (-1, True)]
    engine.close()
    reopened = Engine.open(data_dir, durability="normal", clock=clock)  # from the snapshot
    try:
        again = reopened.produce("events", stamped([b"a", b"b"], NOW_MS), producer=fields)
        assert [r.duplicate for r in again] == [True, True]
        nxt = reopened.produce(
            "events", stamped([b"c"], NOW_MS), producer=fields._replace(first_sequence=3)
        )
        assert [r.offset for r in nxt] == [2]
    finally:
        reopened.close()


def test_open_transactions_committed_offsets_and_fences_outlive_cleaning(
    engine: Engine,
) -> None:
    engine.create_topic("events", config=TopicConfig(retention_ms=DAY_MS))
    engine.produce("events", stamped([b"old"] * 3, NOW_MS - 2 * DAY_MS))
    engine.commit_offsets("billing", "events", {0: 1})
    txn = engine.txn_begin("copier")
    engine.produce(
        "events",
        stamped([b"in-txn"], NOW_MS - 2 * DAY_MS),
        producer=ProducerFields(txn_id=txn.txn_id),
    )
    assert engine.clean_topic("events") == 3
    committed = engine.commit_offsets  # the group's offset below the log start stays
    assert [
        (r.partition, r.next_offset) for r in engine.committed_offsets("billing", "events")
    ] == [(0, 1)]
    assert committed is not None
    engine.txn_commit(txn.txn_id)  # journaled, never in the log: cleaning did not touch it
    assert [r.value for r in engine.fetch("events", {0: 3}, None)] == [b"in-txn"]


def test_partitions_grow_and_never_shrink(engine: Engine) -> None:
    engine.create_topic("grow", 2)
    assert engine.alter_topic("grow", partitions=5).partitions == 5
    engine.produce("grow", [NewRecord(b"x", None, (), 4)])
    with pytest.raises(BrokerError, match="never removed") as refused:
        engine.alter_topic("grow", partitions=3)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert engine.describe_topic("grow").partitions == 5


@pytest.mark.parametrize(
    "config",
    [TopicConfig(retention_ms=0), TopicConfig(retention_bytes=-1), TopicConfig(cleanup="tidy")],
)
def test_a_bad_config_is_refused_and_changes_nothing(engine: Engine, config: TopicConfig) -> None:
    with pytest.raises(BrokerError) as refused:
        engine.create_topic("bad", config=config)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert [t.name for t in engine.list_topics()] == []


def test_owner_fences_and_epochs_stay_as_they_were(engine: Engine) -> None:
    engine.create_topic("owned", owner_group="leaders", config=TopicConfig(retention_ms=DAY_MS))
    session = engine.owners.register_process()
    (claimed,) = engine.owners.own(session, "leaders", [("owned/0", 1)]).claimed
    fence = claimed.fence
    engine.produce("owned", stamped([b"old"] * 3, NOW_MS - 2 * DAY_MS), fences=[fence])
    epoch_before = engine.topic_access("owned").epoch
    assert engine.clean_topic("owned") == 3
    assert engine.topic_access("owned").epoch == epoch_before
    written = engine.produce("owned", stamped([b"new"], NOW_MS), fences=[fence])
    assert [r.offset for r in written] == [3]
    with pytest.raises(BrokerError) as unfenced:
        engine.produce("owned", stamped([b"no fence"], NOW_MS))
    assert unfenced.value.code is ErrorCode.FENCED


def test_records_below_an_offset_are_deleted_in_steps(engine: Engine) -> None:
    engine.create_topic("trimmed", 2)
    engine.produce("trimmed", stamped([b"v"] * 20, NOW_MS))
    assert engine.delete_records_below("trimmed", 0, 16) == 16  # inside the batch
    part = engine.describe_topic("trimmed").partition_details[0]
    # the batch holding the new start stays (its bytes too) until all of it is below it
    assert (part.start_offset, part.end_offset, part.records, part.bytes) == (16, 20, 4, 20)
    assert offsets(engine, "trimmed", 16) == [16, 17, 18, 19]
    assert engine.delete_records_below("trimmed", 0, 3) == 16  # never back
    assert engine.delete_records_below("trimmed", 0, -1) == 20  # -1: the end
    assert engine.delete_records_below("trimmed", 1, 0) == 0
    engine.produce("trimmed", stamped([b"next"], NOW_MS))
    assert offsets(engine, "trimmed", 20) == [20]


@pytest.mark.parametrize(
    ("partition", "offset", "code"),
    [
        (0, 6, ErrorCode.OFFSET_OUT_OF_RANGE),
        (0, -2, ErrorCode.OFFSET_OUT_OF_RANGE),
        (3, 0, ErrorCode.UNKNOWN_PARTITION),
    ],
)
def test_records_below_an_offset_past_the_end_are_refused(
    engine: Engine, partition: int, offset: int, code: ErrorCode
) -> None:
    engine.create_topic("short")
    engine.produce("short", stamped([b"v"] * 5, NOW_MS))
    with pytest.raises(BrokerError) as refused:
        engine.delete_records_below("short", partition, offset)
    assert refused.value.code is code
    assert engine.describe_topic("short").partition_details[0].start_offset == 0
