"""KIP-848, the consumer group protocol (ConsumerGroupHeartbeat): librdkafka's consumer
with `group.protocol=consumer` against the Kafka listener, topic ids in Metadata, and
the coordinator's reconciliation driven directly (revoke before assign, member epochs,
static members), where a client cannot be made to misbehave on purpose.

Only librdkafka (confluent-kafka) speaks this protocol among the clients the tests
have: kafka-python 3.0, aiokafka and KafkaJS send JoinGroup/SyncGroup only."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupType,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka.protocol.consumer import JoinGroupRequest
from kafka.protocol.metadata import MetadataRequest

from broker.client.client import connect
from broker.kafka import groups_consumer, wire
from broker.kafka.groups import Coordinator, Group, Member
from broker.kafka.groups_consumer import ConsumerGroups, Heartbeat
from support.kafka_raw import RawKafka
from support.servers import ServeProcess

STEP_S = 20.0
TOPIC_ID = uuid.UUID(int=(7 << 64) + 1)


def modern(kafka: str, client_id: str, **extra: Any) -> Consumer:
    conf = {
        "bootstrap.servers": kafka,
        "group.id": "modern",
        "group.protocol": "consumer",
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    return Consumer(conf | extra)


def poll_until(done: Any, *members: Consumer, read: list[bytes] | None = None) -> None:
    """Poll members until done(), adding the values they read to `read`."""
    deadline = time.monotonic() + STEP_S
    while not done() and time.monotonic() < deadline:
        for member in members:
            message = member.poll(0.1)
            if message is not None and message.error() is None and read is not None:
                read.append(message.value() or b"")
    assert done()


def partitions(member: Consumer) -> list[int]:
    return sorted(p.partition for p in member.assignment())


def test_consumer_protocol_members_share_partitions_and_the_last_one_gets_all(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """Two librdkafka consumers on the consumer protocol split a topic's partitions,
    the broker assigning; fencelog's `group list` and Kafka's admin describe them; the
    one that leaves hands its partitions over; the committed offsets carry over to a
    consumer that joins later."""
    with connect(kafka_server.address) as client:
        client.create_topic("shared", 4)
    producer = Producer({"bootstrap.servers": kafka})
    for n in range(40):
        producer.produce("shared", str(n).encode(), partition=n % 4)
    producer.flush(10)
    first = modern(kafka, "first")
    second = modern(kafka, "second")
    try:
        first.subscribe(["shared"])
        read: list[bytes] = []
        poll_until(lambda: len(read) >= 40 and partitions(first) == [0, 1, 2, 3], first, read=read)
        assert sorted(int(v) for v in read) == list(range(40))
        first.commit(asynchronous=False)

        second.subscribe(["shared"])
        poll_until(lambda: len(partitions(first)) == len(partitions(second)) == 2, first, second)
        assert sorted(partitions(first) + partitions(second)) == [0, 1, 2, 3]

        admin = AdminClient({"bootstrap.servers": kafka})
        described = admin.describe_consumer_groups(["modern"])["modern"].result(10)
        assert described.type is ConsumerGroupType.CONSUMER
        assert sorted(m.client_id for m in described.members) == ["first", "second"]
        with connect(kafka_server.address) as client:
            (group,) = [g for g in client.kafka_groups() or [] if g.group == "modern"]
        assert (group.protocol_type, group.protocol) == ("consumer", "uniform")
        held = {m.client_id: m.assignment for m in group.members}
        assert held["first"] == (("shared", tuple(partitions(first))),)

        second.close()
        poll_until(lambda: partitions(first) == [0, 1, 2, 3], first)
        listed = admin.list_consumer_groups().result(10).valid
        assert [(g.group_id, g.state) for g in listed] == [("modern", ConsumerGroupState.STABLE)]
        committed = first.committed([TopicPartition("shared", p) for p in range(4)], 10)
        assert [tp.offset for tp in committed] == [10, 10, 10, 10]
    finally:
        first.close()
        second.close()

    producer.produce("shared", b"new", partition=3)
    producer.flush(10)
    later = modern(kafka, "later")
    try:
        later.subscribe(["shared"])
        fresh: list[bytes] = []
        poll_until(lambda: b"new" in fresh, later, read=fresh)
        assert fresh == [b"new"]  # from the committed offsets, not from the start
    finally:
        later.close()


def test_read_committed_on_the_consumer_protocol_sees_committed_transactions_only(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """Exactly once with a consumer-protocol member: read_committed reads the committed
    transactions only, and its offsets commit in a transaction (TxnOffsetCommit with
    its member epoch)."""
    with connect(kafka_server.address) as client:
        client.create_topic("ledger", 1)
    producer = Producer({"bootstrap.servers": kafka, "transactional.id": "ledger-writer"})
    producer.init_transactions(10)
    for values, commit in (([b"a1", b"a2"], True), ([b"x1", b"x2"], False), ([b"b1"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce("ledger", value)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)
    reader = modern(kafka, "reader", **{"isolation.level": "read_committed"})
    try:
        reader.subscribe(["ledger"])
        read: list[bytes] = []
        poll_until(lambda: len(read) >= 3, reader, read=read)
        for _ in range(5):  # nothing more comes
            message = reader.poll(0.1)
            assert message is None or message.error() is not None
        assert read == [b"a1", b"a2", b"b1"]

        producer.begin_transaction()
        producer.produce("ledger", b"c1")
        positions = reader.position(reader.assignment())
        producer.send_offsets_to_transaction(positions, reader.consumer_group_metadata(), 10)
        producer.commit_transaction(10)
        (committed,) = reader.committed([TopicPartition("ledger", 0)], 10)
        assert committed.offset == 3
    finally:
        reader.close()


def test_a_classic_member_is_refused_by_a_consumer_protocol_group(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """A group with members is of one protocol: a JoinGroup to a group with
    consumer-protocol members is INCONSISTENT_GROUP_PROTOCOL (Kafka 4.0's online
    upgrade, which would take the classic member in, is not implemented)."""
    with connect(kafka_server.address) as client:
        client.create_topic("either", 1)
    member = modern(kafka, "modern-member")
    raw = RawKafka(kafka)
    try:
        member.subscribe(["either"])
        poll_until(lambda: partitions(member) == [0], member)
        protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")
        request = JoinGroupRequest(
            group_id="modern",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[protocol],
        )
        assert raw.call(request, 5).error_code == wire.INCONSISTENT_GROUP_PROTOCOL
    finally:
        member.close()
        raw.close()


def test_metadata_names_each_topic_by_an_id_a_recreated_topic_does_not_share(
    kafka_server: ServeProcess, kafka: str
) -> None:
    raw = RawKafka(kafka)
    topic_cls = MetadataRequest.MetadataRequestTopic

    def by_name(name: str) -> Any:
        asked = MetadataRequest(
            topics=[topic_cls(name=name, topic_id=None)], allow_auto_topic_creation=False
        )
        (topic,) = raw.call(asked, 12).topics
        return topic

    try:
        with connect(kafka_server.address) as client:
            client.create_topic("named", 2)
            first = by_name("named").topic_id
            assert first not in (None, uuid.UUID(int=0))
            assert by_name("named").topic_id == first  # the same for the topic's life
            asked = MetadataRequest(
                topics=[topic_cls(name=None, topic_id=first)], allow_auto_topic_creation=False
            )
            (found,) = raw.call(asked, 12).topics
            assert (found.error_code, found.name, len(found.partitions)) == (0, "named", 2)
            client.delete_topic("named")
            client.create_topic("named", 2)
        again = by_name("named").topic_id
        assert again != first
        (gone,) = raw.call(asked, 12).topics
        assert gone.error_code == wire.UNKNOWN_TOPIC_ID
    finally:
        raw.close()


# the coordinator, driven directly ------------------------------------------------------


def beat(
    groups: ConsumerGroups, view: dict[str, tuple[uuid.UUID, int]] | None = None, **fields: Any
) -> groups_consumer.HeartbeatResult:
    async def topics() -> dict[str, tuple[uuid.UUID, int]]:
        return view or {"t": (TOPIC_ID, 4)}

    request = Heartbeat("g", **fields)
    return asyncio.run(groups.heartbeat(request, "client", "host", topics))


def held(result: groups_consumer.HeartbeatResult) -> list[int] | None:
    if result.assignment is None:
        return None
    return [p for _, parts in result.assignment for p in parts]


def fresh_groups(session_timeout_ms: int = 45_000) -> ConsumerGroups:
    async def generation(_group: str) -> int:
        return 1

    coordinator = Coordinator(generation)
    return ConsumerGroups(
        coordinator._classic_members,
        coordinator._forget_empty,
        session_timeout_ms=session_timeout_ms,
    )


def join(groups: ConsumerGroups, member: str, **extra: Any) -> groups_consumer.HeartbeatResult:
    fields: dict[str, Any] = {"rebalance_timeout_ms": 5_000, "topic_names": ["t"]} | extra
    return beat(groups, member_id=member, member_epoch=0, **fields)


def test_a_partition_moves_only_once_its_owner_has_given_it_up() -> None:
    groups = fresh_groups()
    a = join(groups, "a")
    assert (a.epoch, held(a)) == (1, [0, 1, 2, 3])
    b = join(groups, "b")
    assert (b.epoch, held(b)) == (2, [])  # its share is still a's
    a = beat(groups, member_id="a", member_epoch=1)
    assert (a.epoch, held(a)) == (1, [0, 1])  # give up 2 and 3 first, at the old epoch
    b = beat(groups, member_id="b", member_epoch=2)
    assert held(b) is None  # unchanged: a has not said it gave them up
    a = beat(groups, member_id="a", member_epoch=1, owned=[(TOPIC_ID, [0, 1])])
    assert (a.epoch, held(a)) == (2, [0, 1])
    b = beat(groups, member_id="b", member_epoch=2)
    assert (b.epoch, held(b)) == (2, [2, 3])
    assert groups.groups["g"].state == "Stable"
    fenced = beat(groups, member_id="b", member_epoch=7)
    assert fenced.error == groups_consumer.FENCED_MEMBER_EPOCH
    assert groups.check_commit("g", 1, "b") == groups_consumer.STALE_MEMBER_EPOCH
    assert groups.check_commit("g", 2, "b") == wire.NONE
    gone = beat(groups, member_id="b", member_epoch=-1)
    assert gone.epoch == -1
    a = beat(groups, member_id="a", member_epoch=2)
    assert (a.epoch, held(a)) == (3, [0, 1, 2, 3])


def test_the_range_assignor_and_an_unknown_one() -> None:
    groups = fresh_groups()
    join(groups, "a", assignor="range")
    join(groups, "b", assignor="range")
    target = groups.groups["g"].target
    assert sorted(p for _, p in target["a"]) == [0, 1]
    assert sorted(p for _, p in target["b"]) == [2, 3]
    refused = join(groups, "c", assignor="sticky")
    assert refused.error == groups_consumer.UNSUPPORTED_ASSIGNOR


def test_a_static_member_back_within_its_session_keeps_its_partitions_without_a_rebalance() -> None:
    groups = fresh_groups(session_timeout_ms=1_000)
    first = join(groups, "a1", instance_id="app-a")
    epoch = groups.groups["g"].epoch
    away = beat(groups, member_id="a1", member_epoch=-2, instance_id="app-a")
    assert (away.error, away.epoch) == (wire.NONE, -2)
    back = join(groups, "a2", instance_id="app-a")
    assert (back.member_id, back.epoch, held(back)) == ("a2", first.epoch, [0, 1, 2, 3])
    assert groups.groups["g"].epoch == epoch  # no rebalance
    twin = join(groups, "a3", instance_id="app-a")  # while a2 is live
    assert twin.error == groups_consumer.UNRELEASED_INSTANCE_ID
    groups.expire(time.monotonic() + 2)  # silent past its session timeout: removed
    assert groups.groups["g"].members == {}
    assert groups.groups["g"].state == "Empty"


def test_a_pattern_is_resolved_after_the_heartbeat_that_brought_it() -> None:
    """As Kafka resolves subscription patterns in the background: a subscription of a
    name and a pattern is assigned the name's partitions first, the pattern's in a
    later heartbeat (librdkafka's 0045 expects it)."""
    other = uuid.UUID(int=(7 << 64) + 2)
    view = {"t": (TOPIC_ID, 4), "u": (other, 2)}
    groups = fresh_groups()
    first = join(groups, "a", view=view, topic_names=["u"], topic_regex="^t$")
    assert first.assignment == [(other, [0, 1])]
    later = beat(groups, view=view, member_id="a", member_epoch=first.epoch)
    assert later.epoch > first.epoch
    assert later.assignment == [(TOPIC_ID, [0, 1, 2, 3]), (other, [0, 1])]


def test_a_commit_without_a_generation_to_an_empty_group_is_taken_whatever_member_it_names() -> (
    None
):
    """As Kafka takes it: librdkafka's consumer-protocol consumer that assigns its own
    partitions commits with epoch -1 and the member id it made itself."""
    groups = fresh_groups()
    assert groups.check_commit("g", -1, "its-own-id") == wire.NONE
    join(groups, "a")
    assert groups.check_commit("g", -1, "its-own-id") == wire.UNKNOWN_MEMBER_ID

    async def generation(_group: str) -> int:
        return 1

    assert Coordinator(generation).check_commit("classic", -1, "its-own-id") == wire.NONE


def test_a_consumer_protocol_member_is_refused_by_a_classic_group_with_members() -> None:
    async def generation(_group: str) -> int:
        return 1

    coordinator = Coordinator(generation)
    member = Member("m", None, "client", 10.0, 10.0, "consumer", [("range", b"")], 0.0)
    coordinator.groups["c"] = Group("c", members={"m": member})
    request = Heartbeat("c", "new", 0, rebalance_timeout_ms=5_000, topic_names=["t"])

    async def topics() -> dict[str, tuple[uuid.UUID, int]]:
        return {"t": (TOPIC_ID, 4)}

    refused = asyncio.run(coordinator.consumer.heartbeat(request, "client", "host", topics))
    assert refused.error == wire.GROUP_ID_NOT_FOUND
    del coordinator.groups["c"].members["m"]  # an empty classic group gives way
    joined = asyncio.run(coordinator.consumer.heartbeat(request, "client", "host", topics))
    assert (joined.error, "c" in coordinator.groups) == (wire.NONE, False)


def test_members_in_any_order_never_share_a_partition_and_settle_on_all() -> None:
    """Random joins, leaves, heartbeats (each saying what the member holds, as a
    client does) and a topic growing: at no point do two members hold one partition,
    and once every member has heartbeated a few more times the group is Stable with
    every subscribed partition held."""
    other = uuid.UUID(int=(7 << 64) + 2)
    for seed in range(30):
        asyncio.run(_members_in_any_order(random.Random(seed), other))


async def _members_in_any_order(rnd: random.Random, other: uuid.UUID) -> None:
    groups = fresh_groups()
    view = {"a": (TOPIC_ID, 5), "b": (other, 3)}

    async def topics() -> dict[str, tuple[uuid.UUID, int]]:
        return dict(view)

    clients: dict[str, tuple[int, list[tuple[uuid.UUID, list[int]]]]] = {}

    async def beat_as(member_id: str) -> None:
        epoch, owned = clients[member_id]
        request = Heartbeat("g", member_id, epoch, owned=owned)
        answer = await groups.heartbeat(request, "client", "host", topics)
        assert answer.error == wire.NONE
        now_held = owned if answer.assignment is None else answer.assignment
        clients[member_id] = (answer.epoch, now_held)

    for step in range(300):
        roll = rnd.random()
        if roll < 0.1 and len(clients) < 5:
            subscribed = rnd.choice([["a"], ["b"], ["a", "b"]])
            request = Heartbeat(
                "g", f"m{step}", 0, rebalance_timeout_ms=10_000, topic_names=subscribed
            )
            answer = await groups.heartbeat(request, "client", "host", topics)
            clients[f"m{step}"] = (answer.epoch, answer.assignment or [])
        elif roll < 0.15 and clients:
            gone = rnd.choice(sorted(clients))
            await groups.heartbeat(Heartbeat("g", gone, -1), "client", "host", topics)
            del clients[gone]
        elif roll < 0.17:
            view["a"] = (TOPIC_ID, view["a"][1] + 1)
        elif clients:
            await beat_as(rnd.choice(sorted(clients)))
        held: set[groups_consumer.TopicPartition] = set()
        for member in groups.groups["g"].members.values() if "g" in groups.groups else ():
            assert not member.assigned & held
            held |= member.assigned
    for _ in range(5):
        for member_id in sorted(clients):
            await beat_as(member_id)
    group = groups.groups["g"]
    if clients:
        assert group.state == "Stable"
        assert set().union(*(m.assigned for m in group.members.values())) == group.subscribed
