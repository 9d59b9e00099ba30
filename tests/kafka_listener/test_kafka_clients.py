"""Real Kafka clients against `fencelog serve --kafka-listen`: kcat, confluent-kafka
(librdkafka), aiokafka and kafka-python, each as its users write it, on 127.0.0.1.

What they must see: topics auto-created with this broker as the leader, records (keys,
values, headers, timestamps) that read back identically through either protocol, an
idempotent producer's offsets, transactions that are all or nothing with a fenced
zombie, and consumer groups that share partitions, rebalance, and keep their offsets.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
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

from broker.client.client import connect
from broker.types import NewRecord, TopicConfig
from support.servers import ServeProcess, serving
from support.waiting import wait_until

STEP_S = 20.0  # every wait of a test is bounded by this


def poll_values(consumer: Consumer, count: int, timeout_s: float = STEP_S) -> list[Message]:
    """The next count records (and no error), or AssertionError after timeout_s."""
    found: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        found.append(message)
    assert len(found) == count, f"{len(found)} of {count} records within {timeout_s}s"
    return found


def consumer(kafka: str, group: str, **config: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )


def native_records(server: ServeProcess, topic: str) -> list[dict[str, Any]]:
    completed = subprocess.run(
        ["fencelog", "--broker", server.address, "consume", topic, "--json"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )
    return [json.loads(line) for line in completed.stdout.splitlines()]


# kcat -------------------------------------------------------------------------------------


def test_kcat_lists_produces_consumes_and_joins_a_group(
    kafka_server: ServeProcess, kafka: str, kcat: str
) -> None:
    def run(*args: str, stdin: str | None = None) -> str:
        completed = subprocess.run(
            [kcat, "-b", kafka, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=STEP_S,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        return completed.stdout

    run("-P", "-t", "orders", stdin="a\nb\n")  # the topic is created by the producer
    listing = run("-L")
    assert "1 brokers:" in listing
    assert f"broker 0 at {kafka}" in listing
    assert 'topic "orders" with 1 partitions' in listing
    assert "partition 0, leader 0, replicas: 0, isrs: 0" in listing

    lines = run("-C", "-t", "orders", "-o", "beginning", "-e", "-J").splitlines()
    consumed = [json.loads(line) for line in lines]
    assert [(r["offset"], r["payload"]) for r in consumed] == [(0, "a"), (1, "b")]

    grouped = run("-G", "billing", "orders", "-o", "beginning", "-e", "-q")
    assert grouped.split() == ["a", "b"]
    # the group's offsets were committed: the same group starts where it stopped
    run("-P", "-t", "orders", stdin="c\n")
    assert run("-G", "billing", "orders", "-e", "-q").split() == ["c"]

    native = native_records(kafka_server, "orders")
    assert [(r["offset"], r["value"]) for r in native] == [(0, "a"), (1, "b"), (2, "c")]


# records read back identically through either protocol -------------------------------------


def test_records_written_by_either_protocol_read_back_identically(
    kafka_server: ServeProcess, kafka: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka})
    producer.produce(
        "mixed",
        value=b"from kafka",
        key=b"k1",
        headers=[("trace", b"\x00\x01"), ("who", b"kafka")],
        timestamp=1_700_000_000_123,
    )
    assert producer.flush(STEP_S) == 0
    with connect(kafka_server.address) as client:
        client.produce(
            "mixed",
            [
                NewRecord(
                    b"from fencelog", b"k2", (("who", b"native"),), timestamp_ms=1_700_000_000_456
                )
            ],
        )
        stored = client.fetch("mixed", {0: 0})
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in stored] == [
        (b"k1", b"from kafka", (("trace", b"\x00\x01"), ("who", b"kafka")), 1_700_000_000_123),
        (b"k2", b"from fencelog", (("who", b"native"),), 1_700_000_000_456),
    ]

    reader = consumer(kafka, "identical")
    reader.subscribe(["mixed"])
    try:
        seen = poll_values(reader, 2)
    finally:
        reader.close()
    assert [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in seen] == [
        (0, b"k1", b"from kafka", [("trace", b"\x00\x01"), ("who", b"kafka")], 1_700_000_000_123),
        (1, b"k2", b"from fencelog", [("who", b"native")], 1_700_000_000_456),
    ]


# null values: Kafka's tombstone ------------------------------------------------------------


def test_a_null_value_reads_back_null_and_an_empty_value_empty(
    kafka_server: ServeProcess, kafka: str, kcat: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka})
    producer.produce("tombs", value=None, key=b"gone")
    producer.produce("tombs", value=b"", key=b"empty")
    producer.produce("tombs", value=b"v", key=b"kept")
    assert producer.flush(STEP_S) == 0
    with connect(kafka_server.address) as client:
        client.produce("tombs", [NewRecord(None, b"native")])  # a native null, read by Kafka
        assert [r.value for r in client.fetch("tombs", {0: 0})] == [None, b"", b"v", None]
    subprocess.run(  # kcat -Z: an empty message is sent as a null one
        [kcat, "-b", kafka, "-P", "-t", "tombs", "-K:", "-Z"],
        input="kcat:\n",
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )

    reader = consumer(kafka, "tombs")
    reader.subscribe(["tombs"])
    try:
        seen = poll_values(reader, 5)
    finally:
        reader.close()
    assert [(m.key(), m.value()) for m in seen] == [
        (b"gone", None),
        (b"empty", b""),
        (b"kept", b"v"),
        (b"native", None),
        (b"kcat", None),
    ]

    completed = subprocess.run(
        [kcat, "-b", kafka, "-C", "-t", "tombs", "-o", "beginning", "-e", "-f", "%k=%s|%S\\n"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )
    # kcat's %S: a value's length, -1 for a null one
    assert completed.stdout.splitlines() == [
        "gone=|-1",
        "empty=|0",
        "kept=v|1",
        "native=|-1",
        "kcat=|-1",
    ]
    native = native_records(kafka_server, "tombs")
    assert [(r["key"], r["value"]) for r in native] == [
        ("gone", None),
        ("empty", ""),
        ("kept", "v"),
        ("native", None),
        ("kcat", None),
    ]


# the idempotent producer -------------------------------------------------------------------


def test_idempotent_producer_lands_every_record_once_in_order(
    kafka_server: ServeProcess, kafka: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    delivered: list[tuple[Any, int | None]] = []
    for i in range(2000):
        producer.produce(
            "idem",
            value=b"%d" % i,
            on_delivery=lambda error, message: delivered.append((error, message.offset())),
        )
    assert producer.flush(STEP_S) == 0
    assert [error for error, _ in delivered if error is not None] == []
    assert [offset for _, offset in delivered] == list(range(2000))
    records: list[Any] = []
    with connect(kafka_server.address) as client:
        while len(records) < 2000:
            more = client.fetch("idem", {0: len(records)})
            assert more, "the log ends early"
            records += more
    assert [r.value for r in records] == [b"%d" % i for i in range(2000)]
    assert len({r.producer_id for r in records}) == 1  # one pid: the Kafka producer id
    assert records[0].producer_id > 0


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
def test_a_record_batch_of_more_than_ten_thousand_records_lands_whole(
    kafka_server: ServeProcess, kafka: str, transactional: bool
) -> None:
    """Kafka bounds a record batch by bytes only; fencelog refused one of over 10,000
    records (its own append bound) as MESSAGE_TOO_LARGE, failing every message in it, so
    a producer tuned with a large batch.num.messages lost small records."""
    topic = "many-" + ("txn" if transactional else "idem")
    config: dict[str, Any] = {
        "bootstrap.servers": kafka,
        "enable.idempotence": True,
        "batch.num.messages": 100_000,
        "linger.ms": 1000,
    }
    if transactional:
        config["transactional.id"] = "many-1"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(STEP_S)
        producer.begin_transaction()
    failed: list[Any] = []
    for i in range(25_000):
        producer.produce(
            topic,
            value=b"%d" % i,
            partition=0,
            on_delivery=lambda e, m: failed.append(e) if e else None,
        )
    assert producer.flush(STEP_S) == 0
    if transactional:
        producer.commit_transaction(STEP_S)
    assert failed == []
    with connect(kafka_server.address) as client:
        assert client.end_offsets(topic) == [25_000]
        first = client.fetch(topic, {0: 0}, max_records=3)
    assert [r.value for r in first] == [b"0", b"1", b"2"]


@pytest.mark.parametrize("kind", ["plain", "idempotent", "transactional"])
def test_a_producers_batches_of_values_keep_each_records_value_and_timestamp(
    kafka_server: ServeProcess, kafka: str, kind: str
) -> None:
    """Batches of thousands of values of one size (what the listener reads as columns)
    with a timestamp each, a few milliseconds apart (deltas of one to three varint
    bytes) and one out of order: every record reads back with its own value and
    timestamp, at its offset, through a plain producer's batch cut in stored batches
    of 1000, an idempotent one's and a transaction's."""
    topic = f"timed-{kind}"
    config: dict[str, Any] = {"bootstrap.servers": kafka, "linger.ms": 200}
    if kind != "plain":
        config["enable.idempotence"] = True
    if kind == "transactional":
        config["transactional.id"] = "timed-1"
    producer = Producer(config)
    if kind == "transactional":
        producer.init_transactions(STEP_S)
        producer.begin_transaction()
    base = 1_700_000_000_000
    sent = [(b"%08d" % i * 12 + b"\x00" * 4, base + 7 * i) for i in range(2500)]
    sent[1234] = (sent[1234][0], base - 5)  # earlier than the batch's first
    for value, stamp in sent:
        producer.produce(topic, value=value, partition=0, timestamp=stamp)
    assert producer.flush(STEP_S) == 0
    if kind == "transactional":
        producer.commit_transaction(STEP_S)
    read: list[Any] = []
    with connect(kafka_server.address) as client:
        while len(read) < len(sent):
            page = client.fetch(topic, {0: len(read)}, max_records=1000)
            assert page, f"{len(read)} of {len(sent)} records read"
            read += page
    assert [(r.offset, r.value, r.timestamp_ms) for r in read] == [
        (offset, value, stamp) for offset, (value, stamp) in enumerate(sent)
    ]


def test_an_idempotent_producers_own_epoch_bump_lands_its_later_records(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """After a message fails for good (here too large for the broker: over the 32 MiB
    of a batch), librdkafka bumps its idempotent producer's epoch by itself and numbers
    the next batches from 0 again: they are new records, not retries of the first ones,
    and must be written (they were acknowledged with the first records' offsets and
    dropped)."""
    producer = Producer(
        {"bootstrap.servers": kafka, "enable.idempotence": True, "message.max.bytes": 40 << 20}
    )
    delivered: list[tuple[bytes, int | None, int]] = []

    def note(error: Any, message: Message) -> None:
        code = 0 if error is None else error.code()
        delivered.append(((message.value() or b"")[:6], message.offset(), code))

    for i in range(50):
        producer.produce("bumped", value=b"before%d" % i, on_delivery=note)
    assert producer.flush(STEP_S) == 0
    producer.produce("bumped", value=b"x" * ((32 << 20) + 1), on_delivery=note)  # refused
    assert producer.flush(STEP_S) == 0
    for i in range(50):
        producer.produce("bumped", value=b"after%d" % i, on_delivery=note)
    assert producer.flush(STEP_S) == 0
    failed = [entry for entry in delivered if entry[2] != 0]
    assert [value for value, _, _ in failed] == [b"xxxxxx"]
    later = [offset for value, offset, code in delivered if value.startswith(b"after")]
    assert later == list(range(50, 100))
    with connect(kafka_server.address) as client:
        records = client.fetch("bumped", {0: 0}, max_records=1000)
    expected = [b"before%d" % i for i in range(50)] + [b"after%d" % i for i in range(50)]
    assert [r.value for r in records] == expected
    assert records[50].generation == records[0].generation + 1  # the epoch the client bumped


def test_the_cluster_id_is_the_data_directorys_across_restarts(tmp_path: Path) -> None:
    """Kafka's cluster id is persistent, and librdkafka warns of "multiple clusters"
    when it changes: a restarted server keeps it; another data directory has its own."""

    def cluster_id(data: Path) -> str:
        serve_args = ("--no-unix", "--kafka-listen", "127.0.0.1:0")
        with serving(data, tmp_path / "ready.json", serve_args=serve_args) as server:
            admin = AdminClient({"bootstrap.servers": server.kafka})
            found: str = admin.describe_cluster(request_timeout=STEP_S).result(STEP_S).cluster_id
            return found

    first = cluster_id(tmp_path / "one")
    assert first.startswith("fencelog-")
    assert cluster_id(tmp_path / "one") == first
    assert cluster_id(tmp_path / "two") != first


# transactions ------------------------------------------------------------------------------


def test_transactions_are_all_or_nothing_and_a_zombie_is_fenced(
    kafka_server: ServeProcess, kafka: str
) -> None:
    seed = Producer({"bootstrap.servers": kafka})
    for i in range(5):
        seed.produce("tin", value=b"in%d" % i)
    assert seed.flush(STEP_S) == 0

    source = consumer(kafka, "copier", **{"isolation.level": "read_committed"})
    source.subscribe(["tin"])
    copier = Producer({"bootstrap.servers": kafka, "transactional.id": "copier-1"})
    copier.init_transactions(STEP_S)
    try:
        inputs = poll_values(source, 5)
        copier.begin_transaction()
        for message in inputs:
            copier.produce("tout", value=(message.value() or b"").upper())
        copier.send_offsets_to_transaction(
            [TopicPartition("tin", 0, (inputs[-1].offset() or 0) + 1)],
            source.consumer_group_metadata(),
            STEP_S,
        )
        copier.commit_transaction(STEP_S)

        copier.begin_transaction()
        copier.produce("tout", value=b"NEVER")
        assert copier.flush(STEP_S) == 0
        copier.abort_transaction(STEP_S)

        newer = Producer({"bootstrap.servers": kafka, "transactional.id": "copier-1"})
        newer.init_transactions(STEP_S)  # a new incarnation: the epoch goes up
        copier.begin_transaction()
        copier.produce("tout", value=b"ZOMBIE")
        with pytest.raises(KafkaException) as fenced:
            copier.commit_transaction(STEP_S)
        assert fenced.value.args[0].fatal()
        assert "fenced" in fenced.value.args[0].str().lower()
        assert source.committed([TopicPartition("tin", 0)], STEP_S)[0].offset == 5
    finally:
        source.close()

    reader = consumer(kafka, "reader", **{"isolation.level": "read_committed"})
    reader.subscribe(["tout"])
    try:
        copied = poll_values(reader, 5)
        assert reader.poll(1.0) is None  # nothing aborted, nothing from the zombie
    finally:
        reader.close()
    assert [m.value() for m in copied] == [b"IN%d" % i for i in range(5)]
    native = native_records(kafka_server, "tout")
    assert [r["value"] for r in native] == [f"IN{i}" for i in range(5)]

    listed = subprocess.run(
        ["fencelog", "--broker", kafka_server.address, "txn", "list", "--all", "--json"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=True,
    )
    states = [(t["group"], t["state"]) for t in map(json.loads, listed.stdout.splitlines())]
    assert ("kafka:copier-1", "committed") in states
    assert ("kafka:copier-1", "aborted") in states


def test_a_transaction_the_broker_timed_out_commits_none_of_its_partitions(
    kafka_server: ServeProcess, kafka: str
) -> None:
    """Its first partition's records were aborted with it; the partitions added after
    the timeout used to go into a new transaction, which the commit then committed
    (half a Kafka transaction, acknowledged). The producer is fenced instead, as
    Kafka's coordinator fences it by bumping the epoch when it aborts."""
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic("halves", 2, 1)])["halves"].result(STEP_S)
    slow = Producer(
        {
            "bootstrap.servers": kafka,
            "transactional.id": "slow-1",
            "transaction.timeout.ms": 1000,
        }
    )
    slow.init_transactions(STEP_S)
    slow.begin_transaction()
    slow.produce("halves", value=b"first", partition=0)
    assert slow.flush(STEP_S) == 0
    with connect(kafka_server.address) as client:  # past transaction.timeout.ms: aborted

        def aborted() -> bool:
            ended = client.txn_list(include_ended=True)  # expires what is past its deadline
            return any(t.group == "kafka:slow-1" and t.state == "aborted" for t in ended)

        wait_until(aborted, STEP_S, message="the broker aborting the timed-out transaction")
    with pytest.raises(KafkaException) as failed:
        slow.produce("halves", value=b"second", partition=1)
        slow.flush(STEP_S)
        slow.commit_transaction(STEP_S)
    assert failed.value.args[0].fatal(), failed.value.args[0]
    reader = consumer(kafka, "halves-reader", **{"isolation.level": "read_committed"})
    reader.assign([TopicPartition("halves", 0, 0), TopicPartition("halves", 1, 0)])
    try:
        assert reader.poll(2.0) is None
    finally:
        reader.close()
    assert native_records(kafka_server, "halves") == []


# consumer groups ---------------------------------------------------------------------------


def assigned(member: Consumer) -> set[int]:
    member.poll(0.2)
    return {tp.partition for tp in member.assignment()}


def test_two_members_share_the_partitions_and_one_leaving_rebalances(
    kafka_server: ServeProcess, kafka: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic("shared", num_partitions=2, replication_factor=1)])[
        "shared"
    ].result(STEP_S)
    first = consumer(kafka, "pair", **{"heartbeat.interval.ms": 300, "session.timeout.ms": 6000})
    second = consumer(kafka, "pair", **{"heartbeat.interval.ms": 300, "session.timeout.ms": 6000})
    first.subscribe(["shared"])
    second.subscribe(["shared"])
    try:
        wait_until(
            lambda: assigned(first) | assigned(second) == {0, 1},
            STEP_S,
            message="assignment of both",
        )
        wait_until(
            lambda: len(assigned(first)) == 1 and len(assigned(second)) == 1,
            STEP_S,
            message="one partition each",
        )
        second.close()  # LeaveGroup: the first member takes both
        wait_until(
            lambda: assigned(first) == {0, 1}, STEP_S, message="rebalance after a member left"
        )
    finally:
        first.close()


def test_committed_offsets_are_the_groups(kafka_server: ServeProcess, kafka: str) -> None:
    producer = Producer({"bootstrap.servers": kafka})
    for i in range(4):
        producer.produce("kept", value=b"%d" % i)
    assert producer.flush(STEP_S) == 0
    member = consumer(kafka, "keeper")
    member.subscribe(["kept"])
    try:
        poll_values(member, 3)
        member.commit(offsets=[TopicPartition("kept", 0, 3)], asynchronous=False)
    finally:
        member.close()
    with connect(kafka_server.address) as client:
        assert client.committed_offsets("keeper", "kept")[0] == {0: 3}
    again = consumer(kafka, "keeper")
    again.subscribe(["kept"])
    try:
        (rest,) = poll_values(again, 1)
    finally:
        again.close()
    assert (rest.offset(), rest.value()) == (3, b"3")


# aiokafka and kafka-python -------------------------------------------------------------------


def test_aiokafka_produces_consumes_in_a_group_and_commits(kafka: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioPartition

    async def main() -> tuple[list[int], list[bytes], int | None]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True)
        await producer.start()
        try:
            offsets = [
                (await producer.send_and_wait("aio", b"v%d" % i, key=b"k")).offset for i in range(5)
            ]
        finally:
            await producer.stop()
        member = AIOKafkaConsumer(
            "aio", bootstrap_servers=kafka, group_id="aio-group", auto_offset_reset="earliest"
        )
        await member.start()
        try:
            values = []
            async for message in member:
                values.append(message.value)
                if len(values) == 5:
                    break
            await member.commit()
            committed = await member.committed(AioPartition("aio", 0))
        finally:
            await member.stop()
        return offsets, values, committed

    offsets, values, committed = asyncio.run(asyncio.wait_for(main(), STEP_S * 2))
    assert offsets == [0, 1, 2, 3, 4]
    assert values == [b"v%d" % i for i in range(5)]
    assert committed == 5


def test_kafka_python_produces_and_consumes_in_a_group(kafka: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpPartition

    producer = KafkaProducer(bootstrap_servers=kafka, request_timeout_ms=10_000)
    offsets = [producer.send("kp", b"%d" % i).get(timeout=STEP_S).offset for i in range(3)]
    producer.close(timeout=STEP_S)
    member = KafkaConsumer(
        "kp",
        bootstrap_servers=kafka,
        group_id="kp-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5_000,
    )
    try:
        values = []
        for message in member:
            values.append(message.value)
            if len(values) == 3:
                break
        member.commit()
        committed = member.committed(KpPartition("kp", 0))
    finally:
        member.close()
    assert offsets == [0, 1, 2]
    assert values == [b"0", b"1", b"2"]
    assert committed == 3


# admin and offsets -----------------------------------------------------------------------------


def test_create_topics_and_offsets_by_time(kafka_server: ServeProcess, kafka: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    created = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
    created["made"].result(STEP_S)
    again = admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
    with pytest.raises(KafkaException, match="already exists"):
        again["made"].result(STEP_S)
    replicated = admin.create_topics([NewTopic("copies", num_partitions=1, replication_factor=3)])
    with pytest.raises(KafkaException, match="replication factor"):
        replicated["copies"].result(STEP_S)
    assert sorted(admin.list_topics(timeout=STEP_S).topics["made"].partitions) == [0, 1, 2]
    # topic configs fencelog has are applied (they were dropped without a word); a bad
    # value is INVALID_CONFIG; Kafka's others are accepted
    configs = {"cleanup.policy": "compact", "retention.ms": "86400000", "segment.ms": "1000"}
    compacted = admin.create_topics([NewTopic("keyed", 1, 1, config=configs)])
    compacted["keyed"].result(STEP_S)
    bogus = admin.create_topics([NewTopic("nope", 1, 1, config={"cleanup.policy": "bogus"})])
    with pytest.raises(KafkaException, match=r"cleanup\.policy is delete, compact or both"):
        bogus["nope"].result(STEP_S)
    with connect(kafka_server.address) as client:
        assert client.describe_topic("keyed").config == TopicConfig(86_400_000, None, "compact")
        assert "nope" not in [t.name for t in client.list_topics()]
    # a record the broker refuses is INVALID_RECORD, as in Kafka (it was INVALID_REQUEST)
    keyless = Producer({"bootstrap.servers": kafka})
    errors: list[Any] = []
    keyless.produce("keyed", value=b"no key", on_delivery=lambda e, m: errors.append(e))
    keyless.flush(STEP_S)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]

    producer = Producer({"bootstrap.servers": kafka})
    for i, stamp in enumerate((1_000, 2_000, 3_000)):
        producer.produce("made", value=b"%d" % i, partition=1, timestamp=stamp)
    assert producer.flush(STEP_S) == 0
    reader = consumer(kafka, "times")
    try:
        found = [
            reader.offsets_for_times([TopicPartition("made", 1, stamp)], STEP_S)[0]
            for stamp in (1_500, 9_000)  # one partition per request: one request each
        ]
        low, high = reader.get_watermark_offsets(TopicPartition("made", 1), STEP_S)
    finally:
        reader.close()
    assert [tp.offset for tp in found] == [1, -1]
    assert (low, high) == (0, 3)
