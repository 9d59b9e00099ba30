"""The idempotent Producer of broker/client/producer.py, embedded and served (a Server in a
thread on 127.0.0.1): numbering from 1, one pid per partition, pipelined batches kept in
order, saved state that resumes one generation up (replays answered as duplicates, the
old instance fenced from the new one's first record), offset commits that carry the
state, and lease renewal by the broker's clock.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker.client.client import Client, connect
from broker.client.producer import PartitionState, Producer, ProducerState
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.types import NewRecord
from support.helpers import Processes
from support.producing import FakeClock, delivery_faults, send_within, state_rows
from support.servers import served
from support.values import present

TOPIC = "orders"
INPUT = "input"
LEASE_MS = 60_000


@pytest.fixture(params=["embedded", "served"])
def kind(request: pytest.FixtureRequest) -> str:
    chosen: str = request.param
    return chosen


@contextlib.contextmanager
def broker_client(kind: str, data_dir: Path) -> Iterator[Client]:
    """A client of a fresh broker, embedded or served. Used inside each test, so that the
    client and the server are closed (their threads joined), and what they left behind
    finalized, before a failure is reported: on Python 3.11 a finalizer that formats a
    traceback while pytest parses source trips CPython's AST recursion check (gh-106905)
    and ends the whole session with INTERNALERROR."""
    try:
        if kind == "embedded":
            with connect(data_dir, durability="normal") as embedded:
                embedded.create_topic(TOPIC, partitions=2)
                embedded.create_topic(INPUT)
                yield embedded
            return
        with served(data_dir) as server, connect(server.address) as remote:
            remote.create_topic(TOPIC, partitions=2)
            remote.create_topic(INPUT)
            yield remote
    finally:
        gc.collect()


def stored(client: Client, partition: int = 0) -> list[bytes]:
    return [present(r.value) for r in client.consume(TOPIC, partition=partition)]


def test_send_numbers_records_from_one_and_says_where_they_landed(
    kind: str, data_dir: Path
) -> None:
    with broker_client(kind, data_dir) as client:
        producer = client.producer(TOPIC)
        first = send_within(producer, ["a", "b", "c"], partition=0)
        second = send_within(producer, [b"d"], partition=0)
        assert [(r.partition, r.offset, r.duplicate) for r in [*first, *second]] == [
            (0, 0, False),
            (0, 1, False),
            (0, 2, False),
            (0, 3, False),
        ]
        records = list(client.consume(TOPIC, partition=0))
        pid, generation = records[0].producer_id, records[0].generation
        assert pid >= 1
        assert [(r.producer_id, r.generation, r.sequence) for r in records] == [
            (pid, generation, sequence) for sequence in (1, 2, 3, 4)
        ]
        assert producer.state() == ProducerState(TOPIC, {0: PartitionState(pid, generation, 4)})
        rows = state_rows(client.producer_states(TOPIC))
        assert [(p, row_pid, g, s, last) for p, row_pid, g, s, _, last in rows] == [
            (0, pid, generation, 4, 3)
        ]


def test_each_partition_gets_its_own_pid_and_its_own_numbering(kind: str, data_dir: Path) -> None:
    with broker_client(kind, data_dir) as client:
        producer = client.producer(TOPIC)
        values = [NewRecord(f"v{i}".encode(), partition=i % 2) for i in range(6)]
        results = producer.send(values)  # no partition given: one batch per partition
        assert [r.partition for r in results] == [0, 1, 0, 1, 0, 1]
        by_partition = {p: list(client.consume(TOPIC, partition=p)) for p in (0, 1)}
        assert [r.value for r in by_partition[0]] == [b"v0", b"v2", b"v4"]
        assert [r.value for r in by_partition[1]] == [b"v1", b"v3", b"v5"]
        pids = {p: {r.producer_id for r in records} for p, records in by_partition.items()}
        assert len(pids[0]) == len(pids[1]) == 1 and pids[0] != pids[1]
        for records in by_partition.values():
            assert [r.sequence for r in records] == [1, 2, 3]
        assert set(producer.state().partitions) == {0, 1}


def test_send_async_keeps_batches_in_order_with_several_in_flight(
    kind: str, data_dir: Path
) -> None:
    with broker_client(kind, data_dir) as client:
        producer = client.producer(TOPIC, max_in_flight=4)
        batches = [[f"b{i}-{j}".encode() for j in range(1 + i % 3)] for i in range(40)]
        futures = [producer.send_async(batch, partition=0) for batch in batches]
        producer.flush()
        offsets = [r.offset for future in futures for r in future.result(timeout=30)]
        assert offsets == list(range(len(offsets)))
        sent = [value for batch in batches for value in batch]
        faults = delivery_faults(sent, stored(client))
        assert faults.total == 0, faults
        assert producer.state().partitions[0].sequence == len(sent)


def test_one_send_after_another_is_always_answered(kind: str, data_dir: Path) -> None:
    with broker_client(kind, data_dir) as client:
        # Each send waits for the one before: the next batch is queued just as the pump that
        # sent the previous one is finishing.
        producer = client.producer(TOPIC)
        for index in range(300):
            (result,) = send_within(producer, [f"v{index}"], partition=0, timeout_s=5)
            assert result.offset == index
        assert len(stored(client)) == 300


def test_a_producer_that_opts_out_writes_without_a_pid(kind: str, data_dir: Path) -> None:
    with broker_client(kind, data_dir) as client:
        producer = client.producer(TOPIC, idempotent=False)
        send_within(producer, ["a", "a"], partition=0)
        assert [(r.producer_id, r.sequence) for r in client.consume(TOPIC)] == [(0, 0), (0, 0)]
        assert producer.state().partitions == {}
        assert client.producer_states(TOPIC) == []


def test_a_resumed_producer_answers_replays_as_duplicates_and_fences_the_old_one(
    kind: str, data_dir: Path
) -> None:
    with broker_client(kind, data_dir) as client:
        old = client.producer(TOPIC)
        send_within(old, ["a", "b"], partition=0)
        send_within(old, ["c"], partition=0)
        client.commit_offsets("copier", INPUT, {0: 3}, producer=old)  # input 0..2 done
        send_within(old, ["d", "e"], partition=0)  # written, but the commit after it never happened
        offsets, saved = client.committed_offsets("copier", INPUT)
        assert offsets == {0: 3}
        assert saved is not None
        (generation,) = {r.generation for r in client.consume(TOPIC)}
        assert saved.partitions[0].generation == generation and saved.partitions[0].sequence == 3
        successor = client.producer(TOPIC, state=saved)
        replay = send_within(successor, ["d", "e"], partition=0)
        assert [(r.offset, r.duplicate) for r in replay] == [(3, True), (4, True)]
        assert [(r.offset, r.duplicate) for r in send_within(successor, ["f"], partition=0)] == [
            (5, False)
        ]
        with pytest.raises(BrokerError) as raised:
            send_within(old, ["zombie"], partition=0)
        assert raised.value.code is ErrorCode.FENCED
        assert raised.value.details["stored_generation"] == generation + 1
        assert raised.value.details["received_generation"] == generation
        with pytest.raises(BrokerError) as again:  # a fenced producer never sends again
            send_within(old, ["zombie-2"], partition=0)
        assert again.value.code is ErrorCode.FENCED
        assert stored(client) == [b"a", b"b", b"c", b"d", b"e", b"f"]
        assert successor.state().partitions[0] == PartitionState(
            saved.partitions[0].producer_id, generation + 1, 6
        )


def test_a_fenced_producer_fails_every_batch_it_has_queued_and_writes_none(
    kind: str, data_dir: Path
) -> None:
    try:
        with broker_client(kind, data_dir) as client:
            old = client.producer(TOPIC, max_in_flight=3)
            send_within(old, ["a"], partition=0)
            successor = client.producer(TOPIC, state=old.state())
            send_within(successor, ["b"], partition=0)
            refusals: list[BaseException | None] = []
            futures = []
            for index in range(6):
                try:  # embedded, a send runs at once: a fenced producer refuses the next one
                    futures.append(old.send_async([f"zombie-{index}"], partition=0))
                except BrokerError as error:
                    refusals.append(error)
            refusals += [future.exception(timeout=30) for future in futures]
            assert len(refusals) == 6
            for refused in refusals:
                assert isinstance(refused, BrokerError), refused
                assert refused.code is ErrorCode.FENCED, refused
            assert stored(client) == [b"a", b"b"]
            del old, successor, futures, refusals
    finally:
        gc.collect()  # what the producer left behind is finalized now, not in a later test


def never_retrieved(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage().splitlines()[0]
        for record in caplog.records
        if "never retrieved" in record.getMessage()
    ]


async def stall(seconds: float) -> None:
    time.sleep(seconds)  # blocks the event loop it runs on, on purpose


def test_a_fenced_pipeline_leaves_no_unretrieved_errors_behind(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        with broker_client("served", data_dir) as client:
            zombie = client.producer(TOPIC, max_in_flight=5)
            send_within(zombie, ["a"], partition=0)
            successor = client.producer(TOPIC, state=zombie.state())
            send_within(successor, ["b"], partition=0)  # fences the zombie
            # While the client's event loop is busy, the zombie's batches queue up, so
            # that five of them are in flight when the first is refused.
            busy = client._transport.run_async(stall(0.3))  # type: ignore[attr-defined]
            futures = [zombie.send_async([f"z{i}"], partition=0) for i in range(10)]
            busy.result(timeout=5)
            outcomes = [f.exception(timeout=30) for f in futures]
            values = stored(client)
            del zombie, successor, futures
    finally:
        gc.collect()  # finalize what the zombie left behind, here
    assert [e.code if isinstance(e, BrokerError) else e for e in outcomes] == [
        ErrorCode.FENCED
    ] * 10
    assert values == [b"a", b"b"]
    # the refused pipeline must not surface later as asyncio errors nobody asked for
    noise = never_retrieved(caplog)
    assert noise == [], f"{len(noise)} abandoned attempts logged: {noise[0]}"


def test_producer_arguments_and_saved_state_are_checked(kind: str, data_dir: Path) -> None:
    with broker_client(kind, data_dir) as client:
        state = ProducerState(TOPIC, {0: PartitionState(7, 3, 12), 1: PartitionState(8, 1, 0)})
        assert ProducerState.from_bytes(state.to_bytes()) == state
        for bad in (b"not msgpack \xc1", b"\x80", json.dumps({"topic": 1}).encode()):
            with pytest.raises(BrokerError) as raised:
                ProducerState.from_bytes(bad)
            assert raised.value.code is ErrorCode.INVALID_ARGUMENT
        with pytest.raises(BrokerError) as wrong_topic:
            client.producer(INPUT, state=state)
        assert wrong_topic.value.code is ErrorCode.INVALID_ARGUMENT
        with pytest.raises(BrokerError) as in_flight:
            client.producer(TOPIC, max_in_flight=0)
        assert in_flight.value.code is ErrorCode.INVALID_ARGUMENT
        for timeout in (0, -1.0, float("inf"), float("nan")):
            # 0 failed every batch served as "may or may not have been appended" (a retry
            # then wrote it twice); embedded, it was ignored
            with pytest.raises(BrokerError) as no_time:
                client.producer(TOPIC, delivery_timeout_s=timeout)
            assert no_time.value.code is ErrorCode.INVALID_ARGUMENT
        with pytest.raises(BrokerError) as unknown:  # pid 7 was never leased
            client.producer(TOPIC, state=state)
        assert unknown.value.code is ErrorCode.UNKNOWN_PID
        with pytest.raises(BrokerError) as nothing:
            client.producer(TOPIC).send([], partition=0)
        assert nothing.value.code is ErrorCode.INVALID_ARGUMENT


def test_closing_the_client_delivers_what_its_producers_have_in_flight(
    kind: str, data_dir: Path
) -> None:
    """Leaving `with connect(url)` without a flush: served, the batches' futures were
    never resolved (a send in another thread and flush() hung) and nothing landed.
    close() now closes the client's producers first, as Producer.close() does."""
    with broker_client(kind, data_dir) as client:
        producer = client.producer(TOPIC)
        futures = [producer.send_async([b"v%d" % i], partition=0) for i in range(100)]
    done, _ = concurrent.futures.wait(futures, timeout=30)
    assert len(done) == 100
    offsets = [future.result()[0].offset for future in futures]
    assert offsets == list(range(100))
    with pytest.raises(BrokerError) as closed:
        producer.send([b"late"], partition=0)
    assert closed.value.code is ErrorCode.INVALID_ARGUMENT


def test_a_batch_that_fails_on_no_broker_error_leaves_the_partition_sending(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded, an exception that was no BrokerError (a raw SQLite error) left the
    partition marked as being pumped: every later send on it blocked for good."""
    with broker_client("embedded", data_dir) as client:
        producer = client.producer(TOPIC)
        real = client._transport.produce
        calls = iter([RuntimeError("disk on fire"), None])

        def failing_once(*args: object, **kwargs: object) -> object:
            if (error := next(calls, None)) is not None:
                raise error
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(client._transport, "produce", failing_once)
        with pytest.raises(RuntimeError):
            producer.send([b"lost"], partition=0)
        results = send_within(producer, [b"next"], partition=0)
        assert [r.offset for r in results] == [0]
        assert stored(client) == [b"next"]


def test_a_client_closed_under_a_send_fails_it_at_once(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() from another thread made every later call "this client is closed", which
    the producer took for a lost connection and retried until its delivery timeout."""
    with broker_client("embedded", data_dir) as client:
        producer = client.producer(TOPIC, delivery_timeout_s=30)
        real = client._transport.produce

        def closed_first(*args: object, **kwargs: object) -> object:
            closer = threading.Thread(target=client.close)
            closer.start()
            closer.join(timeout=10)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(client._transport, "produce", closed_first)
        future = producer.send_async([b"late"], partition=0)
        with pytest.raises(BrokerError) as closed:
            future.result(timeout=10)  # not after the 30 s delivery timeout
        assert closed.value.message == "this client is closed"


def test_committed_offsets_answer_the_producer_state_stored_last(data_dir: Path) -> None:
    clock = FakeClock()  # two commits within one millisecond
    with connect(data_dir, durability="normal", clock=clock) as client:
        client.create_topic(INPUT, partitions=2)
        first = ProducerState(TOPIC, {0: PartitionState(1, 1, 5)})
        last = ProducerState(TOPIC, {0: PartitionState(1, 1, 9)})
        client.commit_offsets("copier", INPUT, {0: 5}, producer=first)
        client.commit_offsets("copier", INPUT, {1: 9}, producer=last)
        offsets, state = client.committed_offsets("copier", INPUT)
    assert offsets == {0: 5, 1: 9}
    assert state == last


# the lease, by the broker's clock ---------------------------------------------------------


def embedded_with_clock(data_dir: Path, clock: FakeClock) -> Client:
    chosen = replace(DEFAULT_LIMITS, pid_lease_ms=LEASE_MS)
    client = connect(data_dir, durability="normal", clock=clock, limits=chosen)
    client.create_topic(TOPIC)
    return client


def test_a_producer_keeps_its_pid_while_the_broker_clock_says_the_lease_is_young(
    data_dir: Path,
) -> None:
    clock = FakeClock()  # the broker's clock, far behind the wall clock
    with embedded_with_clock(data_dir, clock) as client:
        producer = client.producer(TOPIC)
        for value in ("a", "b", "c"):
            send_within(producer, [value], partition=0)
            clock.advance(1_000)
        pids = [r.producer_id for r in client.consume(TOPIC)]
    assert len(set(pids)) == 1, f"a new pid for every batch: {pids}"


def test_a_producer_leases_a_new_pid_before_the_broker_clock_ends_its_lease(
    data_dir: Path,
) -> None:
    clock = FakeClock(start_ms=time.time_ns() // 1_000_000)
    with embedded_with_clock(data_dir, clock) as client:
        producer = Producer(client, TOPIC, renew_before_ms=10_000)
        send_within(producer, ["a"], partition=0)
        clock.advance(LEASE_MS - 5_000)  # inside renew_before_ms of the end
        send_within(producer, ["b"], partition=0)
        clock.advance(6_000)  # the first pid's lease is over
        send_within(producer, ["c"], partition=0)
        records = list(client.consume(TOPIC))
    assert [r.value for r in records] == [b"a", b"b", b"c"]
    assert records[0].producer_id != records[1].producer_id == records[2].producer_id


RENEWING = r"""
import collections, json, sys, time
from broker.client.client import connect

url, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
with connect(url) as client:
    producer = client.producer(topic, max_in_flight=5)
    pending, failed, sent = collections.deque(), [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # keep the pipeline full the whole time
        pending.append(producer.send_async([f"v{sent}"], partition=0))
        sent += 1
        while len(pending) > 40:
            error = pending.popleft().exception(timeout=20)
            if error is not None:
                failed.append(error.code.name)
    for future in pending:
        error = future.exception(timeout=20)
        if error is not None:
            failed.append(error.code.name)
    print(json.dumps({"sent": sent, "failed": failed}), flush=True)
"""


def test_a_busy_pipelined_producer_renews_its_lease_before_it_ends(
    data_dir: Path, processes: Processes
) -> None:
    # A lease of 3 s and 3.5 s of batches that never let the pipeline drain: the
    # producer must move to a new pid in time, without a batch failing and without
    # blocking (it runs in its own process, so a hang cannot outlive the test). It
    # renews a tenth of the lease before the end: 300 ms, room for a stalled host
    # (a 1.5 s lease left 150 ms, and a CI run on a VM losing CPU to steal missed it).
    limits = replace(DEFAULT_LIMITS, pid_lease_ms=3_000)
    with served(data_dir, limits=limits) as server:
        with connect(server.address) as client:
            client.create_topic(TOPIC)
        process = processes.python(RENEWING, server.address, TOPIC, "3.5")
        try:
            report = json.loads(process.line(30))
        finally:
            process.kill()
        with connect(server.address) as client:
            records = list(client.consume(TOPIC))
    assert report["failed"] == [], f"{len(report['failed'])} batches failed: {report['failed'][0]}"
    values = [f"v{i}".encode() for i in range(report["sent"])]
    faults = delivery_faults(values, [present(r.value) for r in records])
    assert faults.total == 0, faults
    assert len({r.producer_id for r in records}) >= 2  # it did renew
