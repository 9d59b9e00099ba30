"""Model-based tests of transactions (DESIGN.md section 6) through the Python client,
against an embedded broker and a served one.

A Hypothesis RuleBasedStateMachine drives two clients of one fresh broker in random order:
begins in two transactional groups (with or without a key, with the default or a short
timeout), records produced into open, committed, aborted and timed-out transactions
across several partitions of two topics, plain records between them, commits and aborts
(naming the transaction's group, no group, or the wrong one), consumer offsets committed
inside transactions and outside them, a fake clock stepping past deadlines, and requests
naming a transaction that does not exist. A transaction lives in the broker, so either
client may write into, commit or abort a transaction the other began.

Beside it, a plain reference model written from DESIGN.md section 6 says what every reply
must be (the transaction begun or found again under its key, the offsets -1 of journaled
records, the committed transaction with the base offset of each partition, TXN_ABORTED,
TXN_NOT_OPEN, TXN_WRONG_GROUP, UNKNOWN_TXN), and after every step the machine checks what
a reader sees: every committed transaction wholly in the logs, in commit order, at
contiguous offsets after what was there at its commit; no record of an open or aborted
transaction anywhere; the end offsets; the open transactions `txn_list` shows with their
journaled partitions; and the consumer offsets, which a transaction's commit applies and
its abort drops. `txn_show` is checked against the journal entries each state has
(BEGIN; PREPARE_COMMIT, COMPLETE; ABORT) and the records still in the data journals.

What the code answers where DESIGN.md is silent, modelled as found in
broker/core/txn.py: aborting a committed transaction is TXN_NOT_OPEN; aborting an aborted
(or timed-out) one answers it again, aborted, with its first reason; records or offsets
for a committed transaction are TXN_NOT_OPEN; a keyed begin finds an open or committed
transaction of that group and key, never an aborted one.

Time is a fake clock handed to the embedded engines and to the served broker alike, so a
timeout is a clock step, never a sleep. Each example gets its own data directory and,
served, its own Server on 127.0.0.1 in a thread; the example closes and removes them.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.server.server import Server
from broker.types import NewRecord, TxnInfo
from support.models import MODEL_SETTINGS
from support.producing import FakeClock
from support.servers import ServerThread
from support.values import present

TOPICS = {"invoices": 1, "ledger": 3}  # created in this order: the broker lists by it
TOPIC_ORDER = list(TOPICS)
GROUPS = ("billing", "payroll")
KEYS = (None, "batch-1", "batch-2")
CONSUMER_GROUP = "copier"
DEFAULT_TIMEOUT_MS = DEFAULT_LIMITS.txn_timeout_ms
SHORT_TIMEOUT_MS = 5_000
CLOCK_STEPS_MS = (1, 500, 2_000, 4_000, DEFAULT_TIMEOUT_MS)
NO_SUCH_TXN = 1 << 40  # far above any id a block of this run hands out
JOURNAL_KINDS = {
    "open": ["BEGIN"],
    "committed": ["BEGIN", "PREPARE_COMMIT", "COMPLETE"],
    "aborted": ["BEGIN", "ABORT"],
}

# (topic, partition) -> [(value, txn_id or None), ...]: a log as a reader sees it
Logs = dict[tuple[str, int], list[tuple[bytes, int | None]]]
# (topic, partition, records, base_offset): one partition of a TxnInfo
PartitionEntry = tuple[str | None, int, int, int | None]


@dataclass(eq=False)
class ModelTxn:
    """A transaction as the model knows it."""

    txn_id: int
    group: str
    key: str | None
    began_ms: int
    deadline_ms: int
    state: str = "open"  # "open", "committed" or "aborted"
    reason: str | None = None  # why it was aborted: "by request" or "timed out"
    records: list[tuple[str, int, bytes]] = field(default_factory=list)  # in produce order
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, p) -> next
    base_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # at commit

    def __repr__(self) -> str:
        return f"txn{self.txn_id}({self.state})"

    def counts(self) -> dict[tuple[str, int], int]:
        found: dict[tuple[str, int], int] = {}
        for topic, partition, _ in self.records:
            found[topic, partition] = found.get((topic, partition), 0) + 1
        return found

    def partitions(self) -> list[PartitionEntry]:
        """What TxnInfo.partitions must say: the journaled counts while open, the copied
        partitions with their base offsets once committed, nothing once aborted."""
        if self.state == "aborted":
            return []
        ordered = sorted(self.counts().items(), key=lambda kv: partition_order(kv[0]))
        return [(t, p, n, self.base_offsets.get((t, p))) for (t, p), n in ordered]


def partition_order(where: tuple[str, int]) -> tuple[int, int]:
    return TOPIC_ORDER.index(where[0]), where[1]


def all_partitions() -> list[tuple[str, int]]:
    return [(topic, p) for topic, count in TOPICS.items() for p in range(count)]


def partition_lists(topic: str) -> st.SearchStrategy[list[int]]:
    """Where each record of one produce goes: 1 to 3 records over the topic's partitions."""
    return st.lists(st.integers(0, TOPICS[topic] - 1), min_size=1, max_size=3)


class ClockedServerThread(ServerThread):
    """A ServerThread whose broker reads time from the machine's fake clock."""

    def __init__(self, data_dir: Path, clock: FakeClock) -> None:
        super().__init__(data_dir)
        self.server = Server(data_dir, durability="normal", clock=clock)


def refused(code: ErrorCode, call: Callable[[], object]) -> BrokerError:
    """The BrokerError call() raises, which must have this code."""
    with pytest.raises(BrokerError) as caught:
        call()
    assert caught.value.code is code, (caught.value, code)
    return caught.value


class TxnMachine(RuleBasedStateMachine):
    """Begins, journaled produces, commits, aborts, offsets and timeouts, checked against
    DESIGN.md 6."""

    txns = Bundle("txns")
    served = False  # EmbeddedTxns or ServedTxns says

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.stack = contextlib.ExitStack()
        try:
            directory = Path(tempfile.mkdtemp(prefix="fencelog-model-txn-"))
            self.stack.callback(shutil.rmtree, directory, ignore_errors=True)
            data_dir = directory / "data"
            if self.served:
                server = ClockedServerThread(data_dir, self.clock).start()
                self.stack.callback(server.stop)
                self.target = server.address
            else:
                self.target = str(data_dir)
            self.clients = [self.connect(), self.connect()]
            self.observer = self.connect()  # reads only: logs, txn_list, offsets
            for topic, partitions in TOPICS.items():
                self.observer.create_topic(topic, partitions=partitions)
        except BaseException:
            self.stack.close()
            raise
        self.logs: Logs = {where: [] for where in all_partitions()}
        self.offsets: dict[tuple[str, int], int] = {}  # CONSUMER_GROUP's committed offsets
        self.known: list[ModelTxn] = []  # every transaction begun, in begin order
        self.journals: dict[str, int] = {}  # group -> the journal partition it was given
        self.values = 0

    def teardown(self) -> None:
        self.stack.close()

    def connect(self) -> Client:
        if self.served:
            client = connect(self.target)
        else:
            client = connect(self.target, durability="normal", clock=self.clock)
        self.stack.callback(client.close)
        return client

    def next_value(self, prefix: str) -> bytes:
        self.values += 1
        return f"{prefix}-{self.values}".encode()

    def expect_info(self, info: TxnInfo, txn: ModelTxn) -> None:
        assert (info.txn_id, info.group, info.key) == (txn.txn_id, txn.group, txn.key), info
        assert (info.state, info.reason) == (txn.state, txn.reason), (info, txn)
        assert (info.began_ms, info.deadline_ms) == (txn.began_ms, txn.deadline_ms), info
        parts = [(p.topic, p.partition, p.records, p.base_offset) for p in info.partitions]
        assert parts == txn.partitions(), (parts, txn.partitions())
        # J(G): one journal partition per group, the same for all its transactions
        assert 0 <= info.journal < DEFAULT_LIMITS.txn_journals
        assert self.journals.setdefault(txn.group, info.journal) == info.journal, info

    # steps -------------------------------------------------------------------------------

    @rule(
        target=txns,
        client=st.integers(0, 1),
        group=st.sampled_from(GROUPS),
        key=st.sampled_from(KEYS),
        short=st.booleans(),
    )
    def begin(self, client: int, group: str, key: str | None, short: bool) -> ModelTxn:
        timeout_ms = SHORT_TIMEOUT_MS if short else None
        info = self.clients[client].txn_begin(group, key=key, timeout_ms=timeout_ms)
        found = [t for t in self.known if (t.group, t.key) == (group, key) and t.state != "aborted"]
        if key is not None and found:  # a keyed begin finds its open or committed one
            [txn] = found
            assert info.existing, info
            event(f"begin: found again, {txn.state}")
        else:
            assert not info.existing, info
            assert info.txn_id not in {t.txn_id for t in self.known}, "a txn id is reused"
            assert info.txn_id > 0
            deadline_ms = self.clock.now_ms + (timeout_ms or DEFAULT_TIMEOUT_MS)
            txn = ModelTxn(info.txn_id, group, key, self.clock.now_ms, deadline_ms)
            self.known.append(txn)
            event("begin: new")
        self.expect_info(info, txn)
        return txn

    @rule(
        client=st.integers(0, 1),
        txn=txns,
        data=st.data(),
        topic=st.sampled_from(TOPIC_ORDER),
    )
    def produce_in(self, client: int, txn: ModelTxn, data: st.DataObject, topic: str) -> None:
        partitions = data.draw(partition_lists(topic), label="partitions")
        records = [NewRecord(self.next_value(f"t{txn.txn_id}"), partition=p) for p in partitions]
        produce = self.clients[client].produce
        if txn.state == "aborted":
            error = refused(ErrorCode.TXN_ABORTED, lambda: produce(topic, records, txn=txn.txn_id))
            assert error.details["reason"] == txn.reason, error.details
        elif txn.state == "committed":
            refused(ErrorCode.TXN_NOT_OPEN, lambda: produce(topic, records, txn=txn.txn_id))
        else:
            results = produce(topic, records, txn=txn.txn_id)
            assert [(r.topic, r.partition, r.offset) for r in results] == [
                (topic, p, -1) for p in partitions
            ], "journaled: no offset until the commit"
            txn.records += [
                (topic, p, present(r.value)) for r, p in zip(records, partitions, strict=True)
            ]
        event(f"produce into a transaction: {txn.state}")

    def open_txns(self) -> list[ModelTxn]:
        return [t for t in self.known if t.state == "open"]

    # Most transactions drawn from the bundle have ended by the time they are drawn; these
    # two rules pick an open one, so that records and commits of open ones are common.
    @precondition(lambda self: bool(self.open_txns()))
    @rule(client=st.integers(0, 1), data=st.data(), topic=st.sampled_from(TOPIC_ORDER))
    def produce_in_an_open_one(self, client: int, data: st.DataObject, topic: str) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()), label="txn")
        self.produce_in(client, txn, data, topic)

    @precondition(lambda self: bool(self.open_txns()))
    @rule(client=st.integers(0, 1), data=st.data(), choice=st.sampled_from(["none", "own"]))
    def commit_an_open_one(self, client: int, data: st.DataObject, choice: str) -> None:
        txn = data.draw(st.sampled_from(self.open_txns()), label="txn")
        self.commit(client, txn, choice)

    @rule(client=st.integers(0, 1), data=st.data(), topic=st.sampled_from(TOPIC_ORDER))
    def produce_plain(self, client: int, data: st.DataObject, topic: str) -> None:
        """Records outside any transaction go to the log at once, between commits."""
        partitions = data.draw(partition_lists(topic), label="partitions")
        records = [NewRecord(self.next_value("plain"), partition=p) for p in partitions]
        results = self.clients[client].produce(topic, records)
        expected = []
        for record, partition in zip(records, partitions, strict=True):
            log = self.logs[topic, partition]
            expected.append((topic, partition, len(log)))
            log.append((present(record.value), None))
        assert [(r.topic, r.partition, r.offset) for r in results] == expected

    def naming(self, txn: ModelTxn, choice: str) -> str | None:
        """The group a commit or abort names: none, the transaction's, or the other one."""
        if choice == "none":
            return None
        if choice == "own":
            return txn.group
        return GROUPS[1 - GROUPS.index(txn.group)]

    @rule(client=st.integers(0, 1), txn=txns, choice=st.sampled_from(["none", "own", "other"]))
    def commit(self, client: int, txn: ModelTxn, choice: str) -> None:
        group = self.naming(txn, choice)
        commit = self.clients[client].txn_commit
        event(f"commit: {txn.state}" + (", wrong group" if choice == "other" else ""))
        if choice == "other":
            refused(ErrorCode.TXN_WRONG_GROUP, lambda: commit(txn.txn_id, group=group))
            return
        if txn.state == "aborted":
            error = refused(ErrorCode.TXN_ABORTED, lambda: commit(txn.txn_id, group=group))
            assert error.details["reason"] == txn.reason, error.details
            return
        if txn.state == "open":
            # PREPARE_COMMIT, then every partition copied to its log end, in commit order
            for where in sorted(txn.counts(), key=partition_order):
                txn.base_offsets[where] = len(self.logs[where])
            for topic, partition, value in txn.records:
                self.logs[topic, partition].append((value, txn.txn_id))
            for (topic, partition), offset in txn.offsets.items():
                self.offsets[topic, partition] = offset
            txn.state = "committed"
        # committing a committed transaction answers it again and changes nothing
        self.expect_info(commit(txn.txn_id, group=group), txn)

    @rule(client=st.integers(0, 1), txn=txns, choice=st.sampled_from(["none", "own", "other"]))
    def abort(self, client: int, txn: ModelTxn, choice: str) -> None:
        group = self.naming(txn, choice)
        abort = self.clients[client].txn_abort
        event(f"abort: {txn.state}" + (", wrong group" if choice == "other" else ""))
        if choice == "other":
            refused(ErrorCode.TXN_WRONG_GROUP, lambda: abort(txn.txn_id, group=group))
            return
        if txn.state == "committed":  # its commit is decided and cannot be undone
            error = refused(ErrorCode.TXN_NOT_OPEN, lambda: abort(txn.txn_id, group=group))
            assert error.details["state"] == "committed", error.details
            return
        if txn.state == "open":
            txn.state, txn.reason = "aborted", "by request"
        # aborting an aborted transaction answers it again, with its first reason
        self.expect_info(abort(txn.txn_id, group=group), txn)

    @rule(
        client=st.integers(0, 1),
        txn=txns,
        where=st.sampled_from(all_partitions()),
        offset=st.integers(0, 50),
    )
    def commit_offsets_in(
        self, client: int, txn: ModelTxn, where: tuple[str, int], offset: int
    ) -> None:
        """Consumer offsets that take effect at the commit, and never after an abort."""
        topic, partition = where

        def call() -> None:
            self.clients[client].txn_commit_offsets(
                txn.txn_id, CONSUMER_GROUP, topic, {partition: offset}
            )

        event(f"offsets in a transaction: {txn.state}")
        if txn.state == "aborted":
            refused(ErrorCode.TXN_ABORTED, call)
        elif txn.state == "committed":
            refused(ErrorCode.TXN_NOT_OPEN, call)
        else:
            call()
            txn.offsets[where] = offset

    @rule(
        client=st.integers(0, 1), where=st.sampled_from(all_partitions()), offset=st.integers(0, 50)
    )
    def commit_offsets_plain(self, client: int, where: tuple[str, int], offset: int) -> None:
        topic, partition = where
        self.clients[client].commit_offsets(CONSUMER_GROUP, topic, {partition: offset})
        self.offsets[where] = offset

    @rule(step_ms=st.sampled_from(CLOCK_STEPS_MS))
    def time_passes(self, step_ms: int) -> None:
        """An open transaction at or past its deadline is aborted as timed out."""
        now_ms = self.clock.advance(step_ms)
        for txn in self.known:
            if txn.state == "open" and now_ms >= txn.deadline_ms:
                txn.state, txn.reason = "aborted", "timed out"
                event("a transaction timed out")

    @rule(client=st.integers(0, 1), txn=txns)
    def show(self, client: int, txn: ModelTxn) -> None:
        """The journal entries of its state, and what is still in the data journals."""
        detail = self.clients[client].txn_show(txn.txn_id)
        self.expect_info(detail.info, txn)
        assert [e.kind for e in detail.journal] == JOURNAL_KINDS[txn.state], detail.journal
        assert {e.journal for e in detail.journal} == {detail.info.journal}
        positions = [e.position for e in detail.journal]
        assert positions == sorted(positions), detail.journal
        journaled = [(r.topic, r.partition, r.value) for r in detail.records]
        if txn.state == "open":
            assert sorted(journaled) == sorted(txn.records), (journaled, txn.records)
            assert all(r.txn_id == txn.txn_id for r in detail.records)
        else:  # applied or discarded: the data journals no longer hold it
            assert journaled == [], journaled

    @rule(client=st.integers(0, 1), op=st.sampled_from(["commit", "abort", "produce", "show"]))
    def no_such_transaction(self, client: int, op: str) -> None:
        opened = self.clients[client]
        calls: dict[str, Callable[[], object]] = {
            "commit": lambda: opened.txn_commit(NO_SUCH_TXN),
            "abort": lambda: opened.txn_abort(NO_SUCH_TXN),
            "produce": lambda: opened.produce("invoices", [b"x"], txn=NO_SUCH_TXN),
            "show": lambda: opened.txn_show(NO_SUCH_TXN),
        }
        refused(ErrorCode.UNKNOWN_TXN, calls[op])

    # what a reader sees after every step --------------------------------------------------

    @invariant()
    def readers_see_committed_transactions_only(self) -> None:
        for topic, partitions in TOPICS.items():
            expected = [len(self.logs[topic, p]) for p in range(partitions)]
            assert self.observer.end_offsets(topic) == expected, topic
            for partition in range(partitions):
                read = [
                    (r.offset, r.value, r.txn_id)
                    for r in self.observer.consume(topic, partition=partition)
                ]
                log = self.logs[topic, partition]
                assert read == [(n, v, t) for n, (v, t) in enumerate(log)], (topic, partition)

    @invariant()
    def the_open_transactions_are_listed(self) -> None:
        listed = [
            (t.txn_id, t.state, [(p.topic, p.partition, p.records) for p in t.partitions])
            for t in self.observer.txn_list()
        ]
        expected = [
            (t.txn_id, "open", [(p[0], p[1], p[2]) for p in t.partitions()])
            for t in sorted(self.known, key=lambda t: t.txn_id)
            if t.state == "open"
        ]
        assert listed == expected

    @invariant()
    def consumer_offsets_move_only_with_commits(self) -> None:
        for topic in TOPICS:
            found, _ = self.observer.committed_offsets(CONSUMER_GROUP, topic)
            expected = {p: n for (t, p), n in self.offsets.items() if t == topic}
            assert found == expected, topic


class EmbeddedTxns(TxnMachine):
    """Each client opens the data directory in this process, on the machine's clock."""

    served = False


class ServedTxns(TxnMachine):
    """Each client connects to one Server on 127.0.0.1 that runs on the machine's clock."""

    served = True


TestEmbeddedTxns = EmbeddedTxns.TestCase
TestEmbeddedTxns.settings = MODEL_SETTINGS
TestServedTxns = ServedTxns.TestCase
TestServedTxns.settings = MODEL_SETTINGS

pytestmark = pytest.mark.usefixtures("no_thread_is_left")
