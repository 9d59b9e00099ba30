"""Kafka's admin APIs against `fencelog serve --kafka-listen`, through two independent
client implementations: confluent-kafka's AdminClient (librdkafka's protocol code) and
kafka-python's KafkaAdminClient (its own), and kcat or fencelog's own CLI to see the
result the way a user would.

What they must see: topics deleted and grown, records deleted below an offset, topic
configs described with their defaults and altered (an unknown name refused), Kafka and
fencelog groups listed, described and deleted, one broker in the cluster, transactions
and producers described, and the ACL and SCRAM APIs answering as a Kafka broker without
an authorizer (SECURITY_DISABLED).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpPartition
from kafka import errors as kp_errors
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType
from kafka.protocol.consumer import ListOffsetsRequest

from broker.errors import ErrorCode
from broker.kafka import wire
from support.kafka_raw import RawKafka
from support.servers import ServeProcess

STEP_S = 20.0  # every wait of a test is bounded by this


@pytest.fixture
def admin(kafka: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka})


@pytest.fixture
def kp_admin(kafka: str) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kafka, request_timeout_ms=int(STEP_S * 1000))
    yield client
    client.close()


def settled(futures: dict[Any, Any]) -> dict[Any, Any]:
    """Each future's result, or the Kafka error it failed with."""
    answers = {}
    for key, future in futures.items():
        try:
            answers[key] = future.result(STEP_S)
        except KafkaException as failed:
            answers[key] = failed.args[0]
    return answers


def fencelog(server: ServeProcess, *args: str) -> list[Any]:
    """A fencelog command's --json output: its objects, one a line."""
    completed = subprocess.run(
        ["fencelog", "--broker", server.address, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )
    return [json.loads(line) for line in completed.stdout.splitlines()]


def run_kcat(kcat_path: str, kafka: str, *args: str) -> str:
    completed = subprocess.run(
        [kcat_path, "-b", kafka, *args], capture_output=True, text=True, timeout=STEP_S, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def produce(kafka: str, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": kafka})
    for index in range(count):
        producer.produce(topic, value=b"v%d" % index, partition=partition)
    assert producer.flush(STEP_S) == 0


def create(admin: AdminClient, *topics: tuple[str, int]) -> None:
    created = settled(admin.create_topics([NewTopic(name, count) for name, count in topics]))
    assert created == {name: None for name, _ in topics}


# topics -----------------------------------------------------------------------------------


def test_delete_topics_through_both_clients(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    create(admin, ("doomed", 2), ("also-doomed", 1), ("kept", 1))
    produce(kafka, "doomed", 3)

    answers = settled(admin.delete_topics(["doomed", "never-was"], operation_timeout=5))
    assert answers["doomed"] is None
    assert answers["never-was"].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    kp_admin.delete_topics(["also-doomed"])

    names = {topic["topic"] for topic in fencelog(kafka_server, "topic", "list")}
    assert "kept" in names and not names & {"doomed", "also-doomed"}
    with pytest.raises(kp_errors.UnknownTopicOrPartitionError):
        kp_admin.delete_topics(["also-doomed"])
    # a deleted topic can be made again, empty
    create(admin, ("doomed", 1))
    assert fencelog(kafka_server, "topic", "describe", "doomed")[0]["records"] == 0


def test_create_partitions_through_both_clients(
    kafka_server: ServeProcess,
    kafka: str,
    admin: AdminClient,
    kp_admin: KafkaAdminClient,
    kcat: str,
) -> None:
    create(admin, ("growing", 1))
    assert settled(admin.create_partitions([NewPartitions("growing", 3)])) == {"growing": None}
    # validate_only changes nothing; fewer or as many partitions are refused
    assert settled(admin.create_partitions([NewPartitions("growing", 5)], validate_only=True)) == {
        "growing": None
    }
    refused = settled(admin.create_partitions([NewPartitions("growing", 2)]))["growing"]
    assert refused.code() == KafkaError.INVALID_PARTITIONS
    missing = settled(admin.create_partitions([NewPartitions("no-such", 2)]))["no-such"]
    assert missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    kp_admin.create_partitions({"growing": 4})
    with pytest.raises(kp_errors.InvalidPartitionsError):
        kp_admin.create_partitions({"growing": 4})

    assert fencelog(kafka_server, "topic", "describe", "growing")[0]["partitions"] == 4
    assert 'topic "growing" with 4 partitions' in run_kcat(kcat, kafka, "-L", "-t", "growing")
    produce(kafka, "growing", 1, partition=3)  # the new partitions take records


def test_delete_records_moves_the_log_start_through_both_clients(
    kafka_server: ServeProcess,
    kafka: str,
    admin: AdminClient,
    kp_admin: KafkaAdminClient,
    kcat: str,
) -> None:
    create(admin, ("trimmed", 2))
    produce(kafka, "trimmed", 10, partition=0)
    produce(kafka, "trimmed", 5, partition=1)

    deleted = settled(admin.delete_records([TopicPartition("trimmed", 0, 4)]))
    ((partition, result),) = deleted.items()
    assert (partition.partition, result.low_watermark) == (0, 4)
    lines = run_kcat(kcat, kafka, "-C", "-t", "trimmed", "-p", "0", "-o", "beginning", "-e", "-J")
    assert [json.loads(line)["offset"] for line in lines.splitlines()] == list(range(4, 10))

    # kafka-python: -1 is the high watermark; past it is OFFSET_OUT_OF_RANGE
    answers = kp_admin.delete_records({KpPartition("trimmed", 1): -1})
    assert answers[KpPartition("trimmed", 1)]["low_watermark"] == 5
    with pytest.raises(kp_errors.OffsetOutOfRangeError):
        kp_admin.delete_records({KpPartition("trimmed", 0): 11})

    partitions = fencelog(kafka_server, "topic", "describe", "trimmed")[0]["partition_details"]
    assert [(p["start_offset"], p["end_offset"]) for p in partitions] == [(4, 10), (5, 5)]
    # offsets go on from where they were
    produce(kafka, "trimmed", 1, partition=1)
    lines = run_kcat(kcat, kafka, "-C", "-t", "trimmed", "-p", "1", "-o", "beginning", "-e", "-J")
    assert [json.loads(line)["offset"] for line in lines.splitlines()] == [5]


def produce_at(kafka: str, topic: str, stamps: list[int]) -> None:
    """One batch into partition 0, a record per timestamp (linger: sent together)."""
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 1000})
    for index, stamp in enumerate(stamps):
        producer.produce(topic, value=b"t%d" % index, partition=0, timestamp=stamp)
    assert producer.flush(STEP_S) == 0


def spec(name: str) -> OffsetSpec:
    """OffsetSpec.<name>() (confluent-kafka's are untyped)."""
    made: OffsetSpec = getattr(OffsetSpec, name)()
    return made


def listed(admin: AdminClient, specs: dict[TopicPartition, OffsetSpec]) -> dict[int, Any]:
    """AdminClient.list_offsets: {partition: (offset, timestamp)}, or the error."""
    found = {}
    for partition, answer in settled(admin.list_offsets(specs)).items():
        ok = not isinstance(answer, KafkaError)
        found[partition.partition] = (answer.offset, answer.timestamp) if ok else answer.code()
    return found


def test_list_offsets_of_the_greatest_timestamp(kafka: str, admin: AdminClient) -> None:
    # ListOffsets v7's MAX_TIMESTAMP (KIP-734): the record with the greatest timestamp,
    # the first of them on a tie, among the records at or after the log start
    create(admin, ("stamped", 2))
    produce_at(kafka, "stamped", [1000, 8000, 3000, 5000, 2000])  # offsets 0-4
    produce_at(kafka, "stamped", [4000, 6000])  # 5-6
    greatest = {
        TopicPartition("stamped", 0): spec("max_timestamp"),
        TopicPartition("stamped", 1): spec("max_timestamp"),
    }
    assert listed(admin, greatest) == {0: (1, 8000), 1: (-1, -1)}  # partition 1 is empty

    # the log start inside the first batch, past its greatest: the rest's greatest
    settled(admin.delete_records([TopicPartition("stamped", 0, 2)]))
    assert listed(admin, greatest)[0] == (6, 6000)
    produce_at(kafka, "stamped", [6000])  # 7: a tie, and the first one stays
    assert listed(admin, greatest)[0] == (6, 6000)
    produce_at(kafka, "stamped", [1000, 9000, 9000])  # 8-10: a later batch's first
    assert listed(admin, greatest)[0] == (9, 9000)

    at_start_and_end = {
        TopicPartition("stamped", 0): spec("earliest"),
        TopicPartition("stamped", 1): spec("latest"),
    }
    assert listed(admin, at_start_and_end) == {0: (2, -1), 1: (0, -1)}


def test_list_offsets_of_the_tiered_storage_specs(kafka: str, admin: AdminClient) -> None:
    # With no tiered storage the local log is the log (v8's EARLIEST_LOCAL, -4), and
    # nothing is tiered or waiting for upload (v9's -5, v11's -6): -1, as Kafka answers
    create(admin, ("local", 1))
    produce(kafka, "local", 3)
    settled(admin.delete_records([TopicPartition("local", 0, 1)]))
    raw = RawKafka(kafka)
    try:
        for version, stamp, expected in [  # (offset, timestamp, leader epoch)
            (8, -4, (1, -1, 0)),
            (9, -5, (-1, -1, -1)),
            (11, -6, (-1, -1, -1)),
            (11, -1, (3, -1, 0)),
            (6, -7, None),
        ]:
            request = ListOffsetsRequest(
                version=version,
                replica_id=-1,
                isolation_level=0,
                topics=[
                    ListOffsetsRequest.ListOffsetsTopic(
                        name="local",
                        partitions=[
                            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                partition_index=0, timestamp=stamp
                            )
                        ],
                    )
                ],
            )
            (topic,) = raw.call(request, version).topics
            (answer,) = topic.partitions
            if expected is None:  # a place no version names
                assert answer.error_code == wire.UNSUPPORTED_VERSION
                continue
            assert answer.error_code == wire.NONE, (version, stamp)
            assert (answer.offset, answer.timestamp, answer.leader_epoch) == expected, stamp
    finally:
        raw.close()


# configs ----------------------------------------------------------------------------------


def described(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource("topic", topic)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(STEP_S)
    return entries


def test_topic_configs_described_and_altered_through_both_clients(
    kafka_server: ServeProcess, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    create(admin, ("configured", 1))
    entries = described(admin, "configured")
    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("-1", ConfigSource.DEFAULT_CONFIG.value)
    assert not retention.is_read_only
    assert entries["cleanup.policy"].value == "delete"
    assert entries["min.insync.replicas"].is_read_only

    def incremental(*entries: ConfigEntry) -> Any:
        resource = ConfigResource("topic", "configured", incremental_configs=list(entries))
        return settled(admin.incremental_alter_configs([resource]))[resource]

    set_op, append = AlterConfigOpType.SET, AlterConfigOpType.APPEND
    assert (
        incremental(
            ConfigEntry("retention.ms", "3600000", incremental_operation=set_op),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=append),
        )
        is None
    )
    entries = described(admin, "configured")
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert entries["cleanup.policy"].value == "compact"
    native = fencelog(kafka_server, "topic", "describe", "configured")[0]["config"]
    assert native == {"retention_ms": 3_600_000, "retention_bytes": None, "cleanup": "compact"}

    # an unknown name, a bad value, a read-only one changed: INVALID_CONFIG, nothing changes
    for refused in (
        ConfigEntry("no.such.config", "1", incremental_operation=set_op),
        ConfigEntry("retention.bytes", "-7", incremental_operation=set_op),
        ConfigEntry("min.insync.replicas", "2", incremental_operation=set_op),
    ):
        assert incremental(refused).code() == KafkaError.INVALID_CONFIG, refused
    assert fencelog(kafka_server, "topic", "describe", "configured")[0]["config"] == native

    # kafka-python: IncrementalAlterConfigs sets one and keeps the others
    resource = KpConfigResource(ConfigResourceType.TOPIC, "configured", {"retention.bytes": "5000"})
    kp_admin.alter_configs([resource])
    native = fencelog(kafka_server, "topic", "describe", "configured")[0]["config"]
    assert native == {"retention_ms": 3_600_000, "retention_bytes": 5000, "cleanup": "compact"}
    found = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, "configured")])
    assert '"retention.bytes"' in json.dumps(found, default=str)
    assert '"5000"' in json.dumps(found, default=str)

    # AlterConfigs (confluent's alter_configs) replaces them all: what it leaves out is
    # the default again
    replaced = ConfigResource("topic", "configured", set_config={"retention.bytes": "6000"})
    with pytest.warns(DeprecationWarning):  # confluent-kafka deprecates it; tools still use it
        futures = admin.alter_configs([replaced])
    assert settled(futures)[replaced] is None
    native = fencelog(kafka_server, "topic", "describe", "configured")[0]["config"]
    assert native == {"retention_ms": None, "retention_bytes": 6000, "cleanup": "delete"}


def test_broker_configs_are_described_and_read_only(admin: AdminClient) -> None:
    resource = ConfigResource("broker", "0")
    entries = admin.describe_configs([resource])[resource].result(STEP_S)
    assert entries["broker.id"].value == "0"
    assert entries["default.replication.factor"].value == "1"
    assert all(entry.is_read_only for entry in entries.values())
    altered = ConfigResource(
        "broker",
        "0",
        incremental_configs=[
            ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    answer = settled(admin.incremental_alter_configs([altered]))[altered]
    assert answer.code() == KafkaError.INVALID_CONFIG
    missing = ConfigResource("topic", "no-such-topic")
    answer = settled(admin.describe_configs([missing]))[missing]
    assert answer.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


# groups -----------------------------------------------------------------------------------


def live_consumer(kafka: str, group: str, topic: str, count: int) -> Consumer:
    """A member of group that has read count records of topic and committed them."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": group,
            "client.id": "admin-test",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    read = 0
    deadline = time.monotonic() + STEP_S
    while read < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read += 1
    assert read == count, f"{read} of {count} records within {STEP_S}s"
    consumer.commit(asynchronous=False)
    return consumer


def native_groups(server: ServeProcess) -> dict[str, list[tuple[str, int, int]]]:
    return {
        group["group"]: [
            (o["topic"], o["partition"], o["committed_offset"]) for o in group["offsets"]
        ]
        for group in fencelog(server, "group", "list")
    }


def test_groups_listed_described_and_deleted_through_both_clients(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    create(admin, ("work", 2))
    produce(kafka, "work", 2, partition=0)
    produce(kafka, "work", 2, partition=1)
    fencelog(kafka_server, "consume", "work", "--group", "native")  # a fencelog group
    live = live_consumer(kafka, "live", "work", 4)
    try:
        listed = admin.list_consumer_groups().result(STEP_S).valid
        states = {g.group_id: (g.state.name, g.is_simple_consumer_group) for g in listed}
        assert states == {"live": ("STABLE", False), "native": ("EMPTY", True)}
        description = admin.describe_consumer_groups(["live"])["live"].result(STEP_S)
        assert description.state.name == "STABLE"
        assert description.partition_assignor == "range"
        ((member,),) = [description.members]
        assert member.client_id == "admin-test"
        assigned = {(p.topic, p.partition) for p in member.assignment.topic_partitions}
        assert assigned == {("work", 0), ("work", 1)}

        kp_listed = {g["group_id"]: g["protocol_type"] for g in kp_admin.list_groups()}
        assert kp_listed == {"live": "consumer", "native": ""}
        kp_described = kp_admin.describe_groups(["live", "native"])
        assert kp_described["live"]["group_state"] == "Stable"
        ((kp_member,),) = [kp_described["live"]["members"]]
        assert kp_member["member_metadata"]["topics"] == ["work"]
        assigned_kp = kp_member["member_assignment"]["assigned_partitions"]
        assert assigned_kp == [{"topic": "work", "partitions": [0, 1]}]
        assert kp_described["native"]["group_state"] == "Empty"

        # a group with a live member is not deleted, nor are offsets of a topic it reads
        busy = settled(admin.delete_consumer_groups(["live"]))["live"]
        assert busy.code() == KafkaError.NON_EMPTY_GROUP
        refused = kp_admin.delete_group_offsets("live", [KpPartition("work", 0)])
        assert refused == {KpPartition("work", 0): kp_errors.GroupSubscribedToTopicError}
        assert native_groups(kafka_server)["live"] == [("work", 0, 2), ("work", 1, 2)]
    finally:
        live.close()

    # OffsetDelete forgets one partition's offset; DeleteGroups the rest
    forgotten = kp_admin.delete_group_offsets("native", [KpPartition("work", 0)])
    assert forgotten == {KpPartition("work", 0): kp_errors.NoError}
    assert native_groups(kafka_server)["native"] == [("work", 1, 2)]
    assert settled(admin.delete_consumer_groups(["live"])) == {"live": None}
    kp_admin.delete_groups(["native"])
    assert native_groups(kafka_server) == {}
    gone = settled(admin.delete_consumer_groups(["never-was"]))["never-was"]
    assert gone.code() == KafkaError.GROUP_ID_NOT_FOUND
    assert admin.list_consumer_groups().result(STEP_S).valid == []


# cluster and security ---------------------------------------------------------------------


def test_describe_cluster_through_both_clients(
    kafka: str, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    cluster = admin.describe_cluster().result(STEP_S)
    host, port = kafka.rsplit(":", 1)
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, host, int(port))]
    assert cluster.controller.id == 0
    assert cluster.cluster_id.startswith("fencelog-")
    described = kp_admin.describe_cluster()
    assert described["cluster_id"] == cluster.cluster_id
    assert described["controller_id"] == 0
    assert [(b["broker_id"], b["port"]) for b in described["brokers"]] == [(0, int(port))]


def test_describe_log_dirs_names_the_data_directory_and_partition_sizes(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    # what Kafka UIs and kafka-log-dirs.sh read for topic sizes: one directory, the data
    # directory, holding every partition with its bytes as fencelog counts them
    create(admin, ("sized", 2), ("other", 1))
    produce(kafka, "sized", 3, partition=1)
    (broker,) = kp_admin.describe_log_dirs()
    assert broker["broker"] == 0
    (directory,) = broker["log_dirs"]
    assert directory["error_code"] == 0
    assert directory["log_dir"] == str(kafka_server.data_dir.resolve())
    sizes = {
        (topic["name"], p["partition_index"]): p["partition_size"]
        for topic in directory["topics"]
        for p in topic["partitions"]
    }
    described = fencelog(kafka_server, "topic", "describe", "sized")[0]["partition_details"]
    assert {("sized", p["partition"]): p["bytes"] for p in described} == {
        ("sized", 0): 0,
        ("sized", 1): 6,  # b"v0" b"v1" b"v2"
    }
    assert {k: v for k, v in sizes.items() if k[0] == "sized"} == {("sized", 0): 0, ("sized", 1): 6}
    assert ("other", 0) in sizes
    assert directory["total_bytes"] >= directory["usable_bytes"] > 0

    # asked for some: only those that exist
    (broker,) = kp_admin.describe_log_dirs({"sized": [1, 9]})
    (directory,) = broker["log_dirs"]
    assert [
        (t["name"], [p["partition_index"] for p in t["partitions"]]) for t in directory["topics"]
    ] == [("sized", [1])]


def test_acl_and_scram_apis_answer_security_disabled_through_both_clients(
    admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ResourcePatternFilter
    from kafka.admin import ACLResourcePatternType as KpPatternType
    from kafka.admin import ResourceType as KpResourceType

    binding = AclBinding(
        ResourceType.TOPIC,
        "orders",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    created = settled(admin.create_acls([binding]))[binding]
    assert created.code() == KafkaError.SECURITY_DISABLED
    asked = admin.describe_user_scram_credentials(["alice"])
    assert isinstance(asked, dict)  # a future per user asked
    users = settled(asked)
    assert users["alice"].code() == KafkaError.SECURITY_DISABLED

    acl_filter = ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None, KpPatternType.ANY),
    )
    with pytest.raises(kp_errors.SecurityDisabledError):
        kp_admin.describe_acls(acl_filter)
    (alice,) = kp_admin.describe_user_scram_credentials(["alice"]).values()
    assert alice["credential_infos"] == []
    assert alice["error"].startswith("fencelog keeps no SCRAM credentials")
    # asked for every user: there are none (librdkafka crashes on a top-level error here)
    everyone = admin.describe_user_scram_credentials()
    assert not isinstance(everyone, dict)  # one future
    assert everyone.result(STEP_S) == {}


# transactions and producers ---------------------------------------------------------------


def test_transactions_and_producers_described(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    from kafka.admin import TransactionState

    create(admin, ("ledger", 2))
    producer = Producer({"bootstrap.servers": kafka, "transactional.id": "ledger-writer"})
    producer.init_transactions(STEP_S)
    producer.begin_transaction()
    producer.produce("ledger", value=b"one", partition=1)
    assert producer.flush(STEP_S) == 0

    ((listing,),) = kp_admin.list_transactions().values()
    assert (listing.transactional_id, listing.state) == ("ledger-writer", TransactionState.ONGOING)
    described = kp_admin.describe_transactions(["ledger-writer"])["ledger-writer"]
    assert described.state is TransactionState.ONGOING
    assert described.producer_id == listing.producer_id
    assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {("ledger", 1)}
    assert kp_admin.list_transactions(state_filters=["CompleteCommit"]) == {0: []}
    assert kp_admin.list_transactions(transactional_id_pattern="ledger-.*") == {0: [listing]}
    assert kp_admin.list_transactions(transactional_id_pattern="ledger") == {0: []}
    with pytest.raises(kp_errors.InvalidRequestError):
        kp_admin.list_transactions(transactional_id_pattern="(unclosed")
    with pytest.raises(kp_errors.TransactionalIdNotFoundError):
        kp_admin.describe_transactions(["nobody"])

    producer.commit_transaction(STEP_S)
    ((listing,),) = kp_admin.list_transactions().values()
    assert listing.state is TransactionState.EMPTY
    # DescribeProducers: the idempotent producers of a partition (a transaction's records
    # are judged by their transaction, not the producer table)
    idempotent = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    for value in (b"a", b"b"):
        idempotent.produce("ledger", value=value, partition=0)
    assert idempotent.flush(STEP_S) == 0
    producers = kp_admin.describe_producers([KpPartition("ledger", 0), KpPartition("ledger", 1)])
    (state,) = producers[KpPartition("ledger", 0)].active_producers
    assert (state.producer_epoch, state.last_sequence) == (0, 1)
    assert state.producer_id != described.producer_id
    assert producers[KpPartition("ledger", 1)].active_producers == []
    with pytest.raises(kp_errors.UnknownTopicOrPartitionError):
        kp_admin.describe_producers([KpPartition("ledger", 7)])


# every version advertised -----------------------------------------------------------------


def admin_requests() -> dict[str, tuple[Any, Any]]:
    """Per admin API: a request naming the topic `versions` (of 1 partition) or things
    that do not exist, and what its answer must say, (answer, version) -> bool."""
    from kafka.protocol import admin as kp
    from kafka.protocol.consumer import OffsetDeleteRequest

    no_id = uuid.UUID(int=0)
    alter = kp.AlterConfigsRequest.AlterConfigsResource
    incremental = kp.IncrementalAlterConfigsRequest.AlterConfigsResource
    partitions = kp.CreatePartitionsRequest.CreatePartitionsTopic
    records = kp.DeleteRecordsRequest.DeleteRecordsTopic
    producers = kp.DescribeProducersRequest.TopicRequest
    acl = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1}
    acl |= {"principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}
    return {
        "DeleteTopics": (
            lambda v: kp.DeleteTopicsRequest(
                topic_names=["nope"],
                topics=[kp.DeleteTopicsRequest.DeleteTopicState(name="nope", topic_id=no_id)],
                timeout_ms=1000,
            ),
            lambda a, v: a.responses[0].error_code == 3,
        ),
        "CreatePartitions": (
            lambda v: kp.CreatePartitionsRequest(
                topics=[partitions(name="versions", count=2, assignments=[[0]])],
                timeout_ms=1000,
                validate_only=True,
            ),
            lambda a, v: a.results[0].error_code == 0,
        ),
        "DeleteRecords": (
            lambda v: kp.DeleteRecordsRequest(
                topics=[records(name="versions", partitions=[(0, 0)])], timeout_ms=1000
            ),
            lambda a, v: (
                (a.topics[0].partitions[0].error_code, a.topics[0].partitions[0].low_watermark)
                == (0, 0)
            ),
        ),
        "DescribeConfigs": (
            lambda v: kp.DescribeConfigsRequest(
                resources=[(2, "versions", None), (4, "7", None)],  # broker 7: not this one
                include_synonyms=True,
                include_documentation=True,
            ),
            lambda a, v: (
                "retention.ms" in {c.name for c in a.results[0].configs}
                and a.results[1].error_code == 42
            ),
        ),
        "AlterConfigs": (
            lambda v: kp.AlterConfigsRequest(
                resources=[
                    alter(
                        resource_type=2, resource_name="versions", configs=[("retention.ms", "x")]
                    )
                ],
                validate_only=True,
            ),
            lambda a, v: a.responses[0].error_code == 40,
        ),
        "IncrementalAlterConfigs": (
            lambda v: kp.IncrementalAlterConfigsRequest(
                resources=[
                    incremental(
                        resource_type=2,
                        resource_name="versions",
                        configs=[("retention.ms", 0, "9")],
                    )
                ],
                validate_only=True,
            ),
            lambda a, v: a.responses[0].error_code == 0,
        ),
        "ListGroups": (lambda v: kp.ListGroupsRequest(), lambda a, v: a.error_code == 0),
        "DescribeGroups": (
            lambda v: kp.DescribeGroupsRequest(
                groups=["nope"], include_authorized_operations=False
            ),
            lambda a, v: (
                (a.groups[0].group_state, a.groups[0].error_code) == ("Dead", 69 if v >= 6 else 0)
            ),
        ),
        "DeleteGroups": (
            lambda v: kp.DeleteGroupsRequest(groups_names=["nope"]),
            lambda a, v: a.results[0].error_code == 69,
        ),
        "OffsetDelete": (
            lambda v: OffsetDeleteRequest(group_id="nope", topics=[]),
            lambda a, v: a.error_code == 69,
        ),
        "DescribeCluster": (
            lambda v: kp.DescribeClusterRequest(
                include_cluster_authorized_operations=False, endpoint_type=1
            ),
            lambda a, v: [b.broker_id for b in a.brokers] == [0],
        ),
        "DescribeLogDirs": (
            lambda v: kp.DescribeLogDirsRequest(
                topics=[
                    kp.DescribeLogDirsRequest.DescribableLogDirTopic(
                        topic="versions", partitions=[0, 7]
                    ),
                    kp.DescribeLogDirsRequest.DescribableLogDirTopic(topic="nope", partitions=[0]),
                ]
            ),
            lambda a, v: (
                [(t.name, [p.partition_index for p in t.partitions]) for t in a.results[0].topics]
                == [("versions", [0])]
            ),
        ),
        "ListTransactions": (
            lambda v: kp.ListTransactionsRequest(
                state_filters=["Ongoing", "Bogus"], producer_id_filters=[], duration_filter=-1
            ),
            lambda a, v: (
                (a.error_code, a.unknown_state_filters, a.transaction_states) == (0, ["Bogus"], [])
            ),
        ),
        "DescribeTransactions": (
            lambda v: kp.DescribeTransactionsRequest(transactional_ids=["nope"]),
            lambda a, v: a.transaction_states[0].error_code == 105,
        ),
        "DescribeProducers": (
            lambda v: kp.DescribeProducersRequest(
                topics=[producers(name="versions", partition_indexes=[0, 5])]
            ),
            lambda a, v: [p.error_code for p in a.topics[0].partitions] == [0, 3],
        ),
        "DescribeAcls": (
            lambda v: kp.DescribeAclsRequest(**acl),
            lambda a, v: a.error_code == 54,
        ),
        "CreateAcls": (
            lambda v: kp.CreateAclsRequest(
                creations=[
                    kp.CreateAclsRequest.AclCreation(
                        resource_type=2,
                        resource_name="t",
                        resource_pattern_type=3,
                        principal="User:a",
                        host="*",
                        operation=3,
                        permission_type=3,
                    )
                ]
            ),
            lambda a, v: [r.error_code for r in a.results] == [54],
        ),
        "DeleteAcls": (
            lambda v: kp.DeleteAclsRequest(filters=[kp.DeleteAclsRequest.DeleteAclsFilter(**acl)]),
            lambda a, v: [r.error_code for r in a.filter_results] == [54],
        ),
        "DescribeUserScramCredentials": (
            lambda v: kp.DescribeUserScramCredentialsRequest(users=[("alice",)]),
            lambda a, v: [r.error_code for r in a.results] == [54],
        ),
        "AlterUserScramCredentials": (
            lambda v: kp.AlterUserScramCredentialsRequest(deletions=[("alice", 1)], upsertions=[]),
            lambda a, v: [r.error_code for r in a.results] == [54],
        ),
    }


def test_every_admin_api_answers_at_every_advertised_version(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient
) -> None:
    create(admin, ("versions", 1))
    cases = admin_requests()
    advertised = {api.name: api for api in wire.APIS.values() if api.name in cases}
    assert set(advertised) == set(cases)
    raw = RawKafka(kafka)
    try:
        for name, (build, check) in cases.items():
            api = advertised[name]
            for version in range(api.min_version, api.max_version + 1):
                answer = raw.call(build(version), version)
                assert check(answer, version), (name, version, answer)
    finally:
        raw.close()


# fencelog group list/describe -------------------------------------------------------------


def test_fencelog_group_list_and_describe_show_kafka_members(
    kafka_server: ServeProcess, kafka: str, admin: AdminClient
) -> None:
    create(admin, ("watched", 2))
    produce(kafka, "watched", 1, partition=1)
    fencelog(kafka_server, "consume", "watched", "--group", "native")
    live = live_consumer(kafka, "watchers", "watched", 1)
    try:
        listed = {g["group"]: g for g in fencelog(kafka_server, "group", "list")}
        watchers = listed["watchers"]
        assert watchers["state"] == "Stable"
        ((member,),) = [watchers["members"]]
        assert member["client_id"] == "admin-test"
        assert member["assignment"] == [{"topic": "watched", "partitions": [0, 1]}]
        assert (listed["native"]["state"], listed["native"]["members"]) == (None, None)
        (described,) = fencelog(kafka_server, "group", "describe", "watchers")
        assert described["members"] == watchers["members"]
        assert [(o["partition"], o["committed_offset"]) for o in described["offsets"]] == [(1, 1)]
        # a reset under live members is refused, as Kafka's is: they would commit over it
        reset = ["group", "reset", "watchers", "watched", "--to", "earliest"]
        refused = subprocess.run(
            ["fencelog", "--broker", kafka_server.address, *reset],
            capture_output=True,
            text=True,
            timeout=STEP_S,
            check=False,
        )
        assert refused.returncode == ErrorCode.GROUP_NOT_EMPTY, refused.stderr
        assert "consumer group watchers has 1 live Kafka member (Stable)" in refused.stderr
    finally:
        live.close()
    # gone from the listener (it left), the group is its offsets again, with no members
    (described,) = fencelog(kafka_server, "group", "describe", "watchers")
    assert (described["state"], described["members"]) == ("Empty", [])
    (moved,) = fencelog(
        kafka_server, "group", "reset", "watchers", "watched", "-p", "1", "--to", "0"
    )
    assert (moved["from"], moved["to"]) == (1, 0)  # an empty group's offsets may move


# aiokafka: a third protocol implementation, at older versions ------------------------------


def test_aiokafka_admin_drives_the_same_apis(kafka_server: ServeProcess, kafka: str) -> None:
    from aiokafka import TopicPartition as AioPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, RecordsToDelete
    from aiokafka.admin import NewTopic as AioNewTopic
    from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioResourceType

    async def drive() -> dict[str, Any]:
        client = AIOKafkaAdminClient(bootstrap_servers=kafka, request_timeout_ms=20_000)
        await client.start()
        try:
            await client.create_topics([AioNewTopic("aio", 1, 1), AioNewTopic("aio-gone", 1, 1)])
            await client.create_partitions({"aio": NewPartitions(2)})
            produce(kafka, "aio", 3)
            low = await client.delete_records({AioPartition("aio", 0): RecordsToDelete(2)})
            topic = AioResourceType.TOPIC
            await client.alter_configs([AioConfigResource(topic, "aio", {"retention.ms": "60000"})])
            (configs,) = await client.describe_configs([AioConfigResource(topic, "aio")])
            deleted = await client.delete_topics(["aio-gone"])
            groups = await client.list_consumer_groups()
            return {"low": low, "configs": configs, "deleted": deleted, "groups": groups}
        finally:
            await client.close()

    found = asyncio.run(asyncio.wait_for(drive(), STEP_S))
    assert found["low"] == {AioPartition("aio", 0): 2}
    entries = {e[0]: e[1] for e in found["configs"].resources[0][4]}
    assert entries["retention.ms"] == "60000"
    assert [r[1] for r in found["deleted"].topic_error_codes] == [0]
    assert found["groups"] == []
    (described,) = fencelog(kafka_server, "topic", "describe", "aio")
    assert described["partitions"] == 2
    assert described["config"]["retention_ms"] == 60_000
    assert described["partition_details"][0]["start_offset"] == 2
    assert "aio-gone" not in {t["topic"] for t in fencelog(kafka_server, "topic", "list")}
