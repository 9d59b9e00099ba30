"""What a differential run keeps, and what every kind of step shares: its clients and
their sessions (a severed or closed one replaced by a new one), the answers, and the
normalising of what legitimately differs between two brokers: session ids, ids taken
in blocks, clock readings, the random generations leases start from."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.client.client import Client
from broker.client.producer import Producer, ProducerState
from broker.errors import BrokerError
from broker.types import AppendResult, Record, TopicConfig, TxnInfo, TxnMember
from support.differential.world import (
    FENCED_TOPIC,
    GIVEN_TIMESTAMPS_BELOW,
    KEYED_TOPIC,
    OWNER_GROUP,
    OWNERS,
    SESSION_END_S,
    TOPICS,
    WORKERS,
    Answer,
)
from support.waiting import wait_until

if TYPE_CHECKING:
    from support.differential.plan import Step


@dataclass
class LeaseState:
    """A pid this run leased, and what it has been answered about it."""

    producer_id: int
    partition: int
    generation: int
    high_water_sequence: int


@dataclass
class Ids:
    """Producer and transaction ids as the order they were first seen in. Each engine
    takes its ids from the persistent counters in blocks (DESIGN.md sections 4 and 6):
    embedded, every client opens an engine of its own and so a block of its own, where
    one served engine hands out one block; which number an id got is not an answer."""

    seen: dict[tuple[str, int], str] = field(default_factory=dict)

    def pid(self, producer_id: int) -> str | int:
        return 0 if producer_id == 0 else self._name("pid", producer_id)

    def txn(self, txn_id: int | None) -> str | None:
        return None if txn_id is None else self._name("txn", txn_id)

    def _name(self, kind: str, raw: int) -> str:
        return self.seen.setdefault(
            (kind, raw), f"{kind}#{sum(k == kind for k, _ in self.seen) + 1}"
        )


@dataclass
class Actor:
    client: Client
    label: str  # stands for its session id, which differs between brokers


@dataclass
class RunBase:
    """A plan's steps on one broker, and what it has been answered (`answers`, each
    normalised). The steps themselves are the methods `_KIND` of its subclasses."""

    connect: Callable[[], Client]
    observer: Client  # a client of its own that only reads
    served: bool
    answers: list[Answer] = field(default_factory=list)
    actors: list[Actor] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # session id -> label
    opened: int = 0
    generations: dict[tuple[str, str], int] = field(default_factory=dict)  # as answered
    claims: dict[tuple[int, str, str], int] = field(default_factory=dict)  # actor's own
    leases: list[LeaseState] = field(default_factory=list)
    lease_starts: dict[int, int] = field(default_factory=dict)  # pid -> first generation
    txns: list[int] = field(default_factory=list)
    members: list[TxnMember] = field(default_factory=list)
    producers: dict[int, tuple[int, Producer]] = field(default_factory=dict)  # slot
    senders: dict[int, tuple[int, Producer]] = field(default_factory=dict)  # idempotent
    saved: list[ProducerState] = field(default_factory=list)  # senders' states, saved
    epochs: dict[int, int] = field(default_factory=dict)  # slot -> last epoch held
    audit_seen: int = 0
    final: dict[str, object] = field(default_factory=dict)  # state() at the end
    ids: Ids = field(default_factory=Ids)

    def start(self) -> None:
        for name, partitions in TOPICS.items():
            owner = OWNER_GROUP if name == FENCED_TOPIC else None
            config = TopicConfig(cleanup="compact") if name == KEYED_TOPIC else None
            self.observer.create_topic(name, partitions, owner_group=owner, config=config)
        self.actors = [self._open() for _ in range(OWNERS + WORKERS)]

    def close(self) -> None:
        for _, producer in [*self.producers.values(), *self.senders.values()]:
            with contextlib.suppress(BrokerError):
                producer.close()
        for actor in self.actors:
            actor.client.close()

    def run(self, steps: Sequence[Step]) -> None:
        for index, step in enumerate(steps):
            self.answers.append(self._answer(index, step))
            if step.actor < OWNERS and step.kind in ("own", "release"):
                self._replace_severed()

    def _answer(self, index: int, step: Step) -> Answer:
        try:
            return (step.kind, *getattr(self, f"_{step.kind}")(index, step))
        except BrokerError as error:
            return (step.kind, "error", error.code.name, self._details(error))

    def _details(self, error: BrokerError) -> Answer:
        """An error's details (its message says the same in words, with the ids and
        generations that legitimately differ)."""
        pid = error.details.get("producer_id")
        return tuple((k, self._detail(k, v, pid)) for k, v in sorted(error.details.items()))

    def _detail(self, key: str, value: object, producer_id: object) -> object:
        if key == "producer_id" and isinstance(value, int):
            return self.ids.pid(value)
        if key == "txn_id" and isinstance(value, int):
            return self.ids.txn(value)
        if key.endswith("_generation") and isinstance(producer_id, int):
            assert isinstance(value, int), (key, value)
            return self._relative(producer_id, value)
        return value

    # sessions --------------------------------------------------------------------------

    def _open(self) -> Actor:
        client = self.connect()
        self.opened += 1
        label = f"session-{self.opened}"
        self.labels[client.session_id] = label
        return Actor(client, label)

    def _reconnect(self, index: int, step: Step) -> Answer:
        self._replace(step.actor)
        return ()

    def _replace(self, slot: int) -> None:
        """Close the client in `slot` (its session ends) and open a new one there."""
        old = self.actors[slot]
        for table in (self.producers, self.senders):
            for producer_slot, (owner, producer) in list(table.items()):
                if owner == slot:
                    del table[producer_slot]
                    with contextlib.suppress(BrokerError):
                        producer.close()
        session_id = old.client.session_id
        old.client.close()
        if self.served:  # the server ends a closed connection's session just after
            wait_until(
                lambda: (
                    not any(s.live for s in self.observer.sessions() if s.session_id == session_id)
                ),
                SESSION_END_S,
                message=f"the server ends session {session_id}",
            )
        self.claims = {k: g for k, g in self.claims.items() if k[0] != slot}
        self.actors[slot] = self._open()

    def _replace_severed(self) -> None:
        """A claim severs the sessions it displaces. Embedded, a severed client stays
        severed for good (its later claims are SEVERED); served, its connection is closed
        and the client goes on in a new session (DESIGN.md section 3): both runs therefore
        replace a severed client with a new one, so that the next steps mean the same."""
        rows = self.observer.ownership_history(limit=1_000)
        new = [row for row in rows if row.audit_id > self.audit_seen]
        self.audit_seen = max((row.audit_id for row in rows), default=self.audit_seen)
        severed = {row.session_id for row in new if row.event == "severed"}
        for slot, actor in enumerate(self.actors):
            if self._session_of(actor) in severed:
                self._replace(slot)

    def _session_of(self, actor: Actor) -> str:
        return next(s for s, label in self.labels.items() if label == actor.label)

    def label(self, session_id: str | None) -> str | None:
        if session_id is None:
            return None
        return self.labels.get(session_id, "unknown session")

    # shared by the steps --------------------------------------------------------------

    def _relative(self, producer_id: int, generation: int) -> int:
        start = self.lease_starts.get(producer_id)
        return generation if start is None else generation - start

    def _pick_txn(self, step: Step) -> int | None:
        return self.txns[step.ref % len(self.txns)] if self.txns else None

    def _txn(self, info: TxnInfo) -> Answer:
        # began_ms, deadline_ms, ended_ms and age_ms are clock readings.
        partitions = tuple((p.topic, p.partition, p.records) for p in info.partitions)
        return (
            self.ids.txn(info.txn_id),
            info.group,
            info.key,
            info.state,
            info.journal,
            info.reason,
            partitions,
            info.existing,
        )

    def _record(self, r: Record) -> tuple[object, ...]:
        # timestamp_ms is a clock reading unless given; a leased pid's generation is relative to its
        # first lease (a random start); members' generations (1, 2, ...) are as stored.
        generation = self._relative(r.producer_id, r.generation)
        return (
            r.partition,
            r.offset,
            r.timestamp_ms if r.timestamp_ms < GIVEN_TIMESTAMPS_BELOW else "now",
            r.key,
            r.value,
            r.headers,
            self.ids.pid(r.producer_id),
            generation,
            r.sequence,
            r.epoch,
            self.ids.txn(r.txn_id),
        )

    @staticmethod
    def _values(index: int, count: int) -> list[bytes]:
        return [f"step-{index}.{n}".encode() for n in range(count)]


def appended(results: Sequence[AppendResult]) -> Answer:
    return tuple((r.topic, r.partition, r.offset, r.duplicate) for r in results)
