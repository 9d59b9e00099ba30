"""What the exclusive-producer tests share: who holds a topic as the user sees it, a
producer waiting for exclusivity in a thread, a clock that can fall behind (an embedded
client whose heartbeats everyone else then sees as missed), and the log checker: epochs
never go down, and no writer's record lands after the next writer's first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.client.client import Client
from broker.client.producer import Producer
from broker.errors import BrokerError
from broker.types import Record
from support.values import present
from support.waiting import wait_until

STEP_S = 15.0  # a bound on every single wait (support.waiting)


@dataclass(frozen=True)
class AccessView:
    """`topic describe`'s access part, by producer name."""

    mode: str
    epoch: int
    exclusive: str | None
    shared: tuple[str, ...]
    waiting: tuple[str, ...]


def access_view(client: Client, topic: str) -> AccessView:
    info = client.topic_access(topic)
    return AccessView(
        info.mode,
        info.epoch,
        None if info.exclusive is None else info.exclusive.name,
        tuple(a.name for a in info.shared),
        tuple(a.name for a in info.waiting),
    )


def wait_for_access(
    client: Client,
    topic: str,
    check: Callable[[AccessView], bool],
    what: str,
    timeout_s: float = STEP_S,
) -> AccessView:
    """The topic's access once check() holds; fail after timeout_s saying `what`."""

    def matching() -> AccessView | None:
        view = access_view(client, topic)
        return view if check(view) else None

    return wait_until(
        matching, timeout_s, message=lambda: f"{what}; now {access_view(client, topic)}"
    )


class Waiter:
    """`client.producer(topic, access="wait-exclusive")` running in a thread, since it
    blocks until promoted (or its wait ends)."""

    def __init__(
        self, client: Client, topic: str, name: str, wait_timeout_s: float = STEP_S
    ) -> None:
        self.client = client
        self.name = name
        self.producer: Producer | None = None
        self.error: BrokerError | None = None
        self._thread = threading.Thread(
            target=self._run, args=(topic, wait_timeout_s), name=f"waiter-{name}", daemon=True
        )
        self._thread.start()

    def _run(self, topic: str, wait_timeout_s: float) -> None:
        try:
            self.producer = self.client.producer(
                topic,
                idempotent=False,
                access="wait-exclusive",
                name=self.name,
                wait_timeout_s=wait_timeout_s,
            )
        except BrokerError as error:
            self.error = error

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def promoted(self) -> Producer:
        """The producer, once promoted: fails if it was refused or is still waiting."""
        self._thread.join(STEP_S)
        assert not self._thread.is_alive(), f"{self.name} still waiting after {STEP_S}s"
        assert self.error is None, f"{self.name} was refused: {self.error}"
        assert self.producer is not None
        return self.producer

    def refused(self) -> BrokerError:
        self._thread.join(STEP_S)
        assert not self._thread.is_alive(), f"{self.name} still waiting after {STEP_S}s"
        assert self.error is not None, f"{self.name} was promoted, not refused"
        return self.error

    def join(self) -> None:
        self._thread.join(STEP_S)


class LaggingClock:
    """Wall-clock milliseconds until fall_behind(): then that much earlier. An embedded
    client built on it goes on heartbeating, but every heartbeat from then on is older
    than the session timeout to everyone else: to them its process stopped."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def fall_behind(self, ms: int) -> None:
        self.offset_ms -= ms


def segments(records: Sequence[Record]) -> list[tuple[int, str]]:
    """(epoch, writer) runs in offset order; a record's writer is its value up to ':'."""
    runs: list[tuple[int, str]] = []
    for record in records:
        run = (record.epoch, present(record.value).decode().partition(":")[0])
        if not runs or runs[-1] != run:
            runs.append(run)
    return runs


def assert_never_interleaved(records: Sequence[Record]) -> None:
    """One segment per epoch, each from one writer; epochs never go down, and nothing of a
    writer (or an epoch) appears after the next one's first record."""
    runs = segments(records)
    epochs = [epoch for epoch, _ in runs]
    writers = [writer for _, writer in runs]
    assert epochs == sorted(epochs), f"epochs went down: {runs}"
    assert len(set(epochs)) == len(epochs), f"an epoch came back: {runs}"
    assert len(set(writers)) == len(writers), f"a writer came back: {runs}"
