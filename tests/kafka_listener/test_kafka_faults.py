"""Faults between real Kafka clients and `fencelog serve --kafka-listen`, each ending in
what a user reads back:

- an idempotent confluent-kafka producer whose connections a proxy cuts mid-frame (half
  a Produce request sent, half its answer returned, its answer lost): the topic holds
  every record once, in order, and every delivery report says delivered;
- a transactional consume-transform-produce copier (confluent-kafka; this file run as a
  program, `python test_kafka_faults.py copy BOOTSTRAP ...`) killed with SIGKILL at
  seeded random points and restarted with the same transactional.id and group.id:
  `out`, read with read_committed, holds every input once, in order per partition;
- malformed and oversized frames on a raw socket to the Kafka port: each gets an error
  answer or a closed connection within a deadline, and afterwards the broker serves a
  normal client and the records stored before are unchanged.

Random choices are seeded; the seed and the plan are in every failure message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from broker.client.client import connect
from support.helpers import Processes, stored_rows, user_env
from support.kafka_proxy import Action, KafkaFrame, KafkaProxy
from support.producing import delivery_faults
from support.servers import HOST, ServeProcess, serving
from support.waiting import wait_until

STEP_S: Final = 20.0
PRODUCE_KEY: Final = 0
FETCH_KEY: Final = 1
METADATA_KEY: Final = 3
FIND_COORDINATOR_KEY: Final = 10
API_VERSIONS_KEY: Final = 18
INIT_PRODUCER_ID_KEY: Final = 22
UNSUPPORTED_VERSION: Final = 35
TESTS_DIR: Final = Path(__file__).resolve().parents[1]


# threads and Kafka clients, always ended -----------------------------------------------------


def os_threads() -> int:
    """This process's threads, librdkafka's native ones included."""
    return len(os.listdir("/proc/self/task"))


@pytest.fixture(autouse=True)
def threads_end_with_the_test() -> Iterator[None]:
    """Every thread a test starts, Python's and librdkafka's, ends with it."""
    before = os_threads()
    yield
    wait_until(
        lambda: os_threads() <= before,
        STEP_S,
        message=lambda: f"threads back to {before}; now {os_threads()}",
    )


@contextlib.contextmanager
def kafka_producer(config: dict[str, Any]) -> Iterator[Producer]:
    """A confluent-kafka Producer; at exit what it still holds is purged and it is closed."""
    producer = Producer(config)
    try:
        yield producer
    finally:
        producer.purge()
        producer.flush(STEP_S)
        producer.close()


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(name, num_partitions=count) for name, count in partitions.items()]
    for name, future in admin.create_topics(new, request_timeout=STEP_S).items():
        future.result(timeout=STEP_S)  # raises what the broker answered
        assert name in partitions


def produce_all(bootstrap: str, topic: str, values: dict[int, list[bytes]]) -> None:
    """Every value of values[partition] to that partition, idempotently, all delivered."""
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(str(error))

    with kafka_producer({"bootstrap.servers": bootstrap, "enable.idempotence": True}) as sending:
        for partition, batch in values.items():
            for value in batch:
                sending.produce(topic, value, partition=partition, on_delivery=delivered)
        assert sending.flush(STEP_S) == 0, "records not delivered within the deadline"
    assert failures == []


Stored = dict[int, list[tuple[int, bytes]]]  # partition -> (offset, value) in offset order


def read_topic(
    bootstrap: str, topic: str, partitions: int, *, isolation: str = "read_uncommitted"
) -> Stored:
    """Every record of topic, from each partition's start to its end as it is now."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "fault-test-reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        ends = {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), STEP_S, False)[1])
            for p in range(partitions)
        }
        assignment = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        consumer.assign(assignment)
        found: Stored = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + STEP_S

        def at_end() -> bool:
            positions = consumer.position(assignment)
            # a partition not read from yet has position OFFSET_INVALID (-1001)
            return all(t.offset >= ends[t.partition] or not ends[t.partition] for t in positions)

        while not at_end():
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not read to {ends} within {STEP_S}s: {found}")
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is not None:
                    raise AssertionError(f"reading {topic}: {message.error()}")
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None and value is not None
                found[partition].append((offset, value))
        return found
    finally:
        consumer.close()


def values(stored: Stored, partition: int = 0) -> list[bytes]:
    return [value for _, value in stored[partition]]


# 1. an idempotent producer through a proxy that cuts connections mid-frame ----------------

Cut = Literal["request_mid", "answer_mid", "answer_lost"]


@dataclass
class CutProduces:
    """Cuts the connection at the Produce requests of `plan` (numbered from 1 over all
    connections, retries included): request_mid sends the broker half the request;
    answer_mid forwards the request and half its answer; answer_lost forwards the
    request and closes instead of its answer."""

    plan: dict[int, Cut]
    produces: int = 0
    doomed: dict[tuple[int, int], Cut] = field(default_factory=dict)  # answers to cut

    def __call__(self, frame: KafkaFrame) -> Action:
        if frame.api_key != PRODUCE_KEY:
            return "forward"
        if frame.direction == "to_server":
            self.produces += 1
            cut = self.plan.get(self.produces)
            if cut == "request_mid":
                return "cut_mid"
            if cut is not None:
                self.doomed[(frame.connection, frame.correlation_id)] = cut
            return "forward"
        cut = self.doomed.pop((frame.connection, frame.correlation_id), None)
        if cut == "answer_mid":
            return "cut_mid"
        return "cut" if cut == "answer_lost" else "forward"


def cut_plan(rng: random.Random, cuts: int) -> dict[int, Cut]:
    """cuts Produce requests, 2 to 4 apart, each kind at least once."""
    kinds: list[Cut] = ["request_mid", "answer_mid", "answer_lost"]
    chosen = kinds + [rng.choice(kinds) for _ in range(cuts - len(kinds))]
    rng.shuffle(chosen)
    plan: dict[int, Cut] = {}
    number = 1
    for kind in chosen:
        number += rng.randint(2, 4)
        plan[number] = kind
    return plan


@pytest.mark.parametrize("seed", [1337, 7])
def test_idempotent_producer_through_cut_connections_stores_each_record_once_in_order(
    kafka_server: ServeProcess, seed: int
) -> None:
    count, topic = 3000, "cut-orders"
    rng = random.Random(seed)
    rule = CutProduces(cut_plan(rng, cuts=6))
    sent = [f"record-{i:05d}".encode() for i in range(count)]
    delivered: list[tuple[str | None, int, bytes]] = []

    def report(error: KafkaError | None, message: Message) -> None:
        offset, value = message.offset(), message.value()
        failure = None if error is None else str(error)
        delivered.append((failure, -1 if offset is None else offset, value or b""))

    create_topics(kafka_server.kafka, {topic: 1})
    upstream = int(kafka_server.kafka.rpartition(":")[2])
    with KafkaProxy(upstream, rule) as proxy:
        config = {
            "bootstrap.servers": proxy.bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 60_000,
            # at most 20 records a batch: 150 Produce requests or more whatever the load
            # (paced by polls alone, a starved run once sent 16 and missed planned cuts)
            "batch.num.messages": 20,
        }
        with kafka_producer(config) as producer:
            for index, value in enumerate(sent):
                producer.produce(topic, value, partition=0, on_delivery=report)
                if index % 20 == 19:
                    producer.poll(0.01)  # pacing: many Produce requests, not one batch
            assert producer.flush(60) == 0, f"not all delivered; plan {rule.plan}"
        cuts = proxy.cuts()
    stored = read_topic(kafka_server.kafka, topic, 1)
    context = f"seed {seed}, plan {rule.plan}, cuts at {cuts}"
    assert len(cuts) == len(rule.plan), f"not every planned cut happened: {context}"
    assert [error for error, _, _ in delivered if error is not None] == [], context
    faults = delivery_faults(sent, values(stored))
    assert faults.total == 0, f"{faults}; {context}"
    assert [offset for offset, _ in stored[0]] == list(range(count))
    # each delivery report names the offset the record is stored at
    assert sorted((offset, value) for _, offset, value in delivered) == stored[0], context


# 2. a transactional copier killed with SIGKILL and restarted -------------------------------

COPY_IN: Final = "in"
COPY_OUT: Final = "out"
COPY_PARTITIONS: Final = 2
COPY_TXN_ID: Final = "copier"
COPY_GROUP: Final = "copiers"
COPY_TXN_GROUP: Final = "kafka:" + COPY_TXN_ID  # its transactions' group in fencelog
COPY_SESSION_TIMEOUT_MS: Final = 2_000  # a killed copier's member leaves the group this soon


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def caught_up(consumer: Consumer) -> bool:
    """Every assigned partition's committed offset is at its end (the input is final)."""
    assignment = consumer.assignment()
    if not assignment:
        return False
    for committed in consumer.committed(assignment, timeout=STEP_S):
        _, end = consumer.get_watermark_offsets(committed, timeout=STEP_S, cached=False)
        if committed.offset < end:
            return False
    return True


def rewind(consumer: Consumer) -> None:
    """Back to the committed offsets, after an aborted transaction."""
    for committed in consumer.committed(consumer.assignment(), timeout=STEP_S):
        offset = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(committed.topic, committed.partition, offset))


def copy_batch(
    producer: Producer, consumer: Consumer, messages: list[Message], pause: Callable[[], None]
) -> None:
    """One transaction: the batch's copies, uppercased, and the group's new offsets."""
    producer.begin_transaction()
    for message in messages:
        value, partition = message.value(), message.partition()
        assert value is not None and partition is not None, message
        producer.produce(COPY_OUT, value.upper(), partition=partition)
    say(began=len(messages))
    pause()
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), STEP_S
    )
    pause()
    producer.commit_transaction(STEP_S)


def copy_loop(
    producer: Producer, consumer: Consumer, chunk: int, pause: Callable[[], None], budget_s: float
) -> int:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        messages = consumer.consume(num_messages=chunk, timeout=0.2)
        for message in messages:
            if message.error() is not None:
                raise KafkaException(message.error())
        if not messages:
            if caught_up(consumer):
                say(done=True)
                return 0
            continue
        try:
            copy_batch(producer, consumer, messages, pause)
        except KafkaException as failed:
            if not failed.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(STEP_S)
            rewind(consumer)
            say(aborted=str(failed))
            continue
        say(committed=len(messages))
    say(error=f"not done within {budget_s}s")
    return 2


def copier_main(argv: list[str]) -> int:
    """`copy BOOTSTRAP --chunk N [--pause-ms M] [--seed S] [--budget-s B]`: copies `in`
    to the same partition of `out`, uppercased, a transaction per batch of up to N."""
    parser = argparse.ArgumentParser(prog="copy")
    parser.add_argument("bootstrap")
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--pause-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)

    def pause() -> None:
        time.sleep(rng.uniform(0, args.pause_ms / 1000))  # pacing: points to be killed at

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": COPY_GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": COPY_SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 200,
        }
    )
    config = {"bootstrap.servers": args.bootstrap, "transactional.id": COPY_TXN_ID}
    try:
        with kafka_producer(config) as producer:
            producer.init_transactions(STEP_S)  # fences, and aborts what a killed one left
            consumer.subscribe([COPY_IN])
            say(ready=True)
            return copy_loop(producer, consumer, args.chunk, pause, args.budget_s)
    finally:
        consumer.close()


class Copier:
    """One copier process (stopped by the `processes` fixture) and what it said."""

    def __init__(self, processes: Processes, bootstrap: str, seed: int) -> None:
        self.process = processes.start(
            [sys.executable, __file__, "copy", bootstrap, "--chunk", "25", "--pause-ms", "60",
             "--seed", str(seed), "--budget-s", "45"],
            env=user_env(PYTHONPATH=str(TESTS_DIR)),
        )  # fmt: skip
        self.said: list[dict[str, Any]] = []
        self._read = 0

    def wait_for(self, wanted: str, deadline: float) -> dict[str, Any]:
        """Its next line holding `wanted`; fails once it has ended or deadline passed."""

        def found() -> dict[str, Any] | None:
            ended = self.process.popen.poll() is not None
            self.said += [json.loads(line) for line in self.process.lines_now()]
            while self._read < len(self.said):
                line = self.said[self._read]
                self._read += 1
                assert "error" not in line, self.story()
                if wanted in line:
                    return line
            assert not ended, f"the copier ended before saying {wanted!r}: {self.story()}"
            return None

        return wait_until(found, max(deadline - time.monotonic(), 0), message=self.story)

    def kill(self) -> None:
        self.process.kill()
        status = self.process.wait(STEP_S)
        assert status == -9, f"the copier was not killed: {status}; {self.story()}"

    def story(self) -> str:
        return f"it said {self.said}; stderr: {self.process.stderr_text()}"


def test_transactional_copier_killed_and_restarted_copies_each_record_once(
    kafka_server: ServeProcess, processes: Processes
) -> None:
    seed, per_partition = 4242, 400
    rng = random.Random(seed)
    kill_points = ["began", "began", "committed", "committed"]
    rng.shuffle(kill_points)
    inputs = {p: [f"in-{p}-{i:04d}".encode() for i in range(per_partition)] for p in range(2)}
    create_topics(kafka_server.kafka, {COPY_IN: COPY_PARTITIONS, COPY_OUT: COPY_PARTITIONS})
    produce_all(kafka_server.kafka, COPY_IN, inputs)
    for point in kill_points:
        copier = Copier(processes, kafka_server.kafka, rng.randrange(1 << 30))
        deadline = time.monotonic() + STEP_S
        copier.wait_for("ready", deadline)
        for _ in range(rng.randint(0, 2)):
            copier.wait_for("committed", deadline)
        copier.wait_for(point, deadline)
        # a random moment after it: inside the transaction's pauses after "began",
        # between two transactions or early in the next after "committed"
        time.sleep(rng.uniform(0, 0.03 if point == "began" else 0.1))
        copier.kill()
    final = Copier(processes, kafka_server.kafka, rng.randrange(1 << 30))
    final.wait_for("done", time.monotonic() + 45)
    assert final.process.wait(STEP_S) == 0, final.story()
    copied = read_topic(kafka_server.kafka, COPY_OUT, COPY_PARTITIONS, isolation="read_committed")
    with connect(kafka_server.address) as native:
        ended = native.txn_list(include_ended=True, limit=1000)
    states = [t.state for t in ended if t.group == COPY_TXN_GROUP]
    context = f"seed {seed}, killed after {kill_points}; its transactions ended {states}"
    for partition, sent in inputs.items():
        faults = delivery_faults([value.upper() for value in sent], values(copied, partition))
        assert faults.total == 0, f"partition {partition}: {faults}; {context}"
    assert set(states) <= {"committed", "aborted"}, context


# 3. malformed and oversized frames on a raw socket ------------------------------------------


def request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A framed request with a v1 header (client id "faults"; no tagged fields)."""
    client_id = b"faults"
    head = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(head) + len(body)) + head + body


Answer = bytes | None  # an answer frame (its length prefix taken off), or None: closed


def answer_or_close(sock: socket.socket, timeout_s: float = STEP_S) -> Answer:
    """The next answer frame, or None once the broker closed the connection; fails when
    neither happened within timeout_s."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"neither an answer nor a close within {timeout_s}s: {data!r}")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return None
        except TimeoutError:
            continue
        if not chunk:
            return None
        data += chunk
    (size,) = struct.unpack_from(">i", data)
    return data[4 : 4 + size]


def api_versions_v0(answer: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """(correlation id, error code, {api key: (min, max)}) of an ApiVersions v0 answer."""
    correlation_id, error, count = struct.unpack_from(">ihi", answer)
    keys = [struct.unpack_from(">hhh", answer, 10 + 6 * i) for i in range(count)]
    return correlation_id, error, {key: (low, high) for key, low, high in keys}


@dataclass(frozen=True)
class Malformed:
    send: bytes
    close_write: bool = False  # the client then shuts its side, as a crashed one does
    # (api key, version) that an answer, if there is one, is read as; None: none can be
    answered_as: tuple[int, int] | None = None


def v2_request(api_key: int, version: int, correlation_id: int) -> bytes:
    """A request of a flexible version: header v2 (no tagged fields), an empty body's tags."""
    return request(api_key, version, correlation_id, b"\x00\x00")


GARBAGE = random.Random(99).randbytes(64)
MALFORMED: Final = {
    "http-request": Malformed(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
    "garbage-in-a-frame": Malformed(struct.pack(">i", len(GARBAGE)) + GARBAGE),
    "zero-length": Malformed(struct.pack(">i", 0)),
    "negative-length": Malformed(struct.pack(">i", -1)),
    "length-2-GiB": Malformed(struct.pack(">I", 1 << 31)),
    "length-2-GiB-less-1": Malformed(struct.pack(">I", (1 << 31) - 1)),
    "length-over-48-MiB": Malformed(struct.pack(">i", 48 * 1024 * 1024 + 1) + b"\x00" * 4096),
    "truncated-frame": Malformed(request(METADATA_KEY, 1, 5, b"\x00" * 40)[:30], True),
    "truncated-body": Malformed(request(METADATA_KEY, 4, 5, struct.pack(">ih", 3, 3) + b"abc")),
    "short-header": Malformed(struct.pack(">ihh", 4, METADATA_KEY, 1)),
    "unknown-api-key": Malformed(request(9999, 0, 5)),
    "metadata-v99": Malformed(request(METADATA_KEY, 99, 5, b"\x00" * 8)),
    "produce-v99": Malformed(request(PRODUCE_KEY, 99, 5, b"\x00" * 8)),
    # versions newer than fencelog answers, which Kafka's own message specs know
    "produce-v13": Malformed(v2_request(PRODUCE_KEY, 13, 5), answered_as=(PRODUCE_KEY, 13)),
    "fetch-v13": Malformed(v2_request(FETCH_KEY, 13, 5), answered_as=(FETCH_KEY, 13)),
    "metadata-v10": Malformed(v2_request(METADATA_KEY, 10, 5), answered_as=(METADATA_KEY, 10)),
    "find-coordinator-v5": Malformed(
        v2_request(FIND_COORDINATOR_KEY, 5, 5), answered_as=(FIND_COORDINATOR_KEY, 5)
    ),
    "init-producer-id-v5": Malformed(
        v2_request(INIT_PRODUCER_ID_KEY, 5, 5), answered_as=(INIT_PRODUCER_ID_KEY, 5)
    ),
}
RESPONSES: Final = {
    PRODUCE_KEY: ProduceResponse,
    FETCH_KEY: FetchResponse,
    METADATA_KEY: MetadataResponse,
    FIND_COORDINATOR_KEY: FindCoordinatorResponse,
    INIT_PRODUCER_ID_KEY: InitProducerIdResponse,
}


def error_of(answer: bytes, api_key: int, version: int) -> tuple[int, int]:
    """(correlation id, top-level error code) of an answer, read as a Kafka client reads
    it (kafka-python's classes, built from Kafka's message specs); an answer whose
    version has no error code reads as 0, a success."""
    decoded = RESPONSES[api_key].decode(answer, version=version, header=True)
    return int(decoded._header.correlation_id), int(getattr(decoded, "error_code", 0) or 0)


def assert_round_trip(bootstrap: str, topic: str, before: Stored) -> None:
    """A normal client still produces and reads; what was stored is unchanged."""
    produce_all(bootstrap, topic, {0: [b"after"]})
    after = read_topic(bootstrap, topic, 1)
    assert after[0][:-1] == before[0], "records stored before changed"
    assert after[0][-1] == (len(before[0]), b"after")


@pytest.fixture
def stored_before(kafka_server: ServeProcess) -> Stored:
    topic = "kept"
    create_topics(kafka_server.kafka, {topic: 1})
    produce_all(kafka_server.kafka, topic, {0: [f"kept-{i}".encode() for i in range(5)]})
    return read_topic(kafka_server.kafka, topic, 1)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_frame_costs_only_its_connection(
    kafka_server: ServeProcess, stored_before: Stored, case: str
) -> None:
    malformed = MALFORMED[case]
    rows_before = stored_rows(kafka_server.data_dir)["records"]
    answers = send_raw(kafka_server, malformed.send, close_write=malformed.close_write)
    for answer in answers:  # an answer must be an error answer to the request sent
        assert malformed.answered_as is not None, f"{case}: answered {answer!r}"
        correlation_id, error = error_of(answer, *malformed.answered_as)
        assert correlation_id == 5, answer
        assert error != 0, f"{case}: an answer that reads as a success: {answer!r}"
    assert kafka_server.process.popen.poll() is None, kafka_server.stderr_text()
    assert_round_trip(kafka_server.kafka, "kept", stored_before)
    assert stored_rows(kafka_server.data_dir)["records"][: len(rows_before)] == rows_before
    assert "Traceback" not in kafka_server.stderr_text()


def test_a_request_then_garbage_costs_only_that_connection(
    kafka_server: ServeProcess, stored_before: Stored
) -> None:
    # the answer to the good request may be sent before the close, or dropped with it
    data = request(API_VERSIONS_KEY, 0, 5) + b"\xff" * 64
    answers = send_raw(kafka_server, data, requests=2)
    assert [api_versions_v0(answer)[:2] for answer in answers] in ([], [(5, 0)]), answers
    assert kafka_server.process.popen.poll() is None, kafka_server.stderr_text()
    assert_round_trip(kafka_server.kafka, "kept", stored_before)


def send_raw(
    server: ServeProcess, data: bytes, *, requests: int = 1, close_write: bool = False
) -> list[bytes]:
    """Send data on a new connection to the Kafka port; the answers read until the broker
    closed the connection or answered `requests` times (one of which it must do within
    the deadline)."""
    with socket.create_connection((HOST, port_of(server)), timeout=STEP_S) as sock:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        answers: list[bytes] = []
        while len(answers) < requests and (answer := answer_or_close(sock)) is not None:
            answers.append(answer)
        return answers


@pytest.mark.parametrize("version", [4, 99])
def test_api_versions_of_an_unknown_version_gets_unsupported_version_and_the_table(
    kafka_server: ServeProcess, stored_before: Stored, version: int
) -> None:
    body = b"\x07faults\x021\x00"  # v3's compact client software name and version, no tags
    with socket.create_connection((HOST, port_of(kafka_server)), timeout=STEP_S) as sock:
        sock.sendall(request(API_VERSIONS_KEY, version, 41, b"\x00" + body))
        answer = answer_or_close(sock)
        assert answer is not None, "the broker closed instead of answering UNSUPPORTED_VERSION"
        correlation_id, error, table = api_versions_v0(answer)
        assert (correlation_id, error) == (41, UNSUPPORTED_VERSION)
        assert table[API_VERSIONS_KEY][0] == 0 and table[API_VERSIONS_KEY][1] < version
        assert PRODUCE_KEY in table and METADATA_KEY in table
        # as a Kafka client does, it asks again on the same connection, at a version it knows
        sock.sendall(request(API_VERSIONS_KEY, 0, 42))
        again = answer_or_close(sock)
        assert again is not None, "the connection was closed after UNSUPPORTED_VERSION"
        assert api_versions_v0(again) == (42, 0, table)
    assert_round_trip(kafka_server.kafka, "kept", stored_before)


def test_idle_and_stalled_connections_are_closed_and_clients_go_on(tmp_path: Path) -> None:
    """--kafka-idle-timeout (Kafka's connections.max.idle.ms): connections with no
    request for that long, a frame left half sent among them, are closed, so they do not
    hold the listener's connections; one that keeps asking stays open, and a Kafka
    client works throughout."""
    serve_args = ("--no-unix", "--kafka-listen", f"{HOST}:0", "--kafka-idle-timeout", "1s")
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=serve_args) as server:
        port = port_of(server)
        with contextlib.ExitStack() as stack:
            quiet = stack.enter_context(socket.create_connection((HOST, port), timeout=STEP_S))
            stalled = stack.enter_context(socket.create_connection((HOST, port), timeout=STEP_S))
            busy = stack.enter_context(socket.create_connection((HOST, port), timeout=STEP_S))
            stalled.sendall(request(METADATA_KEY, 1, 5, b"\x00" * 40)[:30])  # never finished
            began = time.monotonic()
            for correlation_id in range(6):  # a request every 0.4 s, for 2.4 s in all
                busy.sendall(request(API_VERSIONS_KEY, 0, correlation_id))
                assert answer_or_close(busy) is not None, "an active connection was closed"
                time.sleep(0.4)
            assert answer_or_close(quiet) is None  # closed: it asked nothing for 1 s
            assert answer_or_close(stalled) is None
            assert time.monotonic() - began < STEP_S
            busy.sendall(request(API_VERSIONS_KEY, 0, 99))
            assert answer_or_close(busy) is not None
        create_topics(server.kafka, {"after": 1})
        produce_all(server.kafka, "after", {0: [b"x"]})
        assert read_topic(server.kafka, "after", 1) == {0: [(0, b"x")]}


def port_of(server: ServeProcess) -> int:
    return int(server.kafka.rpartition(":")[2])


if __name__ == "__main__":
    if sys.argv[1:2] != ["copy"]:
        sys.exit(f"usage: {sys.argv[0]} copy BOOTSTRAP --chunk N [...]")
    sys.exit(copier_main(sys.argv[2:]))
