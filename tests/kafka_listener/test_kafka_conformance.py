"""Where a Kafka client sees Kafka's behaviour from `fencelog serve --kafka-listen`
(issue 35's "behaviours that differ from Kafka"): a fetch within its byte budget,
CreateTopics' replica assignments, configs and validate_only, Kafka's record bounds,
commit metadata and leader epochs kept, static membership, and the lag a consumer sees.

Each with a real client where one shows it (confluent-kafka, kafka-python, kcat), and
with raw requests (kafka-python's protocol classes) where the answer's fields are the
point."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaNewTopic
from kafka.errors import InvalidConfigurationError, TopicAlreadyExistsError
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

from broker.client.client import connect
from broker.errors import BrokerError, ErrorCode
from broker.types import NewRecord
from support.kafka_raw import RawKafka
from support.servers import ServeProcess

STEP_S = 20.0  # every wait of a test is bounded by this
KIB = 1024


def produce_each(kafka: str, topic: str, values: dict[int, bytes], **config: Any) -> None:
    """One record per partition, each acknowledged."""
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 0, **config})
    for partition, value in values.items():
        producer.produce(
            topic, value, partition=partition, on_delivery=lambda e, _m: errors.append(e)
        )
    assert producer.flush(STEP_S) == 0, "records still queued after the flush"
    assert errors == [None] * len(values)


# 3. a fetch within its byte budget --------------------------------------------------------


def test_a_consumer_with_a_small_fetch_max_bytes_reads_records_near_that_size(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """Two partitions, a 900 KiB record each, fetch.max.bytes 1,000,000: each fetch
    answers one of them (librdkafka drops a response larger than receive.message.max.bytes
    and would fetch again forever)."""
    with connect(kafka_server.address) as client:
        client.create_topic("big", 2)
    values = {0: b"a" * (900 * KIB), 1: b"b" * (900 * KIB)}
    produce_each(kafka, "big", values)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "big-readers",
            "fetch.max.bytes": 1_000_000,
            "receive.message.max.bytes": 1_000_512,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("big", 0, 0), TopicPartition("big", 1, 0)])
        found: dict[int, bytes] = {}
        deadline = time.monotonic() + STEP_S
        while len(found) < 2 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            found[message.partition() or 0] = message.value() or b""
        assert found == values
    finally:
        consumer.close()


def fetch(kafka: str, max_bytes: int, partition_max_bytes: int, partitions: int) -> Any:
    """A raw Fetch v11 of partitions 0..partitions-1 of topic "budget" from offset 0."""
    topic_cls = FetchRequest.FetchTopic
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            topic_cls(
                topic="budget",
                partitions=[
                    topic_cls.FetchPartition(
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    )
                    for p in range(partitions)
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    raw = RawKafka(kafka)
    try:
        return raw.call(request, 11)
    finally:
        raw.close()


def record_bytes(answer: Any) -> list[int]:
    return [len(p.records or b"") for t in answer.responses for p in t.partitions]


def test_only_the_first_partitions_first_record_may_exceed_the_fetch_budget(
    kafka_server: ServeProcess, kafka: str
) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("budget", 3)
    produce_each(kafka, "budget", {0: b"x" * (10 * KIB), 1: b"y" * (10 * KIB), 2: b"z"})

    # a budget smaller than any record: the first partition's record alone comes back
    sizes = record_bytes(fetch(kafka, 1_000, 1_000, 3))
    assert sizes[0] > 10 * KIB
    assert sizes[1:] == [0, 0]

    # room for the first record and a small one, not for the second big one
    sizes = record_bytes(fetch(kafka, 12 * KIB, 1_000_000, 3))
    assert sizes[0] > 10 * KIB
    assert sizes[1] == 0
    assert 0 < sizes[2] < 200
    assert sum(sizes) <= 12 * KIB

    # a partition's own limit holds for a partition after the first
    sizes = record_bytes(fetch(kafka, 1_000_000, 5 * KIB, 3))
    assert sizes[0] > 10 * KIB
    assert sizes[1] == 0
    assert 0 < sizes[2] < 200

    # a budget for everything answers everything
    sizes = record_bytes(fetch(kafka, 1_000_000, 1_000_000, 3))
    assert all(size > 0 for size in sizes)


# 4. CreateTopics: replica assignments, config names, validate_only -------------------------


def topic_names(server: ServeProcess) -> list[str]:
    with connect(server.address) as client:
        return sorted(t.name for t in client.list_topics())


def test_create_topics_takes_partitions_from_replica_assignments_and_checks_them(
    kafka_server: ServeProcess, kafka: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    made = admin.create_topics([NewTopic("assigned", 3, replica_assignment=[[0], [0], [0]])])
    made["assigned"].result(STEP_S)
    assert sorted(admin.list_topics(timeout=STEP_S).topics["assigned"].partitions) == [0, 1, 2]

    elsewhere = admin.create_topics([NewTopic("elsewhere", 2, replica_assignment=[[0], [1]])])
    with pytest.raises(KafkaException) as refused:
        elsewhere["elsewhere"].result(STEP_S)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert "fencelog is one broker" in refused.value.args[0].str()
    assert "elsewhere" not in topic_names(kafka_server)


def test_create_topics_refuses_a_config_name_kafka_does_not_have(
    kafka_server: ServeProcess, kafka: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    unknown = admin.create_topics([NewTopic("odd", 1, 1, config={"retention.msec": "1000"})])
    with pytest.raises(KafkaException) as refused:
        unknown["odd"].result(STEP_S)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "unknown topic config retention.msec" in refused.value.args[0].str()
    known = admin.create_topics([NewTopic("even", 1, 1, config={"max.message.bytes": "2000"})])
    known["even"].result(STEP_S)
    assert topic_names(kafka_server) == ["even"]


def test_validate_only_creates_nothing_and_says_what_creating_would(
    kafka_server: ServeProcess, kafka: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    checked = admin.create_topics([NewTopic("dry", 4, 1)], validate_only=True)
    checked["dry"].result(STEP_S)
    assert topic_names(kafka_server) == []

    # kafka-python's admin, its own protocol code: the same answers
    python_admin = KafkaAdminClient(bootstrap_servers=kafka, request_timeout_ms=10_000)
    try:
        python_admin.create_topics(
            [KafkaNewTopic("dry", 2, 1)], validate_only=True, timeout_ms=10_000
        )
        assert topic_names(kafka_server) == []
        python_admin.create_topics([KafkaNewTopic("wet", 2, 1)], timeout_ms=10_000)
        with pytest.raises(TopicAlreadyExistsError):
            python_admin.create_topics(
                [KafkaNewTopic("wet", 2, 1)], validate_only=True, timeout_ms=10_000
            )
        with pytest.raises(InvalidConfigurationError):
            python_admin.create_topics(
                [KafkaNewTopic("dry", 2, 1, topic_configs={"no.such.config": "1"})],
                validate_only=True,
                timeout_ms=10_000,
            )
    finally:
        python_admin.close()
    assert topic_names(kafka_server) == ["wet"]


# 5. Kafka's record bounds, not fencelog's --------------------------------------------------


def test_a_kafka_record_is_bounded_by_its_batch_not_by_fencelogs_record_limits(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """A 99,000-byte key, 65 headers and a 2 MiB value: within Kafka's bounds (the
    batch's bytes), beyond fencelog's own per-record ones, which the native protocol
    keeps."""
    key = b"k" * 99_000
    headers: list[tuple[str, str | bytes | None]] = [(f"h{i}", b"%d" % i) for i in range(65)]
    value = b"v" * (2 * 1024 * KIB)
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka, "message.max.bytes": 4_000_000})
    producer.produce("wide", value=b"small", key=key, headers=headers)
    producer.produce("wide", value=value, on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(STEP_S) == 0
    assert errors == [None]
    reader = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "wide-readers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        reader.assign([TopicPartition("wide", 0, 0)])
        found: list[Message] = []
        deadline = time.monotonic() + STEP_S
        while len(found) < 2 and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                found.append(message)
    finally:
        reader.close()
    assert [m.key() for m in found] == [key, None]
    assert found[0].headers() == headers
    assert [len(m.value() or b"") for m in found] == [5, len(value)]

    with connect(kafka_server.address) as client:  # the native protocol keeps its bounds
        with pytest.raises(BrokerError) as refused:
            client.produce("wide", [NewRecord(b"small", key)])
        assert refused.value.code is ErrorCode.RECORD_TOO_LARGE
        assert "key is 99000 bytes; the limit is 65536" in refused.value.message


# 2. commit metadata and leader epochs kept -----------------------------------------------


def raw_commit(kafka: str, group: str, parts: dict[int, tuple[int, str | None, int]]) -> Any:
    """OffsetCommit v8 of topic "kept" without a generation: {partition: (offset,
    metadata, leader epoch)}; the answer's {partition: error}."""
    topic_cls = OffsetCommitRequest.OffsetCommitRequestTopic
    request = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            topic_cls(
                name="kept",
                partitions=[
                    topic_cls.OffsetCommitRequestPartition(
                        partition_index=p,
                        committed_offset=offset,
                        committed_leader_epoch=epoch,
                        committed_metadata=metadata,
                    )
                    for p, (offset, metadata, epoch) in parts.items()
                ],
            )
        ],
    )
    raw = RawKafka(kafka)
    try:
        answer = raw.call(request, 8)
    finally:
        raw.close()
    return {p.partition_index: p.error_code for t in answer.topics for p in t.partitions}


def raw_committed(kafka: str, group: str, partitions: list[int]) -> dict[int, tuple[Any, ...]]:
    """OffsetFetch v7 of topic "kept": {partition: (offset, metadata, leader epoch)}."""
    topic_cls = OffsetFetchRequest.OffsetFetchRequestTopic
    request = OffsetFetchRequest(
        group_id=group,
        topics=[topic_cls(name="kept", partition_indexes=partitions)],
        require_stable=False,
    )
    raw = RawKafka(kafka)
    try:
        answer = raw.call(request, 7)
    finally:
        raw.close()
    return {
        p.partition_index: (p.committed_offset, p.metadata, p.committed_leader_epoch)
        for t in answer.topics
        for p in t.partitions
    }


def test_offset_commit_metadata_and_leader_epoch_are_answered_by_offset_fetch(
    kafka_server: ServeProcess, kafka: str
) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("kept", 3)
    errors = raw_commit(kafka, "raw", {0: (5, "checkpoint-a", 0), 1: (7, None, 4)})
    assert errors == {0: 0, 1: 0}
    assert raw_committed(kafka, "raw", [0, 1, 2]) == {
        0: (5, "checkpoint-a", 0),
        1: (7, "", 4),  # null metadata answers as Kafka's: ""
        2: (-1, "", -1),  # nothing committed
    }
    # metadata over Kafka's offset.metadata.max.bytes: that partition refused, alone
    errors = raw_commit(kafka, "raw", {0: (6, "x" * 4097, 0), 2: (1, "fits", 0)})
    assert errors == {0: KafkaError.OFFSET_METADATA_TOO_LARGE, 2: 0}
    assert raw_committed(kafka, "raw", [0, 2]) == {0: (5, "checkpoint-a", 0), 2: (1, "fits", 0)}


def test_metadata_committed_by_either_protocol_reads_back_through_the_other(
    kafka_server: ServeProcess, kafka: str
) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("kept", 2)
    produce_each(kafka, "kept", {0: b"a", 1: b"b"})
    reader = Consumer({"bootstrap.servers": kafka, "group.id": "both", "enable.auto.commit": False})
    try:
        mark = TopicPartition("kept", 0, 1, metadata="from librdkafka", leader_epoch=0)
        reader.commit(offsets=[mark], asynchronous=False)
        (found,) = reader.committed([TopicPartition("kept", 0)], timeout=STEP_S)
        assert (found.offset, found.metadata, found.leader_epoch) == (1, "from librdkafka", 0)
        with connect(kafka_server.address) as client:
            # confluent-kafka sends the C string's terminating NUL too; kept as sent, as
            # Kafka keeps it
            sent = "from librdkafka\x00"
            assert client.committed_metadata("both", "kept") == {0: sent}
            client.commit_offsets("both", "kept", {1: 1}, metadata="from fencelog")
            assert client.committed_metadata("both", "kept") == {0: sent, 1: "from fencelog"}
            assert client.committed_offsets("both", "kept")[0] == {0: 1, 1: 1}
        # read back on the wire: confluent-kafka turns committed metadata into a str as a C
        # string, so metadata committed without a NUL (every other client's) reads past its
        # end there (seen as "from fencelogU" once)
        assert raw_committed(kafka, "both", [0, 1]) == {
            0: (1, sent, 0),
            1: (1, "from fencelog", -1),
        }
        (found,) = reader.committed([TopicPartition("kept", 1)], timeout=STEP_S)
        assert found.offset == 1
    finally:
        reader.close()


def test_a_transactions_offsets_keep_their_metadata_to_the_commit(
    kafka_server: ServeProcess, kafka: str
) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("kept", 1)
    reader = Consumer({"bootstrap.servers": kafka, "group.id": "txn", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": kafka, "transactional.id": "meta-1"})
    try:
        producer.init_transactions(STEP_S)
        producer.begin_transaction()
        producer.produce("kept", b"out")
        mark = TopicPartition("kept", 0, 1, metadata="in a txn", leader_epoch=0)
        producer.send_offsets_to_transaction([mark], reader.consumer_group_metadata(), STEP_S)
        assert raw_committed(kafka, "txn", [0]) == {0: (-1, "", -1)}  # not before the commit
        producer.commit_transaction(STEP_S)
        assert raw_committed(kafka, "txn", [0]) == {0: (1, "in a txn\x00", 0)}
    finally:
        reader.close()


# 6. static membership ---------------------------------------------------------------------

STATIC = "statics"


def static_join(member: RawKafka, instance: str, member_id: str = "") -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")
    request = JoinGroupRequest(
        group_id=STATIC,
        session_timeout_ms=30_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=[protocol],
    )
    return member.call(request, 7)


def static_sync(
    member: RawKafka, generation: int, member_id: str, instance: str, assignments: dict[str, bytes]
) -> Any:
    request = SyncGroupRequest(
        group_id=STATIC,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[
            SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in assignments.items()
        ],
    )
    return member.call(request, 5)


def static_heartbeat(member: RawKafka, generation: int, member_id: str, instance: str) -> int:
    request = HeartbeatRequest(
        group_id=STATIC, generation_id=generation, member_id=member_id, group_instance_id=instance
    )
    return int(member.call(request, 4).error_code)


def test_a_restarted_static_member_gets_its_assignment_back_and_fences_the_old_one(
    kafka_server: ServeProcess, kafka: str
) -> None:
    with connect(kafka_server.address) as client:
        client.create_topic("any")
    first, restarted = RawKafka(kafka), RawKafka(kafka)
    try:
        joined = static_join(first, "app-1")
        assert joined.error_code == 0
        generation, old_id = joined.generation_id, joined.member_id
        assigned = static_sync(first, generation, old_id, "app-1", {old_id: b"p0,p1"})
        assert assigned.assignment == b"p0,p1"

        # the same group.instance.id again, without a member id: a restart
        again = static_join(restarted, "app-1")
        assert again.error_code == 0
        assert again.generation_id == generation  # no rebalance
        assert again.member_id != old_id
        assert again.leader == old_id  # so it assigns nothing (Kafka's rule)
        new_id = again.member_id
        back = static_sync(restarted, generation, new_id, "app-1", {})
        assert (back.error_code, back.assignment) == (0, b"p0,p1")
        assert static_heartbeat(restarted, generation, new_id, "app-1") == 0

        # the replaced incarnation is fenced, whatever it sends
        fenced = KafkaError.FENCED_INSTANCE_ID
        assert static_heartbeat(first, generation, old_id, "app-1") == fenced
        assert static_join(first, "app-1", old_id).error_code == fenced
        assert static_sync(first, generation, old_id, "app-1", {}).error_code == fenced
        topic_cls = OffsetCommitRequest.OffsetCommitRequestTopic
        commit = OffsetCommitRequest(
            group_id=STATIC,
            generation_id_or_member_epoch=generation,
            member_id=old_id,
            group_instance_id="app-1",
            topics=[
                topic_cls(
                    name="any",
                    partitions=[
                        topic_cls.OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=1, committed_metadata=None
                        )
                    ],
                )
            ],
        )
        assert first.call(commit, 7).topics[0].partitions[0].error_code == fenced
        leave = LeaveGroupRequest(
            group_id=STATIC,
            members=[LeaveGroupRequest.MemberIdentity(member_id=old_id, group_instance_id="app-1")],
        )
        (left,) = first.call(leave, 4).members
        assert left.error_code == fenced
    finally:
        for member in (first, restarted):
            member.close()


def test_a_static_consumer_restarts_without_a_rebalance_and_a_duplicate_is_fenced(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """librdkafka with group.instance.id: a consumer closed and started again gets its
    partition back while the other member goes on undisturbed (no revoke, no assign);
    a second live consumer with the same id fences the first (a fatal error for it)."""
    with connect(kafka_server.address) as client:
        client.create_topic("seats", 2)
    rebalances: dict[str, int] = {"a": 0, "b": 0}

    def static(instance: str) -> Consumer:
        member = Consumer(
            {
                "bootstrap.servers": kafka,
                "group.id": "seated",
                "group.instance.id": instance,
                "session.timeout.ms": 30_000,
                "heartbeat.interval.ms": 200,
                "enable.auto.commit": False,
            }
        )

        def noted(_consumer: Any, _partitions: Any) -> None:
            rebalances[instance] += 1

        member.subscribe(["seats"], on_assign=noted, on_revoke=noted)
        return member

    def poll_until(done: Any, *members: Consumer) -> None:
        deadline = time.monotonic() + STEP_S
        while not done() and time.monotonic() < deadline:
            for member in members:
                member.poll(0.1)
        assert done()

    def partitions(member: Consumer) -> list[int]:
        return sorted(p.partition for p in member.assignment())

    first, other = static("a"), static("b")
    closing = [first, other]
    try:
        poll_until(lambda: len(partitions(first)) == len(partitions(other)) == 1, first, other)
        held = partitions(first)
        other_rebalances = rebalances["b"]
        first.close()  # a static member does not leave: its place is kept
        restarted = static("a")
        closing.append(restarted)
        poll_until(lambda: partitions(restarted) == held, restarted, other)
        other.poll(0.5)
        assert rebalances["b"] == other_rebalances  # the other member was not disturbed

        duplicate = static("a")  # a second live consumer with the same instance id
        closing.append(duplicate)
        errors: list[KafkaError] = []

        def fenced() -> bool:
            message = restarted.poll(0.1)
            error = None if message is None else message.error()
            if error is not None:
                errors.append(error)
            return bool(errors)

        poll_until(lambda: fenced() and partitions(duplicate) == held, duplicate, other)
        assert errors[0].code() == KafkaError._FATAL
        assert "Static consumer fenced by other consumer" in errors[0].str()
    finally:
        for member in closing:
            with contextlib.suppress(KafkaException, RuntimeError):
                member.close()


# 7. the offsets of transactions, and the lag a consumer sees -------------------------------


def test_aborted_transactions_and_markers_take_no_offsets_and_the_lag_ends_at_zero(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """10 plain records, a transaction of 3 aborted, one of 2 committed: the log holds
    offsets 0-11 (Kafka's would hold 0-16, the aborted records and two markers between),
    and a consumer that read everything sees a lag of 0, its end offsets 12."""
    with connect(kafka_server.address) as client:
        client.create_topic("gaps", 1)
    produce_each(kafka, "gaps", {0: b"plain-0"})
    plain = Producer({"bootstrap.servers": kafka})
    for i in range(1, 10):
        plain.produce("gaps", b"plain-%d" % i, partition=0)
    assert plain.flush(STEP_S) == 0
    txns = Producer({"bootstrap.servers": kafka, "transactional.id": "gaps-1"})
    txns.init_transactions(STEP_S)
    for outcome, count in (("aborted", 3), ("committed", 2)):
        txns.begin_transaction()
        for i in range(count):
            txns.produce("gaps", b"%s-%d" % (outcome.encode(), i), partition=0)
        assert txns.flush(STEP_S) == 0
        if outcome == "aborted":
            txns.abort_transaction(STEP_S)
        else:
            txns.commit_transaction(STEP_S)

    lags: list[tuple[int, int, int]] = []  # (hi_offset, ls_offset, consumer_lag_stored)

    def noted(text: str) -> None:
        stats = json.loads(text)
        part = stats["topics"].get("gaps", {}).get("partitions", {}).get("0")
        if part is not None:
            lags.append((part["hi_offset"], part["ls_offset"], part["consumer_lag_stored"]))

    reader = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "gap-readers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 100,
            "stats_cb": noted,
        }
    )
    try:
        reader.assign([TopicPartition("gaps", 0)])
        found: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + STEP_S
        while (len(found) < 12 or not lags or lags[-1] != (12, 12, 0)) and (
            time.monotonic() < deadline
        ):
            message = reader.poll(0.1)
            if message is not None and message.error() is None:
                found.append((message.offset() or 0, message.value() or b""))
        assert [offset for offset, _ in found] == list(range(12))
        assert [value for _, value in found[10:]] == [b"committed-0", b"committed-1"]
        assert lags[-1] == (12, 12, 0)  # end offsets 12, read up to them
        low, high = reader.get_watermark_offsets(TopicPartition("gaps", 0), STEP_S)
        assert (low, high) == (0, 12)
        reader.commit(offsets=[TopicPartition("gaps", 0, 12)], asynchronous=False)
    finally:
        reader.close()
    with connect(kafka_server.address) as client:  # the lag fencelog shows: none either
        (row,) = [r for r in client.consumer_groups() if r.group == "gap-readers"]
        assert (row.topic, row.partition, row.next_offset) == ("gaps", 0, 12)
        assert client.end_offsets("gaps") == [12]


# 1. (part) null header values kept null ----------------------------------------------------


def test_a_null_header_value_stays_null_through_either_protocol(
    kafka_server: ServeProcess, kafka: str
) -> None:
    headers: list[tuple[str, str | bytes | None]] = [("gone", None), ("empty", b""), ("x", b"1")]
    producer = Producer({"bootstrap.servers": kafka})
    producer.produce("heads", b"plain", partition=0, headers=headers)
    assert producer.flush(STEP_S) == 0
    txns = Producer({"bootstrap.servers": kafka, "transactional.id": "heads-1"})
    txns.init_transactions(STEP_S)
    txns.begin_transaction()
    txns.produce("heads", b"in a txn", partition=0, headers=headers)
    txns.commit_transaction(STEP_S)
    with connect(kafka_server.address) as client:
        client.produce("heads", [NewRecord(b"native", headers=(("gone", None), ("empty", b"")))])
        stored = client.fetch("heads", {0: 0})
    expected = (("gone", None), ("empty", b""), ("x", b"1"))
    assert [r.headers for r in stored] == [expected, expected, expected[:2]]

    shown = native_json(kafka_server, "heads")
    assert [line["headers"] for line in shown][-1] == [["gone", None], ["empty", ""]]

    reader = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "heads",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        reader.assign([TopicPartition("heads", 0, 0)])
        found: list[Message] = []
        deadline = time.monotonic() + STEP_S
        while len(found) < 3 and time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message)
    finally:
        reader.close()
    assert [m.headers() for m in found] == [headers, headers, headers[:2]]


def native_json(server: ServeProcess, topic: str) -> list[dict[str, Any]]:
    completed = subprocess.run(
        ["fencelog", "--broker", server.address, "consume", topic, "--json"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )
    return [json.loads(line) for line in completed.stdout.splitlines()]
