"""Exclusive producers (PIP-68, DESIGN.md section 5) through the Python client, embedded
(sessions are clients of a process) and served (sessions are connections), and the
engine driven against a reference model.

Every rule: Shared refused while an exclusive producer is attached; Exclusive refused
while any other producer is attached; WaitForExclusive blocks until promoted, in FIFO
order, or leaves the queue when its wait ends; the epoch is bumped for a new exclusive
producer and kept for the previous one coming back with it; an older epoch is fenced;
close, disconnect and missed heartbeats detach; a producer that lost its access raises
ProducerFenced on its next send and every one after; records carry their epoch and the
log is one segment per epoch, never interleaved; the compacted read gives the newest
record of every key.

A producer "loses its session" without doing anything itself: served, the server ends
its connection (what it does to a session that missed its heartbeats); embedded, its
client runs on a LaggingClock that falls behind by more than the session timeout, so
everyone else sees its heartbeats as too old, exactly as if its process had stopped.
Served, a raw socket that attaches and then says nothing misses its heartbeats for real.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec.structs
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import broker
from broker.client.client import Client, connect
from broker.client.producer import Producer, ProducerFenced
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.protocol.messages import Op, Reply, Request
from broker.types import Access, Mode, NewRecord, Record
from support.exclusive import (
    AccessView,
    LaggingClock,
    Waiter,
    access_view,
    assert_never_interleaved,
    wait_for_access,
)
from support.owning import RawSession
from support.servers import ServerThread, served
from support.values import present

TOPIC = "control"
PAST_TIMEOUT_MS = DEFAULT_LIMITS.session_timeout_ms + 60_000
FREE = AccessView("free", 0, None, (), ())


class Target:
    """The broker under test: embedded (a data directory) or served (a ServerThread)."""

    def __init__(self, data_dir: Path, server: ServerThread | None) -> None:
        self.data_dir = data_dir
        self.server = server
        self._clients: list[Client] = []

    @property
    def url(self) -> str:
        return self.server.address if self.server is not None else str(self.data_dir)

    def client(self, clock: LaggingClock | None = None) -> Client:
        """A new client: a session of its own. `clock` (embedded) stamps its heartbeats."""
        if self.server is not None or clock is None:
            opened = connect(self.url, durability="normal")
        else:
            opened = connect(self.url, durability="normal", clock=clock)
        self._clients.append(opened)
        return opened

    def end_session(self, victim: Producer, clock: LaggingClock, observer: Client) -> None:
        """victim's session ends with victim doing nothing, and the observer sees it gone.
        Served: the server closes its connection, as for missed heartbeats. Embedded:
        victim's clock (given to target.client) falls behind by more than the timeout."""
        if self.server is None:
            clock.fall_behind(PAST_TIMEOUT_MS)
        else:
            info = observer.topic_access(victim.topic)
            attached = [
                a
                for a in (info.exclusive, *info.shared, *info.waiting)
                if a is not None and a.attachment_id == victim.attachment_id
            ]
            assert attached, f"{victim.name} is not attached: {info}"
            server, session_id = self.server.server, attached[0].session_id
            self.server.call(lambda: server.sever(session_id, "missed heartbeats"))
        wait_for_access(
            observer,
            victim.topic,
            lambda v: victim.name not in (v.exclusive, *v.shared, *v.waiting),
            f"{victim.name}'s session ends",
        )

    def close(self) -> None:
        for opened in reversed(self._clients):
            opened.close()


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[Target]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(served(data_dir)) if request.param == "served" else None
        found = Target(data_dir, server)
        stack.callback(found.close)
        yield found


@pytest.fixture
def client(target: Target) -> Client:
    opened = target.client()
    opened.create_topic(TOPIC)
    return opened


def exclusive(client: Client, name: str, epoch: int | None = None) -> Producer:
    return client.producer(TOPIC, idempotent=False, access="exclusive", name=name, epoch=epoch)


def log(client: Client, topic: str = TOPIC) -> list[tuple[str, int]]:
    """(value, epoch) of every record, in offset order (one partition)."""
    return [(present(r.value).decode(), r.epoch) for r in client.consume(topic)]


def waiting_count(count: int) -> Callable[[AccessView], bool]:
    return lambda view: len(view.waiting) == count


def records(client: Client, topic: str = TOPIC) -> list[Record]:
    return list(client.consume(topic))


def refused(code: ErrorCode, call: Callable[[], object]) -> BrokerError:
    """The BrokerError call() raises, which must have this code."""
    with pytest.raises(BrokerError) as caught:
        call()
    assert caught.value.code is code, caught.value
    return caught.value


# holding a topic ------------------------------------------------------------------------


def test_an_exclusive_producer_gets_a_new_epoch_and_its_records_carry_it(
    target: Target, client: Client
) -> None:
    assert access_view(client, TOPIC) == FREE
    leader = client.producer(TOPIC, access="exclusive", name="leader")  # idempotent too
    assert leader.epoch == 1
    assert access_view(client, TOPIC) == AccessView("exclusive", 1, "leader", (), ())
    leader.send(["a", "b"], partition=0)
    assert log(client) == [("a", 1), ("b", 1)]
    leader.close()
    assert access_view(client, TOPIC) == AccessView("free", 1, None, (), ())


def test_shared_is_refused_while_an_exclusive_producer_is_attached(
    target: Target, client: Client
) -> None:
    leader = exclusive(client, "leader")
    other = target.client()
    error = refused(ErrorCode.PRODUCER_BUSY, lambda: other.producer(TOPIC, access="shared"))
    assert "leader" in error.message
    # A plain write is refused too: nothing but the leader reaches the topic.
    refused(ErrorCode.PRODUCER_BUSY, lambda: other.produce(TOPIC, ["plain"]))
    leader.send(["mine"])
    assert log(client) == [("mine", 1)]
    assert access_view(client, TOPIC) == AccessView("exclusive", 1, "leader", (), ())


def test_exclusive_is_refused_while_shared_producers_are_attached(
    target: Target, client: Client
) -> None:
    first = client.producer(TOPIC, idempotent=False, access="shared", name="s1")
    second = target.client().producer(TOPIC, idempotent=False, access="shared", name="s2")
    assert (first.epoch, second.epoch) == (0, 0)
    other = target.client()
    refused(ErrorCode.PRODUCER_BUSY, lambda: exclusive(other, "x"))
    assert Waiter(other, TOPIC, "w", wait_timeout_s=0).refused().code is ErrorCode.WAIT_TIMEOUT
    assert access_view(client, TOPIC) == AccessView("shared", 0, None, ("s1", "s2"), ())
    first.send(["s1:0"])
    second.send(["s2:0"])
    first.close()
    refused(ErrorCode.PRODUCER_BUSY, lambda: exclusive(other, "x"))
    second.close()
    assert exclusive(other, "x").epoch == 1
    assert log(client) == [("s1:0", 0), ("s2:0", 0)]


def test_exclusive_is_refused_while_another_exclusive_producer_is_attached(
    target: Target, client: Client
) -> None:
    exclusive(client, "leader")
    refused(ErrorCode.PRODUCER_BUSY, lambda: exclusive(target.client(), "rival"))
    refused(ErrorCode.PRODUCER_BUSY, lambda: exclusive(client, "same-client"))
    assert access_view(client, TOPIC) == AccessView("exclusive", 1, "leader", (), ())


# waiting for exclusivity ----------------------------------------------------------------


@pytest.mark.parametrize("holders", ["exclusive", "shared"])
def test_wait_exclusive_blocks_until_the_last_holder_closes(
    target: Target, client: Client, holders: str
) -> None:
    held = [
        target.client().producer(TOPIC, idempotent=False, access=holders, name=f"h{n}")
        for n in range(1 if holders == "exclusive" else 2)
    ]
    epoch = access_view(client, TOPIC).epoch
    waiter = Waiter(target.client(), TOPIC, "next")
    view = wait_for_access(client, TOPIC, lambda v: v.waiting == ("next",), "next waits")
    assert view.epoch == epoch  # waiting changes nothing
    for producer in held:
        assert not waiter.done
        producer.close()
    promoted = waiter.promoted()
    assert promoted.epoch == epoch + 1
    assert access_view(client, TOPIC) == AccessView("exclusive", epoch + 1, "next", (), ())
    promoted.send(["next:0"])
    assert log(client) == [("next:0", epoch + 1)]


def test_waiters_are_promoted_in_the_order_they_came(target: Target, client: Client) -> None:
    holder = exclusive(client, "holder")
    names = ("w1", "w2", "w3")
    waiters = []
    for count, name in enumerate(names, 1):
        waiters.append(Waiter(target.client(), TOPIC, name))
        wait_for_access(client, TOPIC, waiting_count(count), f"{name} waits")
    assert access_view(client, TOPIC).waiting == names
    leaving: Producer = holder
    for position, waiter in enumerate(waiters):
        assert not waiter.done
        leaving.close()
        leaving = waiter.promoted()
        assert leaving.epoch == 2 + position
        assert access_view(client, TOPIC) == AccessView(
            "exclusive", 2 + position, waiter.name, (), names[position + 1 :]
        )
        leaving.send([f"{waiter.name}:0"])
    assert log(client) == [("w1:0", 2), ("w2:0", 3), ("w3:0", 4)]


def test_a_waiter_that_times_out_leaves_the_queue(target: Target, client: Client) -> None:
    holder = exclusive(client, "holder")
    impatient = Waiter(target.client(), TOPIC, "impatient", wait_timeout_s=0.5)
    wait_for_access(client, TOPIC, lambda v: "impatient" in v.waiting, "impatient waits")
    patient = Waiter(target.client(), TOPIC, "patient")
    error = impatient.refused()
    assert error.code is ErrorCode.WAIT_TIMEOUT
    assert TOPIC in error.message
    view = wait_for_access(client, TOPIC, lambda v: v.waiting == ("patient",), "one waiter")
    assert view == AccessView("exclusive", 1, "holder", (), ("patient",))
    holder.close()
    assert patient.promoted().epoch == 2


def test_wait_exclusive_with_no_time_to_wait_times_out_at_once_on_a_held_topic(
    target: Target, client: Client
) -> None:
    exclusive(client, "holder")
    error = Waiter(target.client(), TOPIC, "w", wait_timeout_s=0).refused()
    assert error.code is ErrorCode.WAIT_TIMEOUT
    assert access_view(client, TOPIC).waiting == ()


def test_wait_exclusive_on_a_free_topic_is_granted_at_once(target: Target, client: Client) -> None:
    producer = Waiter(client, TOPIC, "first", wait_timeout_s=0).promoted()
    assert producer.epoch == 1


# epochs ---------------------------------------------------------------------------------


def test_the_previous_exclusive_producer_coming_back_with_the_current_epoch_keeps_it(
    target: Target, client: Client
) -> None:
    first = exclusive(client, "a")
    first.send(["a:0"])
    first.close()
    again = exclusive(target.client(), "a", epoch=1)
    assert again.epoch == 1
    again.send(["a:1"])
    again.close()
    assert access_view(client, TOPIC).epoch == 1
    assert log(client) == [("a:0", 1), ("a:1", 1)]


def test_a_new_exclusive_producer_bumps_the_epoch_and_fences_the_old_epoch_for_good(
    target: Target, client: Client
) -> None:
    exclusive(client, "a").close()
    assert exclusive(client, "a").epoch == 2  # the same name without its epoch: new
    client.close()
    other = target.client()
    bumped = exclusive(other, "b", epoch=2)  # another name with the current epoch: new
    assert bumped.epoch == 3
    bumped.close()
    for access in ("exclusive", "wait-exclusive", "shared"):
        with pytest.raises(BrokerError) as caught:
            other.producer(TOPIC, access=access, name="a", epoch=2)
        assert caught.value.code is ErrorCode.PRODUCER_FENCED
        assert (caught.value.details["epoch"], caught.value.details["topic_epoch"]) == (2, 3)
    assert access_view(other, TOPIC) == AccessView("free", 3, None, (), ())


def test_records_carry_the_epoch_they_were_written_under(target: Target, client: Client) -> None:
    client.produce(TOPIC, ["plain:0"])
    with exclusive(client, "a") as a:
        a.send(["a:0", "a:1"])
    with client.producer(TOPIC, idempotent=False, access="shared", name="s") as shared:
        shared.send(["s:0"])
    with exclusive(target.client(), "b") as b:
        b.send(["b:0"])
    client.produce(TOPIC, ["plain:1"])
    assert log(client) == [
        ("plain:0", 0),
        ("a:0", 1),
        ("a:1", 1),
        ("s:0", 1),
        ("b:0", 2),
        ("plain:1", 2),
    ]


# losing access: close, disconnect, missed heartbeats, and fencing -----------------------


def test_closing_the_client_detaches_its_producer_and_promotes_the_waiter(
    target: Target, client: Client
) -> None:
    holder_client = target.client()
    exclusive(holder_client, "holder").send(["holder:0"])
    waiter = Waiter(target.client(), TOPIC, "next")
    wait_for_access(client, TOPIC, lambda v: v.waiting == ("next",), "next waits")
    holder_client.close()  # the producer itself is never closed
    assert waiter.promoted().epoch == 2


def test_a_producer_that_lost_its_session_to_a_waiter_is_fenced_on_every_later_send(
    target: Target, client: Client
) -> None:
    clock = LaggingClock()
    a = exclusive(target.client(clock), "A")
    a.send(["A:0"])
    waiter = Waiter(target.client(), TOPIC, "B")
    wait_for_access(client, TOPIC, lambda v: v.waiting == ("B",), "B waits")
    target.end_session(a, clock, client)
    b = waiter.promoted()
    assert b.epoch == 2
    b.send(["B:0"])
    with pytest.raises(ProducerFenced):
        a.send(["A:1"])
    with pytest.raises(ProducerFenced):  # for good, whatever happens next
        a.send(["A:2"])
    b.send(["B:1"])
    assert log(client) == [("A:0", 1), ("B:0", 2), ("B:1", 2)]
    a.close()
    assert access_view(client, TOPIC) == AccessView("exclusive", 2, "B", (), ())


def test_a_producer_that_lost_its_session_to_a_new_exclusive_producer_is_fenced(
    target: Target, client: Client
) -> None:
    clock = LaggingClock()
    a = exclusive(target.client(clock), "A")
    a.send(["A:0"])
    target.end_session(a, clock, client)
    b = exclusive(target.client(), "B")
    assert b.epoch == 2
    b.send(["B:0"])
    with pytest.raises(ProducerFenced):
        a.send(["A:1"])
    b.send(["B:1"])
    found = records(client)
    assert_never_interleaved(found)
    assert [r.value for r in found] == [b"A:0", b"B:0", b"B:1"]


def test_closing_a_producer_that_already_lost_its_access_leaves_the_new_holder_alone(
    target: Target, client: Client
) -> None:
    clock = LaggingClock()
    a = exclusive(target.client(clock), "A")
    target.end_session(a, clock, client)
    b = exclusive(target.client(), "B")
    a.close()  # A never learned it lost the topic: it gives up what it thinks it holds
    assert access_view(client, TOPIC) == AccessView("exclusive", 2, "B", (), ())
    b.send(["B:0"])
    assert log(client) == [("B:0", 2)]


def test_a_served_session_that_misses_its_heartbeats_loses_exclusive_access(
    data_dir: Path,
) -> None:
    limits = msgspec.structs.replace(DEFAULT_LIMITS, session_timeout_ms=600)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        client.create_topic(TOPIC)
        with RawSession(server.address) as silent:
            silent.hello()
            attach = {"topic": TOPIC, "access": "exclusive", "name": "silent", "wait_ms": 0}
            reply = silent.request(Op.ATTACH, attach)
            assert isinstance(reply, Reply) and reply.result["epoch"] == 1, reply
            waiter = Waiter(client, TOPIC, "next")
            # The silent session sends nothing more: the server ends it, the waiter goes.
            assert waiter.promoted().epoch == 2
            silent.until_closed()


def test_a_served_waiter_that_disconnects_leaves_the_queue(data_dir: Path) -> None:
    """Its connection closes while its wait (60 s here) is far from over: it is detached
    then, not when the wait ends, and the next waiter is the one promoted."""
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic(TOPIC)
        holder = exclusive(client, "holder")
        with RawSession(server.address) as gone:
            gone.hello()
            args = {"topic": TOPIC, "access": "wait-exclusive", "name": "gone", "wait_ms": 60_000}
            gone.sock.sendall(gone.frames.send(Request(99, Op.ATTACH, args)))  # no reply yet
            wait_for_access(client, TOPIC, lambda v: v.waiting == ("gone",), "gone waits")
        waiter = Waiter(connect(server.address), TOPIC, "next")
        try:
            wait_for_access(
                client, TOPIC, lambda v: v.waiting == ("next",), "only next waits", timeout_s=5
            )
            holder.close()
            assert waiter.promoted().epoch == 2
        finally:
            holder.close()  # closing twice is harmless
            waiter.join()
            waiter.client.close()


# the compacted read ---------------------------------------------------------------------


def test_the_compacted_read_gives_the_newest_record_of_every_key_in_offset_order(
    target: Target,
) -> None:
    client = target.client()
    client.create_topic("state", partitions=2)
    assert client.read_compacted("state") == []
    writes = [("k1", "a", 0), ("k2", "b", 0), ("k1", "c", 0), (None, "d", 0), ("k3", "e", 0)]
    writes += [("k2", "f", 0), ("k1", "x", 1), (None, "y", 1)]
    client.produce(
        "state",
        [NewRecord(v.encode(), None if k is None else k.encode(), (), p) for k, v, p in writes],
    )
    latest = [(r.partition, r.offset, r.key, r.value) for r in client.read_compacted("state")]
    assert latest == [
        (0, 2, b"k1", b"c"),
        (0, 4, b"k3", b"e"),
        (0, 5, b"k2", b"f"),
        (1, 0, b"k1", b"x"),
    ]
    assert [r.value for r in client.read_compacted("state", 1)] == [b"x"]
    refused(ErrorCode.UNKNOWN_PARTITION, lambda: client.read_compacted("state", 2))


def test_the_compacted_read_keeps_each_records_epoch(target: Target, client: Client) -> None:
    with exclusive(client, "a") as a:
        a.send(["1", "2"], key="k")
    with exclusive(client, "b") as b:
        b.send(["3"], key="j")
    assert [(r.key, r.value, r.epoch) for r in client.read_compacted(TOPIC)] == [
        (b"k", b"2", 1),
        (b"j", b"3", 2),
    ]


# bad input ------------------------------------------------------------------------------


def test_bad_input_is_refused_with_a_clear_error_and_attaches_nothing(
    target: Target, client: Client
) -> None:
    error = refused(ErrorCode.INVALID_ARGUMENT, lambda: client.producer(TOPIC, access="owner"))
    assert "'owner'" in error.message
    refused(
        ErrorCode.INVALID_ARGUMENT,
        lambda: client.producer(TOPIC, access="wait-exclusive", wait_timeout_s=-1),
    )
    refused(
        ErrorCode.INVALID_ARGUMENT, lambda: client.producer(TOPIC, access="exclusive", epoch=-1)
    )
    refused(ErrorCode.INVALID_NAME, lambda: client.producer(TOPIC, access="shared", name="a\nb"))
    error = refused(ErrorCode.UNKNOWN_TOPIC, lambda: client.producer("nope", access="exclusive"))
    assert "nope" in error.message
    refused(ErrorCode.UNKNOWN_TOPIC, lambda: client.topic_access("nope"))
    refused(ErrorCode.UNKNOWN_TOPIC, lambda: client.read_compacted("nope", 0))
    assert access_view(client, TOPIC) == FREE


def test_the_topic_epoch_survives_a_restart(data_dir: Path) -> None:
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC)
        exclusive(client, "a").send(["a:0"])
    with connect(data_dir, durability="normal") as client:
        assert access_view(client, TOPIC) == AccessView("free", 1, None, (), ())
        refused(ErrorCode.PRODUCER_FENCED, lambda: exclusive(client, "a", epoch=0))
        assert exclusive(client, "b").epoch == 2


# the engine against a reference model -----------------------------------------------------


@dataclasses.dataclass
class Modelled:
    """One attachment as the rules say it should be."""

    handle: int  # the test's own number for it, never reused
    session: str
    name: str
    mode: Mode
    previous_epoch: int | None


@dataclasses.dataclass(frozen=True)
class Handle:
    handle: int
    attachment_id: int


class ExclusiveModel(RuleBasedStateMachine):
    """Random attaches, detaches, session ends and writes against the engine, each checked
    against DESIGN.md section 5 written out plainly: who holds the topic, at which epoch,
    who waits in which order, and which writes go in with which epoch."""

    sessions = Bundle("sessions")
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.now_ms = 1_700_000_000_000
        self.directory = Path(tempfile.mkdtemp(prefix="fencelog-model-"))
        self.engine = broker.Engine.open(
            self.directory / "data", durability="normal", clock=lambda: self.now_ms
        )
        self.engine.create_topic(TOPIC)
        self.live_sessions: set[str] = set()
        self.attached: list[Modelled] = []
        self.epoch = 0
        self.last_exclusive: str | None = None
        self.next_handle = 0
        self.written = 0

    def teardown(self) -> None:
        self.engine.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # the rules, plainly ------------------------------------------------------------------

    def others_hold(self) -> bool:
        return any(a.mode is not Mode.WAITING for a in self.attached)

    def grant(self, name: str, previous_epoch: int | None) -> int:
        if not (previous_epoch == self.epoch and name == self.last_exclusive):
            self.epoch += 1
        self.last_exclusive = name
        return self.epoch

    def promote(self) -> None:
        waiting = [a for a in self.attached if a.mode is Mode.WAITING]
        if waiting and not self.others_hold():
            first = waiting[0]
            self.grant(first.name, first.previous_epoch)
            first.mode = Mode.EXCLUSIVE

    def expected_attach(self, access: Access, name: str, previous: int | None) -> Mode | ErrorCode:
        if previous is not None and previous < self.epoch:
            return ErrorCode.PRODUCER_FENCED
        holder = any(a.mode is Mode.EXCLUSIVE for a in self.attached)
        if access is Access.SHARED:
            return ErrorCode.PRODUCER_BUSY if holder else Mode.SHARED
        if self.others_hold() or (access is Access.WAIT_EXCLUSIVE and self.attached):
            return ErrorCode.PRODUCER_BUSY if access is Access.EXCLUSIVE else Mode.WAITING
        return Mode.EXCLUSIVE

    # steps -------------------------------------------------------------------------------

    @rule(target=sessions)
    def new_session(self) -> str:
        session = self.engine.owners.register_process()
        self.live_sessions.add(session)
        return session

    @rule(
        target=handles,
        session=sessions,
        access=st.sampled_from(list(Access)),
        name=st.sampled_from(["a", "b", "c"]),
        epoch=st.sampled_from(["none", "current", "older", "newer"]),
    )
    def attach(self, session: str, access: Access, name: str, epoch: str) -> Handle | None:
        if session not in self.live_sessions:
            return None
        previous = {"none": None, "current": self.epoch, "older": self.epoch - 1}.get(
            epoch, self.epoch + 1
        )
        if previous is not None and previous < 0:
            return None
        expected = self.expected_attach(access, name, previous)
        try:
            found = self.engine.attach_producer(TOPIC, session, access, name, previous)
        except BrokerError as error:
            assert error.code is expected, (error, expected)
            return None
        assert found.mode is expected, (found, expected)
        self.next_handle += 1
        modelled = Modelled(self.next_handle, session, name, found.mode, previous)
        if found.mode is Mode.EXCLUSIVE:
            assert found.epoch == self.grant(name, previous), (found, self.epoch)
        elif found.mode is Mode.SHARED:
            assert found.epoch == self.epoch
        self.attached.append(modelled)
        return Handle(self.next_handle, found.attachment_id)

    @rule(handle=handles)
    def detach(self, handle: Handle | None) -> None:
        if handle is None:
            return
        self.engine.detach_producer(handle.attachment_id)
        self.attached = [a for a in self.attached if a.handle != handle.handle]
        self.promote()

    @rule(session=consumes(sessions))
    def close_session(self, session: str) -> None:
        self.engine.session_closed(session)
        self.end(session)

    @rule(session=consumes(sessions))
    def miss_heartbeats(self, session: str) -> None:
        """Time passes; every other live session heartbeats, this one does not."""
        self.now_ms += DEFAULT_LIMITS.session_timeout_ms + 1
        for other in self.live_sessions - {session}:
            self.engine.owners.heartbeat(other)
        self.end(session)
        self.engine.topic_access(TOPIC)  # the next look at the topic notices

    def end(self, session: str) -> None:
        self.live_sessions.discard(session)
        self.attached = [a for a in self.attached if a.session != session]
        self.promote()

    @rule(handle=st.one_of(st.none(), handles))
    def write(self, handle: Handle | None) -> None:
        expected = self.expected_write(handle)
        attachment = None if handle is None else handle.attachment_id
        try:
            [result] = self.engine.produce(
                TOPIC, [NewRecord(f"{self.written}".encode())], attachment=attachment
            )
        except BrokerError as error:
            assert error.code is expected, (error, expected, handle, self.attached)
            return
        assert expected is None, (expected, handle, self.attached)
        [record] = self.engine.read(TOPIC, 0, result.offset, 1)
        assert record.epoch == self.epoch
        self.written += 1

    def expected_write(self, handle: Handle | None) -> ErrorCode | None:
        mine = [a for a in self.attached if handle is not None and a.handle == handle.handle]
        if handle is not None and not mine:
            return ErrorCode.PRODUCER_FENCED  # detached: gone for good
        if mine and mine[0].mode is Mode.EXCLUSIVE:
            return None
        if mine and mine[0].mode is Mode.WAITING:
            return ErrorCode.PRODUCER_BUSY
        held = any(a.mode is Mode.EXCLUSIVE for a in self.attached)
        return ErrorCode.PRODUCER_BUSY if held else None

    @invariant()
    def the_broker_shows_what_the_rules_say(self) -> None:
        info = self.engine.topic_access(TOPIC)
        holder = [a.name for a in self.attached if a.mode is Mode.EXCLUSIVE]
        assert info.epoch == self.epoch
        assert ([] if info.exclusive is None else [info.exclusive.name]) == holder
        assert [a.name for a in info.shared] == [
            a.name for a in self.attached if a.mode is Mode.SHARED
        ]
        assert [a.name for a in info.waiting] == [
            a.name for a in self.attached if a.mode is Mode.WAITING
        ]

    @invariant()
    def epochs_never_go_down_in_the_log(self) -> None:
        epochs = [r.epoch for r in self.engine.read(TOPIC, 0, 0, 10_000)]
        assert epochs == sorted(epochs)


TestExclusiveModel = ExclusiveModel.TestCase
# The same examples every run (derandomize, no example database), and no shrinking: a
# failure is reported as found, since shrinking these runs takes minutes.
TestExclusiveModel.settings = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
