"""broker/core/verify.py on logs built in memory: what the CLI tests cannot get a broker to
write (a transaction past its deadline, a pid that starts past sequence 1), and the
counting and capping of findings."""

from __future__ import annotations

from broker.core.verify import Ack, Checker, Report, sha256
from broker.types import PartitionInfo, Record, TxnInfo, TxnPartition


def rec(offset: int, value: bytes, *, partition: int = 0, **fields: int) -> Record:
    return Record(
        "t",
        partition,
        offset,
        0,
        None,
        value,
        (),
        fields.get("pid", 0),
        fields.get("generation", 0),
        fields.get("sequence", 0),
        fields.get("epoch", 0),
        None,
    )


def check(
    records: list[Record],
    *,
    ends: tuple[int, ...] = (),
    acks: tuple[Ack, ...] = (),
    expected: list[bytes] | None = None,
    txns: tuple[TxnInfo, ...] = (),
    examples_max: int = 10,
) -> Report:
    ends = ends or (len(records),)
    partitions = [PartitionInfo(p, 0, end, end, end) for p, end in enumerate(ends)]
    checker = Checker("t", partitions, acks=acks, expected=expected, examples_max=examples_max)
    for record in records:
        checker.record(record)
    return checker.finish(txns)


def kinds(report: Report) -> dict[str, int]:
    return {kind: count for kind, count in report.counts.items() if count}


def txn(state: str, age_ms: int, *, topic: str = "t") -> TxnInfo:
    return TxnInfo(
        txn_id=7,
        group="g",
        key=None,
        state=state,
        journal=0,
        began_ms=1_000,
        deadline_ms=61_000,
        ended_ms=None,
        reason=None,
        age_ms=age_ms,
        partitions=(TxnPartition(topic, 0, 2, 2, None),),
    )


def test_a_clean_log_has_no_findings() -> None:
    records = [rec(o, b"v%d" % o, pid=5, generation=1, sequence=o + 1) for o in range(4)]
    acks = tuple(Ack(0, o, sha256(b"v%d" % o)) for o in range(4))
    report = check(records, acks=acks, expected=[b"v0", b"v1", b"v2", b"v3"])
    assert report.clean
    assert report.to_dict()["anomalies"] == 0


def test_open_and_stale_transactions_on_the_topic_are_reported() -> None:
    report = check([], txns=(txn("open", 5_000), txn("committing", 90_000)))
    assert kinds(report) == {"open_txn": 1, "stale_txn": 1}
    [stale] = report.topic_wide.examples["stale_txn"]
    assert stale.message == (
        "transaction 7 of group g is committing, past its deadline by 30000 ms "
        "(partition 0, 2 records)"
    )
    assert check([], txns=(txn("open", 90_000, topic="other"),)).clean
    assert check([], txns=(txn("committed", 90_000),)).clean


def test_a_pid_starting_past_sequence_one_skips() -> None:
    report = check([rec(0, b"a", pid=5, generation=1, sequence=3)])
    assert kinds(report) == {"sequence_skip": 1}
    assert report.partitions[0].examples["sequence_skip"][0].message == (
        "pid 5 starts at sequence 3, not 1"
    )


def test_a_new_generation_continues_the_sequence_and_an_old_one_is_fenced() -> None:
    records = [
        rec(0, b"a", pid=5, generation=1, sequence=1),
        rec(1, b"b", pid=5, generation=2, sequence=2),  # the newer instance, as the broker does
        rec(2, b"c", pid=5, generation=1, sequence=3),  # the zombie
        rec(3, b"d", pid=5, generation=2, sequence=3),
    ]
    assert kinds(check(records)) == {"fenced_generation": 1}


def test_a_kafka_producers_new_epoch_starts_at_one_and_its_repeats_are_found() -> None:
    """A Kafka producer's epoch bump numbers its records from 1 again (the broker's
    Kafka rule): no finding. A repeat inside the new epoch still is one."""
    records = [
        rec(0, b"a", pid=5, generation=0, sequence=1),
        rec(1, b"b", pid=5, generation=0, sequence=2),
        rec(2, b"c", pid=5, generation=1, sequence=1),
        rec(3, b"d", pid=5, generation=1, sequence=2),
    ]
    assert kinds(check(records)) == {}
    repeated = [*records, rec(4, b"e", pid=5, generation=1, sequence=2)]
    assert kinds(check(repeated)) == {"sequence_repeat": 1}


def test_acks_of_a_partition_that_does_not_exist_and_trailing_gaps_are_found() -> None:
    acks = (Ack(3, 0, source="a.ndjson", line=4),)
    report = check([rec(0, b"a")], ends=(3,), acks=acks)
    assert kinds(report) == {"lost": 1, "gap": 1}
    [lost] = report.topic_wide.examples["lost"]
    assert lost.message == "a.ndjson:4: partition 3 does not exist"
    [gap] = report.partitions[0].examples["gap"]
    assert gap.message == "offsets 1-2 are missing"


def test_a_value_acknowledged_at_several_offsets_may_be_stored_that_many_times() -> None:
    """A topic whose values repeat is checked with acks (README): `x` produced twice,
    acknowledged at offsets 0 and 1, was reported as a duplicate and failed verify."""
    x = sha256(b"x")
    twice = (Ack(0, 0, x), Ack(0, 1, x), Ack(0, 2, sha256(b"y")))
    records = [rec(0, b"x"), rec(1, b"x"), rec(2, b"y")]
    assert kinds(check(records, acks=twice)) == {}
    # a retry's ack names the same offset again: one copy acknowledged, two stored
    retried = (Ack(0, 0, x), Ack(0, 0, x), Ack(0, 2, sha256(b"y")))
    assert kinds(check(records, acks=retried)) == {"duplicate": 1}


def test_every_finding_is_counted_and_only_a_few_kept() -> None:
    records = [rec(o, b"same") for o in range(30)]
    report = check(records, expected=[b"same"], examples_max=2)
    assert kinds(report) == {"duplicate": 1}
    report = check(records, expected=[b"other"], examples_max=2)
    assert kinds(report) == {"unexpected": 30, "lost": 1}
    assert len(report.partitions[0].examples["unexpected"]) == 2
    assert report.to_dict()["partitions"][0]["counts"] == {"unexpected": 30}


def test_a_transaction_members_records_have_no_sequences_to_check() -> None:
    """Two members of one transaction: their pids' records all carry sequence 0."""
    member = {"pid": 5, "generation": 1}
    report = check([rec(0, b"a", **member), rec(1, b"b", **member), rec(2, b"c", pid=6)])
    assert kinds(report) == {}


def test_a_members_older_generation_after_its_newer_one_is_fenced() -> None:
    retried = [rec(0, b"a", pid=5, generation=2), rec(1, b"b", pid=5, generation=1)]
    assert kinds(check(retried)) == {"fenced_generation": 1}
