"""A served Kafka listener against thousands of mutated requests (issue 39): whatever a
hostile or broken client sends, the broker refuses it or answers it, never fails inside
a handler, and goes on serving.

The seeds are the requests real clients sent (golden/requests.json: producers of
librdkafka, kafka-python and aiokafka; golden/sessions.json: kcat, and librdkafka and
kafka-python consumer groups, admins and a transactional producer: 47 requests of 30
API/version pairs). Each case takes one, mutates it as a broken or hostile client would (bytes
flipped, cut short, a length word wrong, another API key or version, garbage appended,
a section zeroed, a null or a huge count written over a field, frames repeated) and
sends it on a connection of its own, followed by a valid ApiVersions request, the
probe; the case is done when the probe is answered or the broker closed the connection
(or, for a request the broker may hold, such as a long fetch or a join, after
CASE_WAIT_S, when the test closes it). Every PROBE_EVERY cases a valid Metadata request
on a new connection must be answered. At the end the server's log has no ERROR and no
traceback, its warnings are few (refusals.py), and a producer and a consumer still work.

Seeded: FENCELOG_FUZZ_SEED (default 39) and FENCELOG_FUZZ_CASES (default 3000) choose
the cases; a failure names the seed, the case and its mutations, and
FENCELOG_FUZZ_ONLY=CASE[,CASE...] sends only those cases.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, Producer, TopicPartition

from broker.kafka import wire
from support.servers import HOST, ServeProcess

SEED: Final = int(os.environ.get("FENCELOG_FUZZ_SEED", "39"))
CASES: Final = int(os.environ.get("FENCELOG_FUZZ_CASES", "3000"))
ONLY: Final = os.environ.get("FENCELOG_FUZZ_ONLY", "")
PROBE_EVERY: Final = 50
CASE_WAIT_S: Final = 0.3
STEP_S: Final = 20.0
PAD_BYTES_MAX: Final = 64 * 1024  # a frame short of this many bytes is completed with zeros
FRAME_BYTES_MAX: Final = 48 * 1024 * 1024  # the listener's frame limit (Limits)
WARNINGS_MAX: Final = 12  # a few kinds of refusal, each warned of once a minute
GOLDEN_DIR: Final = Path(__file__).parent / "golden"
PROBE_CORRELATION: Final = 0x39390000


def captured() -> list[tuple[str, bytes]]:
    """(file/client/api/version, request frame without its length word) of every
    captured request."""
    seeds = []
    for name in ("requests", "sessions"):
        for client, frames in json.loads((GOLDEN_DIR / f"{name}.json").read_text()).items():
            for pair, frame in frames.items():
                seeds.append((f"{name}/{client}/{pair}", bytes.fromhex(frame)))
    return sorted(seeds)


SEEDS: Final = captured()
HEADER_BYTES: Final = 10  # api key, version, correlation id, client id length


# mutations: a request frame (no length word) in, another out ------------------------------

Mutation = Callable[[random.Random, bytes], bytes]


def flip(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def cut(rng: random.Random, frame: bytes) -> bytes:
    return frame[: rng.randrange(len(frame))]


def other_api(rng: random.Random, frame: bytes) -> bytes:
    return struct.pack(">h", rng.choice(sorted(wire.APIS))) + frame[2:]


def other_version(rng: random.Random, frame: bytes) -> bytes:
    if len(frame) < 4:
        return frame
    api = wire.APIS.get(struct.unpack_from(">h", frame)[0])
    high = api.max_version if api is not None else 12
    return frame[:2] + struct.pack(">h", rng.randint(-1, high + 2)) + frame[4:]


def garbage(rng: random.Random, frame: bytes) -> bytes:
    return frame + rng.randbytes(rng.randint(1, 64))


def zeroed(rng: random.Random, frame: bytes) -> bytes:
    start = rng.randrange(len(frame))
    size = rng.randint(1, max(1, len(frame) - start))
    return frame[:start] + bytes(size) + frame[start + size :]


def null_written(rng: random.Random, frame: bytes) -> bytes:
    """A null length over whatever is there: INT16 -1 (string), INT32 -1 (array,
    bytes) or a compact null (varint 0)."""
    null = rng.choice([b"\xff\xff", b"\xff\xff\xff\xff", b"\x00"])
    at = rng.randrange(HEADER_BYTES, max(HEADER_BYTES + 1, len(frame) - len(null) + 1))
    return frame[:at] + null + frame[at + len(null) :]


def huge_count(rng: random.Random, frame: bytes) -> bytes:
    count = rng.choice([b"\x7f\xff\xff\xff", b"\x00\x00\xff\xff", b"\xff\xff\xff\x7f", b"\x7f\xff"])
    at = rng.randrange(HEADER_BYTES, max(HEADER_BYTES + 1, len(frame) - len(count) + 1))
    return frame[:at] + count + frame[at + len(count) :]


MUTATIONS: Final[dict[str, Mutation]] = {
    "flip": flip,
    "cut": cut,
    "other_api": other_api,
    "other_version": other_version,
    "garbage": garbage,
    "zeroed": zeroed,
    "null": null_written,
    "huge_count": huge_count,
}


# framings: a mutated frame onto the wire -------------------------------------------------


def framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def wrong_length(rng: random.Random, frame: bytes) -> bytes:
    length = rng.choice(
        [len(frame) + rng.randint(-len(frame), 64), rng.randint(-(1 << 31), (1 << 31) - 1)]
    )
    return struct.pack(">i", length) + frame


def repeated(rng: random.Random, frame: bytes) -> bytes:
    return framed(frame) * rng.randint(2, 5)


def garbage_after(rng: random.Random, frame: bytes) -> bytes:
    return framed(frame) + rng.randbytes(rng.randint(1, 64))


FRAMINGS: Final[dict[str, Callable[[random.Random, bytes], bytes]]] = {
    "wrong_length": wrong_length,
    "repeated": repeated,
    "garbage_after": garbage_after,
}


@dataclass(frozen=True)
class Case:
    index: int
    seed_name: str
    mutations: tuple[str, ...]
    data: bytes  # what is sent, the probe not included

    def __str__(self) -> str:
        return (
            f"case {self.index} of seed {SEED} ({self.seed_name}, {' + '.join(self.mutations)}; "
            f"rerun with FENCELOG_FUZZ_SEED={SEED} FENCELOG_FUZZ_ONLY={self.index}): "
            f"{self.data[:200].hex()}"
        )


def make_cases(seed: int, count: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        seed_name, frame = rng.choice(SEEDS)
        names = rng.sample(sorted(MUTATIONS), rng.choice([1, 1, 1, 2]))
        for name in names:
            if frame:  # a frame cut to nothing stays so
                frame = MUTATIONS[name](rng, frame)
        if rng.random() < 0.25:
            framing = rng.choice(sorted(FRAMINGS))
            data = FRAMINGS[framing](rng, frame)
            names.append(framing)
        else:
            data = framed(frame)
        cases.append(Case(index, seed_name, tuple(names), completed(data)))
    return cases


def completed(data: bytes) -> bytes:
    """data with its frames completed with zeros where they are short by a little, so
    the broker reads them and the probe after them. A frame the listener refuses for
    its length, or one short of more than PAD_BYTES_MAX, is left as it is: the probe
    then only adds to it."""
    pos = 0
    while pos < len(data):
        data += bytes(max(0, pos + 4 - len(data)))  # a length word begun: finished
        (size,) = struct.unpack_from(">i", data, pos)
        missing = pos + 4 + size - len(data)
        if size < 0 or size > FRAME_BYTES_MAX or missing > PAD_BYTES_MAX:
            return data
        data += bytes(max(0, missing))
        pos += 4 + size
    return data


# sending -------------------------------------------------------------------------------


def probe(correlation_id: int) -> bytes:
    """ApiVersions v0, client id "fuzz-probe"."""
    client = b"fuzz-probe"
    return framed(struct.pack(">hhih", 18, 0, correlation_id, len(client)) + client)


def send_case(port: int, case: Case) -> str:
    """Send the case and its probe; "answered" (the probe was), "closed" (the broker
    closed the connection first) or "held" (neither within CASE_WAIT_S)."""
    correlation_id = PROBE_CORRELATION + case.index % 0xFFFF
    with socket.create_connection((HOST, port), timeout=STEP_S) as sock:
        try:
            sock.sendall(case.data + probe(correlation_id))
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        return answered_or_closed(sock, correlation_id, time.monotonic() + CASE_WAIT_S)


def answered_or_closed(sock: socket.socket, correlation_id: int, deadline: float) -> str:
    data = b""
    while True:
        while len(data) >= 8:
            (size, answered) = struct.unpack_from(">ii", data)
            if answered == correlation_id:
                return "answered"
            if len(data) < 4 + size:
                break
            data = data[4 + size :]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "held"
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "held"
        if not chunk:
            return "closed"
        data += chunk


def a_valid_request_is_answered(port: int, metadata: bytes, context: str) -> None:
    with socket.create_connection((HOST, port), timeout=STEP_S) as sock:
        sock.sendall(framed(metadata))
        correlation_id = struct.unpack_from(">i", metadata, 4)[0]
        outcome = answered_or_closed(sock, correlation_id, time.monotonic() + STEP_S)
        assert outcome == "answered", f"a valid Metadata request {outcome} after {context}"


# the test ------------------------------------------------------------------------------


def test_mutated_requests_from_real_clients_are_refused_or_answered_and_the_broker_goes_on(
    kafka_server: ServeProcess,
) -> None:
    port = int(kafka_server.kafka.rpartition(":")[2])
    cases = make_cases(SEED, CASES)
    if ONLY:
        cases = [cases[int(index)] for index in ONLY.split(",")]
    metadata = dict(SEEDS)["sessions/librdkafka/3/v9"]
    outcomes: dict[str, int] = {}
    began = time.monotonic()
    for case in cases:
        outcome = send_case(port, case)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if case.index % PROBE_EVERY == PROBE_EVERY - 1:
            a_valid_request_is_answered(port, metadata, str(case))
            assert kafka_server.process.popen.poll() is None, f"the broker died at {case}"
    seconds = time.monotonic() - began
    log = kafka_server.stderr_text()
    warnings = [line for line in log.splitlines() if " WARNING " in line]
    summary = (
        f"seed {SEED}, {len(cases)} cases in {seconds:.1f} s: {outcomes}, {len(warnings)} warnings"
    )
    assert " ERROR " not in log and "Traceback" not in log, f"{summary}\n{log}"
    assert len(warnings) <= WARNINGS_MAX, f"{summary}\n" + "\n".join(warnings)
    a_producer_and_a_consumer_still_work(kafka_server.kafka)
    print(summary)


def a_producer_and_a_consumer_still_work(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    try:
        producer.produce("after-fuzz", b"still here", key=b"k")
        assert producer.flush(STEP_S) == 0, "the record was not delivered"
    finally:
        producer.close()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "after-fuzz"})
    try:
        consumer.assign([TopicPartition("after-fuzz", 0, 0)])
        deadline = time.monotonic() + STEP_S
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
        assert message is not None and message.error() is None, message
        assert (message.key(), message.value()) == (b"k", b"still here")
    finally:
        consumer.close()
