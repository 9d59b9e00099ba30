"""Kafka's new consumer group protocol (KIP-848: ConsumerGroupHeartbeat), beside the
classic one (groups.py).

The broker assigns: each member says in its heartbeats what it subscribes to (topic
names or a pattern) and which partitions it holds, and is answered its member epoch
and, when it changes, the partitions it may use. Like the classic groups, this is soft
state in memory (a restart answers UNKNOWN_MEMBER_ID and members join again); the
committed offsets are fencelog's group offsets.

- The group epoch goes up whenever membership, a subscription or a subscribed topic's
  partitions change (checked at every heartbeat; a new subscription pattern is
  resolved after the heartbeat that brought it, so its topics come in the next); the
  assignor (`uniform`, sticky and balanced, the default; or `range`) then computes
  every member's target assignment for that epoch.
- Incremental, revoke before assign: a member that holds partitions its target does not
  include is first answered its assignment without them and keeps its epoch; once a
  heartbeat says it gave them up, it moves to the group's assignment epoch. A partition
  is handed to its new owner only when no other member holds it, so no partition is
  ever held by two members. A member that does not give its partitions up within its
  rebalance timeout is removed, as one that sends no heartbeat within the session
  timeout is.
- Member epochs fence: a heartbeat or commit with another epoch than the member's is
  FENCED_MEMBER_EPOCH (heartbeat) or STALE_MEMBER_EPOCH (commit); the member joins
  again at epoch 0.
- Static members (group.instance.id) leave for now with epoch -2: their partitions stay
  theirs until the session timeout, and the same instance id joining again takes them
  back without a rebalance. A second live member with that id is UNRELEASED_INSTANCE_ID.
- A group with members is of one protocol: a heartbeat to a classic group with
  members is GROUP_ID_NOT_FOUND, a JoinGroup to a consumer group with members is
  INCONSISTENT_GROUP_PROTOCOL (groups.py); an empty group of either kind gives way.
  Kafka answers so when it cannot mix them; Kafka 4.0's default migration policy also
  lets classic members into a consumer group and converts groups between the
  protocols (KIP-848's online upgrade), which is not done here.

Topics are named by Kafka topic ids here (topic_ids.py), so a re-created topic of the
same name is another topic to the assignor.

States, as Kafka names a consumer group's: Empty (no members), Reconciling (some
member does not hold its target yet), Stable.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from broker.core.ownership import check_name
from broker.errors import BrokerError
from broker.kafka import wire

# Kafka's broker defaults are 5 s and 45 s (group.consumer.heartbeat.interval.ms,
# group.consumer.session.timeout.ms); a local broker's members hear of a rebalance
# sooner with a shorter interval, which costs one small request a second each.
HEARTBEAT_INTERVAL_MS: Final = 1_000
SESSION_TIMEOUT_MS: Final = 45_000
EXPIRY_CHECK_S: Final = 0.5
ASSIGNORS: Final = ("uniform", "range")
JOIN: Final = 0
LEAVE: Final = -1
LEAVE_STATIC: Final = -2

# Kafka error codes of this protocol (Errors.java)
FENCED_MEMBER_EPOCH: Final = 110
UNRELEASED_INSTANCE_ID: Final = 111
UNSUPPORTED_ASSIGNOR: Final = 112
STALE_MEMBER_EPOCH: Final = 113
INVALID_REGULAR_EXPRESSION: Final = 130

TopicPartition = tuple[uuid.UUID, int]
TopicsView = dict[str, tuple[uuid.UUID, int]]  # name: (Kafka topic id, partitions)


@dataclass(slots=True)
class Subscription:
    names: tuple[str, ...] = ()
    pattern: str | None = None

    def topics(self, topics: TopicsView, patterns: set[str]) -> set[uuid.UUID]:
        """The subscribed topics' ids: the names, and the pattern's matches once the
        group has resolved it (patterns)."""
        found = {topics[name][0] for name in self.names if name in topics}
        if self.pattern is not None and self.pattern in patterns:
            compiled = _compile(self.pattern)
            if compiled is not None:
                found |= {tid for name, (tid, _) in topics.items() if compiled.fullmatch(name)}
        return found


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rack_id: str | None
    rebalance_timeout_s: float
    subscription: Subscription
    assignor: str | None
    last_seen: float
    epoch: int = 0
    previous_epoch: int = -1
    assigned: frozenset[TopicPartition] = frozenset()
    revoking_since: float | None = None
    away: bool = False  # a static member that left for now (epoch -2)
    answered: tuple[int, frozenset[TopicPartition]] | None = None


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ASSIGNORS[0]
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id: member id
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    topics: TopicsView = field(default_factory=dict)  # as the last heartbeat saw them
    patterns: set[str] = field(default_factory=set)  # the resolved subscription patterns
    subscribed: frozenset[TopicPartition] = frozenset()

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        for member in self.members.values():
            if member.epoch != self.assignment_epoch or member.assigned != self.target.get(
                member.member_id, frozenset()
            ):
                return "Reconciling"
        return "Stable"

    def names(self) -> dict[uuid.UUID, str]:
        return {tid: name for name, (tid, _) in self.topics.items()}


@dataclass(slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request, as the coordinator takes it (None: unchanged)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topic_names: list[str] | None = None
    topic_regex: str | None = None
    assignor: str | None = None
    owned: list[tuple[uuid.UUID, list[int]]] | None = None


@dataclass(slots=True)
class HeartbeatResult:
    error: int
    message: str | None = None
    member_id: str | None = None
    epoch: int = -1
    assignment: list[tuple[uuid.UUID, list[int]]] | None = None
    interval_ms: int = HEARTBEAT_INTERVAL_MS


class ConsumerGroups:
    """Every KIP-848 consumer group of one listener. classic_members(group) says how
    many members the classic group of that id has (groups.py); forget_classic(group)
    drops an empty classic group of that id when a consumer group takes it over."""

    def __init__(
        self,
        classic_members: Callable[[str], int],
        forget_classic: Callable[[str], None],
        *,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> None:
        self._classic_members = classic_members
        self._forget_classic = forget_classic
        self.session_timeout_s = session_timeout_ms / 1000
        self.groups: dict[str, ConsumerGroup] = {}
        self._expiry: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire(), name="kafka-consumer-group-expiry")

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry

    def live(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    # ConsumerGroupHeartbeat -----------------------------------------------------------

    async def heartbeat(
        self,
        request: Heartbeat,
        client_id: str,
        client_host: str,
        topics: Callable[[], Awaitable[TopicsView]],
    ) -> HeartbeatResult:
        refused = self._refused(request)
        if refused is not None:
            return refused
        view = await topics()
        now = asyncio.get_running_loop().time()
        group_id = request.group_id
        group = self.groups.get(group_id)
        if group is None:
            self._forget_classic(group_id)
            group = self.groups[group_id] = ConsumerGroup(group_id)
        group.topics = view
        group.patterns &= _patterns(group)  # a pattern no member subscribes to is dropped
        if request.member_epoch in (LEAVE, LEAVE_STATIC):
            return self._leave(group, request)
        if request.member_epoch == JOIN:
            joined = self._join(group, request, client_id, client_host, now)
            if isinstance(joined, HeartbeatResult):
                return joined
            member = joined
        else:
            found = self._current(group, request)
            if isinstance(found, HeartbeatResult):
                return found
            member = found
            self._update(group, member, request)
        member.last_seen = now
        self._refresh(group)
        owned = None if request.owned is None else _partitions(request.owned)
        usable = self._reconcile(group, member, owned, now)
        # A new pattern is resolved after this heartbeat, as Kafka resolves patterns in
        # the background: its topics come in a later one (librdkafka's tests expect
        # a subscription of a name and a pattern to be assigned the name's first).
        group.patterns |= _patterns(group)
        state = (member.epoch, usable)
        assignment = None
        if member.answered != state or request.member_epoch == JOIN:
            assignment = _listed(usable)
            member.answered = state
        return HeartbeatResult(
            wire.NONE, member_id=member.member_id, epoch=member.epoch, assignment=assignment
        )

    def _refused(self, request: Heartbeat) -> HeartbeatResult | None:  # noqa: PLR0911

        if not valid_group_id(request.group_id):  # one rule for both protocols
            return HeartbeatResult(wire.INVALID_GROUP_ID, f"{request.group_id!r} names no group")
        if self._classic_members(request.group_id):
            return HeartbeatResult(
                wire.GROUP_ID_NOT_FOUND,
                f"group {request.group_id} is a classic group with members, not a consumer group",
            )
        if request.member_epoch < LEAVE_STATIC:
            return HeartbeatResult(wire.INVALID_REQUEST, "a member epoch below -2")
        if request.member_epoch == LEAVE_STATIC and request.instance_id is None:
            return HeartbeatResult(wire.INVALID_REQUEST, "epoch -2 without a group.instance.id")
        if request.member_epoch == JOIN:
            if request.rebalance_timeout_ms < 0:
                return HeartbeatResult(wire.INVALID_REQUEST, "a join without a rebalance timeout")
            if request.topic_names is None and request.topic_regex is None:
                return HeartbeatResult(wire.INVALID_REQUEST, "a join without a subscription")
        if request.assignor is not None and request.assignor not in ASSIGNORS:
            return HeartbeatResult(
                UNSUPPORTED_ASSIGNOR,
                f"assignor {request.assignor!r} is not one of {', '.join(ASSIGNORS)}",
            )
        if request.topic_regex is not None and _compile(request.topic_regex) is None:
            return HeartbeatResult(
                INVALID_REGULAR_EXPRESSION, f"{request.topic_regex!r} is not a pattern"
            )
        return None

    def _join(
        self,
        group: ConsumerGroup,
        request: Heartbeat,
        client_id: str,
        client_host: str,
        now: float,
    ) -> ConsumerMember | HeartbeatResult:
        member_id = request.member_id or str(uuid.uuid4())
        member = ConsumerMember(
            member_id,
            request.instance_id,
            client_id,
            client_host,
            request.rack_id,
            request.rebalance_timeout_ms / 1000,
            Subscription(tuple(request.topic_names or ()), request.topic_regex),
            request.assignor,
            now,
        )
        instance = request.instance_id
        holder_id = None if instance is None else group.static_members.get(instance)
        holder = None if holder_id is None else group.members.get(holder_id)
        if holder is not None and holder.member_id != member_id:
            if not holder.away:
                return HeartbeatResult(
                    UNRELEASED_INSTANCE_ID,
                    f"group.instance.id {instance} is held by a live member",
                )
            # a static member back: its place, epoch and partitions, no rebalance
            del group.members[holder.member_id]
            member.epoch, member.assigned = holder.epoch, holder.assigned
            group.target[member_id] = group.target.pop(holder.member_id, frozenset())
            group.members[member_id] = member
            group.static_members[instance] = member_id  # type: ignore[index]
            if member.subscription != holder.subscription or member.assignor != holder.assignor:
                self._bump(group)
            return member
        old = group.members.pop(member_id, None)
        if old is not None:  # a join again (its answer was lost): it holds nothing now
            group.target.pop(member_id, None)
        group.members[member_id] = member
        if instance is not None:
            group.static_members[instance] = member_id
        self._bump(group)
        return member

    def _current(
        self, group: ConsumerGroup, request: Heartbeat
    ) -> ConsumerMember | HeartbeatResult:
        member = group.members.get(request.member_id)
        if member is None:
            return HeartbeatResult(
                wire.UNKNOWN_MEMBER_ID, f"member {request.member_id} is not in the group"
            )
        owned = None if request.owned is None else _partitions(request.owned)
        if request.member_epoch != member.epoch and not (
            request.member_epoch == member.previous_epoch
            and owned is not None
            and owned <= member.assigned
        ):
            return HeartbeatResult(
                FENCED_MEMBER_EPOCH,
                f"epoch {request.member_epoch} is not the member's ({member.epoch})",
            )
        member.away = False
        return member

    def _update(self, group: ConsumerGroup, member: ConsumerMember, request: Heartbeat) -> None:
        changed = False
        if request.topic_names is not None or request.topic_regex is not None:
            subscription = Subscription(
                tuple(request.topic_names or ())
                if request.topic_names is not None
                else member.subscription.names,
                request.topic_regex
                if request.topic_regex is not None
                else member.subscription.pattern,
            )
            if request.topic_regex == "":
                subscription.pattern = None
            changed = subscription != member.subscription
            member.subscription = subscription
        if request.assignor is not None and request.assignor != member.assignor:
            member.assignor = request.assignor
            changed = True
        if request.rebalance_timeout_ms >= 0:
            member.rebalance_timeout_s = request.rebalance_timeout_ms / 1000
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        if changed:
            self._bump(group)

    def _leave(self, group: ConsumerGroup, request: Heartbeat) -> HeartbeatResult:
        member_id = request.member_id
        if request.instance_id is not None:
            member_id = group.static_members.get(request.instance_id, member_id)
        member = group.members.get(member_id)
        if member is None:
            return HeartbeatResult(
                wire.UNKNOWN_MEMBER_ID, f"member {request.member_id} is not in the group"
            )
        if request.member_epoch == LEAVE_STATIC:
            member.away = True  # its partitions wait for it until the session timeout
            return HeartbeatResult(wire.NONE, member_id=member_id, epoch=LEAVE_STATIC)
        self._remove(group, member)
        return HeartbeatResult(wire.NONE, member_id=member_id, epoch=LEAVE)

    def _remove(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        instance = member.instance_id
        if instance is not None and group.static_members.get(instance) == member.member_id:
            del group.static_members[instance]
        self._bump(group)

    # assignment -----------------------------------------------------------------------

    def _bump(self, group: ConsumerGroup) -> None:
        group.epoch += 1
        self._assign(group)

    def _refresh(self, group: ConsumerGroup) -> None:
        """A new group epoch when the subscribed topics' partitions changed."""
        subscribed = frozenset(
            (tid, p)
            for tid in _subscribed_topics(group)
            for p in range(_partition_count(group.topics, tid))
        )
        if subscribed != group.subscribed:
            group.subscribed = subscribed
            self._bump(group)

    def _assign(self, group: ConsumerGroup) -> None:
        wanted = Counter(m.assignor for m in group.members.values() if m.assignor is not None)
        group.assignor = wanted.most_common(1)[0][0] if wanted else ASSIGNORS[0]
        counts = {tid: n for _, (tid, n) in group.topics.items()}
        subscriptions = {
            m.member_id: {
                tid for tid in m.subscription.topics(group.topics, group.patterns) if tid in counts
            }
            for m in group.members.values()
        }
        assign = _range if group.assignor == "range" else _uniform
        group.target = assign(subscriptions, counts, group.target)
        group.subscribed = frozenset(
            (tid, p) for tid in _subscribed_topics(group) for p in range(counts.get(tid, 0))
        )
        group.assignment_epoch = group.epoch

    def _reconcile(
        self,
        group: ConsumerGroup,
        member: ConsumerMember,
        owned: frozenset[TopicPartition] | None,
        now: float,
    ) -> frozenset[TopicPartition]:
        """Move member toward its target: first give up what it must, then take what no
        other member holds any more. What the member may use now is returned."""
        target = group.target.get(member.member_id, frozenset())
        keep = member.assigned & target
        revoke = member.assigned - target
        if revoke and owned is not None and not owned & revoke:
            member.assigned = keep  # the member says it gave them up
            revoke = frozenset()
        if revoke:
            if member.revoking_since is None:
                member.revoking_since = now
            return keep  # at its current epoch, until it says it gave the rest up
        member.revoking_since = None
        if member.epoch != group.assignment_epoch:
            member.previous_epoch = member.epoch
            member.epoch = group.assignment_epoch
        held: set[TopicPartition] = set()
        for other in group.members.values():
            if other is not member:
                held |= other.assigned
        member.assigned = keep | frozenset(tp for tp in target if tp not in held)
        return member.assigned

    # commits --------------------------------------------------------------------------

    def check_commit(self, group_id: str, member_epoch: int, member_id: str) -> int:
        """Whether a commit to a consumer group is taken now (a Kafka error code)."""
        group = self.groups.get(group_id)
        if member_epoch < 0 and (group is None or not group.members):
            return wire.NONE  # a consumer assigning its own partitions, or an admin
        member = None if group is None else group.members.get(member_id)
        if member is None:
            return wire.UNKNOWN_MEMBER_ID
        if member_epoch != member.epoch:
            return STALE_MEMBER_EPOCH
        return wire.NONE

    def check_fetch(self, group_id: str, member_epoch: int, member_id: str | None) -> int:
        """An OffsetFetch v9+ that names a member: it must be current (Kafka's rule)."""
        if member_id is None:
            return wire.NONE
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if member is None:
            return wire.UNKNOWN_MEMBER_ID
        if member_epoch >= 0 and member_epoch != member.epoch:
            return STALE_MEMBER_EPOCH
        return wire.NONE

    # expiry ---------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Remove each member whose session timed out, or that held partitions past its
        rebalance timeout."""
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                silent = now - member.last_seen > self.session_timeout_s
                stuck = (
                    member.revoking_since is not None
                    and now - member.revoking_since > member.rebalance_timeout_s
                )
                if silent or stuck:
                    self._remove(group, member)

    async def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            self.expire(loop.time())


def _compile(pattern: str) -> re.Pattern[str] | None:
    """A subscription pattern (Kafka's are RE2/J; Python's re reads the common ones)."""
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _subscribed_topics(group: ConsumerGroup) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    for member in group.members.values():
        found |= member.subscription.topics(group.topics, group.patterns)
    return found


def _patterns(group: ConsumerGroup) -> set[str]:
    return {m.subscription.pattern for m in group.members.values() if m.subscription.pattern}


def _partition_count(topics: TopicsView, tid: uuid.UUID) -> int:
    for found, count in topics.values():
        if found == tid:
            return count
    return 0


def _partitions(listed: Iterable[tuple[uuid.UUID, list[int]]]) -> frozenset[TopicPartition]:
    return frozenset((tid, p) for tid, parts in listed for p in parts)


def _listed(partitions: Iterable[TopicPartition]) -> list[tuple[uuid.UUID, list[int]]]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for tid, p in sorted(partitions):
        by_topic.setdefault(tid, []).append(p)
    return list(by_topic.items())


def _uniform(
    subscriptions: dict[str, set[uuid.UUID]],
    counts: dict[uuid.UUID, int],
    previous: dict[str, frozenset[TopicPartition]],
) -> dict[str, frozenset[TopicPartition]]:
    """Balanced and sticky: each member keeps what it had, up to its share, and the
    rest goes to the subscribed member with the fewest partitions."""
    members = sorted(subscriptions)
    partitions = sorted(
        {(tid, p) for subs in subscriptions.values() for tid in subs for p in range(counts[tid])}
    )
    if not members:
        return {}
    share = -(-len(partitions) // len(members))
    target: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member in members:
        for tp in sorted(previous.get(member, frozenset())):
            wanted = tp[0] in subscriptions[member] and tp[1] < counts.get(tp[0], 0)
            if wanted and len(target[member]) < share and tp not in taken:
                target[member].add(tp)
                taken.add(tp)
    for tp in partitions:
        if tp in taken:
            continue
        candidates = [m for m in members if tp[0] in subscriptions[m]]
        chosen = min(candidates, key=lambda m: (len(target[m]), m))
        target[chosen].add(tp)
    return {m: frozenset(parts) for m, parts in target.items()}


def _range(
    subscriptions: dict[str, set[uuid.UUID]],
    counts: dict[uuid.UUID, int],
    previous: dict[str, frozenset[TopicPartition]],
) -> dict[str, frozenset[TopicPartition]]:
    """Each topic's partitions in contiguous ranges over its subscribers, in member id
    order (the first ones get one more when they do not divide evenly)."""
    target: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for tid in sorted({tid for subs in subscriptions.values() for tid in subs}):
        subscribers = sorted(m for m, subs in subscriptions.items() if tid in subs)
        base, extra = divmod(counts[tid], len(subscribers))
        start = 0
        for index, member in enumerate(subscribers):
            size = base + (1 if index < extra else 0)
            target[member] |= {(tid, p) for p in range(start, start + size)}
            start += size
    return {m: frozenset(parts) for m, parts in target.items()}


def valid_group_id(group_id: str) -> bool:
    """Whether group_id can name a group: its generations are ownership generations of
    the resource `<group>`, named as ownership names are (a Kafka group id of another
    character, such as a NUL, would fail the claim of its first generation)."""
    try:
        check_name("consumer group", group_id)
    except BrokerError:
        return False
    return True
