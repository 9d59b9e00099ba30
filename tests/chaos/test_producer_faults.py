"""Faults against the idempotent producer, with real processes and real sockets, each
ending in a checker that counts lost, duplicated and out-of-order records (must be 0):

- lost acknowledgements: `fencelog serve --drop-acks 0.2` appends and then closes the
  connection instead of answering; the Python producer and `fencelog produce
  --idempotent` must still end with every record once, in order;
- pipelining: M1, M2, M3 in flight and M2 lost on the way (or its acknowledgement lost)
  through a proxy that cuts the connection: the log ends M1, M2, M3;
- kill -9 of a real `fencelog serve` at several points of a produce storm: after each
  restart the producers finish, nothing acknowledged is lost, and the rebuilt producer
  state (with and without snapshots) is what the log's records say;
- a consume-transform-produce copier that commits its input offsets with its producer
  state, killed with SIGKILL at chosen points and restarted: output equals input; a
  zombie copier is fenced after its successor's first new record.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from broker.protocol.messages import ErrorReply, Message, Op, Reply, Request
from broker.storage import producers as producer_store
from broker.types import AppendResult, Record
from support.helpers import Processes
from support.producing import (
    Action,
    Direction,
    FrameProxy,
    delivery_faults,
    free_port,
    state_rows,
    states_from_records,
)
from support.servers import ServeProcess, served, serving
from support.values import present
from support.waiting import wait_until

TOPIC = "orders"
STEP_S = 20.0


def all_records(client: Client, topic: str = TOPIC) -> list[Record]:
    return list(client.consume(topic))


def values_of(records: list[Record], partition: int = 0) -> list[bytes]:
    return [present(r.value) for r in records if r.partition == partition]


def wait_done(futures: list[Any], timeout_s: float) -> list[list[AppendResult]]:
    deadline = time.monotonic() + timeout_s
    results = []
    for index, future in enumerate(futures):
        remaining = max(deadline - time.monotonic(), 0.01)
        try:
            results.append(future.result(timeout=remaining))
        except TimeoutError:
            done = sum(f.done() for f in futures)
            raise AssertionError(
                f"batch {index} not acknowledged within {timeout_s}s ({done} of "
                f"{len(futures)} done)"
            ) from None
    return results


# lost acknowledgements ---------------------------------------------------------------------


def test_lost_acknowledgements_still_leave_every_record_once_in_order(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serving(
        data_dir, tmp_path / "ready.json", serve_args=["--drop-acks", "0.2", "--verbose"]
    ) as server:
        with connect(server.address) as client:
            client.create_topic(TOPIC)
            producer = client.producer(TOPIC, max_in_flight=5)
            batches = [[f"m{i}.{j}".encode() for j in range(1 + i % 4)] for i in range(150)]
            futures = [producer.send_async(batch, partition=0) for batch in batches]
            results = wait_done(futures, 60)
            records = all_records(client)
        dropped = server.stderr_text().count("dropping the acknowledgement")
    sent = [value for batch in batches for value in batch]
    faults = delivery_faults(sent, values_of(records))
    assert faults.total == 0, faults
    assert dropped > 0, "the server dropped no acknowledgement: nothing was tested"
    # a batch whose acknowledgement was lost is answered, on its resend, with the offsets
    # it was first appended at
    flat = [r for batch in results for r in batch]
    assert [r.offset for r in flat] == list(range(len(sent)))
    assert any(r.duplicate for r in flat)
    (pid,) = {r.producer_id for r in records}
    assert [r.sequence for r in records] == list(range(1, len(sent) + 1))
    assert pid >= 1


def test_fencelog_produce_idempotent_survives_lost_acknowledgements(
    tmp_path: Path, processes: Processes
) -> None:
    data_dir = tmp_path / "data"
    with serving(
        data_dir, tmp_path / "ready.json", serve_args=["--drop-acks", "0.2", "--verbose"]
    ) as server:
        with connect(server.address) as client:
            client.create_topic(TOPIC)
        produce = processes.fencelog(
            "--broker", server.address, "produce", TOPIC, "--idempotent", "--json", stdin=True
        )
        sent: list[bytes] = []
        answers: list[dict[str, Any]] = []
        for round_ in range(40):  # 40 batches: stdin lines arrive five at a time
            lines = [f"line-{round_}-{i}" for i in range(5)]
            produce.stdin.write("".join(f"{line}\n" for line in lines).encode())
            produce.stdin.flush()
            sent += [line.encode() for line in lines]
            answers += [json.loads(produce.line(10)) for _ in lines]
        produce.stdin.close()
        assert produce.wait(STEP_S) == 0, produce.stderr_text()
        with connect(server.address) as client:
            records = all_records(client)
        dropped = server.stderr_text().count("dropping the acknowledgement")
    faults = delivery_faults(sent, values_of(records))
    assert faults.total == 0, faults
    assert dropped > 0
    assert [a["offset"] for a in answers] == list(range(len(sent)))
    assert any(a["duplicate"] for a in answers)


# pipelining: M1, M2, M3 in flight, M2 fails ---------------------------------------------------


class FirstToCarry:
    """Which connection a rule applies to: the first to carry a request of `op` (the
    client's first connection may carry only plain requests, before its producer moves
    it to the event loop's)."""

    def __init__(self, op: Op) -> None:
        self.op = op
        self.connection: int | None = None

    def applies(self, connection: int, direction: Direction, message: Message) -> bool:
        first = self.connection is None and direction == "to_server"
        if first and isinstance(message, Request) and message.op is self.op:
            self.connection = connection
        return connection == self.connection


class CutAtSecondProduce:
    """On the first connection to carry a produce: lose M2 (its request, or its
    acknowledgement), then cut the connection when the answer to M3 comes back. Later
    connections pass."""

    def __init__(self, lose: str) -> None:
        self.lose = lose
        self.produce_ids: list[int] = []
        self.first = FirstToCarry(Op.PRODUCE)

    def __call__(self, connection: int, direction: Direction, message: Message) -> Action:
        if not self.first.applies(connection, direction, message):
            return "forward"
        if direction == "to_server":
            if isinstance(message, Request) and message.op is Op.PRODUCE:
                self.produce_ids.append(message.request_id)
                if len(self.produce_ids) == 2 and self.lose == "request":
                    return "swallow"
            return "forward"
        if isinstance(message, Reply | ErrorReply) and len(self.produce_ids) >= 2:
            m2, *m3 = self.produce_ids[1:3]
            if message.request_id == m2 and self.lose == "acknowledgement":
                return "swallow"
            if m3 and message.request_id == m3[0]:
                return "cut"
        return "forward"


@pytest.mark.parametrize("lose", ["request", "acknowledgement"])
def test_pipelined_batches_land_in_order_when_the_middle_one_fails(
    data_dir: Path, lose: str
) -> None:
    rule = CutAtSecondProduce(lose)
    with served(data_dir) as server, FrameProxy(server.port, rule) as proxy:
        with connect(proxy.address) as client:
            client.create_topic(TOPIC)
            producer = client.producer(TOPIC, max_in_flight=5)
            futures = [producer.send_async([name], partition=0) for name in ("M1", "M2", "M3")]
            results = wait_done(futures, STEP_S)
        with connect(server.address) as direct:
            records = all_records(direct)
    assert values_of(records) == [b"M1", b"M2", b"M3"]
    assert [r[0].offset for r in results] == [0, 1, 2]
    m3_answer = [
        m
        for n, m in proxy.messages("to_client")
        if n == rule.first.connection
        and isinstance(m, Reply | ErrorReply)
        and m.request_id == rule.produce_ids[2]
    ]
    assert len(m3_answer) == 1
    if lose == "request":
        # the broker itself refused M3 while M2 was missing, and nothing of it landed
        (refusal,) = m3_answer
        assert isinstance(refusal, ErrorReply), refusal
        assert refusal.code == ErrorCode.OUT_OF_ORDER_SEQUENCE
        assert (refusal.details["expected_sequence"], refusal.details["received_sequence"]) == (
            2,
            3,
        )
        assert not any(r[0].duplicate for r in results)
    else:
        # M2 and M3 had landed: their resends are answered as duplicates
        assert [r[0].duplicate for r in results] == [False, True, True]


class CutReplyMidFrame:
    """On the first connection to carry `op`, the answer to its Nth request of `op`
    arrives cut in the middle of its frame, and the connection ends there. Later
    connections pass."""

    def __init__(self, op: Op, nth: int) -> None:
        self.op, self.nth = op, nth
        self.ids: list[int] = []
        self.first = FirstToCarry(op)

    def __call__(self, connection: int, direction: Direction, message: Message) -> Action:
        if not self.first.applies(connection, direction, message):
            return "forward"
        if direction == "to_server":
            if isinstance(message, Request) and message.op is self.op:
                self.ids.append(message.request_id)
            return "forward"
        if isinstance(message, Reply | ErrorReply) and self.ids[self.nth - 1 : self.nth] == [
            message.request_id
        ]:
            return "cut_mid"
        return "forward"


def test_a_reply_cut_mid_frame_is_a_lost_connection_and_the_batches_are_resent(
    data_dir: Path,
) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        rule = CutReplyMidFrame(Op.PRODUCE, 2)
        with FrameProxy(server.port, rule) as proxy, connect(proxy.address) as client:
            producer = client.producer(TOPIC, max_in_flight=5)
            names = [f"M{i}".encode() for i in range(1, 7)]
            futures = [producer.send_async([name], partition=0) for name in names]
            results = wait_done(futures, STEP_S)
            state = producer.state().partitions[0]
        records = all_records(direct)
    assert values_of(records) == names
    assert [r[0].offset for r in results] == list(range(6))
    assert {r.producer_id for r in records} == {state.producer_id}, "one pid: nothing failed"
    assert state.sequence == 6
    assert results[1][0].duplicate, "M2 had landed: its resend is answered as a duplicate"


def test_a_fetch_cut_mid_frame_is_retried(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        direct.produce(TOPIC, [f"v{i}".encode() for i in range(50)], partition=0)
        rule = CutReplyMidFrame(Op.FETCH, 1)
        with FrameProxy(server.port, rule) as proxy, connect(proxy.address) as client:
            values = [r.value for r in client.consume(TOPIC)]
    assert values == [f"v{i}".encode() for i in range(50)]


class FlipOnce:
    """The first frame that carries `op` the way `direction` says arrives with one bit
    flipped (damaged in transit); every other frame passes."""

    def __init__(self, op: Op, direction: Direction) -> None:
        self.op, self.direction = op, direction
        # request ids count per connection, and a client holds more than one (its calls,
        # its producer's): an answer is to one of ours only on the connection it came by
        self.ids: set[tuple[int, int]] = set()
        self.flipped = False

    def __call__(self, connection: int, direction: Direction, message: Message) -> Action:
        if isinstance(message, Request) and message.op is self.op:
            self.ids.add((connection, message.request_id))
        answers = (
            isinstance(message, Reply | ErrorReply) and (connection, message.request_id) in self.ids
        )
        ours = isinstance(message, Request) and message.op is self.op
        if not self.flipped and direction == self.direction and (answers or ours):
            self.flipped = True
            return "flip"
        return "forward"


def test_a_produce_damaged_on_the_way_is_refused_and_nothing_of_it_stored(data_dir: Path) -> None:
    """A bit flipped in a produce frame was stored and acknowledged as if sent: the
    native frames carried no check of their own. Frames now carry a CRC-32."""
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        flip = FlipOnce(Op.PRODUCE, "to_server")
        with (
            FrameProxy(server.port, flip) as proxy,
            connect(proxy.address) as client,
            pytest.raises(BrokerError) as refused,
        ):
            client.produce(TOPIC, [b"MARKER-payload"], partition=0)
        assert refused.value.code is ErrorCode.PROTOCOL_ERROR
        assert "damaged in transit" in refused.value.message
        assert all_records(direct) == []
        direct.produce(TOPIC, [b"after"], partition=0)  # the broker goes on
        assert values_of(all_records(direct)) == [b"after"]


def test_an_acknowledgement_damaged_on_the_way_is_a_lost_one_and_the_batch_resent(
    data_dir: Path,
) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        flip = FlipOnce(Op.PRODUCE, "to_client")
        with FrameProxy(server.port, flip) as proxy, connect(proxy.address) as client:
            producer = client.producer(TOPIC)
            results = wait_done([producer.send_async([b"M1"], partition=0)], STEP_S)
        records = all_records(direct)
    assert values_of(records) == [b"M1"]
    assert results[0][0].duplicate, "M1 had landed: its resend is answered as a duplicate"


# kill -9 of the broker during a produce storm --------------------------------------------


def restart_server(tmp_path: Path, port: int, round_: int) -> ServeProcess:
    server = ServeProcess(
        tmp_path / "data",
        tmp_path / f"ready-{round_}.json",
        listen=f"127.0.0.1:{port}",
        serve_args=["--no-unix"],
    )
    server.wait_ready()
    return server


def delete_snapshots(data_dir: Path) -> int:
    conn = sqlite3.connect(data_dir / DB_FILE)
    try:
        with conn:
            return producer_store.delete_snapshots(conn)
    finally:
        conn.close()


@pytest.mark.slow
def test_kill_9_of_the_broker_during_a_produce_storm_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    port = free_port()
    servers = [restart_server(tmp_path, port, 0)]
    try:
        with connect(f"tcp://127.0.0.1:{port}") as client:
            client.create_topic(TOPIC, partitions=2)
            plan = {  # producer: partition of each of its batches
                "a": [0] * 80,
                "b": [0, 1] * 40,
                "c": [1] * 80,
            }
            producers = {name: client.producer(TOPIC, max_in_flight=4) for name in plan}
            batches: dict[str, list[tuple[int, list[bytes]]]] = {
                name: [
                    (p, [f"{name}{i}.{j}".encode() for j in range(1 + i % 3)])
                    for i, p in enumerate(partitions)
                ]
                for name, partitions in plan.items()
            }
            futures = {
                name: [producers[name].send_async(b, partition=p) for p, b in batches[name]]
                for name in plan
            }
            every = [f for fs in futures.values() for f in fs]
            values_of_future = {
                id(f): batch
                for name in plan
                for f, (_, batch) in zip(futures[name], batches[name], strict=True)
            }
            acknowledged_at_kills = []
            for round_, kill_after in enumerate([1, 3, 30, 31, 80, 120, 170, 220], start=1):
                wait_until(
                    lambda: sum(f.done() for f in every) >= kill_after,  # noqa: B023 - called at once
                    STEP_S,
                    interval_s=0.005,
                    message=f"{kill_after} batches answered (the storm stalled)",
                )
                servers[-1].kill9()
                acknowledged_at_kills.append(
                    [
                        v
                        for f in every
                        if f.done() and not f.exception()
                        for v in values_of_future[id(f)]
                    ]
                )
                servers.append(restart_server(tmp_path, port, round_))
                if round_ == 2:  # a snapshot mid-storm: later starts replay the log after it
                    assert client.snapshot_producers() >= 1
            for name in plan:
                wait_done(futures[name], 60)
            records = all_records(client)
            live_states = state_rows(client.producer_states(TOPIC))
    finally:
        for server in servers:
            server.close()
    stored_values = {r.value for r in records}
    for acknowledged in acknowledged_at_kills:
        assert set(acknowledged) <= stored_values, "an acknowledged record was lost"
    for name in plan:
        for partition in (0, 1):
            sent = [v for p, batch in batches[name] if p == partition for v in batch]
            mine = [r.value for r in records if r.partition == partition and r.value in set(sent)]
            faults = delivery_faults(sent, mine)
            assert faults.total == 0, (name, partition, faults)
    assert len(records) == sum(len(b) for bs in batches.values() for _, b in bs)
    truth = states_from_records(records)
    assert live_states == truth
    # restarted once more, from the newest snapshot and from the log alone
    for keep_snapshots in (True, False):
        if not keep_snapshots:
            assert delete_snapshots(tmp_path / "data") >= 1
        server = restart_server(tmp_path, port, 10 + keep_snapshots)
        try:
            with connect(server.address) as client:
                assert state_rows(client.producer_states(TOPIC)) == truth
        finally:
            server.close()


# the consume-transform-produce copier ----------------------------------------------------

COPIER = r"""
import json, sys
from broker.client.client import connect
from broker.errors import BrokerError

data_dir, chunk = sys.argv[1], int(sys.argv[2])

def say(**fields):
    print(json.dumps(fields), flush=True)

with connect(data_dir, durability="normal") as client:
    offsets, state = client.committed_offsets("copier", "input")
    position = offsets.get(0, 0)
    producer = client.producer("output", state=state)
    say(resumed=position, generation=state.partitions[0].generation if state else None)
    end = client.end_offsets("input")[0]
    while position < end:
        # batches aligned to multiples of chunk: a replay repeats the same batches
        records = client.fetch("input", {0: position}, max_records=chunk - position % chunk)
        try:
            results = producer.send([r.value.upper() for r in records], partition=0)
        except BrokerError as error:
            say(error=error.code.name)
            sys.exit(41)
        say(sent=position, duplicates=sum(r.duplicate for r in results))
        if sys.stdin.readline().strip() != "commit":
            sys.exit(3)
        position += len(records)
        client.commit_offsets("copier", "input", {0: position}, producer=producer)
        say(committed=position)
    say(done=position)
"""

CHUNK = 5
INPUT_RECORDS = 60


@pytest.fixture
def copier_dir(data_dir: Path) -> Iterator[Path]:
    with connect(data_dir, durability="normal") as client:
        client.create_topic("input")
        client.create_topic("output")
        client.produce("input", [f"record-{i}" for i in range(INPUT_RECORDS)], partition=0)
    yield data_dir


class Copier:
    def __init__(self, processes: Processes, data_dir: Path) -> None:
        self.process = processes.python(COPIER, data_dir, str(CHUNK), stdin=True)
        self.resumed = self.next()["resumed"]

    def next(self) -> dict[str, Any]:
        line: dict[str, Any] = json.loads(self.process.line(STEP_S))
        return line

    def sent(self) -> dict[str, Any]:
        event = self.next()
        assert "sent" in event, event
        return event

    def commit(self) -> int:
        self.process.stdin.write(b"commit\n")
        self.process.stdin.flush()
        event = self.next()
        assert "committed" in event, event
        return int(event["committed"])

    def kill(self) -> None:
        self.process.popen.send_signal(signal.SIGKILL)
        self.process.popen.wait(timeout=STEP_S)


def output_of(data_dir: Path) -> list[bytes]:
    with connect(data_dir, durability="normal") as client:
        return [present(r.value) for r in client.consume("output")]


def expected_output() -> list[bytes]:
    return [f"RECORD-{i}".encode() for i in range(INPUT_RECORDS)]


@pytest.mark.slow
def test_a_copier_killed_at_chosen_points_copies_everything_exactly_once(
    copier_dir: Path, processes: Processes
) -> None:
    # each run: how many chunks it commits, then SIGKILL right after sending the next
    # one (written, not committed) or, for "mid", at once without waiting for anything
    runs: list[int | str | None] = [2, 0, 3, "mid", 1, "mid", None]
    replayed = []
    for plan in runs:
        copier = Copier(processes, copier_dir)
        if plan == "mid":
            copier.kill()
            continue
        commits = plan if isinstance(plan, int) else INPUT_RECORDS // CHUNK
        for _ in range(commits):
            event = copier.sent()
            replayed.append(event["duplicates"])
            if copier.commit() == INPUT_RECORDS:
                break
        if plan is None:
            assert copier.next() == {"done": INPUT_RECORDS}
            assert copier.process.wait(STEP_S) == 0, copier.process.stderr_text()
            break
        replayed.append(copier.sent()["duplicates"])  # sent, never committed
        copier.kill()
    faults = delivery_faults(expected_output(), output_of(copier_dir))
    assert faults.total == 0, faults
    assert output_of(copier_dir) == expected_output()
    assert sum(replayed) >= 4 * CHUNK  # the uncommitted chunks came back as duplicates


@pytest.mark.slow
def test_a_zombie_copier_is_fenced_after_its_successors_first_new_record(
    copier_dir: Path, processes: Processes
) -> None:
    zombie = Copier(processes, copier_dir)
    zombie.sent()
    zombie.commit()
    zombie.sent()  # chunk 1 written, and the zombie stalls before committing it
    successor = Copier(processes, copier_dir)
    assert successor.resumed == CHUNK
    assert successor.sent()["duplicates"] == CHUNK  # chunk 1 again: answered as duplicates
    successor.commit()
    assert successor.sent()["duplicates"] == 0  # chunk 2: the successor's first new record
    zombie.commit()  # the zombie wakes up, commits late and sends chunk 2
    assert zombie.next() == {"error": "FENCED"}
    assert zombie.process.wait(STEP_S) == 41
    successor.commit()
    while True:
        event = successor.next()
        if "done" in event:
            break
        successor.process.stdin.write(b"commit\n")
        successor.process.stdin.flush()
        assert "committed" in successor.next()
    assert output_of(copier_dir) == expected_output()


# a broker that stops answering -------------------------------------------------------------


class BlackHole:
    """Once `on`, every connection's replies stop coming, save the handshake's."""

    def __init__(self, on: bool = True) -> None:
        self.on = on

    def __call__(self, connection: int, direction: Direction, message: Message) -> Action:
        hello = isinstance(message, Reply) and "session_id" in message.result
        return "swallow" if self.on and direction == "to_client" and not hello else "forward"


def test_a_request_without_a_reply_fails_at_its_deadline(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        with (
            FrameProxy(server.port, BlackHole()) as proxy,
            connect(proxy.address, request_timeout_s=0.5) as client,
            pytest.raises(BrokerError) as raised,
        ):
            client.produce(TOPIC, [b"x"], partition=0)
    assert raised.value.code is ErrorCode.CONNECTION_FAILED
    assert "no reply from the broker to PRODUCE within its deadline" in raised.value.message


def test_an_idempotent_producer_gives_up_at_its_delivery_timeout(data_dir: Path) -> None:
    hole = BlackHole(on=False)
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        with (
            FrameProxy(server.port, hole) as proxy,
            connect(proxy.address, request_timeout_s=0.3) as client,
        ):
            producer = client.producer(TOPIC, delivery_timeout_s=2.0)
            producer.send([b"a"], partition=0)
            hole.on = True
            with pytest.raises(BrokerError) as raised:
                producer.send([b"b"], partition=0)
        assert [r.value for r in all_records(direct)] in ([b"a"], [b"a", b"b"])
    assert raised.value.code is ErrorCode.CONNECTION_FAILED


def test_a_producers_delivery_timeout_bounds_a_send_to_a_stopped_broker(
    tmp_path: Path,
) -> None:
    """delivery_timeout_s is a bound, as Kafka's delivery.timeout.ms is: batches a
    stopped broker (SIGSTOP) does not answer fail once it passes, long before the
    request timeout (60 s here) would end their attempt. When the broker runs again the
    producer goes on, with a new pid: no later batch is refused as out of order behind
    one that may never have landed."""
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=("--no-unix",)) as server:
        with connect(server.address) as direct:
            direct.create_topic(TOPIC)
        with connect(server.address, request_timeout_s=60) as client:
            producer = client.producer(TOPIC, delivery_timeout_s=1.0)
            producer.send([b"a"], partition=0)
            os.kill(server.pid, signal.SIGSTOP)
            try:
                stuck = [producer.send_async([b"%d" % i], partition=0) for i in range(3)]
                for future in stuck:
                    with pytest.raises(BrokerError) as raised:
                        future.result(timeout=20)  # well inside the request timeout
                    assert raised.value.code is ErrorCode.CONNECTION_FAILED
                    said = "not acknowledged within delivery_timeout_s (1 s)"
                    assert said in raised.value.message
            finally:
                os.kill(server.pid, signal.SIGCONT)
            producer.send([b"after"], partition=0)
        with connect(server.address) as direct:
            stored = all_records(direct)
    assert stored[0].value == b"a" and stored[-1].value == b"after"
    assert stored[-1].producer_id != stored[0].producer_id  # the numbering started again
    assert [r.value for r in stored][1:-1] in ([], [b"0"], [b"0", b"1"], [b"0", b"1", b"2"])


def test_consume_against_a_broker_that_stopped_answering_exits_80(
    data_dir: Path, processes: Processes
) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        direct.produce(TOPIC, [b"a"], partition=0)
        with FrameProxy(server.port, BlackHole()) as proxy:
            consume = processes.fencelog(
                "--broker", proxy.address, "--request-timeout", "500ms", "consume", TOPIC
            )
            status = consume.wait(60)
    assert status == ErrorCode.CONNECTION_FAILED, consume.stderr_text()
    stderr = consume.stderr_text()
    assert stderr.count("\n") == 1 and "within its deadline" in stderr, stderr


def test_a_lease_whose_answer_is_lost_is_leased_again(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as direct:
        direct.create_topic(TOPIC)
        rule = CutReplyMidFrame(Op.LEASE_PID, 1)
        with FrameProxy(server.port, rule) as proxy, connect(proxy.address) as client:
            producer = client.producer(TOPIC)
            assert [r.offset for r in producer.send([b"a"], partition=0)] == [0]
        assert values_of(all_records(direct)) == [b"a"]
    assert len(rule.ids) == 1, "the first lease's answer was cut"
