"""Takeovers with real processes: the exclusive producer is paused (SIGSTOP) mid-stream,
a waiter takes over and writes, the paused one is resumed (SIGCONT): it must be fenced
(ProducerFenced on its next send) and no record of the old epoch may land after the new
epoch's first. Repeated in a chain (the waiter that took over is the next one paused),
embedded (sessions are processes, judged by their heartbeats) and served
(`fencelog serve --session-timeout 1s`: sessions are connections).

Embedded, a writer paused while it holds SQLite's write lock blocks everyone else until
it runs again, so the waiter cannot be promoted: the test sees the lock taken (it cannot
take it itself), resumes the writer for one more record and pauses it again. Paused
outside a write, the waiter must take over within the session timeout. A writer may also
lose its session before it is paused (a late heartbeat on a busy machine): the takeover
then happens early, which the rules allow; the log must hold the same guarantees either
way.

Also: a holder killed with SIGKILL is detached at once (no session timeout to wait for),
and a paused holder whose session ended is fenced when a new producer took plain
Exclusive access instead of a waiter being promoted.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec.structs
import pytest

from broker.client.client import Client, connect
from broker.client.producer import Producer
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.storage.database import DataDir
from support.exclusive import STEP_S, access_view, assert_never_interleaved, segments
from support.helpers import Process
from support.owning import resumed_and_killed, serving
from support.values import present
from support.waiting import wait_until

TOPIC = "control"
TAKEOVERS = 3
SESSION_TIMEOUT_MS = {"embedded": 1500, "served": 1000}
FENCED_EXIT = 3
PAUSE_ATTEMPTS = 20  # embedded: a writer paused holding the write lock is paused again
LOCK_PROBE_S = 0.5  # a write of the others (the waiter's poll, a heartbeat) is shorter

WRITER = """
import msgspec.structs, sys, threading, time
from broker.client.client import connect
from broker.limits import DEFAULT_LIMITS
from broker.client.producer import ProducerFenced

target, topic, name, access, timeout_ms, pace = sys.argv[1:7]
lock = threading.Lock()

def say(line):
    with lock:
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

def values():
    if pace == "stdin":  # one record per line, when the test says so
        yield from (line.strip() for line in sys.stdin)
    else:
        number = 0
        while True:
            yield f"{name}:{number}"
            number += 1
            time.sleep(float(pace))  # pacing: a steady stream for the test to cut into

limits = msgspec.structs.replace(DEFAULT_LIMITS, session_timeout_ms=int(timeout_ms))
client = connect(target, durability="normal", limits=limits)
client.on_severed(lambda reason: say("severed"))  # served: the server ended the session
producer = client.producer(topic, idempotent=False, access=access, name=name, wait_timeout_s=60)
say(f"elected {producer.epoch}")
try:
    for value in values():
        [result] = producer.send([value], partition=0)
        say(f"ack {result.offset} {value}")
except ProducerFenced as fenced:
    say("fenced " + " ".join(fenced.message.split()))
    client.close()
    sys.exit(3)
"""


@dataclass
class Writer:
    """One writer process and what it said: its epoch, its acknowledged records."""

    name: str
    process: Process
    epoch: int | None = None
    acked: dict[int, str] = field(default_factory=dict)  # offset: value
    fenced: str | None = None
    severed: bool = False

    def hear(self, timeout_s: float = STEP_S) -> str:
        """The next line, noted."""
        line = self.process.line(timeout_s)
        words = line.split()
        if words[0] == "elected":
            self.epoch = int(words[1])
        elif words[0] == "ack":
            self.acked[int(words[1])] = words[2]
        elif words[0] == "severed":
            self.severed = True
        elif words[0] == "fenced":
            self.fenced = line
        else:
            raise AssertionError(f"{self.name} said {line!r}")
        return words[0]

    def until(self, word: str, timeout_s: float = STEP_S) -> bool:
        """Hear lines until `word`; False if the writer was fenced first."""
        deadline = time.monotonic() + timeout_s
        while (heard := self.hear(max(deadline - time.monotonic(), 0.01))) != word:
            if heard == "fenced":
                return False
        return True

    def acks(self, count: int) -> bool:
        """Hear `count` more acknowledgements; False if fenced first."""
        wanted = len(self.acked) + count
        while len(self.acked) < wanted:
            if not self.until("ack"):
                return False
        return True

    def step(self, value: str) -> str:
        """Stdin-paced: send one record; what the writer said about it (ack or fenced)."""
        self.process.stdin.write(f"{value}\n".encode())
        self.process.stdin.flush()
        while (heard := self.hear()) not in ("ack", "fenced"):
            pass
        return heard

    def pause(self) -> None:
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.signal(signal.SIGCONT)

    def finish_fenced(self, successor_first: int) -> None:
        """After resume: it must be fenced and exit 3, and acknowledge nothing at or
        past successor_first (the offset of its successor's first record)."""
        deadline = time.monotonic() + STEP_S
        while self.fenced is None:
            assert time.monotonic() < deadline, f"{self.name} never fenced: {self.acked}"
            self.hear(max(deadline - time.monotonic(), 0.01))
            landed_late = [offset for offset in self.acked if offset >= successor_first]
            assert not landed_late, (
                f"{self.name} wrote at {landed_late} after its successor's first record "
                f"at {successor_first}"
            )
        status = self.process.wait(STEP_S)
        assert status == FENCED_EXIT, (self.name, status, self.process.stderr_text())


class Chain:
    """Writers started one after another on one topic, each waiting for the last."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.writers: list[Writer] = []
        self.stack = contextlib.ExitStack()

    def start(self, name: str, access: str = "wait-exclusive", pace: str = "0.02") -> Writer:
        args = (self.url, TOPIC, name, access, str(SESSION_TIMEOUT_MS[self.kind]), pace)
        started = Process([sys.executable, "-c", WRITER, *args], stdin=pace == "stdin")
        process = self.stack.enter_context(resumed_and_killed(started))
        writer = Writer(name, process)
        self.writers.append(writer)
        return writer

    def take_over(self, holder: Writer, waiter: Writer) -> None:
        """Pause holder mid-stream until waiter is elected and has written; resume it."""
        for _ in range(PAUSE_ATTEMPTS):
            if not holder.acks(1):  # it lost its session on its own: an early takeover
                assert waiter.until("elected") and waiter.acks(3)
                return
            holder.pause()
            try:
                if self.kind == "embedded" and self.write_locked():
                    continue  # paused inside a write: everyone waits for it; again
                timeout_s = SESSION_TIMEOUT_MS[self.kind] / 1000 + 4.0
                assert waiter.until("elected", timeout_s), f"{waiter.name} fenced"
                assert waiter.acks(3), f"{waiter.name} fenced while its rival was paused"
                return
            finally:
                holder.resume()
        raise AssertionError(f"{holder.name} was paused inside a write {PAUSE_ATTEMPTS} times")

    def write_locked(self) -> bool:
        """Embedded: does someone (the paused holder) hold the database's write lock?"""
        conn = sqlite3.connect(DataDir(Path(self.url)).db_path, timeout=LOCK_PROBE_S)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
            return False
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            return True
        finally:
            conn.close()

    def close(self) -> None:
        self.stack.close()


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[tuple[str, str]]:
    if request.param == "embedded":
        yield "embedded", str(data_dir)
        return
    with serving(data_dir, session_timeout="1s") as url:
        yield "served", url


def wait_until_waiting(client: Client, name: str) -> None:
    def queued() -> bool:
        view = access_view(client, TOPIC)
        # or promoted already: its rival lost its session early
        return name in view.waiting or view.exclusive == name

    wait_until(queued, STEP_S, message=lambda: f"{name} queued: {access_view(client, TOPIC)}")


def check_log(client: Client, writers: list[Writer]) -> None:
    """One segment per epoch, in epoch order; every acknowledged record where it was
    acknowledged; each writer's records under the epoch it was elected with."""
    log = list(client.consume(TOPIC))
    assert_never_interleaved(log)
    for writer in writers:
        for offset, value in writer.acked.items():
            assert present(log[offset].value).decode() == value, (writer.name, offset, log[offset])
    epochs = {w.name: w.epoch for w in writers}
    assert all(epochs[writer] == epoch for epoch, writer in segments(log)), segments(log)


@pytest.mark.slow
def test_a_paused_exclusive_producer_never_lands_a_record_after_the_next_epoch(
    target: tuple[str, str],
) -> None:
    kind, url = target
    chain = Chain(kind, url)
    with contextlib.closing(chain), connect(url, durability="normal") as client:
        client.create_topic(TOPIC)
        holder = chain.start("w0", access="exclusive")
        assert holder.until("elected") and holder.epoch == 1
        for number in range(1, TAKEOVERS + 1):
            waiter = chain.start(f"w{number}")
            wait_until_waiting(client, waiter.name)
            chain.take_over(holder, waiter)
            assert holder.epoch is not None and waiter.epoch == holder.epoch + 1
            holder.finish_fenced(min(waiter.acked))
            holder = waiter
        assert holder.acks(1)
    with connect(url, durability="normal") as client:  # every writer is stopped by now
        check_log(client, chain.writers)
        assert access_view(client, TOPIC).epoch == 1 + TAKEOVERS


def test_a_killed_holder_is_detached_at_once_and_the_waiter_promoted(
    target: tuple[str, str],
) -> None:
    """kill -9: no goodbye, no heartbeat; embedded the process is gone, served the
    connection is. Neither waits for the session timeout to run out."""
    kind, url = target
    chain = Chain(kind, url)
    with contextlib.closing(chain), connect(url, durability="normal") as client:
        client.create_topic(TOPIC)
        holder = chain.start("killed", access="exclusive")
        assert holder.until("elected") and holder.acks(2)
        waiter = chain.start("next")
        wait_until_waiting(client, waiter.name)
        holder.process.kill()
        assert waiter.until("elected") and waiter.epoch == 2
        assert waiter.acks(2)
    with connect(url, durability="normal") as client:
        check_log(client, chain.writers)


def test_a_paused_holder_is_fenced_after_a_new_exclusive_producer_took_over(
    target: tuple[str, str],
) -> None:
    """No waiter this time: once the paused holder's session has ended, a new producer
    is granted plain Exclusive access (refused while the holder's session lasts). The
    holder writes only when told, so that served, its client has seen its connection
    closed before it tries again, and the write goes out on a new connection."""
    kind, url = target
    chain = Chain(kind, url)
    limits = msgspec.structs.replace(
        DEFAULT_LIMITS, session_timeout_ms=SESSION_TIMEOUT_MS[kind], busy_timeout_ms=2000
    )
    with contextlib.closing(chain), connect(url, durability="normal", limits=limits) as client:
        client.create_topic(TOPIC)
        holder = chain.start("old", access="exclusive", pace="stdin")
        assert holder.until("elected") and holder.epoch == 1
        assert [holder.step(f"old:{n}") for n in range(3)] == ["ack"] * 3
        holder.pause()
        try:
            newcomer = take_exclusive(client, holder)
            assert newcomer.epoch == 2
            newcomer.send([f"new:{n}" for n in range(3)], partition=0)
        finally:
            holder.resume()
        if kind == "served":
            assert holder.until("severed")
        heard = holder.step("old:late")
        assert heard == "fenced", f"old's write after resuming landed: {holder.acked}"
        assert holder.process.wait(STEP_S) == FENCED_EXIT
        log = list(client.consume(TOPIC))
    assert_never_interleaved(log)
    assert [writer for _, writer in segments(log)] == ["old", "new"]
    assert all(
        present(log[offset].value).decode() == value for offset, value in holder.acked.items()
    )


def take_exclusive(client: Client, holder: Writer) -> Producer:
    """Exclusive access, asked again until the paused holder's session has ended.
    Embedded, a holder paused holding the write lock runs again for one more record."""
    extra = 0
    refused: list[BrokerError] = []

    def taken() -> Producer | None:
        nonlocal extra
        try:
            return client.producer(TOPIC, idempotent=False, access="exclusive", name="new")
        except BrokerError as error:
            refused[:] = [error]
            if error.code is ErrorCode.STORAGE_BUSY:
                holder.resume()
                assert holder.step(f"old:extra{extra}") == "ack"
                extra += 1
                holder.pause()
            elif error.code is not ErrorCode.PRODUCER_BUSY:
                raise
        return None

    return wait_until(
        taken,
        STEP_S,
        interval_s=0.05,
        message=lambda: f"exclusive access after the holder's session ended; last: {refused}",
    )
