"""Kafka's consumer group coordinator (the classic JoinGroup/SyncGroup protocol; the
consumer protocol of KIP-848 is groups_consumer.py's, one name space with these).

A group's members and their assignments live here, in memory, as soft state that
clients rebuild by joining again (Kafka keeps them in its offsets topic, so a restart
costs its groups no rebalance; here each member's next request after a restart is
UNKNOWN_MEMBER_ID, and it joins again). What must survive is elsewhere:
committed offsets in fencelog's group offsets, and the generation in fencelog's
ownership table. Each completed rebalance claims the resource `<group>` of the ownership
group `kafka` for a new session, which gives a generation one above the last one ever
given, across restarts. OffsetCommit takes effect only from a member of the current
generation of a stable group, so a zombie (a member that missed a rebalance, or one the
coordinator expired) is refused.

Static membership (KIP-345): a member that joins with a group.instance.id keeps that
id's place. Joining again with the id and no member id (a restart) takes over the
member id's assignment; in a stable group that speaks the same protocols this needs no
rebalance (the answer is the current generation, naming the old leader, so the member
assigns nothing, and its SyncGroup gets its old assignment). The incarnation replaced,
and any request naming the instance id with another member id, is FENCED_INSTANCE_ID.

States, as Kafka names them:
    Empty --join--> PreparingRebalance --all joined or rebalance timeout-->
    CompletingRebalance --leader's SyncGroup--> Stable --join, leave or expiry-->
    PreparingRebalance ...
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from broker.kafka import wire
from broker.kafka.groups_consumer import ConsumerGroups, valid_group_id

log = logging.getLogger("fencelog.kafka")

EXPIRY_CHECK_S: Final = 0.5
EXPIRY_MARGIN_S: Final = 0.001  # past a deadline, so that it has passed when checked
# A new group waits this long for more members before its first generation (Kafka's
# group.initial.rebalance.delay.ms, shorter: a local broker's consumers start together).
INITIAL_DELAY_S: Final = 0.3
SESSION_TIMEOUT_MS_RANGE: Final = (1_000, 300_000)


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(slots=True)
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_seen: float
    joining: asyncio.Future[JoinResult] | None = None
    syncing: asyncio.Future[SyncResult] | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class Group:
    group_id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    deadline: asyncio.TimerHandle | None = None
    completing: bool = False
    static_members: dict[str, str] = field(default_factory=dict)  # instance id: member id


class Coordinator:
    """Every consumer group of one listener. next_generation(group) claims the next
    generation in fencelog's ownership table."""

    def __init__(self, next_generation: Callable[[str], Awaitable[int]]) -> None:
        self._next_generation = next_generation
        self.groups: dict[str, Group] = {}
        self._expiry: asyncio.Task[None] | None = None
        self._completing: set[asyncio.Future[None]] = set()  # rebalances being completed
        # KIP-848 groups (groups_consumer.py): one name space with the classic ones
        self.consumer = ConsumerGroups(self._classic_members, self._forget_empty)

    def _classic_members(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        return 0 if group is None else len(group.members)

    def _forget_empty(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and not group.members:
            del self.groups[group_id]

    def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire_members(), name="kafka-group-expiry")
        self.consumer.start()

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        await self.consumer.stop()
        for group in self.groups.values():
            for member in list(group.members.values()):
                self._fail_waits(member, wire.COORDINATOR_NOT_AVAILABLE)

    # JoinGroup ------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> JoinResult:
        refused = self._join_refused(group_id, member_id, group_instance_id, session_timeout_ms)
        if refused is None:
            group = self.groups.setdefault(group_id, Group(group_id))
            if not protocols or (
                group.members
                and (
                    protocol_type != group.protocol_type
                    or not self._common_protocols(group, protocols, member_id)
                )
            ):
                refused = wire.INCONSISTENT_GROUP_PROTOCOL
        if refused is not None:
            return JoinResult(refused, member_id=member_id)
        loop = asyncio.get_running_loop()
        now = loop.time()
        member = group.members.get(member_id) if member_id else None
        if member is None:
            member = Member(
                f"{client_id or 'member'}-{uuid.uuid4()}",
                group_instance_id,
                client_id,
                session_timeout_ms / 1000,
                max(rebalance_timeout_ms, session_timeout_ms) / 1000,
                protocol_type,
                protocols,
                now,
            )
            if group_instance_id in group.static_members:
                return await self._rejoin_static(group, member)
            group.members[member.member_id] = member
            if group_instance_id is not None:
                group.static_members[group_instance_id] = member.member_id
        else:
            member.protocols = protocols
            member.last_seen = now
            if member.joining is not None and not member.joining.done():
                member.joining.set_result(JoinResult(wire.UNKNOWN_MEMBER_ID))
        member.joining = loop.create_future()
        if group.protocol_type is None or len(group.members) == 1:
            group.protocol_type = protocol_type
        if group.state is not State.PREPARING:
            self._prepare(group, initial=group.state is State.EMPTY)
        self._maybe_complete(group)
        return await member.joining

    def _join_refused(
        self, group_id: str, member_id: str, group_instance_id: str | None, session_timeout_ms: int
    ) -> int | None:
        """The Kafka error a JoinGroup gets before its protocols are looked at, or None."""
        low, high = SESSION_TIMEOUT_MS_RANGE
        group = self.groups.get(group_id)
        if not valid_group_id(group_id):
            return wire.INVALID_GROUP_ID
        if not low <= session_timeout_ms <= high:
            return wire.INVALID_SESSION_TIMEOUT
        if self.consumer.live(group_id):  # a consumer protocol group (KIP-848)
            return wire.INCONSISTENT_GROUP_PROTOCOL
        self.consumer.groups.pop(group_id, None)  # an empty one gives way
        if member_id and _fenced(group, group_instance_id, member_id):
            return wire.FENCED_INSTANCE_ID
        if member_id and (group is None or member_id not in group.members):
            return wire.UNKNOWN_MEMBER_ID
        return None

    async def _rejoin_static(self, group: Group, member: Member) -> JoinResult:
        """A static member joining again without its member id (a restart): it takes its
        group.instance.id's place and assignment, and the incarnation it replaces is
        fenced. In a stable group whose protocols it still speaks, no rebalance: it is
        answered the current generation at once, with the old leader named as leader so
        that it assigns nothing (Kafka's rule), and its SyncGroup gets its assignment."""
        assert member.group_instance_id is not None
        old_id = group.static_members[member.group_instance_id]
        old = group.members.pop(old_id)
        self._fail_waits(old, wire.FENCED_INSTANCE_ID)
        member.assignment = old.assignment
        group.members[member.member_id] = member
        group.static_members[member.group_instance_id] = member.member_id
        leader = group.leader or ""
        if group.leader == old_id:
            group.leader = member.member_id
        if group.state is State.STABLE and member.protocols == old.protocols:
            return JoinResult(
                wire.NONE,
                group.generation,
                group.protocol_type,
                group.protocol_name,
                leader,
                member.member_id,
            )
        member.joining = asyncio.get_running_loop().create_future()
        if group.state is not State.PREPARING:
            self._prepare(group)
        self._maybe_complete(group)
        return await member.joining

    def _common_protocols(
        self, group: Group, protocols: list[tuple[str, bytes]], member_id: str
    ) -> set[str]:
        names = {name for name, _ in protocols}
        for other in group.members.values():
            if other.member_id != member_id:
                names &= {name for name, _ in other.protocols}
        return names

    def _prepare(self, group: Group, *, initial: bool = False) -> None:
        """Start a rebalance: members learn it from their heartbeats and join again."""
        for member in group.members.values():
            if member.syncing is not None and not member.syncing.done():
                member.syncing.set_result(SyncResult(wire.REBALANCE_IN_PROGRESS))
        group.state = State.PREPARING
        if group.deadline is not None:
            group.deadline.cancel()
        timeout = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
        if initial:
            timeout = INITIAL_DELAY_S
        loop = asyncio.get_running_loop()
        group.deadline = loop.call_later(timeout, self._deadline_passed, group)

    def _deadline_passed(self, group: Group) -> None:
        group.deadline = None
        if group.state is State.PREPARING:
            for member in list(group.members.values()):
                if member.joining is None or member.joining.done():
                    _forget(group, member)  # it did not join in time
                    self._fail_waits(member, wire.UNKNOWN_MEMBER_ID)
            self._maybe_complete(group, deadline=True)

    def _maybe_complete(self, group: Group, *, deadline: bool = False) -> None:
        if group.state is not State.PREPARING or group.completing:
            return
        waiting = [m for m in group.members.values() if m.joining and not m.joining.done()]
        if not group.members:
            group.state = State.EMPTY
            return
        if len(waiting) < len(group.members):
            return
        if not deadline and group.deadline is not None and group.generation == 0:
            return  # a new group waits out its initial delay for more members
        group.completing = True
        task = asyncio.ensure_future(self._complete(group))
        self._completing.add(task)
        task.add_done_callback(self._completing.discard)

    async def _complete(self, group: Group) -> None:
        try:
            generation = await self._next_generation(group.group_id)
        except Exception as exc:  # the writer failed: every joiner hears it and may retry
            group.completing = False
            for member in group.members.values():
                self._fail_waits(member, wire.COORDINATOR_NOT_AVAILABLE)
            group.members.clear()
            group.static_members.clear()
            group.state = State.EMPTY
            # said here: nothing awaits this task, and asyncio would log it as an error of
            # its own ("Task exception was never retrieved"), outside fencelog.kafka
            log.warning(
                "Kafka group %s: its next generation could not be claimed (%s); its "
                "members are answered COORDINATOR_NOT_AVAILABLE and join again",
                group.group_id,
                exc,
            )
            return
        group.completing = False
        if group.deadline is not None:
            group.deadline.cancel()
            group.deadline = None
        members = [m for m in group.members.values() if m.joining and not m.joining.done()]
        if not members:
            group.state = State.EMPTY
            return
        group.generation = generation
        leader = group.leader if group.leader in group.members else members[0].member_id
        group.leader = leader
        group.protocol_name = self._choose_protocol(group.members[leader], members)
        group.state = State.COMPLETING
        for member in group.members.values():
            member.assignment = b""
        listing = [
            (m.member_id, m.group_instance_id, dict(m.protocols)[group.protocol_name])
            for m in members
        ]
        for member in members:
            assert member.joining is not None
            member.joining.set_result(
                JoinResult(
                    wire.NONE,
                    generation,
                    group.protocol_type,
                    group.protocol_name,
                    leader,
                    member.member_id,
                    listing if member.member_id == leader else [],
                )
            )

    @staticmethod
    def _choose_protocol(leader: Member, members: list[Member]) -> str:
        for name, _ in leader.protocols:
            if all(name in dict(m.protocols) for m in members):
                return name
        return leader.protocols[0][0]

    # SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> SyncResult:
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        fenced = _fenced(group, group_instance_id, member_id)
        if group is None or member is None or fenced:
            return SyncResult(wire.FENCED_INSTANCE_ID if fenced else wire.UNKNOWN_MEMBER_ID)
        member.last_seen = asyncio.get_running_loop().time()
        if generation != group.generation:
            return SyncResult(wire.ILLEGAL_GENERATION)
        if group.state is State.PREPARING:
            return SyncResult(wire.REBALANCE_IN_PROGRESS)
        if group.state is State.STABLE:
            return self._synced(group, member)
        if member_id == group.leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            group.state = State.STABLE
            for other in group.members.values():
                if other.syncing is not None and not other.syncing.done():
                    other.syncing.set_result(self._synced(group, other))
            return self._synced(group, member)
        member.syncing = asyncio.get_running_loop().create_future()
        return await member.syncing

    @staticmethod
    def _synced(group: Group, member: Member) -> SyncResult:
        return SyncResult(wire.NONE, member.assignment, group.protocol_type, group.protocol_name)

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None
    ) -> int:
        if _fenced(self.groups.get(group_id), group_instance_id, member_id):
            return wire.FENCED_INSTANCE_ID
        return self._current_member(group_id, generation, member_id)

    def _current_member(
        self, group_id: str, generation: int, member_id: str, *, committing: bool = False
    ) -> int:
        """NONE when member_id is a member of the group's current, stable generation (it
        is seen alive); the Kafka error that says why not otherwise. A commit (Kafka's
        rule) is also taken while the group prepares a rebalance, from a member of the
        generation still current (a consumer commits what it read as it gives up its
        partitions), and refused only once the new generation is formed but not yet
        synced."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return wire.UNKNOWN_MEMBER_ID
        member.last_seen = asyncio.get_running_loop().time()
        if group.state is State.PREPARING and not committing:
            return wire.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return wire.ILLEGAL_GENERATION
        if group.state is State.COMPLETING and committing:
            return wire.REBALANCE_IN_PROGRESS
        return wire.NONE

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> list[int]:
        """Each (member id, group.instance.id)'s answer; the group rebalances when anyone
        left. A static member may leave by its instance id alone (member id ""); a
        member id that is not its instance's holder is fenced."""
        group = self.groups.get(group_id)
        answers = []
        left = False
        for given_id, instance in leaving:
            member_id = given_id
            if group is not None and instance is not None:
                holder = group.static_members.get(instance)
                if holder is not None and given_id and given_id != holder:
                    answers.append(wire.FENCED_INSTANCE_ID)
                    continue
                member_id = holder or given_id
            member = None if group is None else group.members.get(member_id)
            if group is None or member is None:
                answers.append(wire.UNKNOWN_MEMBER_ID)
                continue
            _forget(group, member)
            self._fail_waits(member, wire.UNKNOWN_MEMBER_ID)
            answers.append(wire.NONE)
            left = True
        if group is not None and left:
            self._after_removal(group)
        return answers

    def _after_removal(self, group: Group) -> None:
        if not group.members:
            if group.deadline is not None:
                group.deadline.cancel()
                group.deadline = None
            group.state = State.EMPTY
            group.leader = None
        elif group.state is State.PREPARING:
            self._maybe_complete(group)
        else:
            self._prepare(group)

    @staticmethod
    def _fail_waits(member: Member, error: int) -> None:
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(JoinResult(error))
        if member.syncing is not None and not member.syncing.done():
            member.syncing.set_result(SyncResult(error))

    # OffsetCommit ---------------------------------------------------------------------

    def check_commit(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None
    ) -> int:
        """Whether a member may commit offsets now (a Kafka error code; 0: yes). A
        commit without a generation (-1) is a consumer that assigns its own partitions
        or an admin: accepted while the group has no members, whatever member id it
        names (librdkafka's consumer-protocol consumer names its own), else
        UNKNOWN_MEMBER_ID, as Kafka answers (no member of that id). A static member's
        replaced incarnation is fenced."""
        if group_id in self.consumer.groups and group_id not in self.groups:
            return self.consumer.check_commit(group_id, generation, member_id)
        group = self.groups.get(group_id)
        if generation < 0 and (group is None or not group.members):
            return wire.NONE
        if _fenced(group, group_instance_id, member_id):
            return wire.FENCED_INSTANCE_ID
        if generation < 0 and not member_id:
            return wire.UNKNOWN_MEMBER_ID
        return self._current_member(group_id, generation, member_id, committing=True)

    # expiry ---------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Remove every member whose session has timed out by now (one that waits in
        JoinGroup or SyncGroup is not: its rebalance bounds the wait), classic and
        KIP-848 alike. The admin APIs call it before they answer, so a group whose
        members' sessions have just passed is empty to them, as Kafka's exact timers
        make it (librdkafka's 0081 deletes such groups six seconds after their static
        members closed, a session timeout of six seconds)."""
        for group in list(self.groups.values()):
            expired = [m for m in group.members.values() if _silent(m, now)]
            for member in expired:
                _forget(group, member)
            if expired:
                self._after_removal(group)
        self.consumer.expire(now)

    async def _expire_members(self) -> None:
        """Wake at the next session deadline (at most EXPIRY_CHECK_S later), so that a
        member is removed when its session ends, not up to a check interval after."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            deadlines = [
                m.last_seen + m.session_timeout_s
                for group in self.groups.values()
                for m in group.members.values()
                if not _waiting(m)
            ]
            wait = min(deadlines, default=now + EXPIRY_CHECK_S) - now + EXPIRY_MARGIN_S
            await asyncio.sleep(min(max(wait, EXPIRY_MARGIN_S), EXPIRY_CHECK_S))
            self.expire(loop.time())


def _waiting(member: Member) -> bool:
    """Whether member waits for a JoinGroup or SyncGroup answer."""
    return (member.joining is not None and not member.joining.done()) or (
        member.syncing is not None and not member.syncing.done()
    )


def _silent(member: Member, now: float) -> bool:
    return not _waiting(member) and now - member.last_seen > member.session_timeout_s


def _fenced(group: Group | None, group_instance_id: str | None, member_id: str) -> bool:
    """Kafka's static member fencing: another member id holds that group.instance.id."""
    if group is None or group_instance_id is None:
        return False
    holder = group.static_members.get(group_instance_id)
    return holder is not None and holder != member_id


def _forget(group: Group, member: Member) -> None:
    """Remove member from group, and its group.instance.id with it."""
    del group.members[member.member_id]
    instance = member.group_instance_id
    if instance is not None and group.static_members.get(instance) == member.member_id:
        del group.static_members[instance]
