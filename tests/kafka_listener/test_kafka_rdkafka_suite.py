"""What librdkafka's own regression suite (tests/0nnn of confluentinc/librdkafka, run
against `fencelog serve --kafka-listen`; docs/kafka-conformance.md) found fencelog to do
differently from Kafka, each checked here the way a user's client meets it, through
confluent-kafka, kcat or raw requests (not librdkafka's test binary).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

STEP_S = 20.0  # every wait of a test is bounded by this


def test_a_keyless_record_on_a_compacted_topic_fails_alone(kafka: str) -> None:
    # librdkafka's 0011: Kafka names the records it refused (Produce v8 RecordErrors), so
    # the keyless ones fail with INVALID_RECORD and the others of their batch with
    # _INVALID_DIFFERENT_RECORD, which a client may send again; all failed the same way
    admin = AdminClient({"bootstrap.servers": kafka})
    created = admin.create_topics([NewTopic("keyed", 1, 1, config={"cleanup.policy": "compact"})])
    created["keyed"].result(STEP_S)
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 500})
    reports: list[tuple[bytes | None, Any]] = []
    for index in range(10):
        key = None if index % 5 == 0 else b"k%d" % index
        producer.produce(
            "keyed",
            key=key,
            value=b"v%d" % index,
            on_delivery=lambda error, message: reports.append((message.value(), error)),
        )
    assert producer.flush(STEP_S) == 0
    codes = {value: error.code() for value, error in reports}
    said = sorted({str(error) for _, error in reports})  # librdkafka's words, should this fail
    assert codes == {
        b"v%d" % index: (
            KafkaError.INVALID_RECORD if index % 5 == 0 else KafkaError._INVALID_DIFFERENT_RECORD
        )
        for index in range(10)
    }, said
    # the others, sent again, are appended
    for index in (1, 2):
        producer.produce("keyed", key=b"k%d" % index, value=b"again")
    assert producer.flush(STEP_S) == 0


def version(value: str) -> ConfigEntry:
    return ConfigEntry("message.format.version", value, incremental_operation=AlterConfigOpType.SET)


def test_message_format_version_is_taken_and_ignored(kafka: str) -> None:
    # librdkafka's 0092 sets a topic's message.format.version to 0.10.0.0 half way
    # through producing; Kafka 3.x takes it and ignores it (KIP-724), records stay v2.
    # It was INVALID_CONFIG (not a config fencelog knows) and the test stopped there.
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic("mixed", 1, 1)])["mixed"].result(STEP_S)
    producer = Producer({"bootstrap.servers": kafka})
    producer.produce("mixed", value=b"before")
    assert producer.flush(STEP_S) == 0
    old = ConfigResource("topic", "mixed", incremental_configs=[version("0.10.0.0")])
    assert admin.incremental_alter_configs([old])[old].result(STEP_S) is None
    described = admin.describe_configs([ConfigResource("topic", "mixed")])
    entries = next(iter(described.values())).result(STEP_S)
    assert entries["message.format.version"].value == "3.0-IV1"
    bogus = ConfigResource("topic", "mixed", incremental_configs=[version("old")])
    try:
        admin.incremental_alter_configs([bogus])[bogus].result(STEP_S)
        raise AssertionError("a message.format.version that is no version was taken")
    except KafkaException as refused:
        assert refused.args[0].code() == KafkaError.INVALID_CONFIG
    producer.produce("mixed", value=b"after")
    assert producer.flush(STEP_S) == 0
    reader = Consumer(
        {"bootstrap.servers": kafka, "group.id": "mixed", "auto.offset.reset": "earliest"}
    )
    try:
        reader.subscribe(["mixed"])
        values: list[bytes | None] = []
        for _ in range(40):  # bounded: 40 polls of at most 0.5 s
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 2:
                break
    finally:
        reader.close()
    assert values == [b"before", b"after"]


def test_authorized_operations_are_all_a_resource_supports(kafka: str) -> None:
    # librdkafka's 0081 (DescribeTopics, DescribeCluster, DescribeConsumerGroups with
    # authorized operations): a Kafka broker without an authorizer allows, and lists,
    # every operation a resource supports; fencelog answered none
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic("allowed", 1, 1)])["allowed"].result(STEP_S)
    topics = admin.describe_topics(TopicCollection(["allowed"]), include_authorized_operations=True)
    topic = topics["allowed"].result(STEP_S)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(STEP_S)
    reader = Consumer({"bootstrap.servers": kafka, "group.id": "allowed"})
    try:
        reader.subscribe(["allowed"])
        for _ in range(20):  # bounded: until the group has its member
            reader.poll(0.5)
            if reader.assignment():
                break
        groups = admin.describe_consumer_groups(["allowed"], include_authorized_operations=True)
        group = groups["allowed"].result(STEP_S)
    finally:
        reader.close()
    named = {
        "topic": sorted(op.name for op in topic.authorized_operations),
        "cluster": sorted(op.name for op in cluster.authorized_operations),
        "group": sorted(op.name for op in group.authorized_operations),
    }
    topic_ops = "READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS"
    cluster_ops = "CREATE ALTER DESCRIBE CLUSTER_ACTION DESCRIBE_CONFIGS ALTER_CONFIGS"
    assert named == {
        "topic": sorted(topic_ops.split()),
        "cluster": sorted([*cluster_ops.split(), "IDEMPOTENT_WRITE"]),
        "group": ["DELETE", "DESCRIBE", "READ"],
    }
    # not asked for: none listed
    plain = admin.describe_topics(TopicCollection(["allowed"]))["allowed"].result(STEP_S)
    assert not plain.authorized_operations
