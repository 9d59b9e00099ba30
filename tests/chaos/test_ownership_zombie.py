"""The zombie writer and the two readers, with real processes, embedded and served.

Zombie: writer A (a real process) claims a journal partition and keeps producing records
tagged with its generation, each with its fence; A is paused with SIGSTOP, most likely
with a produce in flight; B claims with a higher generation and writes; A is resumed
(SIGCONT). No record of A may land after B's first record, and A must be refused
(FENCED; served, a request in flight when its session was closed may get SEVERED) and be
told it was severed. Repeated many times, since what is in flight at SIGSTOP varies.

Embedded, a paused A may be holding SQLite's write lock: then nothing can be written
until it runs again, so B's claim waits and A is resumed after a deadline. Either way the
log must show no A record after B's first.

Readers: two consumers claim the same partitions over and over; a fetch carrying both
consumers' latest fences must always be FENCED (at most one of them is valid), and no
(resource, generation) is ever granted to both.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.types import Fence
from support.helpers import Process
from support.owning import broker_target, python_process, resumed_and_killed
from support.values import present

ITERATIONS = 10
GROUP = "journal"
STOPPED_EXIT = 41  # the writer was refused (FENCED or SEVERED) and told it was severed
RESUME_AFTER_S = 2.0  # embedded: a paused A holding the write lock is resumed by then
STEP_S = 20.0

WRITER = """
import sys, threading
from msgspec.structs import replace
from broker.client.client import connect
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS

target, topic = sys.argv[1], sys.argv[2]
lock = threading.Lock()

def say(line):
    with lock:
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

severed = threading.Event()
def on_severed(reason):
    say("severed " + " ".join(reason.split()))
    severed.set()

# Embedded, heartbeat every 0.5 s, so a severed A learns it soon (served ignores this).
limits = replace(DEFAULT_LIMITS, session_timeout_ms=1500)
client = connect(target, durability="normal", limits=limits)
client.on_severed(on_severed)
[claimed] = client.own("journal", [topic + "/0"], generation=1)
generation = claimed.generation
say(f"claimed {generation}")
number = 0
while True:
    try:
        [result] = client.produce(
            topic, [f"A:{generation}:{number}"], partition=0, fences=[claimed.fence]
        )
    except BrokerError as error:
        if error.code in (ErrorCode.FENCED, ErrorCode.SEVERED):
            say(error.code.name)
            break
        if error.code is ErrorCode.CONNECTION_FAILED:  # served: severing closed it
            say("lost")
            continue
        raise
    say(f"ack {result.offset} {number}")
    number += 1
told = severed.wait(10)
client.close()
sys.exit(41 if told else 3)
"""


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[str]:
    with broker_target(request.param, data_dir) as found:
        yield found


@dataclass
class WriterLog:
    generation: int
    acked: dict[int, str] = field(default_factory=dict)  # offset: value
    said: list[str] = field(default_factory=list)


def read_until_acks(writer: Process, acks: int) -> WriterLog:
    first = writer.line(STEP_S).split()
    assert first[0] == "claimed", first
    log = WriterLog(int(first[1]))
    while len(log.acked) < acks:
        note(log, writer.line(STEP_S))
    return log


def note(log: WriterLog, line: str) -> None:
    words = line.split()
    if words[0] == "ack":
        log.acked[int(words[1])] = f"A:{log.generation}:{words[2]}"
    else:
        log.said.append(line)


def one_zombie_round(target: str, topic: str) -> None:
    with connect(target, durability="normal") as b:
        b.create_topic(topic, owner_group=GROUP)
        resource = f"{topic}/0"
        with resumed_and_killed(python_process(WRITER, target, topic)) as writer:
            a = read_until_acks(writer, acks=3)
            writer.signal(signal.SIGSTOP)
            resume = threading.Timer(RESUME_AFTER_S, writer.signal, (signal.SIGCONT,))
            resume.start()
            try:
                [claimed] = b.own(GROUP, [resource], generation=a.generation + 1)
                assert claimed.generation == a.generation + 1
                written = b.produce(
                    topic,
                    [f"B:{claimed.generation}:{n}" for n in range(3)],
                    partition=0,
                    fences=[claimed.fence],
                )
            finally:
                resume.cancel()
                writer.signal(signal.SIGCONT)
            status = writer.wait(STEP_S)
            for line in writer.remaining_lines():
                note(a, line)
            assert status == STOPPED_EXIT, (status, a.said, writer.stderr_text())
        assert {"FENCED\n", "SEVERED\n"} & set(a.said), a.said
        assert any(line.startswith("severed ") for line in a.said), a.said
        values = [present(r.value).decode() for r in b.consume(topic)]
    first_b = written[0].offset
    assert values[first_b:] == [f"B:{claimed.generation}:{n}" for n in range(3)]
    assert all(v.startswith(f"A:{a.generation}:") for v in values[:first_b]), values
    # Every acknowledged A record is in the log, where it was acknowledged, before B's.
    assert all(values[offset] == value for offset, value in a.acked.items())
    assert max(a.acked) < first_b


@pytest.mark.slow
def test_a_paused_zombie_writer_never_lands_a_record_after_the_new_owner(target: str) -> None:
    for iteration in range(ITERATIONS):
        one_zombie_round(target, f"journal{iteration}")


# readers ----------------------------------------------------------------------------------

READER_ROUNDS = 30
READERS_FOR_S = 8.0
RESOURCES = ("orders/0", "orders/1")


@dataclass
class Reader:
    name: str
    target: str
    granted: list[tuple[str, int]] = field(default_factory=list)
    fences: tuple[Fence, ...] = ()
    reads_passed: int = 0
    failure: BaseException | None = None


class Readers:
    """Two readers fighting over the same partitions, and a checker between them."""

    def __init__(self, target: str) -> None:
        self.lock = threading.Lock()
        self.readers = [Reader("r1", target), Reader("r2", target)]
        self.deadline = time.monotonic() + READERS_FOR_S

    def run(self, reader: Reader) -> None:
        client = connect(reader.target, durability="normal")
        try:
            for _ in range(READER_ROUNDS):
                if time.monotonic() > self.deadline:
                    return
                client = self.claim_and_read(reader, client)
        except BaseException as failure:
            reader.failure = failure
        finally:
            client.close()

    def claim_and_read(self, reader: Reader, client: Client) -> Client:
        try:
            return self._claim_and_read(reader, client)
        except BrokerError as error:
            if error.code is ErrorCode.SEVERED:  # this session is done: open another
                client.close()
                return connect(reader.target, durability="normal")
            # served: the severed connection was closed under a request; the client
            # reconnects by itself on the next one.
            assert error.code is ErrorCode.CONNECTION_FAILED, error
            return client

    def _claim_and_read(self, reader: Reader, client: Client) -> Client:
        current = {r.resource: r.generation for r in client.ownership(GROUP_READERS)}
        # Alternately claim one above the current generation and at it (which also
        # severs a holder at that generation, and must then grant the next one).
        bump = len(reader.granted) // len(RESOURCES) % 2
        wanted = {r: max(current.get(r, 0) + bump, 1) for r in RESOURCES}
        try:
            claimed = client.own(GROUP_READERS, wanted)
        except BrokerError as error:
            if error.code is not ErrorCode.OWNED_BY_HIGHER_GENERATION:
                raise
            return client  # the other reader got there first
        with self.lock:
            reader.granted += [(c.resource, c.generation) for c in claimed]
            reader.fences = tuple(c.fence for c in claimed)
        try:
            client.fetch("orders", {0: 0, 1: 0}, fences=[c.fence for c in claimed])
            reader.reads_passed += 1
        except BrokerError as error:
            if error.code is not ErrorCode.FENCED:  # the other reader took over
                raise
        return client


GROUP_READERS = "readers"


@pytest.mark.slow
def test_two_readers_never_both_hold_a_valid_fence(target: str) -> None:
    with connect(target, durability="normal") as checker:
        checker.create_topic("orders", partitions=2)
        checker.produce("orders", [b"o0"], partition=0)
        checker.produce("orders", [b"o1"], partition=1)
        readers = Readers(target)
        threads = [threading.Thread(target=readers.run, args=(r,)) for r in readers.readers]
        for thread in threads:
            thread.start()
        checks = 0

        def check_both() -> None:
            nonlocal checks
            with readers.lock:
                both = [f for r in readers.readers for f in r.fences]
            if len(both) == 2 * len(RESOURCES):
                with pytest.raises(BrokerError) as caught:
                    checker.fetch("orders", {0: 0, 1: 0}, fences=both)
                assert caught.value.code is ErrorCode.FENCED, caught.value
                checks += 1

        try:
            while any(thread.is_alive() for thread in threads):
                check_both()
                time.sleep(0.002)  # pacing: check about as often as the readers claim
        finally:
            for thread in threads:
                thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        check_both()  # once more when both have stopped: a loaded machine may starve the loop
    first, second = readers.readers
    for reader in readers.readers:
        assert reader.failure is None, f"{reader.name}: {reader.failure!r}"
        assert reader.granted and reader.reads_passed > 0, reader
        for resource in RESOURCES:
            mine = [g for r, g in reader.granted if r == resource]
            assert mine == sorted(mine), f"{reader.name} {resource}: {mine}"
    assert not set(first.granted) & set(second.granted)
    assert checks > 0
