"""Exclusive producers: seeds/pip-68-exclusive-producer.md with the rules of DESIGN.md
section 5. Pure: a topic's attachments (with liveness) and a request come in, a
decision comes out.

Per topic: a persisted epoch and the producers attached to it, each Shared, Exclusive
or Waiting (for exclusivity, first come first served).
- Shared: refused (PRODUCER_BUSY) while a live exclusive producer is attached.
- Exclusive: refused (PRODUCER_BUSY) while any other live producer is attached.
- WaitForExclusive: queued; promoted in FIFO order once no other live producer is
  attached, or refused (WAIT_TIMEOUT) when its wait ends first.
- Granting exclusivity bumps the epoch, except for the previous exclusive producer
  re-attaching with the current epoch. A producer holding an older epoch is fenced for
  good (PRODUCER_FENCED).
- A write from an exclusive producer must come from the current exclusive attachment
  at the current epoch; any other write is refused while an exclusive producer is
  attached. Every record carries the epoch it was written under, so the log is a
  sequence of segments, one per epoch, never interleaved.
- A wait-for-exclusive attach waits (ExclusiveWait) until its attachment no longer
  waits, for up to wait_ms; then, or when its server is stopping, it detaches and fails
  with WAIT_TIMEOUT. The server (asyncio) and the embedded transport (threads, WAL
  watcher) drive the same policy, each with its own clock and way of waiting.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from broker.core.values import check_integer
from broker.errors import BrokerError, ErrorCode
from broker.types import Access, Attached, Mode


class AttachDecision(Struct, frozen=True):
    mode: Mode
    epoch: int  # the epoch the attachment holds (the topic's, once granted)
    topic_epoch: int  # the topic's epoch after this decision


def parse_access(text: str) -> Access:
    try:
        return Access(text)
    except ValueError:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"unknown access mode {text!r}",
            hint="use shared, exclusive or wait-exclusive",
        ) from None


def decide_attach(
    access: Access,
    name: str,
    previous_epoch: int | None,
    topic_epoch: int,
    others: Sequence[Attached],
    last_exclusive_name: str | None,
) -> AttachDecision:
    """Attach a producer named `name`; others are the topic's live attachments."""
    if previous_epoch is not None and previous_epoch < topic_epoch:
        raise fenced(name, previous_epoch, topic_epoch)
    exclusive = [a for a in others if a.mode is Mode.EXCLUSIVE]
    if access is Access.SHARED:
        if exclusive:
            raise busy(f"producer {exclusive[0].name} holds the topic exclusively")
        return AttachDecision(Mode.SHARED, topic_epoch, topic_epoch)
    blocking = [a for a in others if a.mode is not Mode.WAITING]
    if blocking or (access is Access.WAIT_EXCLUSIVE and _waiting(others)):
        if access is Access.EXCLUSIVE:
            raise busy(f"{len(blocking)} other producer(s) are attached")
        return AttachDecision(Mode.WAITING, previous_epoch or 0, topic_epoch)
    return grant(name, previous_epoch, topic_epoch, last_exclusive_name)


def _waiting(others: Sequence[Attached]) -> bool:
    return any(a.mode is Mode.WAITING for a in others)


def grant(
    name: str, previous_epoch: int | None, topic_epoch: int, last_exclusive_name: str | None
) -> AttachDecision:
    """Exclusivity: the epoch is kept only for the previous exclusive producer coming
    back with the current epoch; anyone else bumps it."""
    if previous_epoch == topic_epoch and name == last_exclusive_name:
        return AttachDecision(Mode.EXCLUSIVE, topic_epoch, topic_epoch)
    return AttachDecision(Mode.EXCLUSIVE, topic_epoch + 1, topic_epoch + 1)


def next_to_promote(attachments: Sequence[Attached]) -> Attached | None:
    """The first live waiter, once no other live producer is attached."""
    live = [a for a in attachments if a.live]
    if any(a.mode is not Mode.WAITING for a in live):
        return None
    waiting = sorted((a for a in live if a.mode is Mode.WAITING), key=lambda a: a.attachment_id)
    return waiting[0] if waiting else None


def check_write(attachment: Attached | None, topic_epoch: int, exclusive: Attached | None) -> None:
    """May a write from this attachment (None: a plain write) go in now?"""
    if attachment is not None and attachment.mode is Mode.EXCLUSIVE:
        if exclusive is None or exclusive.attachment_id != attachment.attachment_id:
            raise fenced(attachment.name, attachment.epoch, topic_epoch)
        return
    if attachment is not None and attachment.mode is Mode.WAITING:
        raise busy("this producer is still waiting for exclusive access")
    if exclusive is not None:
        raise busy(f"producer {exclusive.name} holds the topic exclusively")


def fenced(name: str, epoch: int, topic_epoch: int) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_FENCED,
        f"producer {name} holds epoch {epoch}, the topic is at {topic_epoch}: "
        "another producer took exclusive access",
        producer=name,
        epoch=epoch,
        topic_epoch=topic_epoch,
        hint="this producer can never write again; create a new one",
    )


def busy(why: str) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_BUSY,
        f"the topic is busy: {why}",
        hint="retry later, or use --access wait-exclusive to queue",
    )


def wait_timeout(topic: str, wait_ms: int) -> BrokerError:
    """A wait-exclusive producer whose wait ended first; it has left the queue."""
    return BrokerError(
        ErrorCode.WAIT_TIMEOUT,
        f"no exclusive access to {topic} within {wait_ms} ms",
        topic=topic,
        hint="the producer left the queue; try again or wait longer",
    )


# waiting for exclusive access ---------------------------------------------------------


def check_wait_ms(wait_ms: int) -> None:
    check_integer("wait_ms", wait_ms)
    if wait_ms < 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"wait_ms must be >= 0, not {wait_ms}")


class KeepWaiting(Struct, frozen=True):
    """Wait for a change to the topic's attachments for at most timeout_s, then look at
    the attachment again."""

    timeout_s: float


class GiveUp(Struct, frozen=True):
    """Detach the waiting attachment (it leaves the queue), then raise error."""

    error: BrokerError


class ExclusiveWait(Struct, frozen=True):
    """The wait of one attach for exclusive access. Times are seconds on the driver's
    monotonic clock. The driver: build it (wait_ms is checked), attach, take
    deadline(now), then until step() says None (done: the attachment no longer waits):
    on GiveUp detach and raise its error; on KeepWaiting wait for a change, at most its
    timeout_s, and load the attachment again."""

    topic: str
    wait_ms: int
    recheck_s: float  # the longest a driver waits before looking at the attachment again

    def __post_init__(self) -> None:
        check_wait_ms(self.wait_ms)

    def deadline(self, now: float) -> float:
        return now + self.wait_ms / 1000

    def step(
        self, mode: Mode, deadline: float, now: float, *, stopping: bool = False
    ) -> KeepWaiting | GiveUp | None:
        """What to do next, with the attachment in `mode` at time `now`."""
        if mode is not Mode.WAITING:
            return None
        remaining = deadline - now
        if remaining <= 0 or stopping:
            return GiveUp(wait_timeout(self.topic, self.wait_ms))
        return KeepWaiting(min(remaining, self.recheck_s))
