"""Kafka's group admin APIs: ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

Two kinds of group answer, one name space: a Kafka consumer group lives in the
coordinator's memory (broker/kafka/groups.py: state, protocol, members, assignments)
and its offsets are fencelog's group offsets; a fencelog group (`consume --group`, the
Python client, Spark) is only its committed offsets. Both are listed. A group with
offsets and no live Kafka members is Empty with no protocol type, as Kafka shows a group
that only commits offsets (a "simple" consumer group).

- DeleteGroups forgets a group's committed offsets (and the coordinator's empty group);
  a group with live members is NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND.
- OffsetDelete forgets some partitions' offsets, unless a live member subscribes to the
  topic (GROUP_SUBSCRIBED_TO_TOPIC).
- KIP-848 consumer groups (groups_consumer.py) are listed with the type `consumer`,
  described by ConsumerGroupDescribe (a classic or unknown group there is
  GROUP_ID_NOT_FOUND, and a consumer group is that to DescribeGroups, as Kafka answers:
  clients ask the other API then), and deleted once empty.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any, Final

from kafka.protocol import admin, consumer

from broker.errors import BrokerError, ErrorCode
from broker.kafka import authorized_ops, wire
from broker.kafka.admin_codes import GROUP_SUBSCRIBED_TO_TOPIC, NON_EMPTY_GROUP, Handler
from broker.kafka.groups import Coordinator, Group, State
from broker.kafka.groups_consumer import ConsumerGroup, TopicPartition
from broker.types import KafkaGroup, KafkaGroupMember

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi
    from broker.kafka.listener import KafkaConnection

CLASSIC: Final = "classic"
CONSUMER: Final = "consumer"
DEAD: Final = "Dead"
NOT_ASKED: Final = None  # authorized operations not asked for (INT32_MIN on the wire)
INT32_MIN: Final = -(2**31)
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")


class GroupsAdmin:
    def __init__(self, api: KafkaApi) -> None:
        self.backend = api.backend
        self.coordinator = api.coordinator

    def handlers(self) -> dict[int, Handler]:
        return {
            admin.ListGroupsRequest.API_KEY: self.list_groups,
            admin.DescribeGroupsRequest.API_KEY: self.describe_groups,
            admin.DeleteGroupsRequest.API_KEY: self.delete_groups,
            consumer.OffsetDeleteRequest.API_KEY: self.offset_delete,
        }

    async def _stored_groups(self) -> set[str]:
        reader = self.backend.reader
        rows_max = reader.limits.kafka_listed_rows_max
        rows = await self.backend.read(lambda: reader.consumer_groups(rows_max))
        return {row.group for row in rows}

    # ListGroups ---------------------------------------------------------------------

    async def list_groups(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        self.coordinator.expire(asyncio.get_running_loop().time())
        states = {s.lower() for s in body.states_filter} if version >= 4 else set()
        types = {t.lower() for t in body.types_filter} if version >= 5 else set()
        live = self.coordinator.groups
        listed = {name: (g.state.value, g.protocol_type or "", CLASSIC) for name, g in live.items()}
        for name, group in self.coordinator.consumer.groups.items():
            listed.setdefault(name, (group.state, CONSUMER, CONSUMER))
        for name in await self._stored_groups():
            listed.setdefault(name, (State.EMPTY.value, "", CLASSIC))
        response = admin.ListGroupsResponse
        groups = [
            response.ListedGroup(
                group_id=name,
                protocol_type=protocol_type,
                group_state=state,
                group_type=group_type,
            )
            for name, (state, protocol_type, group_type) in sorted(listed.items())
            if (not states or state.lower() in states) and (not types or group_type in types)
        ]
        return response(version=version, throttle_time_ms=0, error_code=wire.NONE, groups=groups)

    # DescribeGroups -----------------------------------------------------------------

    async def describe_groups(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        self.coordinator.expire(asyncio.get_running_loop().time())
        stored = await self._stored_groups()
        response = admin.DescribeGroupsResponse
        described = []
        for group_id in body.groups:
            group = self.coordinator.groups.get(group_id)
            if group is None and self.coordinator.consumer.live(group_id):
                other = _empty(response, group_id, DEAD, wire.GROUP_ID_NOT_FOUND)
                other.error_message = f"group {group_id} is a consumer group, not a classic one"
                described.append(other)
            elif group is not None:
                described.append(_described(response, group))
            elif group_id in stored:
                described.append(_empty(response, group_id, State.EMPTY.value, wire.NONE))
            elif version >= 6:
                found = _empty(response, group_id, DEAD, wire.GROUP_ID_NOT_FOUND)
                found.error_message = f"group {group_id} is not known"
                described.append(found)
            else:
                described.append(_empty(response, group_id, DEAD, wire.NONE))
        asked = getattr(body, "include_authorized_operations", False)
        for answer in described:  # no authorizer: all a group supports (authorized_ops)
            answer.authorized_operations = authorized_ops.authorized(authorized_ops.GROUP, asked)
        return response(version=version, throttle_time_ms=0, groups=described)

    # DeleteGroups -------------------------------------------------------------------

    async def delete_groups(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DeleteGroupsResponse
        results = [
            response.DeletableGroupResult(
                group_id=group_id, error_code=await self._delete(group_id)
            )
            for group_id in body.groups_names
        ]
        return response(version=version, throttle_time_ms=0, results=results)

    async def _delete(self, group_id: str) -> int:
        self.coordinator.expire(asyncio.get_running_loop().time())
        group = self.coordinator.groups.get(group_id)
        if (group is not None and group.members) or self.coordinator.consumer.live(group_id):
            return NON_EMPTY_GROUP
        held = self.coordinator.consumer.groups.pop(group_id, None) is not None
        writer = self.backend.writer
        try:
            deleted = await self.backend.write(lambda: writer.delete_group(group_id))
        except BrokerError as error:
            return _group_error(error)
        if group is not None and not group.members:
            self.coordinator.groups.pop(group_id, None)
            return wire.NONE
        return wire.NONE if deleted or held else wire.GROUP_ID_NOT_FOUND

    # OffsetDelete -------------------------------------------------------------------

    async def offset_delete(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = consumer.OffsetDeleteResponse
        topic_cls = response.OffsetDeleteResponseTopic
        group_id = body.group_id
        self.coordinator.expire(asyncio.get_running_loop().time())
        group = self.coordinator.groups.get(group_id)
        modern = self.coordinator.consumer.groups.get(group_id)
        if group is None and modern is None and group_id not in await self._stored_groups():
            return response(
                version=version, throttle_time_ms=0, error_code=wire.GROUP_ID_NOT_FOUND, topics=[]
            )
        subscribed = _subscribed_topics(group) if group is not None else set()
        if modern is not None and subscribed is not None:
            subscribed |= _consumer_subscribed(modern)
        topics = []
        for topic in body.topics:
            partitions = [p.partition_index for p in topic.partitions]
            error = await self._forget(group_id, topic.name, partitions, subscribed)
            topics.append(
                topic_cls(
                    name=topic.name,
                    partitions=[
                        topic_cls.OffsetDeleteResponsePartition(partition_index=p, error_code=error)
                        for p in partitions
                    ],
                )
            )
        return response(version=version, throttle_time_ms=0, error_code=wire.NONE, topics=topics)

    async def _forget(
        self, group_id: str, topic: str, partitions: list[int], subscribed: set[str] | None
    ) -> int:
        if subscribed is None or topic in subscribed:
            return GROUP_SUBSCRIBED_TO_TOPIC
        writer = self.backend.writer
        try:
            await self.backend.write(lambda: writer.delete_offsets(group_id, topic, partitions))
        except BrokerError as error:
            return _group_error(error)
        return wire.NONE


def kafka_groups(coordinator: Coordinator) -> list[KafkaGroup]:
    """The coordinator's groups and their live members, each member's assignment as
    the consumer protocol says it (none when it is not that protocol's); KIP-848
    groups with protocol type `consumer`, their assignor as protocol."""
    modern = [
        KafkaGroup(
            group=group.group_id,
            state=group.state,
            protocol_type=CONSUMER,
            protocol=group.assignor,
            members=tuple(
                KafkaGroupMember(
                    member.member_id,
                    member.instance_id,
                    member.client_id,
                    tuple((name, tuple(parts)) for name, parts in _named(group, member.assigned)),
                )
                for member in group.members.values()
            ),
        )
        for group in coordinator.consumer.groups.values()
        if group.group_id not in coordinator.groups
    ]
    classic = [
        KafkaGroup(
            group=group.group_id,
            state=group.state.value,
            protocol_type=group.protocol_type or "",
            protocol=group.protocol_name or "",
            members=tuple(
                KafkaGroupMember(
                    member.member_id,
                    member.group_instance_id,
                    member.client_id,
                    _assignment(member.assignment) if group.protocol_type == "consumer" else (),
                )
                for member in group.members.values()
            ),
        )
        for group in coordinator.groups.values()
    ]
    return sorted(classic + modern, key=lambda g: g.group)


def _named(
    group: ConsumerGroup, partitions: frozenset[TopicPartition]
) -> list[tuple[str, list[int]]]:
    """(topic name, partitions) of a consumer group's partitions, by topic name; a
    topic since deleted is named by its id."""
    names = group.names()
    by_topic: dict[str, list[int]] = {}
    for tid, partition in sorted(partitions):
        by_topic.setdefault(names.get(tid, str(tid)), []).append(partition)
    return sorted(by_topic.items())


def _consumer_subscribed(group: ConsumerGroup) -> set[str]:
    names = group.names()
    found: set[str] = set()
    for member in group.members.values():
        found |= {names[tid] for tid in member.subscription.topics(group.topics, group.patterns)}
    return found


async def describe_consumer_groups(api: KafkaApi, body: Any, version: int) -> Any:
    """ConsumerGroupDescribe: each KIP-848 group asked, its members' assignments and
    targets; another group is GROUP_ID_NOT_FOUND, as Kafka answers."""
    from broker.kafka.wire import ConsumerGroupDescribeResponse as response

    group_cls = response.DescribedGroup
    member_cls = group_cls.Member
    asked = bool(body.include_authorized_operations)
    allowed = authorized_ops.authorized(authorized_ops.GROUP, asked)
    ops = INT32_MIN if allowed is None else sum(1 << op for op in allowed)  # a bit set
    api.coordinator.expire(asyncio.get_running_loop().time())
    described = []
    for group_id in body.group_ids:
        group = api.coordinator.consumer.groups.get(group_id)
        if group is None or group_id in api.coordinator.groups:
            described.append(
                group_cls(
                    error_code=wire.GROUP_ID_NOT_FOUND,
                    error_message=f"group {group_id} is not a consumer group",
                    group_id=group_id,
                    group_state=DEAD,
                    group_epoch=-1,
                    assignment_epoch=-1,
                    assignor_name="",
                    members=[],
                    authorized_operations=ops,
                )
            )
            continue

        def assignment(partitions: frozenset[TopicPartition], of: ConsumerGroup = group) -> Any:
            ids = {name: tid for tid, name in of.names().items()}
            return member_cls.Assignment(
                topic_partitions=[
                    member_cls.Assignment.TopicPartitions(
                        topic_id=ids.get(name), topic_name=name, partitions=parts
                    )
                    for name, parts in _named(of, partitions)
                ]
            )

        described.append(
            group_cls(
                error_code=wire.NONE,
                error_message=None,
                group_id=group_id,
                group_state=group.state,
                group_epoch=group.epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=group.assignor,
                members=[
                    member_cls(
                        member_id=m.member_id,
                        instance_id=m.instance_id,
                        rack_id=m.rack_id,
                        member_epoch=m.epoch,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        subscribed_topic_names=list(m.subscription.names),
                        subscribed_topic_regex=m.subscription.pattern,
                        assignment=assignment(m.assigned),
                        target_assignment=assignment(group.target.get(m.member_id, frozenset())),
                    )
                    for m in group.members.values()
                ],
                authorized_operations=ops,
            )
        )
    return response(version=version, throttle_time_ms=0, groups=described)


def _assignment(data: bytes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A consumer protocol assignment (version, [topic, [partition]], user data) as
    (topic, partitions); () when it cannot be read (or is empty: not synced yet)."""
    try:
        (count,) = _INT32.unpack_from(data, 2)
        pos, found = 6, []
        for _ in range(count):
            (size,) = _INT16.unpack_from(data, pos)
            topic = data[pos + 2 : pos + 2 + size].decode()
            pos += 2 + size
            (partitions,) = _INT32.unpack_from(data, pos)
            indexes = struct.unpack_from(f">{partitions}i", data, pos + 4)
            pos += 4 + 4 * partitions
            found.append((topic, tuple(indexes)))
    except (struct.error, UnicodeDecodeError):
        return ()
    return tuple(found)


def _described(response: Any, group: Group) -> Any:
    member_cls = response.DescribedGroup.DescribedGroupMember
    return response.DescribedGroup(
        error_code=wire.NONE,
        error_message=None,
        group_id=group.group_id,
        group_state=group.state.value,
        protocol_type=group.protocol_type or "",
        protocol_data=group.protocol_name or "",
        members=[
            member_cls(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                client_id=member.client_id,
                client_host="",
                member_metadata=dict(member.protocols).get(group.protocol_name or "", b""),
                member_assignment=member.assignment,
            )
            for member in group.members.values()
        ],
        authorized_operations=NOT_ASKED,
    )


def _empty(response: Any, group_id: str, state: str, error: int) -> Any:
    return response.DescribedGroup(
        error_code=error,
        error_message=None,
        group_id=group_id,
        group_state=state,
        protocol_type="",
        protocol_data="",
        members=[],
        authorized_operations=NOT_ASKED,
    )


def _subscribed_topics(group: Group) -> set[str] | None:
    """The topics the group's live members subscribe to (their consumer protocol
    metadata: version, then the topics); None when one's metadata cannot be read."""
    topics: set[str] = set()
    for member in group.members.values():
        for _, metadata in member.protocols[:1]:
            found = _subscription(metadata)
            if found is None:
                return None
            topics |= found
    return topics


def _subscription(metadata: bytes) -> set[str] | None:
    try:
        (count,) = _INT32.unpack_from(metadata, 2)
        pos, topics = 6, set()
        for _ in range(count):
            (size,) = _INT16.unpack_from(metadata, pos)
            topics.add(metadata[pos + 2 : pos + 2 + size].decode())
            pos += 2 + size
    except (struct.error, UnicodeDecodeError):
        return None
    return topics


def _group_error(error: BrokerError) -> int:
    return {
        ErrorCode.INVALID_NAME: wire.INVALID_GROUP_ID,
        ErrorCode.UNKNOWN_TOPIC: wire.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_PARTITION: wire.UNKNOWN_TOPIC_OR_PARTITION,
    }.get(error.code, wire.UNKNOWN_SERVER_ERROR)
