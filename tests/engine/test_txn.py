"""Transactions (DESIGN.md section 6) through the Python client, embedded and served, and
the engine's recovery of prepared commits.

What a user sees: records produced into a transaction are invisible until the commit and
then sit in their logs at contiguous offsets from the log end; an abort or a timeout
discards them; every bad request gets its own error code and changes nothing; a keyed
begin finds its transaction again; a retried member replaces its earlier attempt; consumer
offsets committed in a transaction take effect with it. Time is a FakeClock handed to the
embedded engine and to the served broker alike, so a timeout is a clock step, not a sleep.

The engine tests at the end build "prepared but not applied" by running a commit whose
APPLY_COMMIT step is switched off (or stopped after its first partition), then check that
the next commit of the journal, or the next start, finishes it exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker.client.client import Client, connect
from broker.client.embedded import EmbeddedTransport
from broker.client.producer import PartitionState, ProducerState
from broker.discovery import DB_FILE
from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.server.server import Server
from broker.types import NewRecord, ProducerFields, Record, TxnInfo
from support.producing import FakeClock, open_engine
from support.servers import ServerThread
from support.values import present
from support.waiting import wait_until

TIMEOUT_MS = DEFAULT_LIMITS.txn_timeout_ms
WAIT_MS = 20_000  # a long-poll that must be ended by the commit, long before this


class ClockedServerThread(ServerThread):
    """A ServerThread whose broker reads time from the test's clock."""

    def __init__(self, data_dir: Path, clock: FakeClock, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(data_dir, limits=limits)
        self.server = Server(data_dir, durability="normal", limits=limits, clock=clock)


class Target:
    """The broker under test: a data directory opened in this process, or a server."""

    def __init__(self, data_dir: Path, clock: FakeClock, server: ServerThread | None) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.server = server
        self._clients: list[Client] = []

    @property
    def served(self) -> bool:
        return self.server is not None

    def client(self) -> Client:
        if self.server is not None:
            opened = connect(self.server.address)
        else:
            opened = connect(self.data_dir, durability="normal", clock=self.clock)
        self._clients.append(opened)
        return opened

    def close(self) -> None:
        for opened in reversed(self._clients):
            opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path, clock: FakeClock) -> Iterator[Target]:
    with contextlib.ExitStack() as stack:
        server = None
        if request.param == "served":
            server = stack.enter_context(ClockedServerThread(data_dir, clock).start())
        found = Target(data_dir, clock, server)
        stack.callback(found.close)
        yield found


@pytest.fixture
def client(target: Target) -> Client:
    """invoices: 1 partition; ledger: 4 partitions; both empty."""
    opened = target.client()
    opened.create_topic("invoices")
    opened.create_topic("ledger", partitions=4)
    return opened


def refused(code: ErrorCode, call: Callable[[], object]) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        call()
    assert caught.value.code is code, caught.value
    return caught.value


def log(client: Client, topic: str, partition: int | None = None) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of every record a consumer reads."""
    return [
        (r.partition, r.offset, present(r.value).decode())
        for r in client.consume(topic, partition=partition)
    ]


def values(client: Client, topic: str) -> list[str]:
    return [present(r.value).decode() for r in client.consume(topic)]


def parts(info: TxnInfo) -> list[tuple[str | None, int, int, int | None]]:
    """(topic, partition, records, base_offset) of each partition of a transaction."""
    return [(p.topic, p.partition, p.records, p.base_offset) for p in info.partitions]


def produce_in(
    client: Client, txn_id: int, topic: str, items: list[str], partition: int | None = None
) -> None:
    results = client.produce(topic, items, partition=partition, txn=txn_id)
    assert [r.offset for r in results] == [-1] * len(items), "journaled, no offsets yet"


# begin, produce, commit -------------------------------------------------------------------


def test_records_are_invisible_until_commit_then_follow_the_log_end(client: Client) -> None:
    client.produce("invoices", ["plain-0", "plain-1"])
    txn = client.txn_begin("billing")
    assert (txn.state, txn.group, txn.existing, txn.partitions) == ("open", "billing", False, ())
    produce_in(client, txn.txn_id, "invoices", ["inv-1", "inv-2", "inv-3"])
    assert values(client, "invoices") == ["plain-0", "plain-1"]
    assert client.end_offsets("invoices") == [2]
    assert client.fetch("invoices", {0: 2}) == []

    committed = client.txn_commit(txn.txn_id)
    assert committed.state == "committed"
    assert parts(committed) == [("invoices", 0, 3, 2)]
    assert log(client, "invoices") == [
        (0, 0, "plain-0"),
        (0, 1, "plain-1"),
        (0, 2, "inv-1"),
        (0, 3, "inv-2"),
        (0, 4, "inv-3"),
    ]
    assert [r.txn_id for r in client.consume("invoices")] == [
        None,
        None,
        txn.txn_id,
        txn.txn_id,
        txn.txn_id,
    ]
    assert client.end_offsets("invoices") == [5]


def test_one_transaction_spans_topics_and_partitions(client: Client) -> None:
    client.produce("ledger", ["before"], partition=1)
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    produce_in(client, txn.txn_id, "ledger", ["debit-1", "debit-2"], partition=3)
    produce_in(client, txn.txn_id, "ledger", ["credit-1"], partition=1)
    produce_in(client, txn.txn_id, "ledger", ["debit-3"], partition=3)

    committed = client.txn_commit(txn.txn_id)
    assert parts(committed) == [
        ("invoices", 0, 1, 0),
        ("ledger", 1, 1, 1),
        ("ledger", 3, 3, 0),
    ]
    assert committed.records == 5
    assert log(client, "invoices") == [(0, 0, "inv-1")]
    assert log(client, "ledger") == [
        (1, 0, "before"),
        (1, 1, "credit-1"),
        (3, 0, "debit-1"),
        (3, 1, "debit-2"),
        (3, 2, "debit-3"),
    ]
    assert client.end_offsets("ledger") == [0, 2, 0, 3]


def test_keys_headers_and_timestamps_survive_the_journal(client: Client, clock: FakeClock) -> None:
    txn = client.txn_begin("billing")
    client.produce(
        "ledger", ["a", "b"], key="acct-9", headers=(("trace", b"\x00t"),), txn=txn.txn_id
    )
    client.produce("ledger", [NewRecord(b"c", b"k", (), 2, timestamp_ms=42)], txn=txn.txn_id)
    journaled_at = clock.now_ms
    clock.advance(1_000)
    client.txn_commit(txn.txn_id)
    found = sorted(client.consume("ledger"), key=lambda r: present(r.value))
    assert [(r.key, r.value, r.headers) for r in found] == [
        (b"acct-9", b"a", (("trace", b"\x00t"),)),
        (b"acct-9", b"b", (("trace", b"\x00t"),)),
        (b"k", b"c", ()),
    ]
    assert found[0].partition == found[1].partition, "one key, one partition"
    assert found[2].partition == 2
    assert [r.timestamp_ms for r in found] == [journaled_at, journaled_at, 42]


def test_every_shape_of_batch_lands_whole_and_in_order(client: Client, clock: FakeClock) -> None:
    """Batches long enough to be copied many rows to a statement (plain, and with the
    producer's timestamps), keyed ones with headers, a mixed one, and more small batches
    than the copy reads at a time: every record lands with its fields, at contiguous
    offsets, in the order produced."""
    txn = client.txn_begin("billing")
    now = clock.now_ms
    sent: list[NewRecord] = []

    def produce(records: list[NewRecord]) -> None:
        client.produce("invoices", records, txn=txn.txn_id)
        sent.extend(records)

    produce([NewRecord(b"plain-%d" % i) for i in range(130)])
    produce([NewRecord(b"stamped-%d" % i, timestamp_ms=7_000 + i) for i in range(130)])
    produce([NewRecord(b"keyed-%d" % i, b"k%d" % (i % 3), (("h", b"%d" % i),)) for i in range(70)])
    produce([NewRecord(b"mixed-0", timestamp_ms=5), NewRecord(b"mixed-1"), NewRecord(b"m", b"")])
    for i in range(40):
        produce([NewRecord(b"small-%d-a" % i), NewRecord(b"small-%d-b" % i)])
    assert client.txn_show(txn.txn_id, records_max=1).records[0].value == b"plain-0"
    clock.advance(1_000)
    committed = client.txn_commit(txn.txn_id)
    assert parts(committed) == [("invoices", 0, len(sent), 0)]
    found = list(client.consume("invoices"))
    assert [r.offset for r in found] == list(range(len(sent)))
    assert [(r.value, r.key, r.headers) for r in found] == [
        (s.value, s.key, s.headers) for s in sent
    ]
    assert [r.timestamp_ms for r in found] == [
        now if s.timestamp_ms is None else s.timestamp_ms for s in sent
    ]
    assert {r.txn_id for r in found} == {txn.txn_id}


def test_a_second_commit_is_answered_committed_and_changes_nothing(client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1", "inv-2"])
    first = client.txn_commit(txn.txn_id)
    again = client.txn_commit(txn.txn_id)
    also = client.txn_commit(txn.txn_id, group="billing")
    assert again == first == also
    assert again.state == "committed"
    assert values(client, "invoices") == ["inv-1", "inv-2"]


def test_an_empty_transaction_commits(client: Client) -> None:
    txn = client.txn_begin("billing")
    committed = client.txn_commit(txn.txn_id)
    assert (committed.state, committed.partitions, committed.records) == ("committed", (), 0)


def test_offsets_stay_contiguous_when_plain_produces_interleave_with_commits(
    client: Client,
) -> None:
    one = client.txn_begin("billing")
    two = client.txn_begin("billing")
    client.produce("invoices", ["p0", "p1"])
    produce_in(client, one.txn_id, "invoices", ["one-a", "one-b"])
    client.produce("invoices", ["p2"])
    produce_in(client, two.txn_id, "invoices", ["two-a"])
    client.produce("invoices", ["p3"])
    assert parts(client.txn_commit(two.txn_id)) == [("invoices", 0, 1, 4)]
    client.produce("invoices", ["p4"])
    assert parts(client.txn_commit(one.txn_id)) == [("invoices", 0, 2, 6)]
    client.produce("invoices", ["p5"])
    found = log(client, "invoices")
    assert [offset for _, offset, _ in found] == list(range(9))
    assert [value for _, _, value in found] == [
        "p0", "p1", "p2", "p3", "two-a", "p4", "one-a", "one-b", "p5",
    ]  # fmt: skip


def test_concurrent_commits_and_plain_produces_keep_each_transaction_adjacent(
    target: Target, client: Client
) -> None:
    rounds = 15
    errors: list[BaseException] = []

    def transactional(name: str) -> None:
        try:
            writer = target.client()
            for n in range(rounds):
                txn = writer.txn_begin(f"group-{name}")
                writer.produce("invoices", [f"{name}{n}-a", f"{name}{n}-b"], txn=txn.txn_id)
                writer.produce("invoices", [f"{name}{n}-c"], txn=txn.txn_id)
                writer.txn_commit(txn.txn_id)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def plain() -> None:
        try:
            writer = target.client()
            for n in range(rounds * 2):
                writer.produce("invoices", [f"plain-{n}"])
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=transactional, args=("x",)),
        threading.Thread(target=transactional, args=("y",)),
        threading.Thread(target=plain),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    found = list(client.consume("invoices"))
    assert [r.offset for r in found] == list(range(rounds * 2 * 3 + rounds * 2))
    stored = [present(r.value).decode() for r in found]
    for name in "xy":
        for n in range(rounds):
            start = stored.index(f"{name}{n}-a")
            assert stored[start : start + 3] == [f"{name}{n}-a", f"{name}{n}-b", f"{name}{n}-c"]
    assert [v for v in stored if v.startswith("plain")] == [f"plain-{n}" for n in range(rounds * 2)]


# abort and bad requests -------------------------------------------------------------------


def test_abort_discards_the_journaled_records(client: Client) -> None:
    client.produce("invoices", ["plain-0"])
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["doomed-1", "doomed-2"])
    produce_in(client, txn.txn_id, "ledger", ["doomed-3"], partition=2)
    aborted = client.txn_abort(txn.txn_id)
    assert (aborted.state, aborted.reason, aborted.partitions) == ("aborted", "by request", ())
    assert client.txn_show(txn.txn_id).records == ()
    client.produce("invoices", ["plain-1"])
    assert log(client, "invoices") == [(0, 0, "plain-0"), (0, 1, "plain-1")]
    assert log(client, "ledger") == []

    error = refused(ErrorCode.TXN_ABORTED, lambda: client.txn_commit(txn.txn_id))
    assert "by request" in error.message
    again = client.txn_abort(txn.txn_id)
    assert (again.state, again.reason) == ("aborted", "by request")
    assert log(client, "invoices") == [(0, 0, "plain-0"), (0, 1, "plain-1")]


def test_a_committed_transaction_cannot_be_aborted_or_written(client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    client.txn_commit(txn.txn_id)
    refused(ErrorCode.TXN_NOT_OPEN, lambda: client.txn_abort(txn.txn_id))
    error = refused(
        ErrorCode.TXN_NOT_OPEN, lambda: client.produce("invoices", ["late"], txn=txn.txn_id)
    )
    assert "committed" in error.message
    refused(ErrorCode.TXN_NOT_OPEN, lambda: client.join_transaction(txn.txn_id, "late-task"))
    refused(
        ErrorCode.TXN_NOT_OPEN,
        lambda: client.txn_commit_offsets(txn.txn_id, "copier", "invoices", {0: 1}),
    )
    assert values(client, "invoices") == ["inv-1"]


def test_an_aborted_transaction_refuses_records_with_txn_aborted(client: Client) -> None:
    txn = client.txn_begin("billing")
    client.txn_abort(txn.txn_id)
    refused(ErrorCode.TXN_ABORTED, lambda: client.produce("invoices", ["late"], txn=txn.txn_id))
    refused(ErrorCode.TXN_ABORTED, lambda: client.join_transaction(txn.txn_id, "task"))
    refused(
        ErrorCode.TXN_ABORTED,
        lambda: client.txn_commit_offsets(txn.txn_id, "copier", "invoices", {0: 1}),
    )
    assert values(client, "invoices") == []


@pytest.mark.parametrize("op", ["commit", "abort", "show", "join", "produce", "offsets"])
def test_an_unknown_transaction_is_unknown_txn(client: Client, op: str) -> None:
    client.txn_begin("billing")
    missing = 987_654
    calls: dict[str, Callable[[], object]] = {
        "commit": lambda: client.txn_commit(missing),
        "abort": lambda: client.txn_abort(missing),
        "show": lambda: client.txn_show(missing),
        "join": lambda: client.join_transaction(missing, "task"),
        "produce": lambda: client.produce("invoices", ["x"], txn=missing),
        "offsets": lambda: client.txn_commit_offsets(missing, "copier", "invoices", {0: 1}),
    }
    error = refused(ErrorCode.UNKNOWN_TXN, calls[op])
    assert error.details["txn_id"] == missing
    assert values(client, "invoices") == []


@pytest.mark.parametrize("txn_id", [0, -1])
@pytest.mark.parametrize("op", ["commit", "abort", "show", "join", "produce", "offsets"])
def test_a_malformed_transaction_id_is_invalid_argument(
    request: pytest.FixtureRequest, target: Target, client: Client, op: str, txn_id: int
) -> None:
    calls: dict[str, Callable[[], object]] = {
        "commit": lambda: client.txn_commit(txn_id),
        "abort": lambda: client.txn_abort(txn_id),
        "show": lambda: client.txn_show(txn_id),
        "join": lambda: client.join_transaction(txn_id, "task"),
        "produce": lambda: client.produce("invoices", ["x"], txn=txn_id),
        "offsets": lambda: client.txn_commit_offsets(txn_id, "copier", "invoices", {0: 1}),
    }
    refused(ErrorCode.INVALID_ARGUMENT, calls[op])
    assert values(client, "invoices") == []


def test_commit_or_abort_naming_another_group_is_txn_wrong_group(client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    error = refused(
        ErrorCode.TXN_WRONG_GROUP, lambda: client.txn_commit(txn.txn_id, group="payroll")
    )
    assert (error.details["group"], error.details["requested"]) == ("billing", "payroll")
    refused(ErrorCode.TXN_WRONG_GROUP, lambda: client.txn_abort(txn.txn_id, group="payroll"))
    assert values(client, "invoices") == []
    assert client.txn_show(txn.txn_id).info.state == "open"
    assert client.txn_commit(txn.txn_id, group="billing").state == "committed"
    refused(ErrorCode.TXN_WRONG_GROUP, lambda: client.txn_commit(txn.txn_id, group="payroll"))
    assert values(client, "invoices") == ["inv-1"]


def test_a_missing_topic_is_refused_and_the_transaction_goes_on(client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    error = refused(
        ErrorCode.UNKNOWN_TOPIC, lambda: client.produce("nowhere", ["x"], txn=txn.txn_id)
    )
    assert error.details["topic"] == "nowhere"
    refused(
        ErrorCode.UNKNOWN_TOPIC,
        lambda: client.txn_commit_offsets(txn.txn_id, "copier", "nowhere", {0: 1}),
    )
    assert [r.value for r in client.txn_show(txn.txn_id).records] == [b"inv-1"]
    produce_in(client, txn.txn_id, "invoices", ["inv-2"])
    committed = client.txn_commit(txn.txn_id)
    assert parts(committed) == [("invoices", 0, 2, 0)]
    assert values(client, "invoices") == ["inv-1", "inv-2"]
    assert [t.name for t in client.list_topics()] == ["invoices", "ledger"]


def test_a_batch_with_a_bad_partition_journals_none_of_its_records(client: Client) -> None:
    txn = client.txn_begin("billing")
    batch = [NewRecord(b"ok", partition=0), NewRecord(b"bad", partition=9)]
    refused(ErrorCode.UNKNOWN_PARTITION, lambda: client.produce("ledger", batch, txn=txn.txn_id))
    refused(
        ErrorCode.UNKNOWN_PARTITION,
        lambda: client.txn_commit_offsets(txn.txn_id, "copier", "ledger", {0: 1, 9: 1}),
    )
    assert client.txn_show(txn.txn_id).records == ()
    assert client.txn_commit(txn.txn_id).partitions == ()
    assert values(client, "ledger") == []
    assert client.committed_offsets("copier", "ledger") == ({}, None)


def test_a_topic_deleted_under_a_transaction_leaves_the_rest_to_commit(client: Client) -> None:
    client.create_topic("scratch")
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "scratch", ["gone"])
    produce_in(client, txn.txn_id, "invoices", ["kept"])
    client.delete_topic("scratch")
    committed = client.txn_commit(txn.txn_id)
    assert committed.state == "committed"
    assert [(p.topic, p.records) for p in committed.partitions if p.topic is not None] == [
        ("invoices", 1)
    ]
    assert values(client, "invoices") == ["kept"]
    client.create_topic("scratch")
    assert values(client, "scratch") == []


def test_a_commit_never_interleaves_an_exclusive_producers_epoch(
    target: Target, client: Client
) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["txn-before"])
    leader = target.client().producer("invoices", idempotent=False, access="exclusive", name="l")
    try:
        leader.send(["leader-1"], partition=0)
        refused(ErrorCode.PRODUCER_BUSY, lambda: client.produce("invoices", ["plain"]))
        with contextlib.suppress(BrokerError):
            client.txn_commit(txn.txn_id)
        leader.send(["leader-2"], partition=0)
    finally:
        leader.close()
    epochs = [r.epoch for r in client.consume("invoices")]
    assert epochs == sorted(epochs), list(zip(values(client, "invoices"), epochs, strict=True))


def test_a_commit_never_lands_records_of_a_fenced_owner(target: Target, client: Client) -> None:
    client.create_topic("owned", owner_group="samza")
    zombie, successor = target.client(), target.client()
    [old] = zombie.own("samza", {"owned/0": 1})
    txn = client.txn_begin("billing")
    zombie.produce("owned", ["zombie"], partition=0, fences=[old.fence], txn=txn.txn_id)
    [new] = successor.own("samza", {"owned/0": 2})
    successor.produce("owned", ["successor"], partition=0, fences=[new.fence])
    with contextlib.suppress(BrokerError):
        client.txn_commit(txn.txn_id)
    assert values(client, "owned") == ["successor"]


# timeouts ---------------------------------------------------------------------------------


def test_an_abandoned_transaction_times_out(client: Client, clock: FakeClock) -> None:
    txn = client.txn_begin("billing")
    assert txn.deadline_ms == txn.began_ms + TIMEOUT_MS
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    clock.advance(TIMEOUT_MS - 1)
    assert [t.txn_id for t in client.txn_list()] == [txn.txn_id]
    clock.advance(1)
    error = refused(
        ErrorCode.TXN_ABORTED, lambda: client.produce("invoices", ["late"], txn=txn.txn_id)
    )
    assert "timed out" in error.message
    assert client.txn_list() == []
    [ended] = client.txn_list(include_ended=True)
    assert (ended.txn_id, ended.state, ended.reason) == (txn.txn_id, "aborted", "timed out")
    assert ended.ended_ms == txn.began_ms + TIMEOUT_MS
    error = refused(ErrorCode.TXN_ABORTED, lambda: client.txn_commit(txn.txn_id))
    assert "timed out" in error.message
    assert error.details["reason"] == "timed out"
    assert values(client, "invoices") == []


def test_keepalive_moves_the_deadline_of_an_open_transaction_only(
    client: Client, clock: FakeClock
) -> None:
    txn = client.txn_begin("billing", timeout_ms=1_000)
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    for _ in range(5):  # a job working five times as long as its timeout
        clock.advance(900)
        kept = client.txn_keepalive(txn.txn_id, 1_000, group="billing")
        assert (kept.state, kept.deadline_ms) == ("open", clock.now_ms + 1_000)
    assert client.txn_commit(txn.txn_id).state == "committed"
    assert values(client, "invoices") == ["inv-1"]
    error = refused(ErrorCode.TXN_NOT_OPEN, lambda: client.txn_keepalive(txn.txn_id, 1_000))
    assert error.message == (
        f"transaction {txn.txn_id} is committed: it has no deadline left to move"
    )

    late = client.txn_begin("billing", timeout_ms=1_000)
    clock.advance(1_000)  # an abandoned job: nobody kept it alive
    error = refused(ErrorCode.TXN_ABORTED, lambda: client.txn_keepalive(late.txn_id, 1_000))
    assert "timed out" in error.message
    other = client.txn_begin("billing")
    refused(ErrorCode.TXN_WRONG_GROUP, lambda: client.txn_keepalive(other.txn_id, 5, group="x"))
    refused(ErrorCode.INVALID_ARGUMENT, lambda: client.txn_keepalive(other.txn_id, 0))
    refused(ErrorCode.UNKNOWN_TXN, lambda: client.txn_keepalive(10**6, 1_000))


def test_a_commit_past_the_deadline_is_txn_aborted_even_before_the_sweep(
    client: Client, clock: FakeClock
) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["inv-1"])
    clock.advance(TIMEOUT_MS + 5)
    refused(ErrorCode.TXN_ABORTED, lambda: client.txn_commit(txn.txn_id))
    info = client.txn_show(txn.txn_id).info
    assert (info.state, info.reason) == ("aborted", "timed out")
    assert client.txn_abort(txn.txn_id).reason == "timed out", "aborting it again answers it"
    assert values(client, "invoices") == []


def test_a_transaction_has_its_own_timeout(client: Client, clock: FakeClock) -> None:
    quick = client.txn_begin("billing", timeout_ms=5_000)
    slow = client.txn_begin("billing")
    assert quick.deadline_ms - quick.began_ms == 5_000
    produce_in(client, quick.txn_id, "invoices", ["quick"])
    produce_in(client, slow.txn_id, "invoices", ["slow"])
    clock.advance(4_999)
    kept = client.txn_begin("billing", timeout_ms=5_000)
    produce_in(client, kept.txn_id, "invoices", ["kept"])
    clock.advance(1)
    refused(ErrorCode.TXN_ABORTED, lambda: client.txn_commit(quick.txn_id))
    assert [t.txn_id for t in client.txn_list()] == sorted([slow.txn_id, kept.txn_id])
    client.txn_commit(kept.txn_id)
    client.txn_commit(slow.txn_id)
    assert values(client, "invoices") == ["kept", "slow"]


@pytest.mark.parametrize("timeout_ms", [0, -5, DEFAULT_LIMITS.txn_timeout_max_ms + 1])
def test_a_bad_timeout_is_invalid_argument(client: Client, timeout_ms: int) -> None:
    error = refused(
        ErrorCode.INVALID_ARGUMENT, lambda: client.txn_begin("billing", timeout_ms=timeout_ms)
    )
    assert str(timeout_ms) in error.message
    assert client.txn_list(include_ended=True) == []


def test_age_counts_from_the_begin(client: Client, clock: FakeClock) -> None:
    txn = client.txn_begin("billing")
    clock.advance(1_500)
    [listed] = client.txn_list()
    assert listed.age_ms == 1_500
    clock.advance(500)
    assert client.txn_commit(txn.txn_id).age_ms == 2_000
    clock.advance(10_000)
    assert client.txn_show(txn.txn_id).info.age_ms == 2_000, "an ended transaction stops aging"


# keyed begin ------------------------------------------------------------------------------


def test_a_keyed_begin_finds_its_open_then_its_committed_transaction(client: Client) -> None:
    first = client.txn_begin("billing", key="batch-7")
    assert (first.key, first.existing) == ("batch-7", False)
    produce_in(client, first.txn_id, "invoices", ["inv-1"])
    again = client.txn_begin("billing", key="batch-7")
    assert (again.txn_id, again.existing, again.state) == (first.txn_id, True, "open")
    assert again.records == 1
    client.txn_commit(first.txn_id)
    replayed = client.txn_begin("billing", key="batch-7")
    assert (replayed.txn_id, replayed.existing, replayed.state) == (first.txn_id, True, "committed")
    assert parts(replayed) == [("invoices", 0, 1, 0)]
    refused(
        ErrorCode.TXN_NOT_OPEN, lambda: client.produce("invoices", ["dup"], txn=replayed.txn_id)
    )
    assert values(client, "invoices") == ["inv-1"]


def test_a_key_belongs_to_its_group(client: Client) -> None:
    billing = client.txn_begin("billing", key="batch-7")
    payroll = client.txn_begin("payroll", key="batch-7")
    assert payroll.txn_id != billing.txn_id
    assert not payroll.existing


def test_after_an_abort_or_a_timeout_the_key_begins_a_new_transaction(
    client: Client, clock: FakeClock
) -> None:
    first = client.txn_begin("billing", key="batch-7")
    client.txn_abort(first.txn_id)
    second = client.txn_begin("billing", key="batch-7")
    assert (second.existing, second.state) == (False, "open")
    assert second.txn_id != first.txn_id
    clock.advance(TIMEOUT_MS)
    third = client.txn_begin("billing", key="batch-7")
    assert (third.existing, third.state) == (False, "open")
    assert third.txn_id not in (first.txn_id, second.txn_id)
    assert client.txn_show(second.txn_id).info.reason == "timed out"


def test_transaction_ids_are_never_reused(target: Target, client: Client) -> None:
    seen = {client.txn_begin("billing").txn_id for _ in range(5)}
    other = target.client()
    seen |= {other.txn_begin("billing").txn_id for _ in range(5)}
    assert len(seen) == 10
    assert all(txn_id > 0 for txn_id in seen)


# members ----------------------------------------------------------------------------------


def test_a_member_joins_with_a_pid_and_generation(client: Client) -> None:
    txn = client.txn_begin("billing")
    task = client.join_transaction(txn.txn_id, "task-1")
    assert task.member is not None
    assert (task.member.member, task.member.generation) == ("task-1", 1)
    assert task.member.producer_id > 0
    assert (task.txn_id, task.group, task.owner) == (txn.txn_id, "billing", False)
    other = client.join_transaction(txn.txn_id, "task-2")
    assert other.member is not None
    assert other.member.producer_id != task.member.producer_id


def test_a_retried_member_replaces_its_earlier_attempt(client: Client) -> None:
    txn = client.txn_begin("billing")
    attempt1 = client.join_transaction(txn.txn_id, "task-1")
    attempt1.produce("invoices", ["t1-first-a", "t1-first-b"])
    attempt1.produce("ledger", ["t1-first-c"], partition=1)
    neighbour = client.join_transaction(txn.txn_id, "task-2")
    neighbour.produce("invoices", ["t2"])

    attempt2 = client.join_transaction(txn.txn_id, "task-1")
    assert attempt1.member is not None and attempt2.member is not None
    assert attempt2.member.producer_id == attempt1.member.producer_id
    assert attempt2.member.generation == 2
    assert attempt2.member.discarded == 3
    attempt2.produce("invoices", ["t1-second"])

    error = refused(ErrorCode.FENCED, lambda: attempt1.produce("invoices", ["zombie"]))
    assert (error.details["stored_generation"], error.details["received_generation"]) == (2, 1)
    client.txn_commit(txn.txn_id)
    assert sorted(values(client, "invoices")) == ["t1-second", "t2"]
    assert values(client, "ledger") == []
    stored = {r.value: r for r in client.consume("invoices")}
    assert (stored[b"t1-second"].producer_id, stored[b"t1-second"].generation) == (
        attempt2.member.producer_id,
        2,
    )


def test_a_pid_that_never_joined_is_unknown_pid(client: Client) -> None:
    txn = client.txn_begin("billing")
    elsewhere = client.txn_begin("billing")
    member = client.join_transaction(elsewhere.txn_id, "task-1").member
    assert member is not None
    stranger = ProducerFields(member.producer_id, member.generation, txn_id=txn.txn_id)
    error = refused(
        ErrorCode.UNKNOWN_PID, lambda: client.produce("invoices", ["x"], producer=stranger)
    )
    assert error.details["producer_id"] == member.producer_id
    never = ProducerFields(999_999, 1, txn_id=txn.txn_id)
    refused(ErrorCode.UNKNOWN_PID, lambda: client.produce("invoices", ["x"], producer=never))
    ahead = ProducerFields(member.producer_id, member.generation + 1, txn_id=elsewhere.txn_id)
    refused(ErrorCode.INVALID_GENERATION, lambda: client.produce("invoices", ["x"], producer=ahead))
    assert client.txn_show(txn.txn_id).records == ()


def test_a_joined_member_writes_but_does_not_end_the_transaction(client: Client) -> None:
    txn = client.txn_begin("billing")
    with client.join_transaction(txn.txn_id, "task-1") as member:
        member.produce("invoices", ["from-task"])
        refused(ErrorCode.INVALID_ARGUMENT, member.commit)
        refused(ErrorCode.INVALID_ARGUMENT, member.abort)
    assert client.txn_show(txn.txn_id).info.state == "open", "a member's with-block ends nothing"
    client.txn_commit(txn.txn_id)
    assert values(client, "invoices") == ["from-task"]


def test_joining_needs_a_member_name(client: Client) -> None:
    txn = client.txn_begin("billing")
    refused(ErrorCode.INVALID_NAME, lambda: client.join_transaction(txn.txn_id, ""))


# consumer offsets -------------------------------------------------------------------------


def test_offsets_in_a_transaction_take_effect_at_its_commit(client: Client) -> None:
    client.commit_offsets("copier", "ledger", {0: 1})
    txn = client.txn_begin("copier-txns")
    state = ProducerState("invoices", {0: PartitionState(5, 1, 10)})
    client.txn_commit_offsets(txn.txn_id, "copier", "ledger", {0: 4, 2: 7}, producer=state)
    assert client.committed_offsets("copier", "ledger") == ({0: 1}, None)
    client.txn_commit(txn.txn_id)
    assert client.committed_offsets("copier", "ledger") == ({0: 4, 2: 7}, state)


def test_offsets_in_an_aborted_or_timed_out_transaction_are_dropped(
    client: Client, clock: FakeClock
) -> None:
    client.commit_offsets("copier", "ledger", {0: 1})
    txn = client.txn_begin("copier-txns")
    client.txn_commit_offsets(txn.txn_id, "copier", "ledger", {0: 4})
    client.txn_abort(txn.txn_id)
    late = client.txn_begin("copier-txns")
    client.txn_commit_offsets(late.txn_id, "copier", "ledger", {0: 9})
    clock.advance(TIMEOUT_MS)
    refused(ErrorCode.TXN_ABORTED, lambda: client.txn_commit(late.txn_id))
    assert client.committed_offsets("copier", "ledger") == ({0: 1}, None)


def test_transaction_commit_offsets_travel_with_the_records(client: Client) -> None:
    client.produce("ledger", ["in-0", "in-1", "in-2"], partition=0)
    with client.transaction("copier-txns") as txn:
        for record in client.consume("ledger", partition=0):
            txn.produce("invoices", [present(record.value).upper()])
        txn.commit_offsets("copier", "ledger", {0: 3})
        assert client.committed_offsets("copier", "ledger") == ({}, None)
        assert values(client, "invoices") == []
    assert values(client, "invoices") == ["IN-0", "IN-1", "IN-2"]
    assert client.committed_offsets("copier", "ledger")[0] == {0: 3}


def test_negative_offsets_are_invalid_argument(client: Client) -> None:
    txn = client.txn_begin("billing")
    refused(
        ErrorCode.INVALID_ARGUMENT,
        lambda: client.txn_commit_offsets(txn.txn_id, "copier", "ledger", {0: -1}),
    )


def test_committed_offsets_answer_the_state_of_the_last_transaction(client: Client) -> None:
    older = ProducerState("invoices", {0: PartitionState(5, 1, 10)})
    newer = ProducerState("invoices", {0: PartitionState(5, 1, 20)})
    client.commit_offsets("copier", "ledger", {0: 5}, producer=older)
    txn = client.txn_begin("copier-txns")
    client.txn_commit_offsets(txn.txn_id, "copier", "ledger", {1: 9}, producer=newer)
    client.txn_commit(txn.txn_id)
    assert client.committed_offsets("copier", "ledger") == ({0: 5, 1: 9}, newer)


# the with-block --------------------------------------------------------------------------------


def test_a_with_block_commits_on_exit(client: Client) -> None:
    with client.transaction("billing") as txn:
        txn.produce("invoices", ["inv-1"])
        txn.produce("ledger", ["debit-1"], partition=3)
        assert values(client, "invoices") == []
    assert txn.info.state == "committed"
    assert values(client, "invoices") == ["inv-1"]
    assert log(client, "ledger") == [(3, 0, "debit-1")]
    refused(ErrorCode.TXN_NOT_OPEN, lambda: txn.produce("invoices", ["after"]))
    refused(ErrorCode.TXN_NOT_OPEN, txn.commit)


def test_a_with_block_aborts_when_its_body_raises(client: Client) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), client.transaction("billing") as txn:
        txn.produce("invoices", ["inv-1"])
        raise Boom
    assert client.txn_show(txn.txn_id).info.state == "aborted"
    assert values(client, "invoices") == []


def test_a_with_block_that_timed_out_raises_txn_aborted_at_exit(
    client: Client, clock: FakeClock
) -> None:
    def body() -> None:
        with client.transaction("billing", timeout_ms=1_000) as txn:
            txn.produce("invoices", ["inv-1"])
            clock.advance(1_000)

    error = refused(ErrorCode.TXN_ABORTED, body)
    assert "timed out" in error.message
    assert values(client, "invoices") == []


def test_a_replayed_keyed_block_finds_its_committed_transaction(client: Client) -> None:
    """A job that reruns its with-block under the same key after a commit it never saw
    acknowledged: the transaction is found committed, and nothing is written twice."""
    found: list[tuple[bool, str]] = []
    for _run in range(2):
        with client.transaction("billing", key="batch-7") as txn:
            found.append((txn.info.existing, txn.info.state))
            if not txn.info.existing:
                txn.produce("invoices", ["inv-1", "inv-2"])
        assert txn.info.state == "committed"
    assert found == [(False, "open"), (True, "committed")]
    assert values(client, "invoices") == ["inv-1", "inv-2"]


def test_an_explicit_commit_inside_the_block_is_not_repeated(client: Client) -> None:
    with client.transaction("billing") as txn:
        txn.produce("invoices", ["inv-1"])
        txn.commit()
    assert values(client, "invoices") == ["inv-1"]


# list and show ----------------------------------------------------------------------------


def test_list_shows_open_and_committing_transactions_with_their_partitions(client: Client) -> None:
    one = client.txn_begin("billing")
    two = client.txn_begin("payroll", key="run-1")
    produce_in(client, one.txn_id, "ledger", ["a", "b"], partition=2)
    produce_in(client, one.txn_id, "invoices", ["c"])
    listed = {t.txn_id: t for t in client.txn_list()}
    assert set(listed) == {one.txn_id, two.txn_id}
    assert parts(listed[one.txn_id]) == [("invoices", 0, 1, None), ("ledger", 2, 2, None)]
    assert (listed[two.txn_id].group, listed[two.txn_id].key) == ("payroll", "run-1")
    client.txn_commit(one.txn_id)
    assert [t.txn_id for t in client.txn_list()] == [two.txn_id]
    assert {t.txn_id for t in client.txn_list(include_ended=True)} == {one.txn_id, two.txn_id}
    assert len(client.txn_list(include_ended=True, limit=1)) == 1
    refused(ErrorCode.INVALID_ARGUMENT, lambda: client.txn_list(limit=-1))


def test_show_gives_the_journal_and_the_journaled_records(client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "ledger", ["a", "b"], partition=1)
    produce_in(client, txn.txn_id, "invoices", ["c"])
    detail = client.txn_show(txn.txn_id)
    assert [e.kind for e in detail.journal] == ["BEGIN"]
    assert sorted((r.topic, r.partition, r.offset, r.value) for r in detail.records) == [
        ("invoices", 0, 0, b"c"),
        ("ledger", 1, 0, b"a"),
        ("ledger", 1, 1, b"b"),
    ]
    assert all(r.txn_id == txn.txn_id for r in detail.records)
    assert len(client.txn_show(txn.txn_id, records_max=2).records) == 2
    assert client.txn_show(txn.txn_id, records_max=0).records == ()
    refused(ErrorCode.INVALID_ARGUMENT, lambda: client.txn_show(txn.txn_id, records_max=-1))

    client.txn_commit(txn.txn_id)
    done = client.txn_show(txn.txn_id)
    assert [e.kind for e in done.journal] == ["BEGIN", "PREPARE_COMMIT", "COMPLETE"]
    assert len({e.journal for e in done.journal}) == 1
    positions = [e.position for e in done.journal]
    assert positions == sorted(positions)
    assert done.records == (), "applied: the data journals are empty"

    other = client.txn_begin("billing")
    client.txn_abort(other.txn_id)
    assert [e.kind for e in client.txn_show(other.txn_id).journal] == ["BEGIN", "ABORT"]


# long-polling consumers ------------------------------------------------------------------------


def wait_parked(target: Target, reader: Client, topic: str) -> None:
    """Until reader's fetch is waiting for new records of topic (not just started)."""
    if target.server is not None:
        target.server.wait_fetch_parked(topic, 10)
        return
    wait_until(
        lambda: getattr(reader._transport, "_watcher", None) is not None,
        10,
        interval_s=0.005,
        message="the fetch started waiting for the data directory's WAL",
    )


def test_a_waiting_fetch_wakes_when_the_commit_lands(target: Target, client: Client) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "ledger", ["debit-1"], partition=2)
    reader = target.client()
    got: list[list[Record]] = []

    def fetch() -> None:
        got.append(reader.fetch("ledger", {0: 0, 1: 0, 2: 0, 3: 0}, wait_ms=WAIT_MS))

    thread = threading.Thread(target=fetch)
    thread.start()
    try:
        wait_parked(target, reader, "ledger")
        client.txn_commit(txn.txn_id)
        # woken by the commit: it returns long before the end of its wait
        thread.join(timeout=WAIT_MS / 1000 / 2)
        assert not thread.is_alive(), "woken by the commit, not by the end of the wait"
    finally:
        thread.join(timeout=WAIT_MS / 1000 + 10)
    [records] = got
    assert [(r.partition, r.offset, r.value) for r in records] == [(2, 0, b"debit-1")]


def test_an_aborted_transaction_never_wakes_a_reader_with_records(
    target: Target, client: Client
) -> None:
    txn = client.txn_begin("billing")
    produce_in(client, txn.txn_id, "invoices", ["doomed"])
    client.txn_abort(txn.txn_id)
    assert client.fetch("invoices", {0: 0}, wait_ms=50) == []


# the engine: journal order and recovery ---------------------------------------------------


def close(opened: list[Engine], engine: Engine) -> None:
    opened.remove(engine)
    engine.close()


def journal_into(
    engine: Engine, txn_id: int, topic: str, items: list[str], partition: int = 0
) -> None:
    engine.produce(
        topic,
        [NewRecord(v.encode(), partition=partition) for v in items],
        producer=ProducerFields(txn_id=txn_id),
    )


def stored(engine: Engine, topic: str) -> list[tuple[int, int, bytes | None, int | None]]:
    partitions = engine.describe_topic(topic).partitions
    return [
        (r.partition, r.offset, r.value, r.txn_id)
        for p in range(partitions)
        for r in engine.read(topic, p, 0)
    ]


def prepare_only(engine: Engine, monkeypatch: pytest.MonkeyPatch, txn_id: int) -> TxnInfo:
    """Commit up to PREPARE_COMMIT and no further: what a broker killed there leaves."""
    with monkeypatch.context() as patched:
        patched.setattr(engine.txns, "_apply", lambda t: engine.txn_show(t, 0).info)
        info = engine.txn_commit(txn_id)
    assert info.state == "prepared"
    return info


def test_commits_of_a_group_are_applied_in_journal_order(
    opened: list[Engine], data_dir: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_engine(opened, data_dir, clock)
    engine.create_topic("invoices")
    first = engine.txn_begin("billing")
    second = engine.txn_begin("billing")
    journal_into(engine, first.txn_id, "invoices", ["first-a", "first-b"])
    journal_into(engine, second.txn_id, "invoices", ["second"])
    prepare_only(engine, monkeypatch, first.txn_id)
    assert stored(engine, "invoices") == [], "prepared, not applied yet"
    assert [t.state for t in engine.txn_list()] == ["prepared", "open"]
    with pytest.raises(BrokerError) as caught:
        engine.txn_abort(first.txn_id)
    assert caught.value.code is ErrorCode.TXN_NOT_OPEN, "a prepared commit is decided"

    assert parts(engine.txn_commit(second.txn_id)) == [("invoices", 0, 1, 2)]
    assert stored(engine, "invoices") == [
        (0, 0, b"first-a", first.txn_id),
        (0, 1, b"first-b", first.txn_id),
        (0, 2, b"second", second.txn_id),
    ]
    assert engine.txn_show(first.txn_id).info.state == "committed"
    assert parts(engine.txn_commit(first.txn_id)) == [("invoices", 0, 2, 0)]
    assert len(stored(engine, "invoices")) == 3


def test_a_copy_that_fails_after_the_commit_point_says_the_commit_is_decided(
    opened: list[Engine], data_dir: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills during APPLY_COMMIT: the error read as a plain failure ("storage
    failed during commit"), while the commit was decided and landed later."""
    engine = open_engine(opened, data_dir, clock)
    engine.create_topic("invoices")
    txn = engine.txn_begin("billing")
    journal_into(engine, txn.txn_id, "invoices", ["a"])

    def disk_full(*args: object) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as patched:
        patched.setattr("broker.storage.txns.apply_partition", disk_full)
        with pytest.raises(BrokerError) as caught:
            engine.txn_commit(txn.txn_id)
    assert caught.value.code is ErrorCode.STORAGE_FAILED
    assert f"transaction {txn.txn_id} is prepared: its commit is decided" in caught.value.message
    assert "database or disk is full" in caught.value.message
    assert caught.value.details["decided"] is True
    assert engine.txn_show(txn.txn_id).info.state == "prepared"
    assert engine.txns.recover() == [txn.txn_id]
    assert stored(engine, "invoices") == [(0, 0, b"a", txn.txn_id)]


def test_recovery_twice_changes_nothing(
    opened: list[Engine], data_dir: Path, clock: FakeClock
) -> None:
    engine = open_engine(opened, data_dir, clock)
    engine.create_topic("ledger", 2)
    txn = engine.txn_begin("billing")
    journal_into(engine, txn.txn_id, "ledger", ["a", "b"], partition=1)
    engine.txn_commit(txn.txn_id)
    before = (stored(engine, "ledger"), engine.end_offsets("ledger"))
    assert engine.txns.recover() == []
    assert engine.txns.recover() == []
    assert (stored(engine, "ledger"), engine.end_offsets("ledger")) == before


def test_a_start_applies_a_prepared_commit_exactly_once(
    opened: list[Engine], data_dir: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_engine(opened, data_dir, clock)
    engine.create_topic("ledger", 2)
    engine.create_topic("invoices")
    engine.produce("invoices", [NewRecord(b"plain-0")])
    txn = engine.txn_begin("billing")
    journal_into(engine, txn.txn_id, "ledger", ["a", "b"], partition=1)
    journal_into(engine, txn.txn_id, "invoices", ["c"])
    prepare_only(engine, monkeypatch, txn.txn_id)
    close(opened, engine)

    engine = open_engine(opened, data_dir, clock)
    expected = [(1, 0, b"a", txn.txn_id), (1, 1, b"b", txn.txn_id)]
    assert stored(engine, "ledger") == expected
    assert stored(engine, "invoices") == [(0, 0, b"plain-0", None), (0, 1, b"c", txn.txn_id)]
    info = engine.txn_show(txn.txn_id).info
    assert info.state == "committed"
    assert parts(info) == [("ledger", 1, 2, 0), ("invoices", 0, 1, 1)]
    assert engine.txns.recover() == []
    close(opened, engine)

    engine = open_engine(opened, data_dir, clock)
    assert stored(engine, "ledger") == expected
    assert engine.end_offsets("ledger") == [0, 2]
    assert engine.end_offsets("invoices") == [2]
    assert engine.txn_commit(txn.txn_id).state == "committed"
    assert engine.end_offsets("invoices") == [2]


class Stop(Exception):
    pass


def test_a_start_finishes_a_half_applied_commit_without_copying_twice(
    opened: list[Engine], data_dir: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_partition_a_time = replace(DEFAULT_LIMITS, txn_apply_records_max=2)
    engine = open_engine(opened, data_dir, clock, one_partition_a_time)
    engine.create_topic("ledger", 3)
    txn = engine.txn_begin("billing")
    for partition in range(3):
        journal_into(
            engine, txn.txn_id, "ledger", [f"p{partition}-a", f"p{partition}-b"], partition
        )
    copies: list[str] = []

    def stop_after_the_first_partition(step: str) -> None:
        copies.append(step)
        if copies.count("apply") == 2:  # the second partition's copy, not yet committed
            raise Stop

    with monkeypatch.context() as patched:
        patched.setattr(engine.txns.failpoints, "reached", stop_after_the_first_partition)
        with pytest.raises(Stop):
            engine.txn_commit(txn.txn_id)
    copied = stored(engine, "ledger")
    assert [(p, o) for p, o, _, _ in copied] == [(0, 0), (0, 1)], "one partition copied"
    engine.produce("ledger", [NewRecord(b"plain", partition=1)])
    close(opened, engine)

    engine = open_engine(opened, data_dir, clock)
    assert stored(engine, "ledger") == [
        (0, 0, b"p0-a", txn.txn_id),
        (0, 1, b"p0-b", txn.txn_id),
        (1, 0, b"plain", None),
        (1, 1, b"p1-a", txn.txn_id),
        (1, 2, b"p1-b", txn.txn_id),
        (2, 0, b"p2-a", txn.txn_id),
        (2, 1, b"p2-b", txn.txn_id),
    ]
    assert engine.end_offsets("ledger") == [2, 3, 2]
    assert engine.txn_show(txn.txn_id).info.state == "committed"
    engine.txns.recover()
    assert engine.end_offsets("ledger") == [2, 3, 2]


def test_an_open_transaction_survives_a_restart_and_still_commits(
    opened: list[Engine], data_dir: Path, clock: FakeClock
) -> None:
    engine = open_engine(opened, data_dir, clock)
    engine.create_topic("invoices")
    txn = engine.txn_begin("billing")
    journal_into(engine, txn.txn_id, "invoices", ["inv-1"])
    close(opened, engine)
    engine = open_engine(opened, data_dir, clock)
    assert stored(engine, "invoices") == [], "not prepared: stays out of the log"
    assert [t.txn_id for t in engine.txn_list()] == [txn.txn_id]
    newer = engine.txn_begin("billing")
    assert newer.txn_id > txn.txn_id, "ids come from the persistent counter"
    engine.txn_commit(txn.txn_id)
    assert stored(engine, "invoices") == [(0, 0, b"inv-1", txn.txn_id)]


def test_history_is_bounded_when_every_process_runs_one_transaction(
    data_dir: Path, clock: FakeClock
) -> None:
    limits = Limits(txn_history_max=2)
    for _process in range(103):
        with Engine.open(data_dir, durability="normal", limits=limits, clock=clock) as engine:
            engine.txn_commit(engine.txn_begin("billing").txn_id)
    with Engine.open(data_dir, durability="normal", limits=limits, clock=clock) as engine:
        kept = engine.txn_list(include_ended=True, limit=1_000)
    # pruning runs every 100 begins: at most 2 kept then, plus the begins since
    assert len(kept) <= 2 + 100


def test_a_commit_naming_members_keeps_only_their_current_records(client: Client) -> None:
    txn = client.txn_begin("billing")
    client.join_transaction(txn.txn_id, "task-1").produce("invoices", ["first-attempt"])
    client.join_transaction(txn.txn_id, "task-1").produce("invoices", ["retry"])
    client.join_transaction(txn.txn_id, "task-2").produce("invoices", ["abandoned"])

    unknown = refused(
        ErrorCode.INVALID_ARGUMENT, lambda: client.txn_commit(txn.txn_id, members={"task-9": 1})
    )
    assert "'task-9' never joined transaction" in unknown.message
    stale = refused(ErrorCode.FENCED, lambda: client.txn_commit(txn.txn_id, members={"task-1": 1}))
    assert "generation 1 is older than the member's generation 2" in stale.message
    assert values(client, "invoices") == [], "a refused commit leaves the transaction open"

    info = client.txn_commit(txn.txn_id, members={"task-1": 2})
    assert (info.state, info.records) == ("committed", 1)
    assert values(client, "invoices") == ["retry"]


# a transaction begun by its first produce (client.transaction) -----------------------------


def test_a_transaction_begins_with_its_first_produce(client: Client, clock: FakeClock) -> None:
    txn = client.transaction("billing", timeout_ms=5_000)
    assert not txn.begun
    clock.advance(4_000)  # a timeout counts from the first produce, not from here
    assert client.txn_list(include_ended=True) == [], "nothing begun before a write"
    results = txn.produce("ledger", ["a", "b", "c", "d", "e"])
    assert [r.offset for r in results] == [-1] * 5
    routed = collections.Counter(r.partition for r in results)  # round robin
    assert sorted(routed.values()) == [1, 1, 1, 2]
    assert txn.begun and txn.info.state == "open"
    assert [(p.topic, p.partition, p.records) for p in txn.info.partitions] == [
        ("ledger", partition, routed[partition]) for partition in range(4)
    ]
    txn.produce("invoices", ["inv"])
    (listed,) = client.txn_list()
    assert listed.txn_id == txn.txn_id and listed.group == "billing"
    assert sum(p.records for p in listed.partitions) == 6
    clock.advance(4_000)
    assert txn.commit().state == "committed"
    assert sorted(values(client, "ledger")) == ["a", "b", "c", "d", "e"]
    assert values(client, "invoices") == ["inv"]


def test_a_first_produce_that_fails_begins_nothing(client: Client) -> None:
    with pytest.raises(BrokerError) as caught, client.transaction("billing") as txn:
        txn.produce("missing", ["x"])
    assert caught.value.code is ErrorCode.UNKNOWN_TOPIC
    assert client.txn_list(include_ended=True) == [], "the failed first write began nothing"
    refused(ErrorCode.TXN_NOT_OPEN, lambda: txn.produce("invoices", ["late"]))
    again = client.transaction("billing")
    refused(ErrorCode.UNKNOWN_PARTITION, lambda: again.produce("ledger", ["y"], partition=9))
    assert client.txn_list(include_ended=True) == []
    again.produce("invoices", ["kept"])
    assert again.commit().state == "committed"
    assert values(client, "invoices") == ["kept"]


def test_asking_for_its_id_begins_a_transaction_before_any_write(client: Client) -> None:
    txn = client.transaction("billing")
    txn_id = txn.txn_id  # e.g. to hand to other processes that join it
    assert [t.txn_id for t in client.txn_list()] == [txn_id]
    member = client.join_transaction(txn_id, "task-1")
    member.produce("invoices", ["from-a-member"])
    txn.produce("invoices", ["from-the-owner"])
    assert txn.commit().partitions[0].records == 2
    assert sorted(values(client, "invoices")) == ["from-a-member", "from-the-owner"]


def test_a_transaction_with_no_write_commits_empty_and_one_that_raises_first_leaves_nothing(
    client: Client,
) -> None:
    with client.transaction("billing") as empty:
        pass
    assert empty.info.state == "committed" and empty.info.partitions == ()
    with pytest.raises(RuntimeError), client.transaction("billing"):
        raise RuntimeError("the body failed before writing")
    assert [t.txn_id for t in client.txn_list(include_ended=True)] == [empty.txn_id]


def test_counts_follow_records_a_retried_member_and_a_commit_by_members_discard(
    client: Client,
) -> None:
    txn = client.txn_begin("billing")
    first = client.join_transaction(txn.txn_id, "task-1")
    first.produce("ledger", ["stale-1", "stale-2"], partition=1)
    retried = client.join_transaction(txn.txn_id, "task-1")  # fences the first attempt
    retried.produce("ledger", ["kept-1"], partition=1)
    other = client.join_transaction(txn.txn_id, "task-2")
    other.produce("ledger", ["dropped"], partition=2)
    shown = client.txn_show(txn.txn_id).info
    assert parts(shown) == [("ledger", 1, 1, None), ("ledger", 2, 1, None)]
    assert [p.bytes for p in shown.partitions] == [len("kept-1"), len("dropped")]
    committed = client.txn_commit(txn.txn_id, members={"task-1": 2})
    assert parts(committed) == [("ledger", 1, 1, 0)]
    assert log(client, "ledger") == [(1, 0, "kept-1")]


LEGACY_JOURNAL = """
CREATE TABLE txn_data (
    txn_id INTEGER NOT NULL, topic_id INTEGER NOT NULL, partition INTEGER NOT NULL,
    position INTEGER NOT NULL, timestamp_ms INTEGER NOT NULL, key BLOB, value BLOB NOT NULL,
    headers BLOB NOT NULL, producer_id INTEGER NOT NULL, generation INTEGER NOT NULL,
    epoch INTEGER NOT NULL, PRIMARY KEY (txn_id, topic_id, partition, position)
) STRICT, WITHOUT ROWID
"""


LEGACY_RECORDS = """
CREATE TABLE records (
    topic_id INTEGER NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL, key BLOB, value BLOB NOT NULL, headers BLOB NOT NULL,
    producer_id INTEGER NOT NULL DEFAULT 0, generation INTEGER NOT NULL DEFAULT 0,
    sequence INTEGER NOT NULL DEFAULT 0, epoch INTEGER NOT NULL DEFAULT 0, txn_id INTEGER,
    PRIMARY KEY (topic_id, partition, offset)
) STRICT, WITHOUT ROWID
"""
LEGACY_RECORDS_BY_KEY = (
    "CREATE INDEX records_by_key ON records (topic_id, partition, key, offset) "
    "WHERE key IS NOT NULL"
)


def test_a_transaction_journaled_before_schema_011_commits_after_the_upgrade(
    data_dir: Path, clock: FakeClock
) -> None:
    """Schemas 011 and 012: a transaction journaled by a broker that kept one row per
    journaled record and counted only at PREPARE is counted, packed and committed."""
    with connect(data_dir, durability="normal", clock=clock) as client:
        client.create_topic("ledger", partitions=2)
        txn = client.txn_begin("billing")
    conn = sqlite3.connect(data_dir / DB_FILE)
    with conn:
        conn.execute("DROP TABLE txn_batches")
        conn.execute("DROP TABLE log")  # schema 015's, and schema 001's log back
        conn.execute("DROP TABLE log_times")  # schema 018's (log's triggers went with it)
        conn.execute(LEGACY_RECORDS)
        conn.execute(LEGACY_RECORDS_BY_KEY)
        for table in ("consumer_offsets", "txn_offsets"):  # schema 014's
            conn.execute(f"ALTER TABLE {table} DROP COLUMN metadata")
            conn.execute(f"ALTER TABLE {table} DROP COLUMN leader_epoch")
        conn.execute(LEGACY_JOURNAL)
        at = clock() - 5
        rows = [  # partition, position, key, value, headers (msgpack)
            (0, 0, None, b"a", b"\x90"),
            (0, 1, b"k", b"b", b"\x91\x92\xa1h\xc4\x01v"),  # headers (("h", b"v"),)
            (1, 0, None, b"c", b"\x90"),
        ]
        conn.executemany(
            "INSERT INTO txn_data VALUES (?, 1, ?, ?, ?, ?, ?, ?, 0, 0, 0)",
            [
                (txn.txn_id, part, pos, at, key, value, headers)
                for part, pos, key, value, headers in rows
            ],
        )
        conn.executemany(
            "INSERT INTO txn_partitions (txn_id, topic_id, partition) VALUES (?, 1, ?)",
            [(txn.txn_id, 0), (txn.txn_id, 1)],
        )
        conn.execute("PRAGMA user_version = 10")
    conn.close()
    with connect(data_dir, durability="normal", clock=clock) as client:
        shown = client.txn_show(txn.txn_id)
        assert parts(shown.info) == [("ledger", 0, 2, None), ("ledger", 1, 1, None)]
        assert [p.bytes for p in shown.info.partitions] == [3, 1]
        assert [
            (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms)
            for r in shown.records
        ] == [
            (0, 0, None, b"a", (), at),
            (0, 1, b"k", b"b", (("h", b"v"),), at),
            (1, 0, None, b"c", (), at),
        ]
        assert client.txn_commit(txn.txn_id).state == "committed"
        stored = [
            (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms, r.txn_id)
            for r in client.consume("ledger")
        ]
        assert sorted(stored) == [
            (0, 0, None, b"a", (), at, txn.txn_id),
            (0, 1, b"k", b"b", (("h", b"v"),), at, txn.txn_id),
            (1, 0, None, b"c", (), at, txn.txn_id),
        ]
    conn = sqlite3.connect(data_dir / DB_FILE)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_schema")}
    finally:
        conn.close()
    assert "txn_data" not in tables and "txn_batches" in tables


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("UPDATE log SET vals = X'c1' WHERE topic_id <= 0", "its values do not hold its 2"),
        ("UPDATE txn_batches SET records = 3", "its row of the log holds 2 records, not 3"),
        ("DELETE FROM log WHERE topic_id <= 0", "its row of the log is missing"),
    ],
)
def test_a_damaged_journal_batch_is_data_corrupt_and_lands_nothing(
    data_dir: Path, clock: FakeClock, damage: str, said: str
) -> None:
    """A journaled batch whose row of the log does not hold its records as the journal
    says (the file damaged under SQLite's own checks): the commit is DATA_CORRUPT and
    lands nothing; the broker still
    opens (the transaction stays prepared, as do later ones of its journal) and serves."""
    with connect(data_dir, durability="normal", clock=clock) as client:
        client.create_topic("ledger", partitions=1)
        txn = client.txn_begin("billing")
        produce_in(client, txn.txn_id, "ledger", ["a", "b"])
    conn = sqlite3.connect(data_dir / DB_FILE)
    with conn:
        conn.execute(damage)
    conn.close()
    with connect(data_dir, durability="normal", clock=clock) as client:
        error = refused(ErrorCode.DATA_CORRUPT, lambda: client.txn_commit(txn.txn_id))
        assert f"transaction {txn.txn_id}'s journaled batch" in error.message
        assert said in error.message
        later = client.txn_begin("billing")
        produce_in(client, later.txn_id, "ledger", ["c"])
        refused(ErrorCode.DATA_CORRUPT, lambda: client.txn_commit(later.txn_id))
        assert values(client, "ledger") == []
    with connect(data_dir, durability="normal", clock=clock) as client:  # recovery skips them
        assert client.txn_show(later.txn_id, records_max=0).info.state == "prepared"
        with client.transaction("other-group") as other:
            other.produce("ledger", ["d"])
        client.produce("ledger", ["e"])
        assert values(client, "ledger") == ["d", "e"]


def test_plain_writes_stay_synced_after_commits_whose_prepare_is_not(data_dir: Path) -> None:
    """Under durability full, PREPARE_COMMIT's write is not synced on its own (the move
    after it is, and covers it); every other write still syncs its commit, also after
    a commit that was refused at its prepare."""
    with connect(data_dir) as client, connect(data_dir) as zombie:  # durability full
        transport = client._transport
        assert isinstance(transport, EmbeddedTransport)
        engine = transport.engine
        client.create_topic("invoices")
        client.create_topic("owned", owner_group="samza")
        [old] = zombie.own("samza", {"owned/0": 1})
        client.txn_begin("warm-up")  # takes this process's block of ids (a synced write)
        with contextlib.contextmanager(commits_synced)(engine) as commits:
            with client.transaction("billing") as txn:
                txn.produce("invoices", ["a"])
            client.produce("invoices", ["b"])
            stale = client.txn_begin("billing")
            zombie.produce("owned", ["c"], partition=0, fences=[old.fence], txn=stale.txn_id)
            client.own("samza", {"owned/0": 2})
            refused(ErrorCode.FENCED, lambda: client.txn_commit(stale.txn_id))
            client.produce("invoices", ["d"])
        assert commits[:5] == [False, False, True, True, False]  # begin with "a", prepare,
        # the move, "b", the stale transaction's begin; then every commit syncs: the new
        # fence, what the refused commit wrote (its prepare rolled back), "d"
        assert len(commits) == 8 and all(commits[5:]), commits
        assert values(client, "invoices") == ["a", "b", "d"] and values(client, "owned") == []


def commits_synced(engine: Engine) -> Iterator[list[bool]]:
    """Whether each write of the engine's writer connection committed with synchronous
    FULL (its reads, BEGIN without IMMEDIATE, are not counted)."""
    commits: list[bool] = []
    synchronous, writing = ["FULL"], [False]

    def traced(statement: str) -> None:
        if statement.startswith("PRAGMA synchronous = "):
            synchronous[0] = statement.split("= ")[1]
        elif statement == "BEGIN IMMEDIATE":
            writing[0] = True
        elif statement == "COMMIT" and writing[0]:
            commits.append(synchronous[0] == "FULL")
            writing[0] = False

    engine.database.conn.set_trace_callback(traced)
    try:
        yield commits
    finally:
        engine.database.conn.set_trace_callback(None)


def test_a_begin_is_synced_only_when_it_takes_a_new_block_of_ids(data_dir: Path) -> None:
    """Durability full: a BEGIN lost in a power loss is a transaction that never existed,
    as long as its id is never handed out again. So only the write that takes a new block
    of ids (its counter) is synced; the next write of the transaction syncs the BEGIN
    with it, and ids stay unique across processes."""
    limits = Limits(txn_id_block_size=2)
    with Engine.open(data_dir, durability="full", limits=limits) as engine:
        engine.create_topic("invoices")
        with contextlib.contextmanager(commits_synced)(engine) as commits:
            first = engine.txn_begin("billing")  # takes ids 1-2
            engine.produce("invoices", [NewRecord(b"a")], producer=ProducerFields(txn_id=1))
            second, _ = engine.txn_begin_produce("billing", "invoices", [NewRecord(b"b")])
            third, _ = engine.txn_begin_produce("billing", "invoices", [NewRecord(b"c")])
            fourth = engine.txn_begin("billing")
        assert commits == [True, True, False, True, False]
        for txn in (first, second, third):
            engine.txn_commit(txn.txn_id)
        assert [r.value for r in engine.read("invoices", 0, 0)] == [b"a", b"b", b"c"]
    with Engine.open(data_dir, durability="full", limits=limits) as engine:
        fifth = engine.txn_begin("billing")
    ids = [t.txn_id for t in (first, second, third, fourth, fifth)]
    assert ids == [1, 2, 3, 4, 5]
