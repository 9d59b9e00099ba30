"""broker/engine/write_cache.py's WriteCache: a produce reuses the topic rows, log ends and
epochs the previous produce on its connection read, and must trust them only while nothing else can
have changed them.

Two engines open one data directory (two SQLite connections, as two processes would be):
`a` warms its cache with produces, then `b` (another connection: PRAGMA data_version moves)
or `a` itself with a write that is not a produce (the connection's write counter moves)
changes what `a` remembers: the log end, the topic behind a name, the topic's epoch and
who may write. Or a produce transaction of `a` rolls back after it updated the cache.
Every test then checks what a user sees: offsets contiguous from 0, the records read
back in order by the other engine, duplicates answered with their original offsets, and
the error code of every refusal. A cache trusted when it should not be shows up as a
skipped or reused offset, records written to a deleted topic, or a write let through.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from broker.engine.engine import Engine, ProduceOutcome, ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.storage import logs
from broker.types import Access, AppendResult, Lease, Mode, NewRecord, ProducerFields
from support.producing import FakeClock, open_engine
from support.values import present

TOPIC = "t"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def a(opened: list[Engine], data_dir: Path, clock: FakeClock) -> Engine:
    """The engine whose cache the test warms and then puts to the test."""
    return open_engine(opened, data_dir, clock)


@pytest.fixture
def b(opened: list[Engine], data_dir: Path, clock: FakeClock, a: Engine) -> Engine:
    """Another connection to the same data directory."""
    return open_engine(opened, data_dir, clock)


@pytest.fixture(params=["other-connection", "same-connection"])
def changer(request: pytest.FixtureRequest, a: Engine, b: Engine) -> Engine:
    """Who makes the change behind a's cache: b, or a itself with a non-produce write."""
    return b if request.param == "other-connection" else a


# helpers --------------------------------------------------------------------------------


def put(engine: Engine, *values: str, partition: int = 0, topic: str = TOPIC) -> list[int]:
    """Plain produce of values to one partition; their offsets."""
    results = engine.produce(topic, [NewRecord(v.encode(), partition=partition) for v in values])
    assert all(r.partition == partition for r in results)
    return [r.offset for r in results]


def log(engine: Engine, partition: int = 0, topic: str = TOPIC) -> list[tuple[int, str]]:
    """(offset, value) of every record of one partition, as a reader sees them."""
    return [(r.offset, present(r.value).decode()) for r in engine.read(topic, partition, 0)]


def in_order(*values: str) -> list[tuple[int, str]]:
    return list(enumerate(values))


def plain(value: str, topic: str = TOPIC, partition: int = 0) -> ProduceRequest:
    return ProduceRequest(topic, [NewRecord(value.encode(), partition=partition)])


def idempotent(lease: Lease, sequence: int, value: str, partition: int = 0) -> ProduceRequest:
    fields = ProducerFields(lease.producer_id, lease.generation, sequence)
    return ProduceRequest(TOPIC, [NewRecord(value.encode(), partition=partition)], fields)


def send(engine: Engine, request: ProduceRequest) -> AppendResult:
    """One one-record request through Engine.produce (its own transaction)."""
    [result] = engine.produce(request.topic, request.records, producer=request.producer)
    return result


Shown = tuple[int, bool] | ErrorCode


def shown(outcomes: Sequence[ProduceOutcome]) -> list[Shown]:
    """Each one-record request's (offset, duplicate), or its error code."""
    found: list[Shown] = []
    for outcome in outcomes:
        if isinstance(outcome, BrokerError):
            found.append(outcome.code)
        else:
            [result] = outcome
            found.append((result.offset, result.duplicate))
    return found


def refused(code: ErrorCode, operation: Callable[[], object]) -> BrokerError:
    with pytest.raises(BrokerError) as raised:
        operation()
    assert raised.value.code is code, raised.value
    return raised.value


# the log end ------------------------------------------------------------------------------


def test_another_connections_appends_move_the_log_end(a: Engine, b: Engine) -> None:
    a.create_topic(TOPIC, partitions=2)
    assert put(a, "a0") == [0]
    assert put(a, "a1") == [1]  # a's cache now holds the end of partition 0
    assert put(a, "a-p1-0", partition=1) == [0]
    assert put(b, "b2", "b3") == [2, 3]
    assert put(a, "a4") == [4]
    assert shown(b.produce_group([plain("b5"), plain("b-p1-1", partition=1)])) == [
        (5, False),
        (1, False),
    ]
    assert put(a, "a6") == [6]
    assert put(a, "a-p1-2", partition=1) == [2]
    assert log(b) == in_order("a0", "a1", "b2", "b3", "a4", "b5", "a6")
    assert log(b, partition=1) == in_order("a-p1-0", "b-p1-1", "a-p1-2")
    assert a.end_offsets(TOPIC) == b.end_offsets(TOPIC) == [7, 3]


def test_a_group_after_another_connections_append_continues_after_it(a: Engine, b: Engine) -> None:
    a.create_topic(TOPIC)
    assert shown(a.produce_group([plain("a0"), plain("a1")])) == [(0, False), (1, False)]
    assert put(b, "b2") == [2]
    assert shown(a.produce_group([plain("a3"), plain("a4")])) == [(3, False), (4, False)]
    assert log(b) == in_order("a0", "a1", "b2", "a3", "a4")


def test_another_connections_idempotent_append_is_seen_by_the_next_batch(
    a: Engine, b: Engine
) -> None:
    """b appends the pid's next sequence behind a's cache: a's retry of it is a duplicate
    with b's offset, and a's next sequence lands after it (a stale log end would hide b's
    batch header from a's producer state and append the retry a second time)."""
    a.create_topic(TOPIC)
    lease = a.lease_pid(TOPIC, 0)
    assert send(a, idempotent(lease, 1, "m1")) == AppendResult(TOPIC, 0, 0)
    assert send(b, idempotent(lease, 2, "m2")) == AppendResult(TOPIC, 0, 1)
    assert send(a, idempotent(lease, 2, "m2")) == AppendResult(TOPIC, 0, 1, duplicate=True)
    assert send(a, idempotent(lease, 3, "m3")) == AppendResult(TOPIC, 0, 2)
    assert log(b) == in_order("m1", "m2", "m3")
    assert b.lease_pid(TOPIC, 0, lease.producer_id).sequence == 3


# the topic behind a name ------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_topic_deleted_and_created_again_is_the_new_topic(
    a: Engine, b: Engine, changer: Engine, partitions: int
) -> None:
    a.create_topic(TOPIC)
    assert put(a, "old0") == [0]
    assert put(a, "old1") == [1]  # a's cache: the old topic's row and log end
    changer.delete_topic(TOPIC)
    changer.create_topic(TOPIC, partitions=partitions)

    last = partitions - 1
    results = a.produce(
        TOPIC, [NewRecord(b"new0", partition=0), NewRecord(b"new-last", partition=last)]
    )
    if last == 0:
        assert [(r.partition, r.offset) for r in results] == [(0, 0), (0, 1)]
        assert log(b) == in_order("new0", "new-last")
    else:
        assert [(r.partition, r.offset) for r in results] == [(0, 0), (last, 0)]
        assert log(b) == in_order("new0")
        assert log(b, partition=last) == in_order("new-last")
    assert b.describe_topic(TOPIC).records == 2
    assert put(a, "new2") == [2 if last == 0 else 1]


def test_a_topic_deleted_behind_the_cache_is_unknown(a: Engine, b: Engine, changer: Engine) -> None:
    a.create_topic(TOPIC)
    assert put(a, "old0") == [0]
    assert put(a, "old1") == [1]
    changer.delete_topic(TOPIC)
    refused(ErrorCode.UNKNOWN_TOPIC, lambda: put(a, "lost"))
    [outcome] = a.produce_group([plain("lost")])
    assert isinstance(outcome, BrokerError)
    assert outcome.code is ErrorCode.UNKNOWN_TOPIC
    assert [t.name for t in b.list_topics()] == []
    b.create_topic(TOPIC)
    assert put(a, "new0") == [0]
    assert log(b) == in_order("new0")


# the engine's own writes that are not produces ---------------------------------------------


def test_a_transaction_committed_into_the_partition_moves_the_log_end(
    a: Engine, b: Engine, changer: Engine
) -> None:
    """a journals records into a transaction and the commit (by a itself, or b) copies
    them into the partition: a's next plain produce lands after them."""
    a.create_topic(TOPIC)
    assert put(a, "p0") == [0]
    assert put(a, "p1") == [1]
    txn = a.txn_begin("billing")
    journaled = a.produce(
        TOPIC,
        [NewRecord(b"x2", partition=0), NewRecord(b"x3", partition=0)],
        producer=ProducerFields(txn_id=txn.txn_id),
    )
    assert [r.offset for r in journaled] == [-1, -1], "offsets are given at the commit"
    assert put(a, "p2") == [2], "journaled records are not in the log yet"
    info = changer.txn_commit(txn.txn_id)
    assert info.state == "committed"
    assert [(p.partition, p.base_offset) for p in info.partitions] == [(0, 3)]
    assert put(a, "p5") == [5]
    assert log(b) == in_order("p0", "p1", "p2", "x2", "x3", "p5")
    assert put(b, "p6") == [6]


def test_a_group_with_a_transactional_request_then_its_commit(a: Engine, b: Engine) -> None:
    """One group: plain, into a transaction, plain (the journal write flushes the plain
    appends before it); after the commit a plain produce lands after the copied records."""
    a.create_topic(TOPIC)
    assert put(a, "p0") == [0]
    txn = a.txn_begin("billing")
    into_txn = ProduceRequest(
        TOPIC, [NewRecord(b"x", partition=0)], ProducerFields(txn_id=txn.txn_id)
    )
    assert shown(a.produce_group([plain("p1"), into_txn, plain("p2")])) == [
        (1, False),
        (-1, False),
        (2, False),
    ]
    assert log(b) == in_order("p0", "p1", "p2")
    a.txn_commit(txn.txn_id)
    assert shown(a.produce_group([plain("p4")])) == [(4, False)]
    assert log(b) == in_order("p0", "p1", "p2", "x", "p4")


# the epoch and exclusive access ------------------------------------------------------------


def attach_exclusive(engine: Engine, name: str = "leader") -> int:
    session = engine.owners.register_process()
    attached = engine.attach_producer(TOPIC, session, Access.EXCLUSIVE, name)
    assert attached.mode is Mode.EXCLUSIVE
    return attached.attachment_id


def test_an_exclusive_producer_attached_behind_the_cache_refuses_a_plain_produce(
    a: Engine, b: Engine, changer: Engine
) -> None:
    a.create_topic(TOPIC)
    assert put(a, "free0") == [0]
    assert put(a, "free1") == [1]  # a's cache: the topic has no attachments, epoch 0
    attachment = attach_exclusive(changer)

    refused(ErrorCode.PRODUCER_BUSY, lambda: put(a, "intruder"))
    [outcome] = a.produce_group([plain("intruder")])
    assert isinstance(outcome, BrokerError)
    assert outcome.code is ErrorCode.PRODUCER_BUSY
    [held] = changer.produce(TOPIC, [NewRecord(b"leader2")], attachment=attachment)
    assert held.offset == 2
    assert [(r.offset, r.value, r.epoch) for r in b.read(TOPIC, 0, 0)] == [
        (0, b"free0", 0),
        (1, b"free1", 0),
        (2, b"leader2", 1),
    ]


def test_a_group_checks_exclusive_access_attached_behind_the_cache(
    a: Engine, b: Engine, changer: Engine
) -> None:
    a.create_topic(TOPIC)
    a.create_topic("other")
    assert shown(a.produce_group([plain("free0"), plain("o0", topic="other")])) == [
        (0, False),
        (0, False),
    ]
    attach_exclusive(changer)
    assert shown(a.produce_group([plain("o1", topic="other"), plain("intruder")])) == [
        (1, False),
        ErrorCode.PRODUCER_BUSY,
    ]
    assert log(b) == in_order("free0")
    assert log(b, topic="other") == in_order("o0", "o1")


def test_a_plain_write_after_an_exclusive_producer_left_carries_the_new_epoch(
    a: Engine, b: Engine, changer: Engine
) -> None:
    """Between two of a's produces an exclusive producer attaches, writes and detaches:
    nothing refuses a's next write, but it must carry the topic's epoch now, 1, not the
    0 a's cache remembers."""
    a.create_topic(TOPIC)
    assert put(a, "free0") == [0]
    assert put(a, "free1") == [1]
    attachment = attach_exclusive(changer)
    [held] = changer.produce(TOPIC, [NewRecord(b"leader2")], attachment=attachment)
    assert held.offset == 2
    changer.detach_producer(attachment)
    assert b.topic_access(TOPIC).mode == "free"

    assert put(a, "free3") == [3]
    assert [(r.offset, r.value, r.epoch) for r in b.read(TOPIC, 0, 0)] == [
        (0, b"free0", 0),
        (1, b"free1", 0),
        (2, b"leader2", 1),
        (3, b"free3", 1),
    ]


def test_a_topic_with_an_attachment_is_checked_on_every_write(
    a: Engine, b: Engine, clock: FakeClock
) -> None:
    """Only a topic with no attachments at all has its epoch cached: whether an attached
    holder is live depends on the clock too, not only on what is committed. b's exclusive
    producer stops heartbeating; to a it looks dead, and a's plain writes go in. Then the
    wall clock steps back (an NTP correction): the holder's heartbeat is recent again, no
    write happened in between, and a's next plain write must be refused like the first."""
    a.create_topic(TOPIC)
    attach_exclusive(b)
    refused(ErrorCode.PRODUCER_BUSY, lambda: put(a, "refused"))
    past_timeout = DEFAULT_LIMITS.session_timeout_ms + 1
    clock.advance(past_timeout)
    assert put(a, "while-dead0") == [0]
    assert put(a, "while-dead1") == [1]
    clock.advance(-past_timeout)
    refused(ErrorCode.PRODUCER_BUSY, lambda: put(a, "refused"))
    [outcome] = a.produce_group([plain("refused")])
    assert isinstance(outcome, BrokerError)
    assert outcome.code is ErrorCode.PRODUCER_BUSY
    assert log(b) == in_order("while-dead0", "while-dead1")


# idempotent producers in a group ------------------------------------------------------------


def test_a_retry_in_the_same_group_is_a_duplicate_of_the_original(a: Engine, b: Engine) -> None:
    a.create_topic(TOPIC)
    lease = a.lease_pid(TOPIC, 0)
    outcomes = a.produce_group(
        [
            idempotent(lease, 1, "m1"),
            idempotent(lease, 2, "m2"),
            idempotent(lease, 3, "m3"),
            idempotent(lease, 2, "m2"),
        ]
    )
    assert shown(outcomes) == [(0, False), (1, False), (2, False), (1, True)]
    assert log(b) == in_order("m1", "m2", "m3")

    later = a.produce_group([idempotent(lease, 1, "m1"), idempotent(lease, 4, "m4")])
    assert shown(later) == [(0, True), (3, False)]
    assert log(b) == in_order("m1", "m2", "m3", "m4")
    assert a.end_offsets(TOPIC) == b.end_offsets(TOPIC) == [4]
    assert b.lease_pid(TOPIC, 0, lease.producer_id).sequence == 4


def test_appends_after_a_duplicate_in_a_group_keep_the_log_end_right(a: Engine, b: Engine) -> None:
    """A duplicate writes the group's held-back appends before it looks the original up;
    the appends after it, plain and idempotent, must still move the end by exactly their
    own records."""
    a.create_topic(TOPIC)
    lease = a.lease_pid(TOPIC, 0)
    assert put(a, "p0") == [0]
    outcomes = a.produce_group(
        [
            idempotent(lease, 1, "m1"),
            plain("p2"),
            idempotent(lease, 2, "m2"),
            idempotent(lease, 1, "m1"),
            plain("p4"),
            idempotent(lease, 3, "m3"),
            idempotent(lease, 3, "m3"),
        ]
    )
    assert shown(outcomes) == [
        (1, False),
        (2, False),
        (3, False),
        (1, True),
        (4, False),
        (5, False),
        (5, True),
    ]
    assert log(b) == in_order("p0", "m1", "p2", "m2", "p4", "m3")
    assert a.end_offsets(TOPIC) == b.end_offsets(TOPIC) == [6]
    assert b.describe_topic(TOPIC).records == 6
    assert put(b, "p6") == [6]
    assert put(a, "p7") == [7]


# failed requests and rolled-back transactions ----------------------------------------------


def test_failed_requests_in_a_group_leave_nothing_and_the_rest_stays_contiguous(
    a: Engine, b: Engine
) -> None:
    a.create_topic(TOPIC)
    lease = a.lease_pid(TOPIC, 0)
    assert put(a, "before0") == [0]
    outcomes = a.produce_group(
        [
            plain("g1"),
            plain("lost", topic="nope"),
            idempotent(lease, 1, "m1"),
            idempotent(lease, 3, "lost"),
            plain("lost", partition=7),
            plain("g3"),
            ProduceRequest(TOPIC, [NewRecord(b"lost", partition=0)], ProducerFields(999_999, 1, 1)),
            idempotent(lease, 2, "m2"),
        ]
    )
    assert shown(outcomes) == [
        (1, False),
        ErrorCode.UNKNOWN_TOPIC,
        (2, False),
        ErrorCode.OUT_OF_ORDER_SEQUENCE,
        ErrorCode.UNKNOWN_PARTITION,
        (3, False),
        ErrorCode.UNKNOWN_PID,
        (4, False),
    ]
    out_of_order = outcomes[3]
    assert isinstance(out_of_order, BrokerError)
    assert out_of_order.details["expected_sequence"] == 2
    assert log(b) == in_order("before0", "g1", "m1", "g3", "m2")
    assert [t.name for t in b.list_topics()] == [TOPIC]
    assert put(a, "after5") == [5]
    assert send(a, idempotent(lease, 3, "m3")) == AppendResult(TOPIC, 0, 6)
    assert put(b, "after7") == [7]
    assert log(b)[5:] == [(5, "after5"), (6, "m3"), (7, "after7")]


def test_a_failed_transactional_request_in_a_group_keeps_the_plain_ones_around_it(
    a: Engine, b: Engine
) -> None:
    """The transactional request rolls back to its savepoint: the plain appends before it
    (written out before the savepoint) and after it both stay, contiguous."""
    a.create_topic(TOPIC)
    assert put(a, "p0") == [0]
    unknown_txn = ProduceRequest(
        TOPIC, [NewRecord(b"lost", partition=0)], ProducerFields(txn_id=999_999)
    )
    outcomes = a.produce_group([plain("p1"), unknown_txn, plain("p2")])
    assert shown(outcomes) == [(1, False), ErrorCode.UNKNOWN_TXN, (2, False)]
    assert log(b) == in_order("p0", "p1", "p2")
    assert put(a, "p3") == [3]
    assert b.end_offsets(TOPIC) == [4]


def failing_storage(
    monkeypatch: pytest.MonkeyPatch, name: str, fails: Callable[[tuple[object, ...]], bool]
) -> None:
    """logs.<name> fails like a disk would (sqlite3.OperationalError) when fails(args)."""
    real = getattr(logs, name)

    def failing(*args: object) -> object:
        if fails(args):
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args)

    monkeypatch.setattr(logs, name, failing)


def test_a_group_rolled_back_after_its_appends_leaves_the_log_end_where_it_was(
    a: Engine, b: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's first request appends (a's cache moves the end past it), then storage
    fails during the second: the whole group rolls back, and the next produce must land
    where the rolled-back records would have."""
    a.create_topic(TOPIC)
    assert put(a, "p0") == [0]
    assert put(a, "p1") == [1]
    with monkeypatch.context() as patched:
        failing_storage(patched, "topic_by_name", lambda args: args[1] == "broken")
        error = refused(
            ErrorCode.STORAGE_FAILED,
            lambda: a.produce_group([plain("doomed2"), plain("doomed", topic="broken")]),
        )
    assert "disk I/O error" in error.message
    assert log(b) == in_order("p0", "p1")
    assert put(a, "p2") == [2]
    assert shown(a.produce_group([plain("p3")])) == [(3, False)]
    assert put(b, "p4") == [4]
    assert log(b) == in_order("p0", "p1", "p2", "p3", "p4")


def test_a_produce_rolled_back_after_its_first_partition_leaves_the_log_end_where_it_was(
    a: Engine, b: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One produce to partitions 0 and 1: partition 0's append is held (a's cache moves
    its end), then reading partition 1's end fails: the produce rolls back."""
    a.create_topic(TOPIC, partitions=2)
    assert put(a, "p0") == [0]
    assert put(a, "p1") == [1]  # partition 0's end is cached, partition 1's is not
    with monkeypatch.context() as patched:
        failing_storage(patched, "end_offset", lambda args: args[2] == 1)
        refused(
            ErrorCode.STORAGE_FAILED,
            lambda: a.produce(
                TOPIC, [NewRecord(b"doomed", partition=0), NewRecord(b"doomed", partition=1)]
            ),
        )
    assert b.end_offsets(TOPIC) == [2, 0]
    assert put(a, "p2") == [2]
    assert put(a, "q0", partition=1) == [0]
    assert log(b) == in_order("p0", "p1", "p2")
    assert log(b, partition=1) == in_order("q0")


def test_an_idempotent_produce_rolled_back_can_be_sent_again(
    a: Engine, b: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group with a pid's sequence 1 and 2 rolls back: neither is in the log, so the
    same sequences sent again are appended (not answered as duplicates), at offset 0."""
    a.create_topic(TOPIC)
    lease = a.lease_pid(TOPIC, 0)
    with monkeypatch.context() as patched:
        failing_storage(patched, "topic_by_name", lambda args: args[1] == "broken")
        refused(
            ErrorCode.STORAGE_FAILED,
            lambda: a.produce_group(
                [
                    idempotent(lease, 1, "m1"),
                    idempotent(lease, 2, "m2"),
                    plain("doomed", topic="broken"),
                ]
            ),
        )
    assert log(b) == []
    outcomes = a.produce_group([idempotent(lease, 1, "m1"), idempotent(lease, 2, "m2")])
    assert shown(outcomes) == [(0, False), (1, False)]
    assert log(b) == in_order("m1", "m2")
