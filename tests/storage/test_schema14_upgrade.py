"""Data directories of older schemas opened by the current code (issue 36): every record,
offset, epoch, transaction and group offset reads back as the code that wrote it read it,
and the broker goes on from there. Every test runs on each of two fixtures:

- tests/storage/fixtures/schema14.db.gz, made with the code of schema 014 (a row a
  record): its open moves the records into the log of batches (schema 015) and that into
  the table with rowids (016);
- schema15.db.gz, made with the code of schema 015 (the log of batches in a WITHOUT
  ROWID table, commit 82bb924): its open copies the batches into 016's table.

Both were made by tests/storage/fixtures/make_schema14.py; schemaNN.json is what that
code read back from it (tests/support/schema14.py's `read_back`), with the facts the
behaviour checks need. Each test gunzips its own copy. The client is opened with a
clock at the moment the fixture was made, so that its open transaction has not timed
out and its pids have not expired, however long after it runs.

- every topic and partition reads back exactly (from the start, and from offsets inside
  large batches, at a compaction gap, below a log start), through the embedded client and
  `fencelog consume --json`; the compacted view, log starts, consumer group offsets (with
  metadata and producer state), offsets by time and transactions agree;
- the idempotent producer's retries are duplicates with their original offsets, its older
  generation is fenced, its next batch appends; the open transaction commits (or aborts)
  and its records and offsets then read back; the prepared one is complete; the exclusive
  topic's epoch goes on and a stale one is refused;
- `fencelog verify` and `fencelog check` find nothing wrong; new records take the old end
  offsets; a Kafka consumer (through `serve --kafka-listen`) reads the records with their
  headers and timestamps, and its group's committed offsets and metadata;
- killed with SIGKILL during the migration (FENCELOG_MIGRATE_FAILPOINT=step:N after its
  Nth committed step, moved:N inside the Nth step, 50 records a step), the directory
  opens, finishes it and reads back the same; killed after every step, one open after
  another, it finishes too. These fail until the migration (and its failpoints) exist.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from confluent_kafka import Consumer, TopicPartition

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
from broker.engine import backup
from broker.errors import BrokerError, ErrorCode
from broker.storage import batches, database
from broker.types import NewRecord, ProducerFields
from support.helpers import fencelog_script, user_env
from support.producing import FakeClock
from support.schema14 import (
    MADE_SCHEMAS,
    Made,
    b64,
    made_with,
    read_back,
    read_topic,
    record_json,
    unb64,
    unpack_db,
)
from support.servers import serving

STEP_S: Final = 60.0
TOPIC_NAMES: Final = sorted(made_with(MADE_SCHEMAS[0]).topics)  # every fixture's
# (topic, partition, offset): a read that starts inside a batch of 64 records or more, at
# an offset compaction removed, or below a log start
STARTS_INSIDE: Final = [
    ("plain", 0, 50),
    ("plain", 0, 140),
    ("plain", 1, 99),
    ("mixed", 0, 40),
    ("mixed", 1, 100),
    ("idem", 0, 110),
    ("idem", 1, 57),
    ("excl", 0, 40),
    ("txn-a", 0, 35),
    ("prepared", 0, 35),
    ("kafka-idem", 1, 50),
    ("kafka-txn", 0, 35),
    ("retained", 0, 80),
    ("cut", 0, 50),
]
MIGRATION_FAILPOINTS: Final = [f"{where}:{n}" for where in ("step", "moved") for n in (1, 2, 3, 10)]
MIGRATION_ENV: Final = {"FENCELOG_MIGRATE_STEP_RECORDS": "50"}
MIGRATION_RUNS_MAX: Final = 1_000  # killed after one step each time: more than it has


@pytest.fixture(params=MADE_SCHEMAS, ids=lambda schema: f"schema{schema}")
def made(request: pytest.FixtureRequest) -> Made:
    """Each fixture in turn: the directory of schema 014 (a row a record) and of 015."""
    return made_with(request.param)


@pytest.fixture
def upgraded(made: Made, tmp_path: Path) -> Path:
    """A copy of the fixture's directory, not opened yet."""
    return unpack_db(made.db, tmp_path / "data")


@pytest.fixture
def client(made: Made, upgraded: Path) -> Iterator[Client]:
    with opened(made, upgraded) as client:
        yield client


def opened(made: Made, data_dir: Path) -> Client:
    return connect(data_dir, durability="normal", clock=FakeClock(made.clock_ms))


def records_of(made: Made, topic: str, partition: int) -> list[dict[str, Any]]:
    logs = made.topics[topic]["partition_logs"]
    records: list[dict[str, Any]] = logs[str(partition)]["records"]
    return records


def fencelog(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(fencelog_script()), "--broker", str(data_dir), *args],
        env=user_env(**env),
        capture_output=True,
        text=True,
        timeout=STEP_S,
        check=False,
    )


def json_out(completed: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert completed.returncode == 0, (completed.args, completed.returncode, completed.stderr)
    return [json.loads(line) for line in completed.stdout.splitlines()]


def assert_reads_back_as_made(made: Made, seen: dict[str, Any]) -> None:
    """read_back of the opened copy is the fixture's, section by section."""
    assert sorted(seen["topics"]) == sorted(made.topics)
    for name, topic in made.topics.items():
        assert seen["topics"][name] == topic, name
    assert seen["transactions"] == made.document["transactions"]
    assert seen["groups"] == made.document["groups"]


# reading back ------------------------------------------------------------------------------


def test_the_fixture_holds_every_kind_of_record(made: Made) -> None:
    """What the other tests rely on is in the fixture (it cannot pass by being empty)."""
    assert sorted(made.topics) == TOPIC_NAMES
    topics = made.topics
    everything = [
        r for t in topics for p in range(topics[t]["partitions"]) for r in records_of(made, t, p)
    ]
    assert len(everything) > 1_000
    assert any(r["value"] == "" for r in everything)  # an empty value
    assert any(r["key"] is not None and r["headers"] for r in everything)
    assert any(value is None for r in everything for _, value in r["headers"])
    assert any(r["producer_id"] and r["sequence"] for r in everything)
    assert any(r["epoch"] == 2 for r in everything)
    assert any(r["txn_id"] is not None for r in everything)
    assert any(r["timestamp_ms"] < made.clock_ms - 10**10 for r in everything)
    assert topics["cut"]["partition_logs"]["0"]["start_offset"] == 37
    assert topics["retained"]["partition_logs"]["0"]["start_offset"] == 60
    assert topics["compacted"]["compacted"]
    states = {t["txn_id"]: t["state"] for t in made.document["transactions"]}
    assert states[made.facts["open"]["txn_id"]] == "open"
    assert "aborted" in states.values()


@pytest.mark.parametrize("topic", TOPIC_NAMES)
def test_each_topic_reads_back_as_its_schema_read_it(
    made: Made, client: Client, topic: str
) -> None:
    assert read_topic(client, topic) == made.topics[topic]


def test_transactions_and_group_offsets_read_back_as_its_schema_read_them(
    made: Made, client: Client
) -> None:
    seen = read_back(client)
    assert seen["transactions"] == made.document["transactions"]
    assert seen["groups"] == made.document["groups"]


@pytest.mark.parametrize(("topic", "partition", "offset"), STARTS_INSIDE)
def test_a_read_from_inside_a_batch_starts_at_its_offset(
    made: Made, client: Client, topic: str, partition: int, offset: int
) -> None:
    records = records_of(made, topic, partition)
    assert records[0]["offset"] < offset < records[-1]["offset"]
    expected = [r for r in records if r["offset"] >= offset]
    read = client.consume(topic, partition=partition, start=offset)
    assert [record_json(r) for r in read] == expected
    fetched = client.fetch(topic, {partition: offset}, max_records=3)
    assert [record_json(r) for r in fetched] == expected[:3]


def test_a_read_at_a_compacted_offset_or_below_the_log_start_gets_the_next_record(
    made: Made, client: Client
) -> None:
    compacted = [r["offset"] for r in records_of(made, "compacted", 0)]
    gap = next(o for o in range(compacted[0], compacted[-1]) if o not in compacted)
    [first] = client.fetch("compacted", {0: gap}, max_records=1)
    assert first.offset == min(o for o in compacted if o > gap)
    assert [r.offset for r in client.consume("cut", partition=0)][:1] == [37]
    assert list(client.consume("cut", partition=1)) == []


@pytest.mark.parametrize("topic", TOPIC_NAMES)
def test_fencelog_consume_json_prints_every_record(made: Made, upgraded: Path, topic: str) -> None:
    lines = json_out(fencelog(upgraded, "consume", topic, "--json", "--format", "base64"))
    printed = sorted(lines, key=lambda line: (line["partition"], line["offset"]))
    expected = [
        {
            "topic": topic,
            "partition": partition,
            "offset": r["offset"],
            "timestamp_ms": r["timestamp_ms"],
            "key": r["key"],
            "value": r["value"],
            "headers": r["headers"],
            "epoch": r["epoch"],
        }
        | ({} if r["txn_id"] is None else {"txn_id": r["txn_id"]})
        for partition in range(made.topics[topic]["partitions"])
        for r in records_of(made, topic, partition)
    ]
    assert printed == expected


def test_fencelog_consume_from_inside_a_batch_and_compacted(made: Made, upgraded: Path) -> None:
    lines = json_out(
        fencelog(
            upgraded, "consume", "plain", "-p", "0", "--from", "50", "--json", "--format", "base64"
        )
    )
    assert [(line["offset"], line["value"]) for line in lines] == [
        (r["offset"], r["value"]) for r in records_of(made, "plain", 0) if r["offset"] >= 50
    ]
    lines = json_out(
        fencelog(upgraded, "consume", "compacted", "--compacted", "--json", "--format", "base64")
    )
    assert [(line["partition"], line["offset"], line["key"], line["value"]) for line in lines] == [
        (r["partition"], r["offset"], r["key"], r["value"])
        for r in made.topics["compacted"]["compacted"]
    ]


# behaviour after the upgrade ---------------------------------------------------------------


def test_an_idempotent_retry_is_a_duplicate_at_its_original_offsets_and_the_next_appends(
    made: Made, client: Client
) -> None:
    facts = made.facts["idempotent"]
    topic, partition, pid = facts["topic"], facts["partition"], facts["producer_id"]
    generation, next_sequence = facts["generation"], facts["next_sequence"]
    assert client.lease_pid(topic, partition, pid).sequence == next_sequence - 1
    for retry in facts["retries"]:
        values = [unb64(v) or b"" for v in retry["values"]]
        fields = ProducerFields(pid, generation, retry["first_sequence"])
        results = client.produce(topic, values, partition=partition, producer=fields)
        assert [(r.offset, r.duplicate) for r in results] == [(o, True) for o in retry["offsets"]]
    with pytest.raises(BrokerError) as zombie:
        client.produce(
            topic,
            [b"zombie"],
            partition=partition,
            producer=ProducerFields(pid, facts["older_generation"], next_sequence),
        )
    assert zombie.value.code is ErrorCode.FENCED
    end = made.topics[topic]["partition_logs"][str(partition)]["end_offset"]
    fields = ProducerFields(pid, generation, next_sequence)
    first = client.produce(topic, [b"next-1", b"next-2"], partition=partition, producer=fields)
    assert [(r.offset, r.duplicate) for r in first] == [(end, False), (end + 1, False)]
    again = client.produce(topic, [b"next-1", b"next-2"], partition=partition, producer=fields)
    assert [(r.offset, r.duplicate) for r in again] == [(end, True), (end + 1, True)]
    assert [r.value for r in client.consume(topic, partition=partition, start=end)] == [
        b"next-1",
        b"next-2",
    ]


@pytest.mark.parametrize("ending", ["commit", "abort"])
def test_the_open_transaction_can_still_end(made: Made, client: Client, ending: str) -> None:
    facts = made.facts["open"]
    txn_id, topic = facts["txn_id"], facts["topic"]
    found = client.txn_begin(facts["group"], key=facts["key"])
    assert (found.txn_id, found.state, found.existing) == (txn_id, "open", True)
    assert list(client.consume(topic)) == []
    offsets = facts["offsets"]
    if ending == "abort":
        assert client.txn_abort(txn_id).state == "aborted"
        assert list(client.consume(topic)) == []
        assert client.committed_offsets(offsets["group"], offsets["topic"])[0] == {}
        return
    assert client.txn_commit(txn_id).state == "committed"
    read = list(client.consume(topic))
    assert [[b64(r.key), b64(r.value)] for r in read] == facts["records"]
    assert [r.offset for r in read] == list(range(len(facts["records"])))
    assert {r.txn_id for r in read} == {txn_id}
    committed = client.committed_offsets(offsets["group"], offsets["topic"])[0]
    assert {str(p): o for p, o in committed.items()} == offsets["offsets"]


def test_the_prepared_transaction_is_complete(made: Made, client: Client) -> None:
    facts = made.facts["prepared"]
    assert client.txn_show(facts["txn_id"]).info.state == "committed"
    [listed] = [t for t in made.document["transactions"] if t["txn_id"] == facts["txn_id"]]
    for topic, partition, count, _, base_offset in listed["partitions"]:
        read = list(client.consume(topic, partition=partition))
        assert len(read) == count and read[0].offset == base_offset
        assert {r.txn_id for r in read} == {facts["txn_id"]}


def test_the_exclusive_topic_epoch_goes_on_and_a_stale_one_is_fenced(
    made: Made, client: Client
) -> None:
    facts = made.facts["exclusive"]
    topic = facts["topic"]
    assert client.topic_access(topic).epoch == facts["epoch"]
    with pytest.raises(BrokerError) as stale:
        client.producer(
            topic, access="exclusive", name=facts["stale_name"], epoch=facts["stale_epoch"]
        )
    assert stale.value.code is ErrorCode.PRODUCER_FENCED
    with client.producer(topic, idempotent=False, access="exclusive", name="after") as after:
        assert after.epoch == facts["epoch"] + 1
        [result] = after.send([b"after-upgrade"])
    assert result.offset == made.topics[topic]["partition_logs"]["0"]["end_offset"]
    [record] = client.consume(topic, start=result.offset)
    assert (record.value, record.epoch) == (b"after-upgrade", facts["epoch"] + 1)


def test_new_records_take_the_old_end_offsets(made: Made, client: Client) -> None:
    for name, topic in made.topics.items():
        for partition in range(topic["partitions"]):
            record = NewRecord(b"new", b"key", (), partition)
            [result] = client.produce(name, [record])
            end = topic["partition_logs"][str(partition)]["end_offset"]
            assert (name, partition, result.offset) == (name, partition, end)
            [read] = client.consume(name, partition=partition, start=end)
            assert (read.offset, read.key, read.value) == (end, b"key", b"new")


def test_verify_and_check_find_nothing_wrong(made: Made, upgraded: Path) -> None:
    [checked] = json_out(fencelog(upgraded, "check", "--json"))
    assert (checked["ok"], checked["problems"]) == (True, [])
    for topic in made.topics:
        completed = fencelog(upgraded, "verify", topic, "--json")
        [report] = [json.loads(line) for line in completed.stdout.splitlines()]
        found = {kind: count for kind, count in report["counts"].items() if count}
        if topic == "compacted":  # the offsets compaction removed, and only them
            assert found == {"gap": _gaps(made, "compacted")}, found
        elif topic == made.facts["open"]["topic"]:  # open (or, by now, timed out): that only
            assert set(found) <= {"open_txn", "stale_txn"}, found
        else:
            assert (found, completed.returncode) == ({}, 0), (topic, report)
    [checked] = json_out(fencelog(upgraded, "check", "--json"))
    assert checked["ok"] is True


def _gaps(made: Made, topic: str) -> int:
    """Runs of offsets missing between each partition's log start and end."""
    runs = 0
    for partition, log in made.topics[topic]["partition_logs"].items():
        expected = log["start_offset"]
        for record in [*records_of(made, topic, int(partition)), {"offset": log["end_offset"]}]:
            runs += record["offset"] > expected
            expected = record["offset"] + 1
    return runs


def test_an_old_snapshot_file_restores_and_reads_back(
    made: Made, upgraded: Path, tmp_path: Path
) -> None:
    """The fixture's database is what `snapshot create` writes (one file, checkpointed):
    restored into a new directory, it reads back as its schema read it."""
    restored = tmp_path / "restored"
    json_out(fencelog(restored, "snapshot", "restore", str(upgraded / DB_FILE), "--json"))
    with opened(made, restored) as client:
        assert_reads_back_as_made(made, read_back(client))


# through the Kafka listener -----------------------------------------------------------------


def test_a_kafka_consumer_reads_the_kafka_records_and_its_groups_offsets(
    made: Made, upgraded: Path
) -> None:
    """Keys, values, headers (a null header value), the producer's own timestamps and the
    Kafka group's committed offsets with their metadata, as a Kafka client sees them."""
    serve_args = ("--no-unix", "--kafka-listen", "127.0.0.1:0")
    with serving(upgraded, upgraded.parent / "ready.json", serve_args=serve_args) as server:
        consumer = Consumer(
            {
                "bootstrap.servers": server.kafka,
                "group.id": made.facts["kafka_group"]["group"],
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        try:
            group = made.facts["kafka_group"]
            committed = consumer.committed(
                [TopicPartition(group["topic"], p) for p, _, _ in group["committed"]], STEP_S
            )
            answered = [[tp.partition, tp.offset, tp.metadata] for tp in committed]
            assert answered == group["committed"]
            for topic in ("kafka-idem", "kafka-txn", "mixed"):
                for partition in range(made.topics[topic]["partitions"]):
                    expected = [_as_kafka(r) for r in records_of(made, topic, partition)]
                    consumer.assign([TopicPartition(topic, partition, 0)])
                    read = [_kafka_record(m) for m in _poll(consumer, len(expected))]
                    assert read == expected, (topic, partition)
        finally:
            consumer.close()


def _as_kafka(record: dict[str, Any]) -> tuple[Any, ...]:
    """A record of the JSON as _kafka_record gives it: a null value as empty, as schema
    014's native read gave the Kafka producer's null value (015's gives null)."""
    headers = [(name, unb64(value)) for name, value in record["headers"]]
    return (
        record["offset"],
        record["timestamp_ms"],
        unb64(record["key"]),
        unb64(record["value"]) or b"",
        headers or None,
    )


def _kafka_record(message: Any) -> tuple[Any, ...]:
    assert message.error() is None, message.error()
    value = message.value()
    return (
        message.offset(),
        message.timestamp()[1],
        message.key(),
        b"" if value is None else value,
        message.headers(),
    )


def _poll(consumer: Consumer, count: int) -> list[Any]:
    found: list[Any] = []
    deadline = time.monotonic() + STEP_S
    while len(found) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            found.append(message)
    assert len(found) == count, f"{len(found)} of {count} records within {STEP_S}s"
    return found


# kill -9 during the migration ---------------------------------------------------------------


def migrate_killed(data_dir: Path, failpoint: str) -> subprocess.CompletedProcess[str]:
    """`fencelog topic list` (an open: the migration) armed with failpoint."""
    return fencelog(
        data_dir, "topic", "list", "--json", **MIGRATION_ENV, FENCELOG_MIGRATE_FAILPOINT=failpoint
    )


def assert_killed(completed: subprocess.CompletedProcess[str], failpoint: str) -> None:
    assert completed.returncode == -9, (
        f"FENCELOG_MIGRATE_FAILPOINT={failpoint}: exit {completed.returncode}, not SIGKILL; "
        f"stderr: {completed.stderr!r}"
    )


def assert_finished_as_made(made: Made, data_dir: Path) -> None:
    """Opened (twice: the second open changes nothing), it reads back as its schema did,
    an idempotent retry is still a duplicate, and `fencelog check` passes."""
    for _ in range(2):
        with opened(made, data_dir) as client:
            assert_reads_back_as_made(made, read_back(client))
    with opened(made, data_dir) as client:
        facts = made.facts["idempotent"]
        [retry, *_] = facts["retries"]
        values = [unb64(v) or b"" for v in retry["values"]]
        fields = ProducerFields(facts["producer_id"], facts["generation"], retry["first_sequence"])
        results = client.produce(
            facts["topic"], values, partition=facts["partition"], producer=fields
        )
        assert [(r.offset, r.duplicate) for r in results] == [(o, True) for o in retry["offsets"]]
    [checked] = json_out(fencelog(data_dir, "check", "--json"))
    assert (checked["ok"], checked["problems"]) == (True, [])


@pytest.mark.parametrize("failpoint", MIGRATION_FAILPOINTS)
def test_kill_9_during_migration(made: Made, upgraded: Path, failpoint: str) -> None:
    """The migration of the old schema, 50 records a step, killed after its Nth committed
    step (step:N) or inside it before its commit (moved:N): the directory opens, finishes
    it and reads back the same. Fails until the migration exists."""
    assert_killed(migrate_killed(upgraded, failpoint), failpoint)
    assert_finished_as_made(made, upgraded)


def test_kill_9_after_every_step_of_the_migration(made: Made, upgraded: Path) -> None:
    """Each open commits one more step and is killed, until one finds nothing left to
    migrate: every state between two steps opens and goes on. Fails until the migration
    exists."""
    runs = 0
    while (completed := migrate_killed(upgraded, "step:1")).returncode == -9:
        runs += 1
        assert runs < MIGRATION_RUNS_MAX, "the migration never finishes"
    assert completed.returncode == 0, (completed.returncode, completed.stderr)
    assert runs > 1, f"killed {runs} times: the migration took at most one step"
    assert_finished_as_made(made, upgraded)


def test_check_reads_one_snapshot_while_another_process_finishes_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fencelog check` of a schema 015 directory left halfway through 016's copy (killed
    after three steps), while another process opens it and finishes the copy between two
    of the check's reads: every batch is decoded once, from one snapshot, and nothing is
    said damaged (read apart, the old table was gone for the second read, or the moved
    batches were in neither)."""
    made = made_with(15)
    data_dir = unpack_db(made.db, tmp_path / "data")
    assert_killed(migrate_killed(data_dir, "step:3"), "step:3")
    keys = "SELECT topic_id, partition, first_offset FROM"
    with contextlib.closing(sqlite3.connect(data_dir / DB_FILE)) as conn:
        halfway = conn.execute(f"{keys} log UNION ALL {keys} log_015").fetchall()
    decoded: list[tuple[int, int, int]] = []
    damage = batches.damage

    def decode_while_the_copy_finishes(batch: batches.Stored) -> str | None:
        if not decoded:
            finished = fencelog(data_dir, "topic", "list", "--json", **MIGRATION_ENV)
            assert finished.returncode == 0, finished.stderr
        decoded.append((batch.topic_id, batch.partition, batch.first_offset))
        return damage(batch)

    monkeypatch.setattr(batches, "damage", decode_while_the_copy_finishes)
    inspection = backup.inspect(data_dir)
    assert inspection.problems == ()
    with contextlib.closing(sqlite3.connect(data_dir / DB_FILE)) as conn:
        left = conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'log_015'").fetchall()
    assert left == []  # the other process finished the copy meanwhile
    assert len(halfway) > 40 and sorted(decoded) == sorted(halfway)


def test_a_move_that_lasts_says_how_far_it_is_and_when_it_is_done(
    made: Made, upgraded: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The open's move of an old log warns (what a command prints on stderr) how many
    records it has moved, every so often (here: after every step of 50 records), and
    once more when it has finished, with the total; a second open says nothing."""
    monkeypatch.setattr(database, "_UPGRADE_PROGRESS_S", 0.0)
    monkeypatch.setenv("FENCELOG_MIGRATE_STEP_RECORDS", "50")
    with caplog.at_level(logging.WARNING, logger="broker.storage.database"):
        opened(made, upgraded).close()
    said = [record.getMessage() for record in caplog.records]
    assert len(said) > 2, said
    progress = [int(m.split(": ")[1].split()[0]) for m in said[:-1]]
    assert all(m.startswith(f"upgrading {upgraded} to schema ") for m in said[:-1]), said
    assert progress == sorted(progress) and progress[0] > 0, progress
    topics = made.topics
    readable = sum(
        len(records_of(made, t, p)) for t in topics for p in range(topics[t]["partitions"])
    )
    total = int(said[-1].split(": ")[1].split()[0])
    assert said[-1].startswith(f"upgraded {upgraded}: ") and total >= progress[-1], said[-1]
    # every stored record: those read back but the prepared transaction's, applied after
    # the move, and a few below a log start inside a batch
    prepared = made.facts["prepared"]["txn_id"]
    [listed] = [t for t in made.document["transactions"] if t["txn_id"] == prepared]
    applied = sum(count for _, _, count, _, _ in listed["partitions"])
    assert readable - applied <= total <= readable + 200, (readable, applied, total)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="broker.storage.database"):
        opened(made, upgraded).close()
    assert caplog.records == []
