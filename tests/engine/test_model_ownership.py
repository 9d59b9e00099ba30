"""Model-based tests of ownership (DESIGN.md section 3) through the Python client, against
an embedded broker and a served one.

A Hypothesis RuleBasedStateMachine opens several clients on one fresh broker (each client
is its own session) and drives them in random order: claims of one or two resources with
generations 0, 1, below, equal to, just above and far above the current one; releases of
the own claims or an operator's release of anyone's; clients closing; fenced writes to a
topic whose owner group enforces fences; fenced reads. Beside it, a plain reference model
(a dict of generations and holders, written from DESIGN.md section 3, not from the code)
says what every reply must be, and after every step the machine checks:

- each claim's reply: the generation granted (max(current + 1, g); 0 resets to 1; the
  holder claiming again at or below its generation keeps it), or the refusal
  (OWNED_BY_HIGHER_GENERATION with the current generation and the refused resources, and
  nothing granted), or SEVERED for an embedded session that was severed;
- who is severed: every other holder a claim displaces loses everything it held, in every
  group; served, that client is told so and goes on with a new session;
- `ownership()` lists exactly the model's generation, holder session and liveness of every
  resource ever granted, and generations never go back except through a reset;
- the audit rows each step adds (claimed, unchanged, reset, refused, severed, released);
- fences at the log: a write to partition P of the owner-group topic passes only with the
  current generation of TOPIC/P in that group while it has a live holder (so a severed
  session's fence is FENCED), and the log holds exactly the writes that passed.

Each example gets its own data directory; served, its own Server on 127.0.0.1 in a
thread. Every client, server thread and directory is closed or removed by the example.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.types import Fence
from support.models import MODEL_SETTINGS
from support.servers import ServerThread
from support.waiting import wait_until

OWNER_GROUP = "owners"  # the owner group of TOPIC: its writes need fences of this group
OTHER_GROUP = "others"  # the same resource names in another group: independent holdings
GROUPS = (OWNER_GROUP, OTHER_GROUP)
TOPIC = "journal"
PARTITIONS = 2
RESOURCES = tuple(f"{TOPIC}/{p}" for p in range(PARTITIONS))
CLIENTS_MAX = 6  # open at once, severed embedded ones included
UNSEVERED_MAX = 3  # open at once that can still claim
NOTICE_WITHIN_S = 5.0  # served: the severing push arrives at once; this is a bound
AUDIT_ROWS_MAX = 1_000

# A requested generation, relative to the resource's current generation.
GENERATION_CHOICES = ("zero", "one", "below", "equal", "next", "above")
# Which fence a write to or a read of partition P carries.
FENCE_CHOICES = ("none", "mine", "current", "stale", "other-partition", "other-group")

# (group, resource, event, session, generation, requested, other): one audit row
AuditEntry = tuple[str, str, str, str | None, int, int | None, str | None]
# (group, resource, generation, holder session, holder live): one row of ownership()
OwnershipEntry = tuple[str, str, int, str | None, bool]


@dataclass(eq=False)
class Actor:
    """One client of the machine, and what the model knows of it."""

    number: int
    client: Client
    session_id: str = ""
    severed: bool = False  # embedded: severed for good (every later claim is SEVERED)
    severings: int = 0  # how many times the broker severed one of its sessions
    severings_seen: int = 0  # severings when session_id was last looked at
    granted: dict[tuple[str, str], int] = field(default_factory=dict)  # its last claims
    told: list[str] = field(default_factory=list)  # what its on_severed callback heard

    def __repr__(self) -> str:
        return f"actor{self.number}"


@dataclass
class Holding:
    """The model of one (group, resource): generation 0 means never owned."""

    generation: int = 0
    holder: Actor | None = None


@dataclass(frozen=True)
class Grant:
    """The model's grant of one resource: the audit event, the generation, and the other
    holder it displaces (severed)."""

    resource: str
    kind: str  # "claimed", "unchanged" or "reset"
    generation: int
    other: Actor | None


@dataclass(frozen=True)
class Refusal:
    resource: str
    current: int
    holder: Actor


def told_of_severings(actor: Actor) -> Callable[[], bool]:
    return lambda: len(actor.told) >= actor.severings


class OwnershipMachine(RuleBasedStateMachine):
    """Several sessions claiming, releasing and closing, checked against DESIGN.md 3."""

    actors = Bundle("actors")
    served = False  # EmbeddedOwnership or ServedOwnership says

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        try:
            directory = Path(tempfile.mkdtemp(prefix="fencelog-model-own-"))
            self.stack.callback(shutil.rmtree, directory, ignore_errors=True)
            data_dir = directory / "data"
            if self.served:
                server = ServerThread(data_dir).start()
                self.stack.callback(server.stop)
                self.target = server.address
            else:
                self.target = str(data_dir)
            self.observer = self.connect()  # reads only: ownership, audit, the log
            self.observer.create_topic(TOPIC, partitions=PARTITIONS, owner_group=OWNER_GROUP)
        except BaseException:
            self.stack.close()
            raise
        self.holdings: dict[tuple[str, str], Holding] = {}
        self.open_actors: list[Actor] = []
        self.actors_opened = 0
        self.log: list[list[bytes]] = [[] for _ in range(PARTITIONS)]
        self.writes = 0
        self.expected_audit: list[AuditEntry] = []
        self.audit_seen = 0  # the newest audit_id already compared
        self.reset_now: set[tuple[str, str]] = set()  # reset by the step just run
        self.generations_seen: dict[tuple[str, str], int] = {}

    def teardown(self) -> None:
        self.stack.close()

    def connect(self) -> Client:
        client = connect(self.target, durability="normal")
        self.stack.callback(client.close)  # closing twice is harmless
        return client

    # the model: DESIGN.md section 3, written out plainly --------------------------------

    def holding(self, group: str, resource: str) -> Holding:
        return self.holdings.get((group, resource), Holding())

    def requested(self, group: str, resource: str, choice: str) -> int:
        current = self.holding(group, resource).generation
        return {
            "zero": 0,
            "one": 1,
            "below": max(1, current - 1),
            "equal": max(1, current),
            "next": current + 1,
            "above": current + 3,
        }[choice]

    def decide(
        self, actor: Actor, group: str, requested: dict[str, int]
    ) -> tuple[list[Grant], list[Refusal]]:
        """DESIGN.md 3, per resource, against the state before the claim."""
        grants: list[Grant] = []
        refusals: list[Refusal] = []
        for resource, g in requested.items():
            now = self.holding(group, resource)
            other = now.holder if now.holder not in (None, actor) else None
            if g == 0:  # always granted, resets to 1, severs any other holder
                grants.append(Grant(resource, "reset", 1, other))
            elif other is not None and now.generation > g:  # a live holder is higher
                refusals.append(Refusal(resource, now.generation, other))
            elif now.holder is actor and g <= now.generation:  # the holder again: no change
                grants.append(Grant(resource, "unchanged", now.generation, None))
            else:  # severs any other holder; max(current + 1, g)
                grants.append(Grant(resource, "claimed", max(now.generation + 1, g), other))
        return grants, refusals

    def sever(self, victim: Actor, by: Actor) -> None:
        """The broker severs victim's session: it releases all it holds, in every group."""
        for (group, resource), holding in sorted(self.holdings.items(), key=lambda kv: kv[0]):
            if holding.holder is victim:
                self.audit(group, resource, "severed", victim, holding.generation, None, by)
                holding.holder = None
        victim.severings += 1
        victim.severed = not self.served  # served, the client goes on with a new session

    def audit(
        self,
        group: str,
        resource: str,
        kind: str,
        session: Actor,
        generation: int,
        requested: int | None = None,
        other: Actor | None = None,
    ) -> None:
        """One audit row the step must add."""
        other_id = other.session_id if other is not None else None
        entry = (group, resource, kind, session.session_id, generation, requested, other_id)
        self.expected_audit.append(entry)

    def wait_for_notices(self, victims: set[Actor]) -> None:
        """Served: a severed client hears of it (a push) before it acts again, so that its
        next request goes on a new session instead of racing the closing connection."""
        if not self.served:
            return
        for victim in victims:
            wait_until(
                told_of_severings(victim),
                NOTICE_WITHIN_S,
                message=f"{victim} is told it was severed",
            )

    def refresh_session(self, actor: Actor) -> None:
        """The session the actor's next request runs in (served: a new one after a
        severing; embedded: the client's one session, registered on first use)."""
        session_id = actor.client.session_id
        if actor.session_id:
            if self.served and actor.severings > actor.severings_seen:
                # its connection was closed: it goes on in a new session
                assert session_id != actor.session_id, (actor, session_id)
            else:
                assert session_id == actor.session_id, (actor, session_id)
        actor.session_id = session_id
        actor.severings_seen = actor.severings

    # steps -----------------------------------------------------------------------------

    def open_actor(self) -> Actor:
        self.actors_opened += 1
        actor = Actor(self.actors_opened, self.connect())
        actor.client.on_severed(actor.told.append)
        self.open_actors.append(actor)
        return actor

    @initialize(target=actors)
    def two_clients(self) -> object:
        return multiple(self.open_actor(), self.open_actor())

    @precondition(
        lambda self: (
            len(self.open_actors) < CLIENTS_MAX
            and sum(not a.severed for a in self.open_actors) < UNSEVERED_MAX
        )
    )
    @rule(target=actors)
    def new_client(self) -> Actor:
        return self.open_actor()

    # Claims are the heart of it: two rules, so that they are drawn about twice as often.
    @rule(
        actor=actors,
        group=st.sampled_from(GROUPS),
        resource=st.sampled_from(RESOURCES),
        choice=st.sampled_from(GENERATION_CHOICES),
    )
    def own_one(self, actor: Actor, group: str, resource: str, choice: str) -> None:
        self.own(actor, group, [(resource, choice)])

    @rule(
        actor=actors,
        group=st.sampled_from(GROUPS),
        claims=st.lists(
            st.tuples(st.sampled_from(RESOURCES), st.sampled_from(GENERATION_CHOICES)),
            min_size=2,
            max_size=2,
            unique_by=lambda claim: claim[0],
        ),
    )
    def own_several(self, actor: Actor, group: str, claims: list[tuple[str, str]]) -> None:
        self.own(actor, group, claims)

    def own(self, actor: Actor, group: str, claims: list[tuple[str, str]]) -> None:
        """One claim request, all or nothing, checked against the model's decision."""
        self.refresh_session(actor)
        requested = {r: self.requested(group, r, choice) for r, choice in claims}
        if actor.severed:  # embedded: a severed session never claims again
            with pytest.raises(BrokerError) as caught:
                actor.client.own(group, requested)
            assert caught.value.code is ErrorCode.SEVERED, caught.value
            event("own: SEVERED")
            return

        grants, refusals = self.decide(actor, group, requested)
        if refusals:
            with pytest.raises(BrokerError) as caught:
                actor.client.own(group, requested)
            error = caught.value
            assert error.code is ErrorCode.OWNED_BY_HIGHER_GENERATION, error
            assert error.details["generation"] == refusals[0].current, error.details
            assert list(error.details["refused"]) == [r.resource for r in refusals], error.details
            for refusal in refusals:
                self.audit(
                    group,
                    refusal.resource,
                    "refused",
                    actor,
                    refusal.current,
                    requested[refusal.resource],
                    refusal.holder,
                )
            event("own: OWNED_BY_HIGHER_GENERATION")
            return

        claimed = actor.client.own(group, requested)
        assert [(c.group, c.resource, c.generation) for c in claimed] == [
            (group, g.resource, g.generation) for g in grants
        ], (claimed, grants)
        victims = {g.other for g in grants if g.other is not None}
        for victim in sorted(victims, key=lambda v: v.session_id):
            self.sever(victim, actor)
        for g in grants:
            event(f"own: {g.kind}" + (", severing" if g.other is not None else ""))
            self.audit(
                group, g.resource, g.kind, actor, g.generation, requested[g.resource], g.other
            )
            if g.kind != "unchanged":
                self.holdings[group, g.resource] = Holding(g.generation, actor)
            if g.kind == "reset":
                self.reset_now.add((group, g.resource))
            actor.granted[group, g.resource] = g.generation
        self.wait_for_notices(victims)

    @precondition(lambda self: bool(self.holdings))  # else UNKNOWN_GROUP, every time
    @rule(
        actor=actors,
        group=st.sampled_from(GROUPS),
        named=st.one_of(
            st.none(), st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2, unique=True)
        ),
        any_holder=st.booleans(),
    )
    def release(self, actor: Actor, group: str, named: list[str] | None, any_holder: bool) -> None:
        self.refresh_session(actor)
        ever = {r for (g, r) in self.holdings if g == group}
        holders = {
            r: h.holder
            for (g, r), h in self.holdings.items()
            if g == group and h.holder is not None and (any_holder or h.holder is actor)
        }
        wanted = sorted(holders) if named is None else sorted(set(named))
        missing = [r for r in wanted if r not in holders]
        expected = None
        if not ever:
            expected = ErrorCode.UNKNOWN_GROUP
        elif missing or not wanted:
            expected = ErrorCode.NOT_HELD
        if expected is not None:
            with pytest.raises(BrokerError) as caught:
                actor.client.release(group, named, any_holder=any_holder)
            assert caught.value.code is expected, caught.value
            event(f"release: {expected.name}")
            if expected is ErrorCode.NOT_HELD:
                assert list(caught.value.details["resources"]) == missing, caught.value
            return

        released = actor.client.release(group, named, any_holder=any_holder)
        assert released == wanted
        victims = {holders[r] for r in wanted} - {actor}
        event("release: another's claim, severing" if victims else "release: own claims")
        for victim in sorted(victims, key=lambda v: v.session_id):
            self.sever(victim, actor)  # an operator's release severs the other holder
        for resource in wanted:
            holding = self.holdings[group, resource]
            if holding.holder is actor:
                self.audit(group, resource, "released", actor, holding.generation)
                holding.holder = None  # the generation stays
        self.wait_for_notices(victims)

    @precondition(lambda self: len(self.open_actors) > 2)  # else clients mostly churn
    @rule(actor=consumes(actors))
    def close(self, actor: Actor) -> None:
        """A session that ends releases everything it holds; generations stay."""
        held = sorted(k for k, h in self.holdings.items() if h.holder is actor)
        event("close: releasing" if held else "close: holding nothing")
        actor.client.close()
        self.open_actors.remove(actor)
        for group, resource in held:
            holding = self.holdings[group, resource]
            self.audit(group, resource, "released", actor, holding.generation)
            holding.holder = None
        if held and self.served:
            # The server ends the session just after the goodbye. The ownership view hides
            # a holder as soon as its connection is gone, before the release is written:
            # wait for the release's audit rows, which come in the same transaction.
            wait_until(
                lambda: self.released_rows(actor) == len(held),
                NOTICE_WITHIN_S,
                message=f"the closed {actor}'s session released what it held",
            )

    def released_rows(self, actor: Actor) -> int:
        rows = self.observer.ownership_history(None, limit=AUDIT_ROWS_MAX)
        return sum(
            1
            for r in rows
            if r.audit_id > self.audit_seen
            and r.event == "released"
            and r.session_id == actor.session_id
        )

    def fence_for(self, actor: Actor, partition: int, choice: str) -> list[Fence]:
        resource = RESOURCES[partition]
        current = self.holding(OWNER_GROUP, resource).generation
        if choice == "none":
            return []
        if choice == "mine":
            return [Fence(OWNER_GROUP, resource, actor.granted.get((OWNER_GROUP, resource), 1))]
        if choice == "current":
            return [Fence(OWNER_GROUP, resource, current)]
        if choice == "stale":
            return [Fence(OWNER_GROUP, resource, max(0, current - 1))]
        if choice == "other-partition":
            other = RESOURCES[(partition + 1) % PARTITIONS]
            return [Fence(OWNER_GROUP, other, self.holding(OWNER_GROUP, other).generation)]
        assert choice == "other-group"
        return [Fence(OTHER_GROUP, resource, self.holding(OTHER_GROUP, resource).generation)]

    def passes(self, partition: int, fences: list[Fence]) -> bool:
        """A fence passes when it is the current generation of a resource with a live
        holder; a write to partition P of the owner-group topic needs P's fence."""
        for fence in fences:
            holding = self.holding(fence.group, fence.resource)
            if fence.generation != holding.generation or holding.holder is None:
                return False
        return any(f.group == OWNER_GROUP and f.resource == RESOURCES[partition] for f in fences)

    @rule(
        actor=actors,
        partition=st.integers(0, PARTITIONS - 1),
        choice=st.sampled_from(FENCE_CHOICES),
    )
    def fenced_write(self, actor: Actor, partition: int, choice: str) -> None:
        fences = self.fence_for(actor, partition, choice)
        value = f"w{self.writes}".encode()
        self.writes += 1
        if not self.passes(partition, fences):
            with pytest.raises(BrokerError) as caught:
                actor.client.produce(TOPIC, [value], partition=partition, fences=fences)
            assert caught.value.code is ErrorCode.FENCED, (caught.value, fences)
            event(f"write with fence {choice}: FENCED")
            return
        event(f"write with fence {choice}: appended")
        [result] = actor.client.produce(TOPIC, [value], partition=partition, fences=fences)
        assert (result.partition, result.offset) == (partition, len(self.log[partition]))
        self.log[partition].append(value)

    @rule(
        actor=actors,
        partition=st.integers(0, PARTITIONS - 1),
        choice=st.sampled_from(FENCE_CHOICES[1:]),
    )
    def fenced_read(self, actor: Actor, partition: int, choice: str) -> None:
        fences = self.fence_for(actor, partition, choice)
        # A read needs every fence it carries to be current; the partition's own fence is
        # not required (the owner group guards writes).
        current = all(
            f.generation == self.holding(f.group, f.resource).generation
            and self.holding(f.group, f.resource).holder is not None
            for f in fences
        )
        if not current:
            with pytest.raises(BrokerError) as caught:
                actor.client.fetch(TOPIC, {partition: 0}, fences=fences)
            assert caught.value.code is ErrorCode.FENCED, (caught.value, fences)
            event(f"read with fence {choice}: FENCED")
            return
        event(f"read with fence {choice}: read")
        records = actor.client.fetch(TOPIC, {partition: 0}, fences=fences)
        assert [r.value for r in records] == self.log[partition]

    # what the broker shows after every step ----------------------------------------------

    def broker_ownership(self) -> list[OwnershipEntry]:
        return sorted(
            (r.group, r.resource, r.generation, r.holder, r.holder_live)
            for r in self.observer.ownership()
        )

    @invariant()
    def ownership_is_the_models(self) -> None:
        expected = sorted(
            (
                group,
                resource,
                h.generation,
                h.holder.session_id if h.holder is not None else None,
                h.holder is not None,  # every holder the model keeps is a live session
            )
            for (group, resource), h in self.holdings.items()
        )
        assert self.broker_ownership() == expected

    @invariant()
    def generations_go_back_only_by_a_reset(self) -> None:
        for group, resource, generation, _, _ in self.broker_ownership():
            before = self.generations_seen.get((group, resource), 0)
            if generation < before:
                assert (group, resource) in self.reset_now, (group, resource, before, generation)
            self.generations_seen[group, resource] = generation
        self.reset_now.clear()

    @invariant()
    def the_audit_log_has_the_steps_rows(self) -> None:
        rows = self.observer.ownership_history(None, limit=AUDIT_ROWS_MAX)
        added = [r for r in rows if r.audit_id > self.audit_seen]
        self.audit_seen = max([r.audit_id for r in rows], default=self.audit_seen)
        found = sorted(
            (
                (r.group, r.resource, r.event, r.session_id, r.generation, r.requested, r.other)
                for r in added
            ),
            key=repr,
        )
        assert found == sorted(self.expected_audit, key=repr), (found, self.expected_audit)
        self.expected_audit.clear()

    @invariant()
    def the_log_holds_the_writes_that_passed(self) -> None:
        assert self.observer.end_offsets(TOPIC) == [len(p) for p in self.log]
        for partition, values in enumerate(self.log):
            records = self.observer.fetch(TOPIC, {partition: 0})
            assert [r.value for r in records] == values

    @invariant()
    def severed_clients_are_told(self) -> None:
        for actor in self.open_actors:
            if self.served:  # a push per severing, before the client's next request
                assert len(actor.told) == actor.severings, (actor, actor.told)
            else:  # the heartbeat notices, once, within a second or so
                assert len(actor.told) <= min(actor.severings, 1), (actor, actor.told)


class EmbeddedOwnership(OwnershipMachine):
    """Every client opens the data directory in this process: a session per client."""

    served = False


class ServedOwnership(OwnershipMachine):
    """Every client connects to one Server on 127.0.0.1: a session per connection."""

    served = True


TestEmbeddedOwnership = EmbeddedOwnership.TestCase
TestEmbeddedOwnership.settings = MODEL_SETTINGS
TestServedOwnership = ServedOwnership.TestCase
TestServedOwnership.settings = MODEL_SETTINGS

pytestmark = pytest.mark.usefixtures("no_thread_is_left")
