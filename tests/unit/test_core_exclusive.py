"""The pure exclusive-producer rules (broker/core/exclusive.py), DESIGN.md section 5:
values in, a decision out; no SQLite, no socket, no sleep.

- Shared: refused (PRODUCER_BUSY) while an exclusive producer is attached.
- Exclusive: refused (PRODUCER_BUSY) while any other producer is attached.
- WaitForExclusive: queued behind whoever holds the topic, and behind earlier waiters.
- Granting exclusivity bumps the epoch, except for the previous exclusive producer
  re-attaching with the current epoch; a request with an older epoch is fenced.
- The first live waiter (FIFO) is promoted once nobody else is attached.
- A write passes only from the current exclusive attachment, or while nobody holds the
  topic exclusively.
- A wait for exclusive access (ExclusiveWait) keeps waiting, in slices of at most
  recheck_s, until its attachment no longer waits; at its deadline, or when its server
  is stopping, it gives up with WAIT_TIMEOUT. Time is a number here, never a sleep.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.core.exclusive import (
    AttachDecision,
    ExclusiveWait,
    GiveUp,
    KeepWaiting,
    check_wait_ms,
    check_write,
    decide_attach,
    grant,
    next_to_promote,
    parse_access,
)
from broker.errors import BrokerError, ErrorCode
from broker.types import Access, Attached, Mode

EPOCH = 4  # the topic's epoch in these tests


def attached(
    attachment_id: int, mode: Mode, *, name: str = "", epoch: int = EPOCH, live: bool = True
) -> Attached:
    return Attached(
        attachment_id, f"session-{attachment_id}", name or f"p{attachment_id}", mode, epoch, live
    )


def attach(
    access: Access,
    others: Sequence[Attached] = (),
    *,
    name: str = "new",
    previous_epoch: int | None = None,
    last_exclusive: str | None = "old",
) -> AttachDecision:
    return decide_attach(access, name, previous_epoch, EPOCH, others, last_exclusive)


def refused(
    code: ErrorCode,
    access: Access,
    others: Sequence[Attached] = (),
    *,
    name: str = "new",
    previous_epoch: int | None = None,
    last_exclusive: str | None = "old",
) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        attach(
            access, others, name=name, previous_epoch=previous_epoch, last_exclusive=last_exclusive
        )
    assert caught.value.code is code, caught.value
    return caught.value


# access modes ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["shared", "exclusive", "wait-exclusive"])
def test_each_access_mode_is_parsed_from_its_cli_spelling(text: str) -> None:
    assert parse_access(text).value == text


@pytest.mark.parametrize("text", ["", "Exclusive", "wait_exclusive", "WaitForExclusive", "x"])
def test_an_unknown_access_mode_is_invalid_and_says_which_modes_exist(text: str) -> None:
    with pytest.raises(BrokerError) as caught:
        parse_access(text)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert repr(text) in caught.value.message
    assert caught.value.hint is not None
    assert all(mode in caught.value.hint for mode in ("shared", "exclusive", "wait-exclusive"))


# Shared ---------------------------------------------------------------------------------


def test_shared_on_a_free_topic_is_granted_at_the_topic_epoch_without_bumping_it() -> None:
    assert attach(Access.SHARED) == AttachDecision(Mode.SHARED, EPOCH, EPOCH)


def test_shared_producers_attach_beside_each_other_and_beside_waiters() -> None:
    others = [attached(1, Mode.SHARED), attached(2, Mode.WAITING)]
    assert attach(Access.SHARED, others) == AttachDecision(Mode.SHARED, EPOCH, EPOCH)


def test_shared_is_refused_busy_while_an_exclusive_producer_is_attached() -> None:
    error = refused(
        ErrorCode.PRODUCER_BUSY, Access.SHARED, [attached(1, Mode.EXCLUSIVE, name="leader")]
    )
    assert "leader" in error.message


# Exclusive ------------------------------------------------------------------------------


def test_exclusive_on_a_free_topic_bumps_the_epoch() -> None:
    assert attach(Access.EXCLUSIVE) == AttachDecision(Mode.EXCLUSIVE, EPOCH + 1, EPOCH + 1)


@pytest.mark.parametrize("holder", [Mode.SHARED, Mode.EXCLUSIVE])
def test_exclusive_is_refused_busy_while_any_other_producer_is_attached(holder: Mode) -> None:
    refused(ErrorCode.PRODUCER_BUSY, Access.EXCLUSIVE, [attached(1, holder)])


def test_exclusive_is_refused_while_several_shared_producers_are_attached() -> None:
    others = [attached(1, Mode.SHARED), attached(2, Mode.SHARED)]
    error = refused(ErrorCode.PRODUCER_BUSY, Access.EXCLUSIVE, others)
    assert "2" in error.message


# WaitForExclusive -----------------------------------------------------------------------


def test_wait_exclusive_on_a_free_topic_is_granted_at_once_with_a_new_epoch() -> None:
    assert attach(Access.WAIT_EXCLUSIVE) == AttachDecision(Mode.EXCLUSIVE, EPOCH + 1, EPOCH + 1)


@pytest.mark.parametrize("holder", [Mode.SHARED, Mode.EXCLUSIVE])
def test_wait_exclusive_waits_behind_a_holder_and_the_epoch_does_not_move(holder: Mode) -> None:
    decision = attach(Access.WAIT_EXCLUSIVE, [attached(1, holder)])
    assert decision.mode is Mode.WAITING
    assert decision.topic_epoch == EPOCH


def test_wait_exclusive_queues_behind_earlier_waiters_even_with_no_holder() -> None:
    decision = attach(Access.WAIT_EXCLUSIVE, [attached(1, Mode.WAITING)])
    assert decision.mode is Mode.WAITING


# epochs: bumped, kept, fenced -----------------------------------------------------------


def test_the_previous_exclusive_producer_with_the_current_epoch_keeps_it() -> None:
    decision = attach(Access.EXCLUSIVE, name="old", previous_epoch=EPOCH, last_exclusive="old")
    assert decision == AttachDecision(Mode.EXCLUSIVE, EPOCH, EPOCH)


@pytest.mark.parametrize(
    ("name", "previous_epoch"),
    [
        ("new", None),  # a new producer
        ("new", EPOCH),  # a different producer that names the current epoch
        ("old", None),  # the previous one, but without its epoch
    ],
)
def test_anyone_else_taking_exclusivity_bumps_the_epoch(
    name: str, previous_epoch: int | None
) -> None:
    decision = attach(Access.EXCLUSIVE, name=name, previous_epoch=previous_epoch)
    assert decision == AttachDecision(Mode.EXCLUSIVE, EPOCH + 1, EPOCH + 1)


@pytest.mark.parametrize("access", list(Access))
def test_a_request_with_an_older_epoch_is_fenced_whatever_its_access(access: Access) -> None:
    error = refused(
        ErrorCode.PRODUCER_FENCED,
        access,
        name="old",
        previous_epoch=EPOCH - 1,
        last_exclusive="old",
    )
    assert error.details["epoch"] == EPOCH - 1
    assert error.details["topic_epoch"] == EPOCH
    assert error.hint is not None and "never" in error.hint


def test_an_older_epoch_is_fenced_even_on_a_topic_nobody_holds() -> None:
    refused(ErrorCode.PRODUCER_FENCED, Access.WAIT_EXCLUSIVE, previous_epoch=0)


def test_grant_keeps_the_epoch_only_for_the_last_exclusive_name_at_the_current_epoch() -> None:
    assert grant("a", EPOCH, EPOCH, "a") == AttachDecision(Mode.EXCLUSIVE, EPOCH, EPOCH)
    assert grant("a", EPOCH, EPOCH, "b").epoch == EPOCH + 1
    assert grant("a", None, EPOCH, "a").epoch == EPOCH + 1
    assert grant("a", EPOCH, EPOCH, None).epoch == EPOCH + 1


def test_the_first_exclusive_producer_of_a_new_topic_gets_epoch_1() -> None:
    assert decide_attach(Access.EXCLUSIVE, "first", None, 0, [], None).epoch == 1


# promotion ------------------------------------------------------------------------------


def test_the_first_waiter_by_arrival_is_promoted_once_the_topic_is_free() -> None:
    waiters = [attached(7, Mode.WAITING), attached(3, Mode.WAITING), attached(5, Mode.WAITING)]
    promoted = next_to_promote(waiters)
    assert promoted is not None and promoted.attachment_id == 3


@pytest.mark.parametrize("holder", [Mode.SHARED, Mode.EXCLUSIVE])
def test_nobody_is_promoted_while_a_live_producer_holds_the_topic(holder: Mode) -> None:
    assert next_to_promote([attached(1, holder), attached(2, Mode.WAITING)]) is None


def test_a_dead_holder_does_not_block_promotion_and_a_dead_waiter_is_skipped() -> None:
    found = next_to_promote(
        [
            attached(1, Mode.EXCLUSIVE, live=False),
            attached(2, Mode.WAITING, live=False),
            attached(3, Mode.WAITING),
            attached(4, Mode.WAITING),
        ]
    )
    assert found is not None and found.attachment_id == 3


def test_nobody_to_promote_without_waiters() -> None:
    assert next_to_promote([]) is None
    assert next_to_promote([attached(1, Mode.EXCLUSIVE, live=False)]) is None


# writes ---------------------------------------------------------------------------------


def test_the_current_exclusive_producer_may_write() -> None:
    holder = attached(1, Mode.EXCLUSIVE)
    check_write(holder, EPOCH, holder)


def test_a_former_exclusive_producer_is_fenced_with_its_epoch_and_the_topic_epoch() -> None:
    former = attached(1, Mode.EXCLUSIVE, name="old", epoch=EPOCH - 1)
    with pytest.raises(BrokerError) as caught:
        check_write(former, EPOCH, attached(2, Mode.EXCLUSIVE, name="new"))
    assert caught.value.code is ErrorCode.PRODUCER_FENCED
    assert (caught.value.details["epoch"], caught.value.details["topic_epoch"]) == (
        EPOCH - 1,
        EPOCH,
    )


def test_an_exclusive_attachment_is_fenced_when_nobody_holds_the_topic_any_more() -> None:
    with pytest.raises(BrokerError) as caught:
        check_write(attached(1, Mode.EXCLUSIVE), EPOCH, None)
    assert caught.value.code is ErrorCode.PRODUCER_FENCED


@pytest.mark.parametrize("writer", [None, Mode.SHARED])
def test_plain_and_shared_writes_are_busy_while_someone_holds_the_topic(
    writer: Mode | None,
) -> None:
    attachment = None if writer is None else attached(2, writer)
    with pytest.raises(BrokerError) as caught:
        check_write(attachment, EPOCH, attached(1, Mode.EXCLUSIVE))
    assert caught.value.code is ErrorCode.PRODUCER_BUSY


def test_a_waiter_may_not_write_before_it_is_promoted() -> None:
    with pytest.raises(BrokerError) as caught:
        check_write(attached(2, Mode.WAITING), EPOCH, attached(1, Mode.EXCLUSIVE))
    assert caught.value.code is ErrorCode.PRODUCER_BUSY
    with pytest.raises(BrokerError) as caught:
        check_write(attached(2, Mode.WAITING), EPOCH, None)
    assert caught.value.code is ErrorCode.PRODUCER_BUSY


@pytest.mark.parametrize("writer", [None, Mode.SHARED])
def test_plain_and_shared_writes_pass_while_nobody_holds_the_topic(writer: Mode | None) -> None:
    check_write(None if writer is None else attached(2, writer), EPOCH, None)


# waiting for exclusive access -----------------------------------------------------------

T0 = 1000.0  # a driver's monotonic clock, in seconds


def wait(wait_ms: int = 300, recheck_s: float = 0.5) -> ExclusiveWait:
    return ExclusiveWait("orders", wait_ms, recheck_s)


@pytest.mark.parametrize("wait_ms", [-1, -30_000])
def test_a_negative_wait_is_invalid(wait_ms: int) -> None:
    for check in (check_wait_ms, wait):
        with pytest.raises(BrokerError) as caught:
            check(wait_ms)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT
        assert caught.value.message == f"wait_ms must be >= 0, not {wait_ms}"


def test_no_wait_is_a_valid_wait() -> None:
    check_wait_ms(0)
    assert wait(0).deadline(T0) == T0


def test_the_deadline_is_wait_ms_after_the_attach() -> None:
    assert wait(300).deadline(T0) == pytest.approx(T0 + 0.3)


@pytest.mark.parametrize("mode", [Mode.SHARED, Mode.EXCLUSIVE])
@pytest.mark.parametrize(("now", "stopping"), [(T0, False), (T0 + 9, False), (T0, True)])
def test_an_attachment_that_no_longer_waits_is_done(mode: Mode, now: float, stopping: bool) -> None:
    """Promoted (or never queued): done, even past the deadline or while stopping."""
    assert wait().step(mode, T0 + 0.3, now, stopping=stopping) is None


def test_a_waiter_before_its_deadline_waits_at_most_recheck_s_then_looks_again() -> None:
    assert wait(recheck_s=0.5).step(Mode.WAITING, T0 + 2.0, T0) == KeepWaiting(0.5)


def test_a_waiter_near_its_deadline_waits_only_what_remains() -> None:
    step = wait(recheck_s=0.5).step(Mode.WAITING, T0 + 0.3, T0 + 0.1)
    assert isinstance(step, KeepWaiting)
    assert step.timeout_s == pytest.approx(0.2)


@pytest.mark.parametrize("now", [T0 + 0.3, T0 + 5.0])
def test_a_waiter_at_or_past_its_deadline_gives_up_with_wait_timeout(now: float) -> None:
    step = wait(300).step(Mode.WAITING, T0 + 0.3, now)
    assert isinstance(step, GiveUp)
    error = step.error
    assert error.code is ErrorCode.WAIT_TIMEOUT
    assert error.message == "no exclusive access to orders within 300 ms"
    assert error.details["topic"] == "orders"
    assert error.hint == "the producer left the queue; try again or wait longer"


def test_a_waiter_gives_up_when_its_server_is_stopping_even_with_time_left() -> None:
    step = wait(30_000).step(Mode.WAITING, T0 + 30.0, T0, stopping=True)
    assert isinstance(step, GiveUp)
    assert step.error.code is ErrorCode.WAIT_TIMEOUT


def test_no_wait_on_a_held_topic_gives_up_at_once() -> None:
    policy = wait(0)
    assert isinstance(policy.step(Mode.WAITING, policy.deadline(T0), T0), GiveUp)


def drive(policy: ExclusiveWait, promoted_at: float | None) -> tuple[list[float], str]:
    """What a driver does, on a simulated clock: each wait lasts its whole timeout, and
    the attachment stops waiting once the clock reaches promoted_at."""
    now, waits = T0, list[float]()
    deadline = policy.deadline(now)
    mode = Mode.WAITING
    while (step := policy.step(mode, deadline, now)) is not None:
        if isinstance(step, GiveUp):
            return waits, "gave up"
        assert len(waits) < 100, f"the wait never ends: {waits[-3:]}"
        waits.append(round(step.timeout_s, 6))
        now += step.timeout_s
        if promoted_at is not None and now >= promoted_at:
            mode = Mode.EXCLUSIVE
    return waits, "done"


def test_a_driven_wait_looks_again_every_recheck_s_until_its_deadline() -> None:
    assert drive(wait(1200, recheck_s=0.5), None) == ([0.5, 0.5, 0.2], "gave up")


def test_a_driven_wait_ends_once_the_attachment_is_promoted() -> None:
    assert drive(wait(1200, recheck_s=0.5), T0 + 0.7) == ([0.5, 0.5], "done")
