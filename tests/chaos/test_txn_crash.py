"""Crash safety of transactions (issue 7, DESIGN.md section 6), with real processes that
die by SIGKILL at named failure points (FENCELOG_FAILPOINT=STEP[:N], broker/engine/transactions.py):

- every failure point, in an embedded `fencelog` process and in a `fencelog serve`: after
  the restart each transaction is wholly in the logs (killed at or after PREPARE_COMMIT)
  or wholly absent (before it; that transaction then aborts or times out), offsets stay
  contiguous from 0, and opening the directory twice more changes nothing;
- a recovery that is itself killed (mid APPLY_COMMIT, before COMPLETE) finishes later,
  copying nothing twice; a member killed mid-write is replaced by its retry alone;
- consumers following the topics while transactions commit, abort, time out and die
  never read a record of a transaction that ended aborted, and see one group's commits
  in journal order;
- a consume-transform-produce copier (tests/support/txn_copier.py) killed with SIGKILL at random
  points, against a served broker that is killed too (from outside, and at its own
  failure point), and embedded copiers that die at their own failure points: output
  equals input, once each, in order per partition.

Each kill is asserted (exit status -9). Random choices print their seed on failure.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import broker
from broker.client.client import connect
from broker.discovery import DB_FILE
from broker.engine.transactions import FAILPOINT_ENV
from broker.errors import BrokerError, ErrorCode
from support import SCRIPTS
from support.helpers import Process, Processes, fencelog_script, user_env
from support.producing import free_port
from support.servers import HOST, ServeProcess
from support.stored import stored_records
from support.waiting import wait_until

STEP_S = 20.0
GROUP = "crashy"
TOPICS = {"alpha": 2, "beta": 2}  # a transaction over both touches 4 partitions
COMMITTED_STEPS = ("prepare", "apply", "complete", "ack")  # the commit point is passed
TXN_ABORTED_EXIT = int(ErrorCode.TXN_ABORTED)


# processes --------------------------------------------------------------------------------


def child_env(failpoint: str | None = None) -> dict[str, str]:
    """A user's environment, with the failure point armed only when asked."""
    env = {k: v for k, v in user_env().items() if k != FAILPOINT_ENV}
    if failpoint is not None:
        env[FAILPOINT_ENV] = failpoint
    return env


def fencelog(
    processes: Processes,
    broker_at: str | Path,
    *args: str,
    failpoint: str | None = None,
    stdin: bool = False,
) -> Process:
    return processes.start(
        [fencelog_script(), "--broker", str(broker_at), *args],
        env=child_env(failpoint),
        stdin=stdin,
    )


def finished(process: Process) -> tuple[int, list[dict[str, Any]]]:
    """Exit status and the JSON lines it printed."""
    status = process.wait(STEP_S)
    lines = [json.loads(line) for line in process.remaining_lines()]
    return status, lines


def run_ok(processes: Processes, broker_at: str | Path, *args: str) -> list[dict[str, Any]]:
    process = fencelog(processes, broker_at, *args)
    status, lines = finished(process)
    assert status == 0, (args, status, process.stderr_text())
    return lines


def assert_killed(process: Process, what: str) -> None:
    status = process.wait(STEP_S)
    assert status == -9, f"{what}: exit {status}, not SIGKILL; stderr: {process.stderr_text()!r}"


def produce_until_killed(
    processes: Processes,
    data_dir: Path,
    topic: str,
    txn_id: int,
    values: list[bytes],
    *extra: str,
) -> list[bytes]:
    """`fencelog produce TOPIC --txn ID` armed with data:2 and fed one line per batch:
    its second batch is journaled (committed), then it dies before acknowledging it.
    The values journaled."""
    producing = fencelog(
        processes, data_dir, "produce", topic, "--txn", str(txn_id), "--json", *extra,
        failpoint="data:2", stdin=True,
    )  # fmt: skip
    producing.stdin.write(values[0] + b"\n")
    producing.stdin.flush()
    ack = json.loads(producing.line(STEP_S))
    assert ack["offset"] is None and ack["txn_id"] == txn_id, ack
    producing.stdin.write(values[1] + b"\n")
    producing.stdin.flush()
    assert_killed(producing, "produce --txn")
    return values[:2]


@pytest.fixture
def servers() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    try:
        yield started
    finally:
        for server in started:
            server.close()


def start_server(
    servers: list[ServeProcess],
    data_dir: Path,
    port: int,
    failpoint: str | None = None,
) -> ServeProcess:
    """`fencelog serve` on 127.0.0.1:port (the same port across restarts). The failure
    point is in its environment only, never in this process's."""
    ready = data_dir.parent / f"ready-{len(servers)}.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(FAILPOINT_ENV, raising=False)
        if failpoint is not None:
            patch.setenv(FAILPOINT_ENV, failpoint)
        server = ServeProcess(data_dir, ready, listen=f"{HOST}:{port}", serve_args=["--no-unix"])
    servers.append(server)
    server.wait_ready()
    return server


# what the directory holds, read straight from SQLite ---------------------------------------


def table(conn: sqlite3.Connection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in conn.execute(sql)]


def stored(data_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Logs, partitions, transactions, journals and data journals, every column that a
    second recovery could change."""
    conn = sqlite3.connect(data_dir / DB_FILE)
    try:
        return {
            "records": [tuple(record.values()) for record in stored_records(data_dir / DB_FILE)],
            "partitions": table(
                conn,
                "SELECT t.name, p.partition, p.next_offset, p.bytes "
                "FROM partitions AS p JOIN topics AS t USING (topic_id) "
                "ORDER BY t.name, p.partition",
            ),
            "txns": table(
                conn,
                "SELECT txn_id, group_name, state, reason, ended_ms, prepare_position "
                "FROM txns ORDER BY txn_id",
            ),
            "journal": table(
                conn, "SELECT journal, position, txn_id, kind FROM txn_journal ORDER BY 1, 2"
            ),
            "txn_partitions": table(conn, "SELECT * FROM txn_partitions ORDER BY 1, 2, 3"),
            "txn_batches": table(
                conn,
                "SELECT txn_id, topic_id, partition, position, records FROM txn_batches "
                "ORDER BY 1, 2, 3, 4",
            ),
            "offsets": table(
                conn,
                "SELECT group_name, topic_id, partition, next_offset FROM consumer_offsets "
                "ORDER BY 1, 2, 3",
            ),
        }
    finally:
        conn.close()


def txn_states(data_dir: Path) -> dict[int, str]:
    return {row[0]: row[2] for row in stored(data_dir)["txns"]}


def assert_contiguous(snapshot: dict[str, list[tuple[Any, ...]]]) -> None:
    """Every partition's offsets are 0..next_offset-1, no gap, no repeat."""
    for topic, partition, next_offset, _ in snapshot["partitions"]:
        offsets = [r[2] for r in snapshot["records"] if (r[0], r[1]) == (topic, partition)]
        assert offsets == list(range(next_offset)), (topic, partition, offsets, next_offset)


def assert_wholly_present(
    snapshot: dict[str, list[tuple[Any, ...]]], txn_id: int, values: dict[str, list[bytes]]
) -> None:
    """Each value once, with txn_id; per partition in produce order and contiguous."""
    mine = [r for r in snapshot["records"] if r[11] == txn_id]
    for topic, sent in values.items():
        landed = [r for r in mine if r[0] == topic]
        assert sorted(r[5] for r in landed) == sorted(sent), (txn_id, topic)
        for partition in {r[1] for r in landed}:
            here = [r for r in landed if r[1] == partition]
            offsets = [r[2] for r in here]
            assert offsets == list(range(offsets[0], offsets[0] + len(here))), (txn_id, topic)
            order = [sent.index(r[5]) for r in here]
            assert order == sorted(order), f"txn {txn_id}: {topic}/{partition} out of order"
    assert len(mine) == sum(len(v) for v in values.values())
    all_values = [r[5] for r in snapshot["records"]]
    for sent in values.values():
        for value in sent:
            assert all_values.count(value) == 1, f"{value!r} is in the logs more than once"


def assert_wholly_absent(
    snapshot: dict[str, list[tuple[Any, ...]]], txn_id: int, values: dict[str, list[bytes]]
) -> None:
    assert not [r for r in snapshot["records"] if r[11] == txn_id], txn_id
    sent = {v for vs in values.values() for v in vs}
    assert not [r for r in snapshot["records"] if r[5] in sent], txn_id


def recover_twice_more(data_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Open the directory twice more (recovery runs at every open): nothing changes."""
    first = stored(data_dir)
    for _ in range(2):
        broker.open(data_dir).close()
        assert stored(data_dir) == first, "a second recovery changed the directory"
    return first


# failure points ---------------------------------------------------------------------------


def values_of(tag: str) -> dict[str, list[bytes]]:
    return {topic: [f"{tag}-{topic}-{i}".encode() for i in range(4)] for topic in TOPICS}


@dataclass
class Scene:
    """A directory with history: plain records and a committed transaction `before`,
    written before the victim transaction dies."""

    data_dir: Path
    before: int = 0
    victim: dict[str, list[bytes]] = field(default_factory=lambda: values_of("victim"))

    def prepare(self) -> None:
        with connect(self.data_dir) as client:
            for topic, partitions in TOPICS.items():
                client.create_topic(topic, partitions)
                client.produce(topic, [f"plain-{topic}-{i}" for i in range(3)])
            with client.transaction(GROUP) as txn:
                for topic, values in values_of("before").items():
                    txn.produce(topic, values)
            self.before = txn.txn_id

    def check(self, victim: int, present: bool) -> dict[str, list[tuple[Any, ...]]]:
        """The directory after a crash: recovered, contiguous, the victim wholly in or out."""
        snapshot = recover_twice_more(self.data_dir)
        assert_contiguous(snapshot)
        assert_wholly_present(snapshot, self.before, values_of("before"))
        if present:
            assert_wholly_present(snapshot, victim, self.victim)
        else:
            assert_wholly_absent(snapshot, victim, self.victim)
        return snapshot

    def finish_absent(self, processes: Processes, victim: int, *, wait_timeout: bool) -> None:
        """A victim that never prepared: it times out (or is aborted), its journaled
        records are dropped, and a late commit is refused with TXN_ABORTED."""
        if wait_timeout:

            def timed_out() -> bool:
                listed = run_ok(processes, self.data_dir, "txn", "list", "--all", "--json")
                (info,) = [t for t in listed if t["txn_id"] == victim]
                if info["state"] == "aborted":
                    assert info["reason"] == "timed out", info
                    return True
                assert info["state"] == "open", info
                return False

            wait_until(timed_out, STEP_S, interval_s=0.2, message="the transaction timed out")
        else:
            (info,) = run_ok(processes, self.data_dir, "txn-abort", str(victim), "--json")
            assert info["state"] == "aborted", info
        late = fencelog(processes, self.data_dir, "txn-commit", str(victim), "-g", GROUP)
        assert finished(late)[0] == TXN_ABORTED_EXIT, late.stderr_text()
        snapshot = stored(self.data_dir)
        assert_contiguous(snapshot)
        assert_wholly_absent(snapshot, victim, self.victim)
        assert not [d for d in snapshot["txn_batches"] if d[0] == victim], "journal data kept"

    def finish_present(self, processes: Processes, victim: int) -> None:
        """A committed victim: committing again answers it again and changes nothing."""
        before = stored(self.data_dir)
        (info,) = run_ok(processes, self.data_dir, "txn-commit", str(victim), "--json")
        assert info["state"] == "committed", info
        assert info["records"] == 8
        assert stored(self.data_dir) == before
        assert not [d for d in before["txn_batches"] if d[0] == victim], "journal data kept"


def step_name(spec: str) -> str:
    return spec.partition(":")[0]


EMBEDDED_STEPS = ["begin", "data:2", "prepare", "apply:1", "apply:3", "complete"]


@pytest.mark.parametrize("spec", EMBEDDED_STEPS)
def test_an_embedded_fencelog_killed_at_a_failure_point_leaves_whole_transactions(
    data_dir: Path, processes: Processes, spec: str
) -> None:
    scene = Scene(data_dir)
    scene.prepare()
    step = step_name(spec)

    def armed(name: str) -> str | None:
        return spec if step == name else None

    # only the victim that never gets anywhere has a short life: it times out
    timeout = "1s" if step == "begin" else "60s"
    begin = fencelog(
        processes, data_dir, "txn-begin", "-g", GROUP, "--timeout", timeout, "--json",
        failpoint=armed("begin"),
    )  # fmt: skip
    if step == "begin":
        assert_killed(begin, "txn-begin")
        (victim,) = [t for t, s in txn_states(data_dir).items() if s == "open"]
    else:
        status, (info,) = finished(begin)
        assert status == 0, begin.stderr_text()
        victim = int(info["txn_id"])
        beta = scene.victim["beta"]
        run_ok(processes, data_dir, "produce", "beta", "--txn", str(victim), "--json",
               *[f"-v{v.decode()}" for v in beta])  # fmt: skip
        if step == "data":
            # alpha from stdin, one line per batch: killed after the 2nd is journaled
            scene.victim["alpha"] = produce_until_killed(
                processes, data_dir, "alpha", victim, scene.victim["alpha"]
            )
        else:
            run_ok(processes, data_dir, "produce", "alpha", "--txn", str(victim), "--json",
                   *[f"-v{v.decode()}" for v in scene.victim["alpha"]])  # fmt: skip
            commit = fencelog(
                processes, data_dir, "txn-commit", str(victim), "--json", failpoint=armed(step)
            )
            assert_killed(commit, "txn-commit")
            assert txn_states(data_dir)[victim] == "prepared"  # the commit point is durable

    # a fresh process opens the directory: recovery runs there
    run_ok(processes, data_dir, "topic", "list", "--json")
    present = step in COMMITTED_STEPS
    snapshot = scene.check(victim, present)
    if present:
        assert txn_states(data_dir)[victim] == "committed"
        scene.finish_present(processes, victim)
    else:
        assert txn_states(data_dir)[victim] == "open"
        journaled = sum(d[4] for d in snapshot["txn_batches"] if d[0] == victim)
        assert journaled == (0 if step == "begin" else 6)  # data:2's 2nd batch is there
        scene.finish_absent(processes, victim, wait_timeout=step == "begin")


SERVED_STEPS = [*EMBEDDED_STEPS, "ack"]


@dataclass
class Victim:
    txn_id: int | None = None
    committed: str | None = None
    error: BrokerError | None = None


def run_victim(address: str, values: dict[str, list[bytes]], timeout_ms: int) -> Victim:
    """begin, produce to beta then alpha (round robin: 2 partitions each), commit."""
    victim = Victim()
    try:
        with connect(address) as client:
            victim.txn_id = client.txn_begin(GROUP, timeout_ms=timeout_ms).txn_id
            client.produce("beta", values["beta"], txn=victim.txn_id)
            client.produce("alpha", values["alpha"], txn=victim.txn_id)
            victim.committed = client.txn_commit(victim.txn_id, group=GROUP).state
    except BrokerError as error:
        victim.error = error
    return victim


@pytest.mark.parametrize("spec", SERVED_STEPS)
def test_a_served_broker_killed_at_a_failure_point_leaves_whole_transactions(
    data_dir: Path, processes: Processes, servers: list[ServeProcess], spec: str
) -> None:
    scene = Scene(data_dir)
    scene.prepare()
    step = step_name(spec)
    port = free_port()
    server = start_server(servers, data_dir, port, failpoint=spec)
    timeout_ms = 2_000 if step == "begin" else 60_000
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        work = pool.submit(run_victim, server.address, scene.victim, timeout_ms)
        assert_killed(server.process, f"fencelog serve with {spec}")
        # back on the same port at once: a commit in flight is retried there
        restarted = start_server(servers, data_dir, port)
        victim = work.result(timeout=STEP_S)
    if step == "begin":
        assert victim.txn_id is None
        assert victim.error is not None and victim.error.code is ErrorCode.CONNECTION_FAILED
    else:
        assert victim.txn_id is not None
    with connect(restarted.address) as client:
        if victim.txn_id is None:  # begun, never answered: the broker knows it
            (found,) = [
                t
                for t in client.txn_list(include_ended=True)
                if t.group == GROUP and t.txn_id != scene.before
            ]
            victim.txn_id = found.txn_id
        txn_id = victim.txn_id
        state = client.txn_show(txn_id, records_max=0).info.state
        if step in COMMITTED_STEPS:
            # acknowledged (or answered on the retry after the restart): committed
            assert victim.error is None, victim.error
            assert victim.committed == "committed"
            assert state == "committed"
        else:
            assert victim.error is not None and victim.error.code is ErrorCode.CONNECTION_FAILED
            assert victim.committed is None
            # open (a short-lived one may have timed out already)
            assert state == "open" or (step == "begin" and state == "aborted"), state
            # nothing of it is readable through the server either
            sent = {v for vs in scene.victim.values() for v in vs}
            for topic in TOPICS:
                assert not [r for r in client.consume(topic) if r.value in sent]
    assert restarted.stop() == 0, restarted.stderr_text()
    snapshot = scene.check(txn_id, step in COMMITTED_STEPS)
    if step in COMMITTED_STEPS:
        scene.finish_present(processes, txn_id)
    else:
        journaled = sum(d[4] for d in snapshot["txn_batches"] if d[0] == txn_id)
        assert journaled == (0 if step == "begin" else 8)
        scene.finish_absent(processes, txn_id, wait_timeout=step == "begin")


def test_a_recovery_killed_mid_apply_and_before_complete_finishes_later(
    data_dir: Path, processes: Processes
) -> None:
    scene = Scene(data_dir)
    scene.prepare()
    with connect(data_dir) as client:
        victim = client.txn_begin(GROUP).txn_id
        for topic, values in scene.victim.items():
            client.produce(topic, values, txn=victim)
    assert_killed(
        fencelog(processes, data_dir, "txn-commit", str(victim), failpoint="prepare"), "commit"
    )
    # each later open recovers, and is killed again: mid-copy, then just before COMPLETE;
    # with the default txn_apply_records_max every partition of this transaction is
    # copied in one SQLite transaction, so each kill rolls the whole copy back
    # (tests/engine/test_txn.py covers a copy spread over several SQLite transactions)
    for spec in ("apply:1", "apply:1", "complete"):
        opening = fencelog(processes, data_dir, "topic", "list", "--json", failpoint=spec)
        assert_killed(opening, f"recovery with {spec}")
        assert txn_states(data_dir)[victim] == "prepared"
        assert_contiguous(stored(data_dir))
    copied = [p for p in stored(data_dir)["txn_partitions"] if p[0] == victim and p[5] is not None]
    assert copied == [], "a killed copy leaves nothing half-copied"
    run_ok(processes, data_dir, "topic", "list", "--json")
    assert txn_states(data_dir)[victim] == "committed"
    scene.check(victim, present=True)
    scene.finish_present(processes, victim)


def test_a_member_killed_mid_write_is_replaced_by_its_retry_alone(
    data_dir: Path, processes: Processes
) -> None:
    scene = Scene(data_dir)
    scene.prepare()
    with connect(data_dir) as client:
        victim = client.txn_begin(GROUP).txn_id
        client.produce("beta", scene.victim["beta"], txn=victim)
    attempt = [f"attempt-1-{i}".encode() for i in range(4)]
    produce_until_killed(processes, data_dir, "alpha", victim, attempt, "--member", "w")
    # the retried task joins under the same name: the killed attempt's records go
    run_ok(processes, data_dir, "produce", "alpha", "--txn", str(victim), "--member", "w",
           "--json", *[f"-v{v.decode()}" for v in scene.victim["alpha"]])  # fmt: skip
    (info,) = run_ok(processes, data_dir, "txn-commit", str(victim), "--json")
    assert info["state"] == "committed" and info["records"] == 8, info
    snapshot = scene.check(victim, present=True)
    assert not [r for r in snapshot["records"] if r[5] in attempt]


# consumers never see an aborted transaction ------------------------------------------------


def read_follower(follower: Process, count: int) -> list[dict[str, Any]]:
    """What a `consume --follow --json` printed: `count` records, then whatever else
    arrives within 0.3 s (nothing should), then it is stopped."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + STEP_S
    while len(seen) < count:
        seen.append(json.loads(follower.line(max(deadline - time.monotonic(), 0.1))))
    time.sleep(0.3)  # on purpose: a window for a record that must not come
    follower.kill()
    return seen + [json.loads(line) for line in follower.remaining_lines()]


def check_followed(
    topic: str, seen: list[dict[str, Any]], expected: list[bytes], prepared_order: list[int]
) -> None:
    """Exactly the committed values, offsets contiguous from 0 in every partition, and
    the transactions' blocks in the order they prepared (one group: journal order)."""
    assert sorted(str(r["value"]).encode() for r in seen) == expected, topic
    assert {r["txn_id"] for r in seen} == set(prepared_order), topic
    for partition in range(TOPICS[topic]):
        here = [r for r in seen if r["partition"] == partition]
        assert [r["offset"] for r in here] == list(range(len(here))), (topic, partition)
        blocks: list[int] = []
        for record in here:
            if blocks[-1:] != [record["txn_id"]]:
                blocks.append(record["txn_id"])
        assert blocks == [t for t in prepared_order if t in blocks], (topic, partition)


def test_followers_never_read_a_record_of_a_transaction_that_ended_aborted(
    data_dir: Path, processes: Processes
) -> None:
    with connect(data_dir) as client:
        for topic, partitions in TOPICS.items():
            client.create_topic(topic, partitions)
    followers = {
        topic: fencelog(processes, data_dir, "consume", topic, "--follow", "--json")
        for topic in TOPICS
    }
    labels = ["c1", "a1", "kdata", "kprep", "kapply", "t1", "a2", "c2"]
    sent = {label: values_of(label) for label in labels}
    with connect(data_dir) as client:
        # every transaction open at once: their records share the same data journals
        txn = {
            label: client.txn_begin(GROUP, timeout_ms=600 if label == "t1" else 60_000).txn_id
            for label in labels
        }
        for label in labels:
            for topic, values in sent[label].items():
                if label == "kdata" and topic == "alpha":
                    continue
                if label == "a2" and topic == "alpha":  # a joined member writes alpha
                    producer = client.txn_join(txn[label], "worker").producer
                    client.produce(topic, values, producer=producer)
                    continue
                client.produce(topic, values, txn=txn[label])
        client.txn_commit(txn["c1"], group=GROUP)
        client.txn_abort(txn["a1"], group=GROUP)
        # kdata: a producer killed after its 2nd batch was journaled, then aborted
        produce_until_killed(processes, data_dir, "alpha", txn["kdata"], sent["kdata"]["alpha"])
        client.txn_abort(txn["kdata"], group=GROUP)
        # kapply, kprep: committers killed mid APPLY_COMMIT and after PREPARE_COMMIT (in
        # that order: kprep's committer first recovers kapply when it opens the directory)
        for label, spec in (("kapply", "apply:2"), ("kprep", "prepare")):
            committing = fencelog(processes, data_dir, "txn-commit", str(txn[label]),
                                  failpoint=spec)  # fmt: skip
            assert_killed(committing, f"txn-commit with {spec}")
        # t1 timed out; a2 (with its member's records) aborted
        time.sleep(0.7)  # on purpose: t1's 600 ms timeout passes
        with pytest.raises(BrokerError) as refused:
            client.txn_commit(txn["t1"], group=GROUP)
        assert refused.value.code is ErrorCode.TXN_ABORTED
        client.txn_abort(txn["a2"], group=GROUP)
        # c2: a later commit of the group applies the earlier prepared ones first
        client.txn_commit(txn["c2"], group=GROUP)
        states = {label: client.txn_show(txn[label]).info.state for label in labels}
    run_ok(processes, data_dir, "topic", "list", "--json")  # a fresh open: recovery (nothing left)
    committed = {"c1", "kprep", "kapply", "c2"}
    assert states == {label: "committed" if label in committed else "aborted" for label in labels}

    prepared_order = [txn[label] for label in ("c1", "kapply", "kprep", "c2")]
    for topic, follower in followers.items():
        expected = sorted(v for label in committed for v in sent[label][topic])
        check_followed(topic, read_follower(follower, len(expected)), expected, prepared_order)
    snapshot = recover_twice_more(data_dir)
    assert_contiguous(snapshot)
    for label in labels:
        check = assert_wholly_present if label in committed else assert_wholly_absent
        check(snapshot, txn[label], sent[label])
    assert snapshot["txn_batches"] == [], "ended transactions left journal data behind"


# the consume-transform-produce copier -------------------------------------------------------

COPIER = SCRIPTS / "txn_copier.py"
COPIER_GROUP = "copier"
COPY_PARTITIONS = 3
PER_PARTITION = 2_000
CHUNK = 100  # per partition: 300 records a transaction, 20 transactions in all


class ServedBroker:
    """A served broker on a fixed port, killed and restarted by the test."""

    def __init__(self, servers: list[ServeProcess], data_dir: Path) -> None:
        self.servers = servers
        self.data_dir = data_dir
        self.port = free_port()
        self.server = start_server(servers, data_dir, self.port)
        self.deaths: list[tuple[str | None, int]] = []  # (failpoint, exit status)
        self.armed: str | None = None

    @property
    def address(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    def kill9(self, rearm: str | None) -> None:
        self.server.kill9()
        self.deaths.append((self.armed, self.server.process.popen.returncode))
        self.armed = rearm
        try:
            self.server = start_server(self.servers, self.data_dir, self.port, failpoint=rearm)
        except AssertionError:
            # Recovery at start-up applies the commits the kill left prepared, and may
            # reach the armed point itself: a death like any other, then back unarmed.
            died = self.servers[-1].process.popen.poll()
            if died != -signal.SIGKILL:
                raise
            self.deaths.append((rearm, died))
            self.armed = None
            self.server = start_server(self.servers, self.data_dir, self.port)

    def revive(self) -> None:
        """A server that killed itself at its failure point comes back unarmed."""
        status = self.server.process.popen.poll()
        if status is not None:
            self.deaths.append((self.armed, status))
            self.armed = None
            self.server = start_server(self.servers, self.data_dir, self.port)


class Copiers:
    """Copier processes (tests/support/txn_copier.py), one at a time, restarted when gone."""

    def __init__(
        self,
        processes: Processes,
        target: str,
        rng: random.Random,
        revive: Callable[[], None] = lambda: None,
    ) -> None:
        self.processes = processes
        self.target = target
        self.rng = rng
        self.revive = revive  # called while waiting: restarts a broker that died
        self.current: Process | None = None
        self.events: list[dict[str, Any]] = []
        self.kills = 0

    def running(self, failpoint: str | None = None) -> Process:
        if self.current is None or self.current.popen.poll() is not None:
            self.current = self.processes.start(
                [sys.executable, COPIER, self.target, "--group", COPIER_GROUP,
                 "--chunk", str(CHUNK), "--pause-ms", "10",
                 "--seed", str(self.rng.randrange(1 << 30))],
                env=child_env(failpoint),
            )  # fmt: skip
        return self.current

    def pump(self, commits: int, deadline: float) -> str:
        """Read the copier's events until `commits` more commits ("committed"), its
        "done", or its exit ("exited")."""
        copier = self.running()
        while commits > 0:
            self.revive()
            assert time.monotonic() < deadline, f"the copier stalled: {self.events[-5:]}"
            try:
                event: dict[str, Any] = json.loads(copier.line(0.05))
            except AssertionError:  # nothing within 50 ms
                if copier.popen.poll() is None:
                    continue
                self.events += [json.loads(line) for line in copier.remaining_lines()]
                return "exited"
            self.events.append(event)
            commits -= "committed" in event
            if "done" in event:
                assert copier.wait(STEP_S) == 0, copier.stderr_text()
                return "done"
        return "committed"

    def finish(self, deadline: float) -> None:
        while self.pump(1 << 30, deadline) != "done":
            pass

    def kill9(self) -> None:
        assert self.current is not None
        self.current.kill()
        if self.current.popen.returncode == -9:
            self.kills += 1

    def errors(self) -> list[str]:
        return [str(e["error"]) for e in self.events if "error" in e]


def copy_inputs(target: str) -> dict[int, list[bytes]]:
    inputs = {
        p: [f"in-{p}-{i:05d}".encode() for i in range(PER_PARTITION)]
        for p in range(COPY_PARTITIONS)
    }
    with connect(target) as client:
        client.create_topic("input", COPY_PARTITIONS)
        client.create_topic("output", COPY_PARTITIONS)
        for partition, values in inputs.items():
            client.produce("input", values, partition=partition)
    return inputs


def check_copied(target: str, inputs: dict[int, list[bytes]], why: str) -> None:
    """Output is input, transformed: once each, in order per partition."""
    with connect(target) as client:
        for partition, values in inputs.items():
            copied = [r.value for r in client.consume("output", partition=partition)]
            assert copied == [b"copied:" + v for v in values], f"partition {partition}, {why}"
        offsets, _ = client.committed_offsets(COPIER_GROUP, "input")
        assert offsets == dict.fromkeys(range(COPY_PARTITIONS), PER_PARTITION), why
        assert [t for t in client.txn_list() if t.group == COPIER_GROUP] == [], why


def check_copied_logs(data_dir: Path, copiers: Copiers) -> None:
    snapshot = recover_twice_more(data_dir)
    assert_contiguous(snapshot)
    states = {row[0]: row[2] for row in snapshot["txns"]}
    output = [r for r in snapshot["records"] if r[0] == "output"]
    assert all(states[r[11]] == "committed" for r in output)
    # every commit a copier reported is in the output
    reported = {e["committed"] for e in copiers.events if "committed" in e}
    assert reported <= {r[11] for r in output}
    assert snapshot["txn_batches"] == [], "ended transactions left journal data behind"


@pytest.mark.slow
def test_a_copier_and_its_broker_killed_at_random_points_copy_everything_once(
    data_dir: Path, processes: Processes, servers: list[ServeProcess]
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    served = ServedBroker(servers, data_dir)
    inputs = copy_inputs(served.address)
    copiers = Copiers(processes, served.address, rng, revive=served.revive)
    deadline = time.monotonic() + 60
    # kill -9 the copier at random points; the broker once from outside, and once more
    # by its own failure point: in the middle of APPLY_COMMIT of the 2nd commit after
    plan = ["copier", "copier", "broker", "copier", "copier", "copier", "copier"]
    for action in plan:
        outcome = copiers.pump(rng.randint(1, 2), deadline)
        assert outcome != "done", f"finished before the plan (seed {seed}): kill later"
        time.sleep(rng.uniform(0, 0.04))  # on purpose: a random kill point
        if action == "copier":
            copiers.kill9()
        else:
            served.kill9(rearm="apply:3")
    copiers.finish(deadline)
    served.revive()

    assert set(copiers.errors()) <= {"CONNECTION_FAILED"}, (seed, copiers.events)
    assert copiers.kills >= 4, (seed, copiers.kills)
    assert [status for _, status in served.deaths] == [-9, -9], (seed, served.deaths)
    assert served.deaths[1][0] == "apply:3", "the armed broker did not die at its failure point"
    check_copied(served.address, inputs, f"seed {seed}")
    assert served.server.stop() == 0
    check_copied_logs(data_dir, copiers)


def test_an_embedded_copier_killed_at_its_failure_points_copies_everything_once(
    data_dir: Path, processes: Processes
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    inputs = copy_inputs(str(data_dir))
    copiers = Copiers(processes, str(data_dir), rng)
    deadline = time.monotonic() + 60
    # each copier opens the directory itself (recovering what its predecessor prepared)
    # and dies at its own failure point, within its first three transactions
    specs = ["begin:2", "data:3", "prepare:1", "apply:3", "complete:2", "data:5", "prepare:2"]
    rng.shuffle(specs)
    for spec in specs:
        copier = copiers.running(failpoint=spec)
        assert copiers.pump(1 << 30, deadline) == "exited", (seed, spec)
        assert copier.popen.returncode == -9, (seed, spec, copier.stderr_text())
    copiers.finish(deadline)
    assert copiers.errors() == [], (seed, copiers.events)
    check_copied(str(data_dir), inputs, f"seed {seed}, order {specs}")
    check_copied_logs(data_dir, copiers)
