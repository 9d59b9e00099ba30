"""The differential test's plan and its runner: one seeded random sequence of operations,
run through the Python client against a broker, every answer and the resulting state
written down as plain values, so that an embedded run and a served run can be compared.

- `plan(seed, steps)`: the operations, as data only (which client acts, which group,
  resources, partitions, and which *kind* of generation, sequence or fence to use). It
  never looks at a broker: each choice is resolved when run, against what that run has
  been answered so far (the current generation of a resource, a lease's high-water
  sequence, the transactions begun), so two runs that agree resolve it alike.
- `Run(connect, observer)`: runs a plan's steps on one broker (`answers`), then
  `state()` reads back every record of every log, the ownership listing and audit log,
  the transactions, producer states and topic access.

Clients 0..OWNERS-1 claim, release and write fenced records (a claim may sever another of
them: both runs then replace the severed client with a new one, see `_replace_severed`);
the others lease pids and write idempotently, attach exclusive and shared producers, and
run transactions, as owner and as joined members. Either kind may close its client and
open a new one (a session ending). What may legitimately differ between two brokers is
normalised here, each where it is made: session ids, timestamps, and the generations a
lease starts from (random).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msgspec.structs import replace

from broker.client.client import Client
from broker.client.producer import Producer, ProducerState
from broker.errors import BrokerError
from broker.limits import DEFAULT_LIMITS
from broker.rows import records_of
from broker.types import (
    AppendResult,
    Fence,
    Headers,
    Lease,
    NewRecord,
    ProducerFields,
    Record,
    TopicConfig,
    TxnInfo,
    TxnMember,
)
from support.waiting import wait_until

if TYPE_CHECKING:
    import pyarrow as pa

# The Arrow forms (fencelog[spark]) are compared where pyarrow is installed.
ARROW = importlib.util.find_spec("pyarrow") is not None

OWNERS = 3  # clients 0..2 claim and write fenced records
WORKERS = 2  # clients 3..4 produce idempotently, exclusively and in transactions
OWNER_GROUP = "owners"  # the owner group of FENCED_TOPIC: its writes need its fences
GROUPS = (OWNER_GROUP, "others")
FENCED_TOPIC = "owned"
RESOURCES = (f"{FENCED_TOPIC}/0", f"{FENCED_TOPIC}/1")
PLAIN_TOPIC = "plain"  # 2 partitions: idempotent, plain and transactional records
LEDGER_TOPIC = "ledger"  # 1 partition: a transaction's second topic
EXCLUSIVE_TOPIC = "excl"  # 1 partition: producers attached shared or exclusive
KEYED_TOPIC = "keyed"  # 2 partitions, compacted: the newest record of each key stays
TOPICS = {FENCED_TOPIC: 2, PLAIN_TOPIC: 2, LEDGER_TOPIC: 1, EXCLUSIVE_TOPIC: 1, KEYED_TOPIC: 2}
TXN_TARGETS = ((PLAIN_TOPIC, 0), (PLAIN_TOPIC, 1), (LEDGER_TOPIC, 0))
TXN_GROUPS = ("billing", "audit")
MEMBERS = ("m1", "m2")
PRODUCER_SLOTS = 3  # exclusive/shared producers open at once, at most
SESSION_END_S = 15.0
COUNT_MAX = 5  # records a write sends, at most: more than one append takes (LIMITS)
# Both brokers take at most 4 records an append: a larger write is split into appends.
LIMITS = replace(
    DEFAULT_LIMITS, append_records_max=COUNT_MAX - 1
)  # served: a closed connection's session ends soon after; a bound

OWNER_STEPS = {
    "own": 6,
    "release": 2,
    "fenced_produce": 5,
    "fenced_fetch": 2,
    "txn_fenced_produce": 2,
    "read": 1,
    "bad_input": 2,
    "reconnect": 1,
}
WORKER_STEPS = {
    "lease": 2,
    "resume_lease": 1,
    "idempotent_produce": 7,
    "producer_send": 3,
    "producer_close": 2,
    "producer_checkpoint": 1,
    "plain_produce": 1,
    "attach": 2,
    "wait_for_exclusive": 1,
    "exclusive_send": 3,
    "detach": 1,
    "txn_begin": 2,
    "txn_begin_produce": 1,
    "txn_produce": 3,
    "txn_join": 2,
    "member_produce": 3,
    "txn_commit": 2,
    "txn_abort": 1,
    "commit_offsets": 1,
    "txn_commit_offsets": 1,
    "txn_show": 1,
    "txn_keepalive": 1,
    "recreate_ledger": 1,
    "keyed_produce": 2,
    "clean": 1,
    "snapshot_producers": 1,
    "read": 2,
    "bad_input": 2,
    "reconnect": 1,
}
# Relative to the resource's current generation (as this run was last answered).
CLAIM_CHOICES = ("zero", "one", "below", "equal", "next", "above")
# Which fence a write to partition P of FENCED_TOPIC carries.
FENCE_CHOICES = ("none", "mine", "mine", "mine", "stale", "other-partition", "other-group")
# An idempotent batch: its generation and first sequence against the lease's state.
GENERATION_CHOICES = ("same", "same", "same", "next", "stale", "far")
SEQUENCE_CHOICES = ("next", "next", "next", "duplicate", "overlap", "gap", "first")

Answer = tuple[object, ...]
_KEYS: tuple[bytes | None, ...] = (None, b"", b"k1", b"k2")
_HEADERS: tuple[Headers, ...] = ((), (("trace", b""),), (("trace", b"t1"), ("trace", b"t1")))
GIVEN_TIMESTAMPS_BELOW = 10**9  # a timestamp the plan gave, not the broker's clock


@dataclass(frozen=True)
class Step:
    """One operation, as data: what kind, which client, and its choices."""

    kind: str
    actor: int
    group: str = ""
    resources: tuple[str, ...] = ()
    choice: str = ""
    second_choice: str = ""
    partition: int = 0
    count: int = 1
    ref: int = 0  # which lease, transaction, member or producer slot (taken modulo)
    flag: bool = False


def plan(seed: int, steps: int) -> list[Step]:
    """A random sequence of `steps` operations, the same for the same seed."""
    rng = random.Random(seed)
    return [_step(rng) for _ in range(steps)]


def _step(rng: random.Random) -> Step:
    actor = rng.randrange(OWNERS + WORKERS)
    table = OWNER_STEPS if actor < OWNERS else WORKER_STEPS
    kind = rng.choices(list(table), weights=list(table.values()))[0]
    resources = tuple(sorted(rng.sample(RESOURCES, rng.choice((1, 1, 2)))))
    return Step(
        kind=kind,
        actor=actor,
        group=rng.choice(GROUPS if kind != "txn_begin" else TXN_GROUPS),
        resources=resources,
        choice=rng.choice(_choices(kind)),
        second_choice=rng.choice(SEQUENCE_CHOICES),
        partition=rng.randrange(3),
        count=rng.randint(1, COUNT_MAX),
        ref=rng.randrange(1_000),
        flag=rng.random() < 0.3,
    )


def _choices(kind: str) -> Sequence[str]:
    return {
        "own": CLAIM_CHOICES,
        "fenced_produce": FENCE_CHOICES,
        "idempotent_produce": GENERATION_CHOICES,
        "attach": ("shared", "exclusive", "exclusive", "wait-exclusive"),
        "fenced_fetch": FENCE_CHOICES,
        "txn_fenced_produce": FENCE_CHOICES,
        "txn_commit": ("all", "all", "latest", "stale"),
        "bad_input": tuple(BAD_INPUTS),
    }.get(kind, ("",))


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
class Run:
    """A plan's steps on one broker; `answers` holds each step's answer, normalised."""

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

    # ownership -------------------------------------------------------------------------

    def _own(self, index: int, step: Step) -> Answer:
        claims = {r: self._claim_generation(step.group, r, step.choice) for r in step.resources}
        claimed = self.actors[step.actor].client.own(step.group, claims)
        for c in claimed:
            self.generations[(c.group, c.resource)] = c.generation
            self.claims[(step.actor, c.group, c.resource)] = c.generation
        return tuple((c.group, c.resource, c.generation) for c in claimed)

    def _claim_generation(self, group: str, resource: str, choice: str) -> int:
        current = self.generations.get((group, resource), 0)
        return {
            "zero": 0,
            "one": 1,
            "below": max(current - 1, 1),
            "equal": max(current, 1),
            "next": current + 1,
            "above": current + 5,
        }[choice]

    def _release(self, index: int, step: Step) -> Answer:
        resources = None if step.flag else list(step.resources)
        any_holder = step.count == 3
        released = self.actors[step.actor].client.release(
            step.group, resources, any_holder=any_holder
        )
        for resource in released:
            for key in [k for k in self.claims if k[1:] == (step.group, resource)]:
                del self.claims[key]
        return tuple(released)

    def _fenced_produce(self, index: int, step: Step) -> Answer:
        held = sorted(
            p for p, r in enumerate(RESOURCES) if (step.actor, OWNER_GROUP, r) in self.claims
        )
        partition = step.partition % 2
        if held and step.choice in ("mine", "stale"):  # a partition it holds, if any
            partition = held[step.partition % len(held)]
        fences = self._fences(step.actor, partition, step.choice)
        results = self.actors[step.actor].client.produce(
            FENCED_TOPIC, self._values(index, step.count), partition=partition, fences=fences
        )
        return _appended(results)

    def _fenced_fetch(self, index: int, step: Step) -> Answer:
        partition = step.partition % 2
        fences = self._fences(step.actor, partition, step.choice)
        records = self.actors[step.actor].client.fetch(FENCED_TOPIC, {partition: 0}, fences=fences)
        return tuple(r.value for r in records)

    def _fences(self, actor: int, partition: int, choice: str) -> list[Fence]:
        resource = RESOURCES[partition]
        other = RESOURCES[1 - partition]
        mine = self.claims.get((actor, OWNER_GROUP, resource), 1)
        return {
            "none": [],
            "mine": [Fence(OWNER_GROUP, resource, mine)],
            "stale": [Fence(OWNER_GROUP, resource, max(mine - 1, 0))],
            "other-partition": [
                Fence(OWNER_GROUP, other, self.claims.get((actor, OWNER_GROUP, other), 1))
            ],
            "other-group": [
                Fence("others", resource, self.claims.get((actor, "others", resource), 1))
            ],
        }[choice]

    # idempotent producers --------------------------------------------------------------

    def _lease(self, index: int, step: Step) -> Answer:
        partition = step.partition % 2
        lease = self.actors[step.actor].client.lease_pid(PLAIN_TOPIC, partition)
        self.lease_starts.setdefault(lease.producer_id, lease.generation)
        self.leases.append(
            LeaseState(lease.producer_id, partition, lease.generation, lease.sequence)
        )
        return self._lease_answer(lease)

    def _resume_lease(self, index: int, step: Step) -> Answer:
        if not self.leases:
            return ("no lease",)
        known = self.leases[step.ref % len(self.leases)]
        partition = known.partition if step.flag else step.partition % 2
        lease = self.actors[step.actor].client.lease_pid(PLAIN_TOPIC, partition, known.producer_id)
        if partition == known.partition:
            known.generation, known.high_water_sequence = lease.generation, lease.sequence
        return self._lease_answer(lease)

    def _lease_answer(self, lease: Lease) -> Answer:
        # A lease's generation starts at random: it is compared relative to the first
        # generation the pid was leased with (expire_ms and now_ms are clock readings).
        return (
            self.ids.pid(lease.producer_id),
            self._relative(lease.producer_id, lease.generation),
            lease.sequence,
        )

    def _relative(self, producer_id: int, generation: int) -> int:
        start = self.lease_starts.get(producer_id)
        return generation if start is None else generation - start

    def _idempotent_produce(self, index: int, step: Step) -> Answer:
        if not self.leases:
            return ("no lease",)
        lease = self.leases[step.ref % len(self.leases)]
        generation = lease.generation + {"same": 0, "next": 1, "stale": -1, "far": 2}[step.choice]
        high = lease.high_water_sequence
        first = {
            "next": high + 1,
            "duplicate": max(high - step.count + 1, 1),
            "overlap": max(high, 1),
            "gap": high + 2,
            "first": 1,
        }[step.second_choice]
        producer = ProducerFields(lease.producer_id, generation, first)
        results = self.actors[step.actor].client.produce(
            PLAIN_TOPIC,
            self._values(index, step.count),
            partition=lease.partition,
            producer=producer,
        )
        if not all(r.duplicate for r in results):
            lease.generation = generation
            lease.high_water_sequence = max(high, first + step.count - 1)
        return _appended(results)

    def _plain_produce(self, index: int, step: Step) -> Answer:
        """Records of every shape: keys null, empty or set, values empty or set, headers
        none, empty or repeated, timestamps given or the broker's, one partition or
        the broker's choice."""
        shapes = [
            NewRecord(
                value,
                key=_KEYS[(step.ref + n) % len(_KEYS)],
                headers=_HEADERS[(step.ref + n) % len(_HEADERS)],
            )
            for n, value in enumerate(self._values(index, step.count))
        ]
        if step.flag:
            shapes = [r._replace(value=b"", timestamp_ms=1_000 + index) for r in shapes]
        if step.partition == 2:  # the broker chooses by the key's hash; a record without
            # a key goes round robin from a random start, which differs between brokers
            shapes = [r._replace(key=b"k0") if r.key is None else r for r in shapes]
        partition = None if step.partition == 2 else step.partition
        records = [r._replace(partition=partition) for r in shapes]
        return _appended(self.actors[step.actor].client.produce(PLAIN_TOPIC, records))

    def _producer_send(self, index: int, step: Step) -> Answer:
        """The client's idempotent producer: new, or resumed from a closed one's saved
        state (perhaps an older one: its replays answer as duplicates)."""
        slot = step.ref % 2
        opened: tuple[str, ...] = ()
        if slot not in self.senders:
            state = self.saved[step.ref % len(self.saved)] if step.flag and self.saved else None
            sender = self.actors[step.actor].client.producer(
                PLAIN_TOPIC, state=state, max_in_flight=1, delivery_timeout_s=SESSION_END_S
            )
            self.senders[slot] = (step.actor, sender)
            opened = ("resumed" if state is not None else "opened",)
        _, sender = self.senders[slot]
        results = sender.send(self._values(index, step.count), partition=step.partition % 2)
        for partition_state in sender.state().partitions.values():
            self.lease_starts.setdefault(partition_state.producer_id, partition_state.generation)
        return (*opened, _appended(results))

    def _producer_checkpoint(self, index: int, step: Step) -> Answer:
        """Save a sender's state as a consumer that produces does with its input offsets;
        one resumed from it later replays what was sent since."""
        slot = step.ref % 2
        if slot not in self.senders:
            return ("no producer",)
        self.saved.append(self.senders[slot][1].state())
        return ("saved", len(self.saved))

    def _producer_close(self, index: int, step: Step) -> Answer:
        slot = step.ref % 2
        if slot not in self.senders:
            return ("no producer",)
        _, sender = self.senders.pop(slot)
        sender.close()
        state = sender.state()
        self.saved.append(state)
        return tuple(
            (
                p,
                self.ids.pid(s.producer_id),
                self._relative(s.producer_id, s.generation),
                s.sequence,
            )
            for p, s in sorted(state.partitions.items())
        )

    # exclusive producers ---------------------------------------------------------------

    def _attach(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot in self.producers:
            self._detach(index, step)
        epoch = self.epochs.get(slot) if step.flag else None
        producer = self.actors[step.actor].client.producer(
            EXCLUSIVE_TOPIC,
            idempotent=False,
            access=step.choice,
            name=f"producer-{slot}",
            epoch=epoch,
            wait_timeout_s=0,
        )
        self.producers[slot] = (step.actor, producer)
        if producer.epoch is not None:
            self.epochs[slot] = producer.epoch
        return (producer.attachment_id, producer.name, producer.access, producer.epoch)

    def _wait_for_exclusive(self, index: int, step: Step) -> Answer:
        """A producer waits for exclusive access while others are attached; once they
        have all closed, it is promoted (at a new epoch)."""
        slot = step.ref % PRODUCER_SLOTS
        if slot in self.producers:
            self._detach(index, step)
        name = f"producer-{slot}"
        client = self.actors[step.actor].client
        with concurrent.futures.ThreadPoolExecutor(1) as waiting:
            promoted = waiting.submit(
                client.producer,
                EXCLUSIVE_TOPIC,
                idempotent=False,
                access="wait-exclusive",
                name=name,
                wait_timeout_s=SESSION_END_S,
            )
            if self.producers:  # it waits until they are gone
                wait_until(
                    lambda: any(
                        a.name == name for a in self.observer.topic_access(EXCLUSIVE_TOPIC).waiting
                    ),
                    SESSION_END_S,
                    message=f"{name} waits for exclusive access",
                )
            closed = sorted(self.producers)
            for other in closed:
                self.producers.pop(other)[1].close()
            producer = promoted.result(SESSION_END_S)
        self.producers[slot] = (step.actor, producer)
        if producer.epoch is not None:
            self.epochs[slot] = producer.epoch
        return (tuple(closed), producer.attachment_id, producer.access, producer.epoch)

    def _exclusive_send(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot not in self.producers:
            return ("no producer",)
        _, producer = self.producers[slot]
        return _appended(producer.send(self._values(index, step.count), partition=0))

    def _detach(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot not in self.producers:
            return ("no producer",)
        _, producer = self.producers.pop(slot)
        producer.close()
        return ("closed", slot)

    # transactions ----------------------------------------------------------------------

    def _txn_begin(self, index: int, step: Step) -> Answer:
        key = f"key-{step.ref % 4}" if step.flag else None
        info = self.actors[step.actor].client.txn_begin(step.group, key=key)
        self.txns.append(info.txn_id)
        return self._txn(info)

    def _txn_begin_produce(self, index: int, step: Step) -> Answer:
        topic, partition = TXN_TARGETS[step.partition]
        info, results = self.actors[step.actor].client.txn_begin_produce(
            TXN_GROUPS[step.ref % 2], topic, self._values(index, step.count), partition=partition
        )
        self.txns.append(info.txn_id)
        return (self._txn(info), _appended(results))

    def _pick_txn(self, step: Step) -> int | None:
        return self.txns[step.ref % len(self.txns)] if self.txns else None

    def _txn_produce(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        topic, partition = TXN_TARGETS[step.partition]
        results = self.actors[step.actor].client.produce(
            topic, self._values(index, step.count), partition=partition, txn=txn_id
        )
        return _appended(results)

    def _txn_join(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        member = self.actors[step.actor].client.txn_join(txn_id, MEMBERS[step.count % 2])
        self.members.append(member)
        return (
            self.ids.txn(member.txn_id),
            member.member,
            self.ids.pid(member.producer_id),
            member.generation,
            member.discarded,
        )

    def _member_produce(self, index: int, step: Step) -> Answer:
        if not self.members:
            return ("no member",)
        member = self.members[step.ref % len(self.members)]  # older joins are stale
        topic, partition = TXN_TARGETS[step.partition]
        results = self.actors[step.actor].client.produce(
            topic, self._values(index, step.count), partition=partition, producer=member.producer
        )
        return _appended(results)

    def _txn_commit(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        members = None  # "all": every member's records, as joined last
        joined = [m for m in self.members if m.txn_id == txn_id]
        if step.choice == "latest":  # as a coordinator names the attempts that succeeded
            members = {m.member: m.generation for m in joined}
        elif step.choice == "stale":  # an attempt that was joined again since
            members = {m.member: max(m.generation - 1, 1) for m in joined}
        return self._txn(self.actors[step.actor].client.txn_commit(txn_id, members=members))

    def _txn_abort(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        return self._txn(self.actors[step.actor].client.txn_abort(txn_id))

    def _txn_fenced_produce(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        partition = step.partition % 2
        fences = self._fences(step.actor, partition, step.choice)
        results = self.actors[step.actor].client.produce(
            FENCED_TOPIC,
            self._values(index, step.count),
            partition=partition,
            fences=fences,
            txn=txn_id,
        )
        return _appended(results)

    def _txn_show(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        detail = self.actors[step.actor].client.txn_show(txn_id)
        # at_ms is a clock reading; a body names topics by id, alike on both brokers
        journal = tuple((e.journal, e.position, e.kind, repr(e.body)) for e in detail.journal)
        return (self._txn(detail.info), journal, tuple(self._record(r) for r in detail.records))

    def _txn_keepalive(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        return self._txn(self.actors[step.actor].client.txn_keepalive(txn_id, 60_000))

    def _recreate_ledger(self, index: int, step: Step) -> Answer:
        """A topic transactions write to, deleted under them and created again."""
        client = self.actors[step.actor].client
        client.delete_topic(LEDGER_TOPIC)
        client.create_topic(LEDGER_TOPIC, TOPICS[LEDGER_TOPIC])
        return ("recreated",)

    def _read(self, index: int, step: Step) -> Answer:
        """One read three ways: fetch (from inside a batch too), stored rows, consume."""
        topic = (PLAIN_TOPIC, LEDGER_TOPIC, EXCLUSIVE_TOPIC, FENCED_TOPIC, KEYED_TOPIC)[
            step.ref % 5
        ]
        partition = step.partition % TOPICS[topic]
        client = self.actors[step.actor].client
        end = client.end_offsets(topic)[partition]
        start = step.ref % (end + 1)
        limit = 2 * step.count
        fetched = client.fetch(topic, {partition: start}, max_records=limit)
        rows = client.fetch_rows(topic, {partition: start}, max_records=limit)
        consumed = list(client.consume(topic, partition=partition, start=start, max_records=limit))
        ways = [fetched, records_of(topic, rows), consumed]
        if ARROW:
            ways.append(
                _arrow_records(client.fetch_arrow(topic, partition, start, max_records=limit))
            )
        return tuple(tuple(self._record(r) for r in way) for way in ways)

    def _keyed_produce(self, index: int, step: Step) -> Answer:
        """Keyed records into the compacted topic, as Arrow columns when flagged."""
        client = self.actors[step.actor].client
        values = self._values(index, step.count)
        keys = [f"k{(step.ref + n) % 3}".encode() for n in range(step.count)]
        if step.flag and ARROW:
            import pyarrow as pa

            batch = pa.table({"value": values, "key": keys})
            return tuple(
                map(
                    tuple,
                    (r.values() for r in client.produce_arrow(KEYED_TOPIC, batch).to_pylist()),
                )
            )
        records = [NewRecord(v, key=k) for v, k in zip(values, keys, strict=True)]
        return _appended(client.produce(KEYED_TOPIC, records))

    def _clean(self, index: int, step: Step) -> Answer:
        return (self.actors[step.actor].client.clean_topic(KEYED_TOPIC),)

    def _snapshot_producers(self, index: int, step: Step) -> Answer:
        return (self.actors[step.actor].client.snapshot_producers(),)

    def _commit_offsets(self, index: int, step: Step) -> Answer:
        offsets = {step.partition % 2: step.ref % 5}
        client = self.actors[step.actor].client
        client.commit_offsets(f"readers-{step.count}", PLAIN_TOPIC, offsets)
        return ("committed",)

    def _txn_commit_offsets(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        offsets = {step.partition % 2: step.ref % 7}
        client = self.actors[step.actor].client
        client.txn_commit_offsets(txn_id, f"readers-{step.count}", PLAIN_TOPIC, offsets)
        return ("journaled",)

    def _bad_input(self, index: int, step: Step) -> Answer:
        """A call a careless caller makes: both brokers must refuse it with the same code."""
        result = BAD_INPUTS[step.choice](self.actors[step.actor].client, self)
        if isinstance(result, Producer):  # accepted after all: let go at once
            epoch = result.epoch
            result.close()
            return ("attached", result.access, epoch)
        if isinstance(result, TxnInfo):
            return ("accepted", self._txn(result))
        return ("accepted", type(result).__name__)

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

    # values and state ------------------------------------------------------------------

    @staticmethod
    def _values(index: int, count: int) -> list[bytes]:
        return [f"step-{index}.{n}".encode() for n in range(count)]

    def state(self) -> dict[str, object]:
        """Everything the operations left behind, normalised."""
        observer = self.observer
        return {
            "logs": {topic: self._log(topic) for topic in TOPICS},
            "ownership": [
                (o.group, o.resource, o.generation, self.label(o.holder), o.holder_live)
                for o in observer.ownership()
            ],
            "audit": self._audit(),
            "txns": sorted(
                (self._txn(t) for t in observer.txn_list(include_ended=True, limit=10_000)),
                key=repr,
            ),
            "producers": {topic: self._producer_states(topic) for topic in TOPICS},
            "access": self._access(),
            "compacted": [self._record(r) for r in observer.read_compacted(PLAIN_TOPIC)],
            "offsets_for_times": [
                observer.offset_for_time(PLAIN_TOPIC, p, t)
                for p in range(TOPICS[PLAIN_TOPIC])
                for t in (0, 1_050, 1_150, 1_300, 10**13)
            ],
            "topics": [
                (t.name, t.partitions, t.owner_group, t.partition_details, t.config)
                for t in sorted(observer.list_topics(), key=lambda t: t.name)
            ],
            "consumer_groups": sorted(
                (g.group, g.topic, g.partition, g.next_offset) for g in observer.consumer_groups()
            ),
            "producer_snapshots": [
                # a snapshot's size depends on the pids' numbers and generations
                (r.snapshot_id, r.producers, r.evictions)
                for r in observer.producer_snapshots()
            ],
            "offsets": [
                observer.committed_offsets(f"readers-{count}", PLAIN_TOPIC)[0]
                for count in range(1, COUNT_MAX + 1)
            ],
        }

    def _audit(self) -> list[tuple[object, ...]]:
        rows = sorted(self.observer.ownership_history(limit=10_000), key=lambda a: a.audit_id)
        entries = [
            (
                a.group,
                a.resource,
                a.event,
                self.label(a.session_id),
                a.generation,
                a.requested,
                self.label(a.other),
            )
            for a in rows
        ]
        # One claim or release that severs several sessions audits them in the order of
        # their session ids, which differ between brokers: each such run is sorted.
        runs = itertools.groupby(entries, key=lambda e: (e[2] == "severed", e[6]))
        return [
            entry
            for (severed, _), run in runs
            for entry in (sorted(run, key=repr) if severed else run)
        ]

    def _log(self, topic: str) -> list[tuple[object, ...]]:
        partitions = {p: 0 for p in range(TOPICS[topic])}
        return [self._record(r) for r in _read_all(self.observer, topic, partitions)]

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

    def _producer_states(self, topic: str) -> list[tuple[object, ...]]:
        return sorted(
            (
                p,
                self.ids.pid(e.producer_id),
                self._relative(e.producer_id, e.generation),
                e.high_water_sequence,
                e.last_offset,
            )
            for p, e in self.observer.producer_states(topic)
        )

    def _access(self) -> tuple[object, ...]:
        access = self.observer.topic_access(EXCLUSIVE_TOPIC)
        attached = [access.exclusive] if access.exclusive is not None else []
        return (
            access.epoch,
            tuple(
                (a.attachment_id, self.label(a.session_id), a.name, str(a.mode), a.epoch, a.live)
                for a in [*attached, *access.shared, *access.waiting]
            ),
        )


def _arrow_records(batch: pa.RecordBatch) -> list[Record]:
    """An Arrow page's rows as Records, to be compared as any read is."""
    return [
        Record(
            row["topic"],
            row["partition"],
            row["offset"],
            int(row["timestamp"].timestamp() * 1000),
            row["key"],
            row["value"],
            tuple((h["key"], h["value"]) for h in row["headers"] or ()),
            row["producer_id"],
            row["generation"],
            row["sequence"],
            row["epoch"],
            row["txn_id"],
        )
        for row in batch.to_pylist()
    ]


def _read_all(client: Client, topic: str, positions: dict[int, int]) -> Iterator[Record]:
    ends = client.end_offsets(topic)
    for partition in positions:
        offset = 0
        while offset < ends[partition]:
            page = client.fetch(topic, {partition: offset})
            if not page:
                break
            yield from page
            offset = page[-1].offset + 1


def _appended(results: Sequence[AppendResult]) -> Answer:
    return tuple((r.topic, r.partition, r.offset, r.duplicate) for r in results)


def _known_txn(run: Run) -> int:
    return run.txns[-1] if run.txns else 1


BAD_INPUTS: dict[str, Callable[[Client, Run], object]] = {
    "own negative generation": lambda c, r: c.own(OWNER_GROUP, {RESOURCES[0]: -1}),
    "own empty group": lambda c, r: c.own("", [RESOURCES[0]]),
    "own empty resource": lambda c, r: c.own(OWNER_GROUP, [""]),
    "own no resources": lambda c, r: c.own(OWNER_GROUP, []),
    "release unknown group": lambda c, r: c.release("nobody", None),
    "release never claimed": lambda c, r: c.release(OWNER_GROUP, ["nothing/9"]),
    "produce missing partition": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], partition=7),
    "produce negative partition": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], partition=-1),
    "produce unknown topic": lambda c, r: c.produce("missing", [b"x"]),
    "produce no fence": lambda c, r: c.produce(FENCED_TOPIC, [b"x"], partition=0),
    "produce fence of unknown group": lambda c, r: c.produce(
        FENCED_TOPIC, [b"x"], partition=0, fences=[Fence("nobody", RESOURCES[0], 1)]
    ),
    "produce negative sequence": lambda c, r: c.produce(
        PLAIN_TOPIC, [b"x"], partition=0, producer=ProducerFields(1, 1, -5)
    ),
    "produce unleased pid": lambda c, r: c.produce(
        PLAIN_TOPIC, [b"x"], partition=0, producer=ProducerFields(99_999, 1, 1)
    ),
    "produce to unknown txn": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], txn=999_999),
    "produce txn and fence": lambda c, r: c.produce(
        FENCED_TOPIC, [b"x"], partition=0, txn=_known_txn(r)
    ),
    "fetch missing partition": lambda c, r: c.fetch(PLAIN_TOPIC, {5: 0}),
    "fetch past the end": lambda c, r: c.fetch(PLAIN_TOPIC, {0: 10_000}),
    "fetch negative offset": lambda c, r: c.fetch(PLAIN_TOPIC, {0: -3}),
    "lease missing partition": lambda c, r: c.lease_pid(PLAIN_TOPIC, 9),
    "lease unknown pid": lambda c, r: c.lease_pid(PLAIN_TOPIC, 0, 88_888),
    "lease unknown topic": lambda c, r: c.lease_pid("missing", 0),
    "commit unknown txn": lambda c, r: c.txn_commit(999_999),
    "abort unknown txn": lambda c, r: c.txn_abort(999_999),
    "commit in the wrong group": lambda c, r: c.txn_commit(_known_txn(r), group="elsewhere"),
    "join unknown txn": lambda c, r: c.txn_join(999_999, "m1"),
    "join empty member": lambda c, r: c.txn_join(_known_txn(r), ""),
    "begin empty group": lambda c, r: c.txn_begin(""),
    "begin zero timeout": lambda c, r: c.txn_begin("billing", timeout_ms=0),
    "commit unknown member": lambda c, r: c.txn_commit(_known_txn(r), members={"ghost": 1}),
    "offsets negative": lambda c, r: c.commit_offsets("readers", PLAIN_TOPIC, {0: -1}),
    "offsets missing partition": lambda c, r: c.commit_offsets("readers", PLAIN_TOPIC, {4: 1}),
    "attach bad access": lambda c, r: c.producer(EXCLUSIVE_TOPIC, idempotent=False, access="solo"),
    "attach unknown topic": lambda c, r: c.producer("missing", idempotent=False, access="shared"),
    "attach future epoch": lambda c, r: c.producer(
        EXCLUSIVE_TOPIC, idempotent=False, access="exclusive", epoch=50, wait_timeout_s=0
    ),
    "create existing topic": lambda c, r: c.create_topic(PLAIN_TOPIC, 2),
    "create zero partitions": lambda c, r: c.create_topic("zero", 0),
}
