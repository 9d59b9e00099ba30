"""Ownership end to end through broker.client, embedded and served.

Embedded: two clients in one process are two sessions; a session is live while its
process exists, is not severed, and heartbeats. Served: a session is a connection to a
real `fencelog serve`; severing closes it. Both: the rules of DESIGN.md section 3, the
whole-request atomicity, fences checked at the log, and the audit log.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.protocol.messages import Op, Push, Reply
from broker.types import Fence
from support.owning import (
    RawSession,
    broker_target,
    ownership_rows,
    python_process,
    resumed_and_killed,
    serving,
)
from support.waiting import wait_until

SEVERED_WITHIN_S = 5.0  # embedded: the next heartbeat (1 s); served: at once


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[str]:
    with broker_target(request.param, data_dir) as found:
        yield found


class Sessions:
    """Opens clients (sessions) on the test's broker; every one still open is closed at
    teardown."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.opened: list[Client] = []

    def open(self) -> Client:
        client = connect(self.target, durability="normal")
        self.opened.append(client)
        return client

    def close(self, client: Client) -> None:
        self.opened.remove(client)
        client.close()

    def close_and_wait(self, client: Client, observer: Client) -> None:
        """Close client, then wait until observer sees its session hold nothing (served,
        the broker ends a session just after answering the client's goodbye)."""
        session_id = client.session_id
        self.close(client)
        wait_until(
            lambda: all(row[3] != session_id for row in ownership_rows(observer)),
            10,
            message=f"the closed session {session_id} holds nothing",
        )

    def close_all(self) -> None:
        while self.opened:
            self.opened.pop().close()


@pytest.fixture
def sessions(target: str) -> Iterator[Sessions]:
    opened = Sessions(target)
    try:
        yield opened
    finally:
        opened.close_all()


@pytest.fixture
def a(sessions: Sessions) -> Client:
    return sessions.open()


@pytest.fixture
def b(sessions: Sessions) -> Client:
    return sessions.open()


def refused(call: Callable[[], object], code: ErrorCode) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        call()
    assert caught.value.code is code, caught.value
    return caught.value


def severed_signal(client: Client) -> threading.Event:
    told = threading.Event()
    client.on_severed(lambda _reason: told.set())
    return told


def fence(group: str, resource: str, generation: int) -> Fence:
    return Fence(group, resource, generation)


def audit(client: Client, group: str | None = None) -> list[tuple[str, str, str | None, int]]:
    """The audit log oldest first: (resource, event, session, generation)."""
    rows = reversed(client.ownership_history(group))
    return [(r.resource, r.event, r.session_id, r.generation) for r in rows]


# the rules ------------------------------------------------------------------------------


def test_a_never_owned_resource_claimed_with_generation_one_gets_one(a: Client) -> None:
    [claimed] = a.own("workers", ["orders/0"])
    assert (claimed.resource, claimed.generation) == ("orders/0", 1)
    assert ownership_rows(a) == [("workers", "orders/0", 1, a.session_id, True)]


def test_a_live_holder_with_a_higher_generation_refuses_the_claim(a: Client, b: Client) -> None:
    a.create_topic("orders")
    [held] = a.own("workers", ["orders/0"], generation=5)
    before = ownership_rows(a)
    error = refused(
        lambda: b.own("workers", ["orders/0"], generation=4), ErrorCode.OWNED_BY_HIGHER_GENERATION
    )
    assert error.details["generation"] == 5
    assert ownership_rows(a) == before
    a.produce("orders", [b"still mine"], fences=[held.fence])


def test_a_claim_at_the_holders_generation_severs_it_and_takes_the_next(
    a: Client, b: Client
) -> None:
    told = severed_signal(a)
    a.own("workers", ["orders/0", "orders/1"], generation=3)
    [taken] = b.own("workers", ["orders/0"], generation=3)
    assert taken.generation == 4
    assert told.wait(SEVERED_WITHIN_S), "the old holder was not told it was severed"
    # Severing releases everything the old session held, not only what was claimed.
    assert ownership_rows(b) == [
        ("workers", "orders/0", 4, b.session_id, True),
        ("workers", "orders/1", 3, None, False),
    ]


def test_a_claim_above_the_holders_generation_takes_the_claimed_generation(
    a: Client, b: Client
) -> None:
    told = severed_signal(a)
    a.own("workers", ["orders/0"], generation=3)
    [taken] = b.own("workers", ["orders/0"], generation=10)
    assert taken.generation == 10
    assert told.wait(SEVERED_WITHIN_S)


def test_the_holder_claiming_again_at_or_below_its_generation_changes_nothing(
    a: Client,
) -> None:
    a.create_topic("orders")
    a.own("workers", ["orders/0"], generation=5)
    before = ownership_rows(a)
    [again] = a.own("workers", ["orders/0"], generation=2)
    assert again.generation == 5
    assert ownership_rows(a) == before
    a.produce("orders", [b"x"], fences=[fence("workers", "orders/0", 5)])
    assert audit(a)[-1] == ("orders/0", "unchanged", a.session_id, 5)


def test_generation_zero_always_wins_resets_to_one_and_severs(a: Client, b: Client) -> None:
    a.create_topic("orders")
    told = severed_signal(a)
    [old] = a.own("workers", ["orders/0"], generation=7)
    [reset] = b.own("workers", ["orders/0"], generation=0)
    assert reset.generation == 1
    assert told.wait(SEVERED_WITHIN_S)
    assert ownership_rows(b) == [("workers", "orders/0", 1, b.session_id, True)]
    refused(lambda: a.produce("orders", [b"zombie"], fences=[old.fence]), ErrorCode.FENCED)
    b.produce("orders", [b"new owner"], fences=[reset.fence])


def test_a_released_higher_generation_does_not_refuse(sessions: Sessions, b: Client) -> None:
    gone = sessions.open()
    gone.own("workers", ["orders/0"], generation=9)
    sessions.close_and_wait(gone, b)
    [claimed] = b.own("workers", ["orders/0"], generation=2)
    assert claimed.generation == 10


# whole-request atomicity ---------------------------------------------------------------


def test_a_refused_multi_resource_claim_changes_nothing(
    sessions: Sessions, a: Client, b: Client
) -> None:
    a.create_topic("orders", partitions=4)
    [low] = a.own("workers", ["orders/0"], generation=1)  # would be severed if granted
    high = sessions.open()
    high.own("workers", ["orders/1"], generation=9)  # refuses the claim
    gone = sessions.open()
    gone.own("workers", ["orders/3"], generation=4)
    sessions.close_and_wait(gone, a)
    before = ownership_rows(a)
    told = severed_signal(a)
    error = refused(
        lambda: b.own("workers", {"orders/0": 3, "orders/1": 3, "orders/2": 3, "orders/3": 3}),
        ErrorCode.OWNED_BY_HIGHER_GENERATION,
    )
    assert list(error.details["refused"]) == ["orders/1"]
    assert ownership_rows(a) == before
    assert not told.wait(0.5 if "://" in b.target else 1.5)  # a heartbeat has run
    a.produce("orders", [b"still mine"], partition=0, fences=[low.fence])


# fences at the log -----------------------------------------------------------------------


def test_a_stale_fence_is_fenced_and_nothing_is_appended(a: Client, b: Client) -> None:
    a.create_topic("orders", partitions=2)
    [old] = a.own("workers", ["orders/0"])
    a.produce("orders", [b"a0"], partition=0, fences=[old.fence])
    told = severed_signal(a)
    [new] = b.own("workers", ["orders/0"], generation=old.generation)
    # Served, a request racing the severing push fails SEVERED instead; once a knows, its
    # next request goes on a new session and meets the fence at the log.
    assert told.wait(SEVERED_WITHIN_S)
    error = refused(
        lambda: a.produce("orders", [b"late", b"later"], partition=1, fences=[old.fence]),
        ErrorCode.FENCED,
    )
    assert error.details["generation"] == new.generation
    assert b.end_offsets("orders") == [1, 0]
    b.produce("orders", [b"b0"], partition=0, fences=[new.fence])
    assert [r.value for r in b.consume("orders")] == [b"a0", b"b0"]


def test_one_stale_fence_among_several_fails_the_whole_append(a: Client, b: Client) -> None:
    a.create_topic("orders")
    [mine] = a.own("workers", ["orders/0"])
    [other] = b.own("readers", ["orders/0"], generation=2)
    stale = fence("readers", "orders/0", 1)
    refused(lambda: a.produce("orders", [b"x"], fences=[mine.fence, stale]), ErrorCode.FENCED)
    assert a.end_offsets("orders") == [0]
    a.produce("orders", [b"x"], fences=[mine.fence, other.fence])
    assert a.end_offsets("orders") == [1]


def test_a_fence_of_a_released_claim_is_fenced(a: Client) -> None:
    a.create_topic("orders")
    [claimed] = a.own("workers", ["orders/0"], generation=4)
    assert a.release("workers", ["orders/0"]) == ["orders/0"]
    assert ownership_rows(a) == [("workers", "orders/0", 4, None, False)]
    refused(lambda: a.produce("orders", [b"x"], fences=[claimed.fence]), ErrorCode.FENCED)
    assert a.end_offsets("orders") == [0]


def test_a_fence_of_a_never_owned_resource_is_fenced(a: Client) -> None:
    a.create_topic("orders")
    for generation in (0, 1):
        refused(
            partial(a.produce, "orders", [b"x"], fences=[fence("w", "orders/0", generation)]),
            ErrorCode.FENCED,
        )
    assert a.end_offsets("orders") == [0]


def test_an_owner_group_topic_needs_the_fence_of_its_partition(a: Client) -> None:
    a.create_topic("journal", partitions=2, owner_group="samza")
    assert a.describe_topic("journal").owner_group == "samza"
    [p0] = a.own("samza", ["journal/0"], generation=5)
    [elsewhere] = a.own("other", ["journal/0"])
    for fences, partition in (
        ([], 0),  # no fence
        ([p0.fence], 1),  # the fence of another partition
        ([elsewhere.fence], 0),  # the right resource in another group
        ([fence("samza", "journal/0", 4)], 0),  # a stale generation
    ):
        refused(
            partial(a.produce, "journal", [b"x"], partition=partition, fences=fences),
            ErrorCode.FENCED,
        )
    assert a.end_offsets("journal") == [0, 0]
    a.produce("journal", [b"x"], partition=0, fences=[p0.fence])
    # A batch over both partitions needs both fences, and is all or nothing.
    both = [b"k0", b"k1", b"k2", b"k3"]
    refused(lambda: a.produce("journal", both, fences=[p0.fence]), ErrorCode.FENCED)
    assert a.end_offsets("journal") == [1, 0]
    [p1] = a.own("samza", ["journal/1"])
    a.produce("journal", both, fences=[p0.fence, p1.fence])
    assert sum(a.end_offsets("journal")) == 5


def test_fetch_with_a_stale_fence_is_fenced(a: Client, b: Client) -> None:
    a.create_topic("orders")
    a.produce("orders", [b"r0", b"r1"])
    [old] = a.own("readers", ["orders/0"])
    assert [r.value for r in a.fetch("orders", {0: 0}, fences=[old.fence])] == [b"r0", b"r1"]
    [new] = b.own("readers", ["orders/0"], generation=2)
    refused(lambda: a.fetch("orders", {0: 0}, fences=[old.fence]), ErrorCode.FENCED)
    refused(lambda: list(a.consume("orders", fences=[old.fence])), ErrorCode.FENCED)
    assert [r.value for r in b.consume("orders", fences=[new.fence])] == [b"r0", b"r1"]


def test_consume_with_a_stale_fence_is_fenced_even_with_nothing_to_read(
    a: Client, b: Client
) -> None:
    """A zombie reader must learn it lost the partition, not read 'nothing new'."""
    a.create_topic("orders")
    [old] = a.own("readers", ["orders/0"])
    b.own("readers", ["orders/0"], generation=2)
    refused(lambda: list(a.consume("orders", fences=[old.fence])), ErrorCode.FENCED)
    refused(lambda: list(a.consume("orders", start="end", fences=[old.fence])), ErrorCode.FENCED)


# severing --------------------------------------------------------------------------------


def test_the_severed_client_is_told_why(a: Client, b: Client) -> None:
    reasons: list[str] = []
    told = threading.Event()

    def on_severed(reason: str) -> None:
        reasons.append(reason)
        told.set()

    a.on_severed(on_severed)
    a.own("workers", ["orders/0"])
    b.own("workers", ["orders/0"], generation=2)
    assert told.wait(SEVERED_WITHIN_S)
    assert reasons and "severed" in reasons[0]


def test_an_operator_release_severs_a_live_holder_and_keeps_the_generation(
    a: Client, b: Client
) -> None:
    a.create_topic("orders")
    told = severed_signal(a)
    held, _ = a.own("workers", ["orders/0", "orders/1"], generation=6)
    assert b.release("workers", ["orders/0"], any_holder=True) == ["orders/0"]
    assert told.wait(SEVERED_WITHIN_S)
    assert ownership_rows(b) == [
        ("workers", "orders/0", 6, None, False),
        ("workers", "orders/1", 6, None, False),
    ]
    refused(lambda: a.produce("orders", [b"x"], fences=[held.fence]), ErrorCode.FENCED)
    [next_owner] = b.own("workers", ["orders/0"])
    assert next_owner.generation == 7


def test_release_without_any_holder_cannot_take_another_sessions_claim(
    a: Client, b: Client
) -> None:
    a.own("workers", ["orders/0"])
    before = ownership_rows(a)
    refused(lambda: b.release("workers", ["orders/0"]), ErrorCode.NOT_HELD)
    refused(lambda: b.release("workers"), ErrorCode.NOT_HELD)
    assert ownership_rows(a) == before


def test_an_embedded_severed_client_cannot_claim_again(data_dir: Path) -> None:
    """Severed is final for an embedded session, even before its heartbeat notices: a
    claim by it is refused and severs no one (a new client is a new session)."""
    with connect(data_dir) as old, connect(data_dir) as new, connect(data_dir) as third:
        [kept] = third.own("workers", ["orders/1"])
        old.own("workers", ["orders/0"])
        new.own("workers", ["orders/0"], generation=2)
        before = ownership_rows(new)
        refused(lambda: old.own("workers", ["orders/1"], generation=5), ErrorCode.SEVERED)
        assert ownership_rows(new) == before
        third.create_topic("orders", partitions=2)
        third.produce("orders", [b"x"], partition=1, fences=[kept.fence])


def test_an_embedded_severed_client_learns_it_at_its_next_heartbeat(data_dir: Path) -> None:
    with connect(data_dir) as old, connect(data_dir) as new:
        told = severed_signal(old)
        old.own("workers", ["orders/0"])
        new.own("workers", ["orders/0"], generation=2)
        assert told.wait(SEVERED_WITHIN_S)
        error = refused(lambda: old.own("workers", ["orders/1"]), ErrorCode.SEVERED)
        assert error.hint is not None and "new client" in error.hint
        assert ownership_rows(new) == [("workers", "orders/0", 2, new.session_id, True)]


def test_severing_closes_the_served_connection_after_saying_why(data_dir: Path) -> None:
    with serving(data_dir) as url, RawSession(url) as raw, connect(url) as newer:
        session_id = raw.hello()
        reply = raw.request(Op.OWN, {"group": "workers", "claims": [["orders/0", 1]]})
        assert isinstance(reply, Reply), reply
        newer.own("workers", ["orders/0"], generation=2)
        [push] = raw.until_closed()
        assert isinstance(push, Push) and push.event == "session_closed", push
        assert "severed" in str(push.data["reason"])
        rows = ownership_rows(newer)
        assert rows == [("workers", "orders/0", 2, newer.session_id, True)]
        assert session_id not in {row[3] for row in rows}


def test_a_severed_served_client_goes_on_with_a_new_session(data_dir: Path) -> None:
    with serving(data_dir) as url, connect(url) as old, connect(url) as new:
        told = severed_signal(old)
        first = old.session_id
        old.create_topic("orders")
        [stale] = old.own("workers", ["orders/0"])
        new.own("workers", ["orders/0"], generation=2)
        assert told.wait(SEVERED_WITHIN_S)
        refused(lambda: old.produce("orders", [b"x"], fences=[stale.fence]), ErrorCode.FENCED)
        assert old.session_id != first  # the old connection was closed


# sessions that end ----------------------------------------------------------------------

HOLDER = """
import sys, time
from broker.client.client import connect
client = connect(sys.argv[1], durability="normal")
[claimed] = client.own("workers", ["orders/0"], generation=int(sys.argv[2]))
print(claimed.generation, client.session_id, flush=True)
time.sleep(120)  # holds the claim until the test kills or pauses this process
"""


def test_a_claim_by_a_process_that_died_is_released(target: str, b: Client) -> None:
    with resumed_and_killed(python_process(HOLDER, target, "5")) as holder:
        generation, session_id = holder.line(20).split()
        assert generation == "5"
        assert ownership_rows(b) == [("workers", "orders/0", 5, session_id, True)]
        refused(
            lambda: b.own("workers", ["orders/0"], generation=2),
            ErrorCode.OWNED_BY_HIGHER_GENERATION,
        )
        holder.popen.send_signal(signal.SIGKILL)
        holder.popen.wait(timeout=30)
        wait_until(
            lambda: not any(row[4] for row in ownership_rows(b)),
            10,
            message="the dead process's claim is no longer live",
        )
        [claimed] = b.own("workers", ["orders/0"], generation=2)
        assert claimed.generation == 6


def test_a_dead_holders_claim_is_released_embedded_as_served(target: str, b: Client) -> None:
    """Issue 37 item 2: embedded, a holder that died without releasing stayed the holder
    (listed, not live), an operator's release severed it and said it released it, and
    the next claim audited a severing; served, the claim was released when the holder's
    connection ended. Both now answer as served: released, audited as its own release."""
    with resumed_and_killed(python_process(HOLDER, target, "5")) as holder:
        _, session_id = holder.line(20).split()
        holder.popen.send_signal(signal.SIGKILL)
        holder.popen.wait(timeout=30)
    wait_until(
        lambda: ownership_rows(b) == [("workers", "orders/0", 5, None, False)],
        10,
        message="the dead holder holds nothing",
    )
    refused(lambda: b.release("workers", ["orders/0"], any_holder=True), ErrorCode.NOT_HELD)
    [claimed] = b.own("workers", ["orders/0"], generation=2)
    assert claimed.generation == 6
    history = [(r.event, r.session_id, r.generation, r.other) for r in b.ownership_history()]
    assert history[::-1] == [
        ("claimed", session_id, 5, None),
        ("released", session_id, 5, None),
        ("claimed", b.session_id, 6, None),
    ]


def test_a_stopped_embedded_process_is_released_after_missing_heartbeats(
    data_dir: Path,
) -> None:
    impatient = replace(DEFAULT_LIMITS, session_timeout_ms=1_000)
    with (
        resumed_and_killed(python_process(HOLDER, str(data_dir), "5")) as holder,
        connect(data_dir) as patient,
        connect(data_dir, limits=impatient) as claimant,
    ):
        _, session_id = holder.line(20).split()
        holder.popen.send_signal(signal.SIGSTOP)
        # The process still exists: with the default 15 s timeout it is still live.
        refused(
            lambda: patient.own("workers", ["orders/0"], generation=2),
            ErrorCode.OWNED_BY_HIGHER_GENERATION,
        )
        wait_until(
            lambda: ownership_rows(claimant) == [("workers", "orders/0", 5, None, False)],
            10,
            message="a holder without heartbeats for session_timeout_ms is not live",
        )
        [claimed] = claimant.own("workers", ["orders/0"], generation=2)
        assert claimed.generation == 6
        assert holder.popen.poll() is None  # paused, not dead: liveness came from heartbeats
        # its claim was released as its own (a server would have closed its connection),
        # and it was severed: woken, it learns its claims are gone
        assert audit(claimant)[-2:] == [
            ("orders/0", "released", session_id, 5),
            ("orders/0", "claimed", claimant.session_id, 6),
        ]
        assert [s.severed for s in claimant.sessions() if s.session_id == session_id] == [True]


def test_an_embedded_heartbeat_outlasts_a_write_lock_held_past_the_busy_timeout(
    data_dir: Path,
) -> None:
    """Another process holds SQLite's write lock longer than the busy timeout: the
    heartbeats in that time are missed, and the ones after it keep the session live."""
    limits = replace(DEFAULT_LIMITS, busy_timeout_ms=100, session_timeout_ms=3_000)
    with connect(data_dir, limits=limits) as holder, connect(data_dir, limits=limits) as watcher:
        holder.own("workers", ["orders/0"])
        blocker = sqlite3.connect(data_dir / DB_FILE, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            # on purpose: a heartbeat (one a second) finds the lock held and gives up
            time.sleep(1.5)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # on purpose: the session timeout passes; the heartbeats since must keep it live
        time.sleep(limits.session_timeout_ms / 1000 + 0.5)
        assert ownership_rows(watcher) == [("workers", "orders/0", 1, holder.session_id, True)]


def test_closing_a_client_releases_its_claims_and_keeps_generations(
    sessions: Sessions, b: Client
) -> None:
    a = sessions.open()
    a.own("workers", ["orders/0", "orders/1"], generation=3)
    sessions.close_and_wait(a, b)
    assert ownership_rows(b) == [
        ("workers", "orders/0", 3, None, False),
        ("workers", "orders/1", 3, None, False),
    ]
    [claimed] = b.own("workers", ["orders/1"])
    assert claimed.generation == 4


# the audit log ----------------------------------------------------------------------------


def test_claims_refusals_severings_resets_and_releases_are_audited(
    sessions: Sessions,
) -> None:
    first, second, third = sessions.open(), sessions.open(), sessions.open()
    # Read before severing: a severed served client goes on with a new connection.
    s1, s2, s3 = first.session_id, second.session_id, third.session_id
    first.own("workers", ["orders/0"], generation=2)
    refused(lambda: second.own("workers", ["orders/0"]), ErrorCode.OWNED_BY_HIGHER_GENERATION)
    second.own("workers", ["orders/0"], generation=2)
    third.own("workers", ["orders/0"], generation=0)
    third.release("workers", ["orders/0"])
    assert audit(third) == [
        ("orders/0", "claimed", s1, 2),
        ("orders/0", "refused", s2, 2),
        ("orders/0", "severed", s1, 2),
        ("orders/0", "claimed", s2, 3),
        ("orders/0", "severed", s2, 3),
        ("orders/0", "reset", s3, 1),
        ("orders/0", "released", s3, 1),
    ]
    history = third.ownership_history()
    refusal = next(r for r in history if r.event == "refused")
    assert (refusal.requested, refusal.other) == (1, s1)
    reset = next(r for r in history if r.event == "reset")
    assert (reset.requested, reset.other) == (0, s2)
    assert [r.event for r in third.ownership_history(limit=2)] == ["released", "reset"]
    assert third.ownership_history("nosuch") == []


# bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "claims", "code"),
    [
        ("", {"orders/0": 1}, ErrorCode.INVALID_NAME),
        ("g" * 256, {"orders/0": 1}, ErrorCode.INVALID_NAME),
        ("workers", {"": 1}, ErrorCode.INVALID_NAME),
        ("workers", {"r" * 256: 1}, ErrorCode.INVALID_NAME),
        ("workers", {"orders/9": 1, "orders/0": -1}, ErrorCode.INVALID_ARGUMENT),
        ("workers", {}, ErrorCode.INVALID_ARGUMENT),
    ],
)
def test_a_bad_claim_is_rejected_and_changes_nothing(
    a: Client, b: Client, group: str, claims: dict[str, int], code: ErrorCode
) -> None:
    a.own("workers", ["orders/0"], generation=3)
    before, history = ownership_rows(b), audit(b)
    refused(lambda: b.own(group, claims), code)
    assert (ownership_rows(b), audit(b)) == (before, history)


def test_a_resource_named_twice_is_rejected_and_changes_nothing(a: Client) -> None:
    refused(lambda: a.own("workers", ["orders/0", "orders/0"]), ErrorCode.INVALID_ARGUMENT)
    assert (ownership_rows(a), audit(a)) == ([], [])


def test_release_in_an_unknown_group_or_of_an_unheld_resource(a: Client, b: Client) -> None:
    a.own("workers", ["orders/0"])
    a.release("workers", ["orders/0"])
    before, history = ownership_rows(b), audit(b)
    refused(lambda: b.release("nosuch", ["orders/0"], any_holder=True), ErrorCode.UNKNOWN_GROUP)
    refused(lambda: b.release("workers", ["orders/0"], any_holder=True), ErrorCode.NOT_HELD)
    refused(lambda: b.release("workers", ["orders/7"], any_holder=True), ErrorCode.NOT_HELD)
    refused(lambda: b.release("", any_holder=True), ErrorCode.INVALID_NAME)
    assert (ownership_rows(b), audit(b)) == (before, history)


@pytest.mark.parametrize("generation", [2**63, 2**64])
def test_a_generation_too_large_to_store_is_invalid_and_changes_nothing(
    a: Client, b: Client, generation: int
) -> None:
    a.create_topic("orders")
    [held] = a.own("workers", ["orders/0"], generation=3)
    before, history = ownership_rows(b), audit(b)
    error = None
    try:
        a.own("workers", ["orders/1"], generation=generation)
    except Exception as raised:  # what it raises is the point
        error = raised
    # Nothing changed: a's session and its claim are intact, its fence still writes.
    assert (ownership_rows(b), audit(b)) == (before, history)
    a.produce("orders", [b"x"], fences=[held.fence])
    assert isinstance(error, BrokerError), f"{error!r} is not a BrokerError"
    assert error.code is ErrorCode.INVALID_ARGUMENT, error


def test_the_largest_generation_cannot_wedge_a_resource(a: Client, b: Client) -> None:
    """Whether or not the broker accepts the top of the range, the next claim gets an
    answer (a grant or a clear refusal), never an internal failure."""
    try:
        a.own("workers", ["orders/0"], generation=2**63 - 1)
    except BrokerError as error:
        assert error.code is ErrorCode.INVALID_ARGUMENT
        return
    a.release("workers")
    try:
        b.own("workers", ["orders/0"], generation=1)
    except BrokerError as error:
        assert error.code is not ErrorCode.INTERNAL, error


def test_releasing_a_whole_group_nobody_holds_says_so(a: Client, b: Client) -> None:
    # It said "no resource of workers is not held by anyone" (or "by this session").
    a.own("workers", ["orders/0", "orders/1"])
    a.release("workers")
    operator = refused(lambda: b.release("workers", any_holder=True), ErrorCode.NOT_HELD)
    assert operator.message == "no resource of workers is held by anyone: nothing to release"
    own = refused(lambda: b.release("workers"), ErrorCode.NOT_HELD)
    assert own.message == "no resource of workers is held by this session: nothing to release"
    named = refused(lambda: b.release("workers", ["orders/0"]), ErrorCode.NOT_HELD)
    assert named.message == "workers:orders/0 is not held by this session: nothing to release"


def test_an_errors_details_are_the_same_embedded_and_served(a: Client, b: Client) -> None:
    # Served, the lists in an error's details came back as tuples (a frame's arrays).
    a.own("workers", ["orders/0"], generation=5)
    higher = refused(
        lambda: b.own("workers", ["orders/0"], generation=2), ErrorCode.OWNED_BY_HIGHER_GENERATION
    )
    assert higher.details["refused"] == ["orders/0"]
    unheld = refused(lambda: b.release("workers", ["orders/0"]), ErrorCode.NOT_HELD)
    assert unheld.details["resources"] == ["orders/0"]
