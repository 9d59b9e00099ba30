"""fencelog mirror, as a team moving to (or sampling from) a Kafka cluster uses it.

The Kafka cluster is another fencelog served with --kafka-listen (there is no Kafka
broker on these machines): the mirror reaches it through confluent-kafka only, as it
would reach Kafka. What users must see: the same records on the other side, record for
record; a second --once copies nothing; a mirror killed -9 again and again while the
source keeps producing (and the target restarted) ends with every record exactly once;
consumer groups that move over read exactly the rest; bad input is one line and its
own exit status, with nothing created.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.mirror import mirror_from_kafka, mirror_to_kafka
from broker.mirror.failpoints import FAILPOINT_ENV, STEPS
from broker.types import NewRecord, Record, TopicConfig
from cli.main import command
from support.helpers import Processes, expect, fencelog_script, json_error, json_lines, user_env
from support.servers import HOST, ServeProcess, serving
from support.waiting import wait_until

STEP_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A fencelog served with --kafka-listen: the Kafka cluster of these tests."""
    base = tmp_path_factory.mktemp("cluster")
    with serving(
        base / "data", base / "ready.json", serve_args=["--kafka-listen", f"{HOST}:0"]
    ) as server:
        yield server


def fencelog(runner: CliRunner, broker: Path | str, *args: str) -> Result:
    argv = ["--broker", str(broker), *args]
    return runner.invoke(command(argv), argv)


def kafka_url(server: ServeProcess) -> str:
    return f"kafka://{server.kafka}"


def seen(record: Record) -> tuple[Any, ...]:
    """What a reader sees of a record, its offset included."""
    return (
        record.partition,
        record.offset,
        record.timestamp_ms,
        record.key,
        record.value,
        record.headers,
    )


def done(result: Result) -> dict[str, Any]:
    lines = json_lines(result.stdout)
    assert lines[-1]["event"] == "done", lines
    return lines[-1]


def events(result: Result, kind: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(result.stdout) if line["event"] == kind]


# round trip ---------------------------------------------------------------------------


def test_round_trip_through_kafka_is_equal_record_for_record(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    source, copy = tmp_path / "source", tmp_path / "copy"
    week = TopicConfig(retention_ms=7 * 86_400_000, cleanup="delete")
    records = [
        NewRecord(
            f"value-{i}".encode() if i % 5 else None if i % 10 else b"",  # null and empty
            None if i % 4 == 0 else f"key-{i % 7}".encode(),
            (("trace", f"t{i}".encode()), ("empty", b""), ("null", None)) if i % 3 == 0 else (),
            i % 3,
            1_700_000_000_000 + i * 1_000,
        )
        for i in range(60)
    ]
    with connect(source) as client:
        client.create_topic("round", 3, config=week)
        client.produce("round", records)
        original = [seen(r) for r in client.consume("round")]

    first = expect(
        fencelog(
            runner, source, "mirror", "--to", kafka_url(cluster), "-t", "round", "--once", "--json"
        ),
        0,
    )
    assert events(first, "created") == [{"event": "created", "topic": "round", "partitions": 3}]
    assert done(first)["records"] == 60
    again = expect(
        fencelog(
            runner, source, "mirror", "--to", kafka_url(cluster), "-t", "round", "--once", "--json"
        ),
        0,
    )
    assert done(again)["records"] == 0
    assert events(again, "created") == []

    back = expect(
        fencelog(runner, copy, "mirror", "--from", kafka_url(cluster), "-t", "round", "--once"), 0
    )
    assert back.stdout.splitlines() == [
        "created round (3 partitions)",
        f"copied 60 records from {kafka_url(cluster)} (round 60)",
    ]
    with connect(copy) as client:
        assert [seen(r) for r in client.consume("round")] == original
        info = client.describe_topic("round")
        assert (info.partitions, info.config) == (3, week)
    with connect(cluster.address) as on_cluster:
        assert on_cluster.describe_topic("round").config == week


def test_a_regex_mirrors_the_topics_it_matches_and_no_other(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    source, copy = tmp_path / "source", tmp_path / "copy"
    with connect(source) as client:
        for name, partitions in (("multi-a", 1), ("multi-b", 2), ("other", 1)):
            client.create_topic(name, partitions)
            client.produce(name, [f"{name}-{i}".encode() for i in range(5)])
    out = expect(
        fencelog(
            runner,
            source,
            "mirror",
            "--to",
            kafka_url(cluster),
            "-t",
            "multi-.*",
            "--once",
            "--json",
        ),
        0,
    )
    assert [(e["topic"], e["partitions"]) for e in events(out, "created")] == [
        ("multi-a", 1),
        ("multi-b", 2),
    ]
    assert done(out)["topics"] == {"multi-a": 5, "multi-b": 5}
    back = expect(
        fencelog(
            runner,
            copy,
            "mirror",
            "--from",
            kafka_url(cluster),
            "-t",
            "multi-a",
            "-t",
            "multi-b",
            "--once",
            "--json",
        ),
        0,
    )
    assert done(back)["records"] == 10
    with connect(source) as on_source, connect(copy) as on_copy:
        for name in ("multi-a", "multi-b"):
            assert by_partition(on_copy, name) == by_partition(on_source, name)
        assert "other" not in {t.name for t in on_copy.list_topics()}


# bad input ----------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def test_bad_input_is_one_line_with_its_status_and_creates_nothing(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    with connect(source) as client:
        client.create_topic("narrow", 2)
        client.create_topic("fresh", 1)
    with connect(cluster.address) as on_cluster:
        on_cluster.create_topic("narrow", 1)
    to = ("mirror", "--to", kafka_url(cluster), "--once")

    def refused(status: ErrorCode, *args: str) -> str:
        result = expect(fencelog(runner, source, *args), int(status))
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        return line

    assert "topic nowhere is not on the source" in refused(
        ErrorCode.UNKNOWN_TOPIC, *to, "-t", "nowhere"
    )
    line = refused(ErrorCode.UNKNOWN_PARTITION, *to, "-t", "fresh", "-t", "narrow")
    assert "narrow has 1 partitions on the target and 2 on the source" in line
    line = refused(
        ErrorCode.CONNECTION_FAILED,
        "mirror", "--to", f"kafka://{HOST}:{closed_port()}", "-t", "fresh", "--once",
        "--kafka-timeout", "1s",
    )  # fmt: skip
    assert "Kafka cluster" in line
    line = refused(
        ErrorCode.INVALID_ARGUMENT, *to, "-t", "fresh", "--kafka-config", "sasl.password:hunter2"
    )
    assert "hunter2" not in line and "is not KEY=VALUE" in line
    line = refused(
        ErrorCode.INVALID_ARGUMENT,
        *to,
        "-t",
        "fresh",
        "--kafka-config",
        "security.protocol=hunter2",
    )
    assert "hunter2" not in line and "security.protocol" in line
    missing = tmp_path / "missing.conf"
    assert "cannot read --kafka-config-file" in refused(
        ErrorCode.INVALID_ARGUMENT, *to, "-t", "fresh", "--kafka-config-file", str(missing)
    )
    assert "one of --to or --from" in refused(ErrorCode.INVALID_ARGUMENT, "mirror", "-t", "fresh")
    json_refusal = expect(fencelog(runner, source, *to, "-t", "nowhere", "--json"), 20)
    assert json_error(json_refusal)["error"] == "UNKNOWN_TOPIC"
    with connect(cluster.address) as on_cluster:
        names = {t.name for t in on_cluster.list_topics()}
    assert "fresh" not in names  # refused as a whole: nothing created


def test_without_confluent_kafka_the_error_says_which_extra_to_install(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with connect(tmp_path / "source") as client:
        client.create_topic("plain", 1)
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # as if not installed
    result = expect(
        fencelog(runner, tmp_path / "source", "mirror", "--to", "kafka://k:9092", "-t", "plain"),
        int(ErrorCode.INVALID_ARGUMENT),
    )
    [line] = result.stderr.splitlines()
    assert "needs confluent-kafka" in line and "pip install 'fencelog[mirror]'" in line


def test_a_group_live_on_the_source_is_refused(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    with connect(cluster.address) as on_cluster:
        on_cluster.create_topic("busy", 1)
        on_cluster.produce("busy", [b"a"])
    member = Consumer(
        {
            "bootstrap.servers": cluster.kafka,
            "group.id": "busy-readers",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        member.subscribe(["busy"])
        wait_until(lambda: member.poll(0.2) is not None and member.assignment(), STEP_S)
        result = expect(
            fencelog(
                runner, tmp_path / "copy", "mirror", "--from", kafka_url(cluster),
                "-t", "busy", "--groups", "busy-readers", "--once",
            ),
            int(ErrorCode.GROUP_NOT_EMPTY),
        )  # fmt: skip
        assert "busy-readers has live members on the source" in result.stderr
        assert not (tmp_path / "copy").exists()
    finally:
        member.close()


def test_sasl_settings_from_a_file_log_in_and_a_wrong_password_is_never_echoed(
    runner: CliRunner, tmp_path: Path
) -> None:
    token = "mirror-token-7f3a9c"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    source = tmp_path / "source"
    with connect(source) as client:
        client.create_topic("secured", 1)
        client.produce("secured", [b"in"])
    settings = tmp_path / "kafka.conf"
    settings.write_text(
        "# the cluster's SASL/PLAIN login\n"
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=mirror\n"
    )
    args = ("--no-unix", "--kafka-listen", f"{HOST}:0", "--auth-token-file", str(token_file))
    with serving(tmp_path / "cluster", tmp_path / "ready.json", serve_args=args) as server:
        to = ("mirror", "--to", kafka_url(server), "-t", "secured", "--once")
        login = ("--kafka-config-file", str(settings))
        wrong = expect(
            fencelog(
                runner, source, *to, *login, "--kafka-config", "sasl.password=wrong-pass-5e1d",
                "--kafka-timeout", "1s",
            ),
            int(ErrorCode.AUTH_FAILED),
        )  # fmt: skip
        assert "wrong-pass-5e1d" not in wrong.stderr and len(wrong.stderr.splitlines()) == 1
        assert "SASL authentication error" in wrong.stderr
        result = expect(
            fencelog(runner, source, *to, *login, "--kafka-config", f"sasl.password={token}"), 0
        )
        assert token not in result.stdout + result.stderr
        assert result.stdout.endswith(
            "copied 1 record into " + kafka_url(server) + " (secured 1)\n"
        )


# groups -------------------------------------------------------------------------------


def test_groups_from_kafka_move_over_and_read_exactly_the_rest(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    with connect(cluster.address) as on_cluster:
        on_cluster.create_topic("ledger", 2)
        on_cluster.produce(
            "ledger", [NewRecord(f"p{i % 2}-{i // 2}".encode(), partition=i % 2) for i in range(20)]
        )
        on_cluster.commit_offsets("billing", "ledger", {0: 7, 1: 3})
    # the cluster's partition 0 starts at 4: its offsets are the copy's plus 4
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    for future in admin.delete_records([TopicPartition("ledger", 0, 4)]).values():
        future.result(timeout=STEP_S)

    result = expect(
        fencelog(
            runner, copy, "mirror", "--from", kafka_url(cluster), "-t", "ledger",
            "--groups", "billing", "--once", "--json",
        ),
        0,
    )  # fmt: skip
    assert events(result, "group") == [
        {
            "event": "group",
            "group": "billing",
            "topic": "ledger",
            "offsets": {"0": {"source": 7, "target": 3}, "1": {"source": 3, "target": 3}},
            "ahead": [],
        }
    ]
    rest = json_lines(
        expect(
            fencelog(runner, copy, "consume", "ledger", "--group", "billing", "--json"), 0
        ).stdout
    )
    assert sorted(r["value"] for r in rest) == sorted(
        [f"p0-{i}" for i in range(7, 10)] + [f"p1-{i}" for i in range(3, 10)]
    )


def kafka_rest(kafka: str, group: str, topic: str, partitions: int) -> list[tuple[int, bytes]]:
    """What a Kafka consumer of group reads from its committed offsets to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=STEP_S
        )
        consumer.assign(committed)
        found: list[tuple[int, bytes]] = []
        ended: set[int] = set()
        deadline = time.monotonic() + STEP_S
        while len(ended) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error, partition, value = message.error(), message.partition(), message.value()
            assert partition is not None
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                ended.add(partition)
                continue
            assert value is not None
            found.append((partition, value))
        assert len(ended) == partitions, f"not every partition ended within {STEP_S}s"
        return found
    finally:
        consumer.close()


def test_groups_into_kafka_move_over_and_read_exactly_the_rest(
    runner: CliRunner, cluster: ServeProcess, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    with connect(source) as client:
        client.create_topic("invoices", 2)
        client.produce(
            "invoices", [NewRecord(f"i{i}".encode(), partition=i % 2) for i in range(12)]
        )
        client.commit_offsets("payers", "invoices", {0: 2, 1: 6})
    with connect(cluster.address) as on_cluster:  # the target had 3 records already
        on_cluster.create_topic("invoices", 2)
        on_cluster.produce("invoices", [b"old-1", b"old-2", b"old-3"], partition=0)

    result = expect(
        fencelog(
            runner, source, "mirror", "--to", kafka_url(cluster), "-t", "invoices",
            "--groups", "payers", "--once",
        ),
        0,
    )  # fmt: skip
    assert "group payers: invoices/0 2 -> 5, invoices/1 6 -> 6" in result.stdout
    rest = kafka_rest(cluster.kafka, "payers", "invoices", 2)
    assert sorted(rest) == sorted((0, f"i{i}".encode()) for i in (4, 6, 8, 10))


# killed -9 while following --------------------------------------------------------------


class Producing:
    """Records into a topic of the source, in small batches, until stopped (or total)."""

    def __init__(self, source: Path | str, topic: str, first: int = 0) -> None:
        self.source, self.topic, self.total = source, topic, first + 50_000
        self.first = self.produced = first
        self.failure: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with connect(self.source) as client:
                while self.produced < self.total and not self.stopping.is_set():
                    batch = range(self.produced, min(self.produced + 25, self.total))
                    client.produce(
                        self.topic,
                        [NewRecord(f"r{i}".encode(), f"k{i % 5}".encode()) for i in batch],
                    )
                    self.produced += len(batch)
                    self.stopping.wait(0.02)  # a steady trickle, as an application writes
        except BaseException as exc:  # the test reports it
            self.failure = exc

    def stop(self) -> int:
        """Stops and returns how many records it produced."""
        self.stopping.set()
        self.thread.join(timeout=STEP_S)
        assert not self.thread.is_alive() and self.failure is None, self.failure
        return self.produced - self.first


def follow(
    processes: Processes, broker: Path, server: ServeProcess, topic: str, direction: str = "--to"
) -> Any:
    return processes.fencelog(
        "--broker", str(broker), "mirror", direction, kafka_url(server), "-t", topic,
        "--batch-records", "40", "--json",
    )  # fmt: skip


def copied_lines(mirror: Any, count: int) -> None:
    """Waits for count more `copied` lines of a mirror's --json output."""
    seen_lines = 0
    while seen_lines < count:
        line = json.loads(mirror.line(STEP_S))
        seen_lines += line["event"] == "copied"


def by_partition(client: Client, topic: str) -> dict[int, list[bytes | None]]:
    found: dict[int, list[bytes | None]] = {}
    for record in client.consume(topic):
        found.setdefault(record.partition, []).append(record.value)
    return found


RESTARTS_MAX = 20  # tries of restarted_on, half a second apart


def restarted_on(target_dir: Path, ready: Path, kafka_port: str) -> ServeProcess:
    """The target served again on its Kafka port. While it was down, another test's
    connection may have taken that port as its own end (the port came from the
    ephemeral range): LISTEN_FAILED then, until that connection closes."""
    for attempt in range(RESTARTS_MAX):
        server = ServeProcess(
            target_dir, ready, serve_args=["--kafka-listen", f"{HOST}:{kafka_port}"]
        )
        try:
            server.wait_ready()
            return server
        except AssertionError as failed:
            server.close()
            if "LISTEN_FAILED" not in str(failed) or attempt == RESTARTS_MAX - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def test_killed_again_and_again_while_following_every_record_lands_once(
    runner: CliRunner, processes: Processes, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    with connect(source) as client:
        client.create_topic("events", 2)
    target_dir, ready = tmp_path / "target", tmp_path / "target.json"
    server = ServeProcess(target_dir, ready, serve_args=["--kafka-listen", f"{HOST}:0"])
    producing: Producing | None = None
    try:
        server.wait_ready()
        kafka_port = server.kafka.rpartition(":")[2]
        producing = Producing(source, "events")
        pause = random.Random(38)
        for round_number in range(4):
            mirror = follow(processes, source, server, "events")
            copied_lines(mirror, 1)
            time.sleep(pause.uniform(0, 0.15))  # killed anywhere: in a transaction, or between
            mirror.popen.send_signal(signal.SIGKILL)
            mirror.wait(STEP_S)
            if round_number == 1:  # the target restarted between two mirrors
                server.stop()
                server.close()
                server = restarted_on(target_dir, ready, kafka_port)
        last = follow(processes, source, server, "events")
        copied_lines(last, 1)
        last.signal(signal.SIGTERM)  # a follow ends at SIGTERM: exit 0
        assert last.wait(STEP_S) == 0, last.stderr_text()
        produced = producing.stop()
        expect(
            fencelog(runner, source, "mirror", "--to", kafka_url(server), "-t", "events", "--once"),
            0,
        )
        with connect(source) as on_source, connect(server.address) as on_target:
            expected = by_partition(on_source, "events")
            assert by_partition(on_target, "events") == expected
        assert sum(len(values) for values in expected.values()) == produced
        expect(fencelog(runner, server.address, "verify", "events"), 0)
    finally:
        if producing is not None:
            producing.stopping.set()
        with contextlib.suppress(Exception):
            server.close()


def test_killed_again_and_again_copying_out_of_kafka_every_record_lands_once(
    runner: CliRunner, processes: Processes, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    source_dir, ready = tmp_path / "source", tmp_path / "source.json"
    server = ServeProcess(source_dir, ready, serve_args=["--kafka-listen", f"{HOST}:0"])
    try:
        server.wait_ready()
        kafka_port = server.kafka.rpartition(":")[2]
        with connect(server.address) as on_source:
            on_source.create_topic("events", 2)
        producing = Producing(server.address, "events")
        pause = random.Random(3838)
        for _ in range(3):
            mirror = follow(processes, target, server, "events", "--from")
            copied_lines(mirror, 1)
            time.sleep(pause.uniform(0, 0.15))  # killed anywhere: in a transaction, or between
            mirror.popen.send_signal(signal.SIGKILL)
            mirror.wait(STEP_S)
        produced = producing.stop()
        server.stop()  # the source restarted, then one more mirror killed
        server.close()
        server = ServeProcess(
            source_dir, ready, serve_args=["--kafka-listen", f"{HOST}:{kafka_port}"]
        )
        server.wait_ready()
        more = Producing(server.address, "events", first=produced)
        mirror = follow(processes, target, server, "events", "--from")
        copied_lines(mirror, 1)
        mirror.popen.send_signal(signal.SIGKILL)
        mirror.wait(STEP_S)
        produced += more.stop()
        expect(
            fencelog(
                runner, target, "mirror", "--from", kafka_url(server), "-t", "events", "--once"
            ),
            0,
        )
        with connect(server.address) as on_source, connect(target) as on_target:
            expected = by_partition(on_source, "events")
            assert by_partition(on_target, "events") == expected
        assert sum(len(values) for values in expected.values()) == produced
        expect(fencelog(runner, target, "verify", "events"), 0)
    finally:
        with contextlib.suppress(Exception):
            server.close()


def test_the_python_api_mirrors_and_reports_each_step(
    cluster: ServeProcess, tmp_path: Path
) -> None:
    seen_events: list[dict[str, Any]] = []
    with connect(tmp_path / "source") as client:
        client.create_topic("api", 2)
        client.produce("api", [NewRecord(b"x", partition=1, timestamp_ms=5)])
        summary = mirror_to_kafka(
            client, kafka_url(cluster), ["api"], group="api-mirror", on_event=seen_events.append
        )
        assert (summary.records, summary.per_topic, summary.created) == (1, {"api": 1}, ["api"])
        assert [e["event"] for e in seen_events] == ["created", "copied"]
        with pytest.raises(BrokerError) as refused:
            mirror_to_kafka(client, kafka_url(cluster), ["api"], batch_records=0)
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    with connect(tmp_path / "copy") as client:
        assert mirror_from_kafka(client, kafka_url(cluster), "api").records == 1  # one name
        [record] = client.consume("api")
        assert (record.partition, record.timestamp_ms, record.value) == (1, 5, b"x")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("direction", ["--to", "--from"])
def test_killed_at_each_step_of_a_batch_the_next_run_lands_every_record_once(
    runner: CliRunner,
    processes: Processes,
    cluster: ServeProcess,
    tmp_path: Path,
    direction: str,
    step: str,
) -> None:
    """FENCELOG_MIRROR_FAILPOINT kills the mirror at a chosen step of its second batch:
    records in the open transaction, its position too, or just committed."""
    topic = f"steps-{direction.strip('-')}-{step}"
    local = tmp_path / "local"
    source: Path | str = local if direction == "--to" else cluster.address
    with connect(source) as client:
        client.create_topic(topic, 2)
        client.produce(topic, [NewRecord(f"s{i}".encode(), partition=i % 2) for i in range(50)])
    args = ("mirror", direction, kafka_url(cluster), "-t", topic, "--once", "--batch-records", "10")
    killed = processes.start(
        [fencelog_script(), "--broker", str(local), *args],
        env=user_env(**{FAILPOINT_ENV: f"{step}:2"}),
    )
    assert killed.wait(STEP_S) == -signal.SIGKILL, killed.stderr_text()
    expect(fencelog(runner, local, *args), 0)
    target = cluster.address if direction == "--to" else local
    with connect(source) as on_source, connect(target) as on_target:
        assert by_partition(on_target, topic) == by_partition(on_source, topic)
    expect(fencelog(runner, target, "verify", topic), 0)


# librdkafka's mock cluster: several brokers, replicas, transactions with markers -------


@pytest.fixture(scope="module")
def mock_cluster() -> Iterator[tuple[str, Producer]]:
    """librdkafka's mock cluster of 3 brokers (test.mock.num.brokers), living as long as
    the client that made it: its bootstrap servers, and that client. Its topics are made
    by a producer's metadata request (4 partitions, 3 replicas: it answers no
    CreateTopics, DescribeConfigs or DescribeGroups), and its transactions' markers take
    offsets, as Kafka's do."""
    owner = Producer({"test.mock.num.brokers": 3, "log_level": 4})
    metadata = owner.list_topics(timeout=STEP_S)
    yield ",".join(f"{b.host}:{b.port}" for b in metadata.brokers.values()), owner
    owner.flush(STEP_S)


def kafka_offsets(servers: str, topic: str, partition: int) -> list[int]:
    """The offsets of a partition's committed records, read as a Kafka consumer reads."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "offsets-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 4,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        found: list[int] = []
        deadline = time.monotonic() + STEP_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                return found
            offset = message.offset()
            assert offset is not None
            found.append(offset)
        raise AssertionError(f"{topic}/{partition} did not end within {STEP_S}s")
    finally:
        consumer.close()


def test_through_a_mock_cluster_of_three_brokers_with_transaction_markers(
    runner: CliRunner, mock_cluster: tuple[str, Producer], tmp_path: Path
) -> None:
    servers, owner = mock_cluster
    url = f"kafka://{servers}"
    assert len(owner.list_topics("mocked", timeout=STEP_S).topics["mocked"].partitions) == 4
    source, copy = tmp_path / "source", tmp_path / "copy"
    with connect(source) as client:
        client.create_topic("mocked", 4)
        client.produce(
            "mocked",
            [
                NewRecord(
                    f"m{i}".encode(),
                    f"k{i}".encode(),
                    (("n", b"%d" % i),),
                    i % 4,
                    1_600_000_000_000 + i,
                )
                for i in range(40)
            ],
        )
        original = [seen(r) for r in client.consume("mocked")]
        client.commit_offsets("src-readers", "mocked", {1: 4})
    out = (
        "mirror", "--to", url, "-t", "mocked", "--once", "--batch-records", "7",
        "--groups", "src-readers", "--kafka-timeout", "2s", "--json",
    )  # fmt: skip
    result = expect(fencelog(runner, source, *out), 0)
    assert done(result)["records"] == 40
    # 10 records in partition 0, written in several transactions: markers between them
    on_mock = kafka_offsets(servers, "mocked", 0)
    assert len(on_mock) == 10 and on_mock[-1] > 9
    # src-readers, at its 5th record of partition 1 on the source, is there on the mock
    on_mock_1 = kafka_offsets(servers, "mocked", 1)
    assert [e["offsets"] for e in events(result, "group")] == [
        {"1": {"source": 4, "target": on_mock_1[4]}}
    ]
    moved = Consumer({"bootstrap.servers": servers, "group.id": "src-readers", "log_level": 4})
    try:
        [committed] = moved.committed([TopicPartition("mocked", 1)], timeout=STEP_S)
        assert committed.offset == on_mock_1[4] > 4
    finally:
        moved.close()
    reader = Consumer({"bootstrap.servers": servers, "group.id": "mock-readers", "log_level": 4})
    try:
        reader.commit(offsets=[TopicPartition("mocked", 0, on_mock[3])], asynchronous=False)
    finally:
        reader.close()

    back = (
        "mirror", "--from", url, "-t", "mocked", "--once", "--groups", "mock-readers",
        "--kafka-timeout", "2s", "--json",
    )  # fmt: skip
    result = expect(fencelog(runner, copy, *back), 0)
    assert done(result)["records"] == 40
    assert [e["offsets"] for e in events(result, "group")] == [
        {"0": {"source": on_mock[3], "target": 3}}
    ]
    warnings = [json.loads(line)["warning"] for line in result.stderr.splitlines()]
    assert any("describe consumer groups" in w for w in warnings), warnings
    assert done(expect(fencelog(runner, copy, *back), 0))["records"] == 0  # resumed: nothing
    with connect(copy) as client:
        assert [seen(r) for r in client.consume("mocked")] == original
    rest = json_lines(
        expect(
            fencelog(
                runner, copy, "consume", "mocked", "-p", "0", "--group", "mock-readers", "--json"
            ),
            0,
        ).stdout
    )
    assert [r["value"] for r in rest] == [f"m{i}" for i in range(12, 40, 4)]


def test_a_second_mirror_of_the_same_group_into_fencelog_is_refused_while_one_runs(
    runner: CliRunner, processes: Processes, cluster: ServeProcess, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    with connect(cluster.address) as on_cluster:
        on_cluster.create_topic("twice", 1)
        on_cluster.produce("twice", [b"t1", b"t2"])
    first = follow(processes, local, cluster, "twice", "--from")
    copied_lines(first, 1)
    second = expect(
        fencelog(runner, local, "mirror", "--from", kafka_url(cluster), "-t", "twice", "--once"),
        int(ErrorCode.OWNED_BY_HIGHER_GENERATION),
    )
    assert "another mirror of group fencelog-mirror.twice is running" in second.stderr
    first.signal(signal.SIGTERM)
    assert first.wait(STEP_S) == 0, first.stderr_text()
    again = expect(
        fencelog(runner, local, "mirror", "--from", kafka_url(cluster), "-t", "twice", "--once"), 0
    )
    assert "copied 0 records" in again.stdout


def test_a_second_mirror_into_kafka_fences_the_first(
    processes: Processes, cluster: ServeProcess, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    with connect(local) as client:
        client.create_topic("fenced", 1)
    producing = Producing(local, "fenced")
    try:
        first = follow(processes, local, cluster, "fenced")
        copied_lines(first, 1)
        second = follow(processes, local, cluster, "fenced")
        copied_lines(second, 1)  # its start fenced the first, which fails on its next batch
        assert first.wait(STEP_S) == int(ErrorCode.PRODUCER_FENCED), first.stderr_text()
        assert "another mirror of group fencelog-mirror.fenced took over" in first.stderr_text()
        second.signal(signal.SIGTERM)
        assert second.wait(STEP_S) == 0, second.stderr_text()
    finally:
        producing.stop()
    with connect(local) as on_source, connect(cluster.address) as on_target:
        copied = by_partition(on_target, "fenced")[0]
        assert copied == by_partition(on_source, "fenced")[0][: len(copied)]  # once, in order
