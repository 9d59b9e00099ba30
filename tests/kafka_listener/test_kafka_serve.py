"""`fencelog serve --kafka-listen`: its address in the ready file, its options, SASL/PLAIN
with the server's token, and its refusals (one line each, nothing left behind)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata import ApiVersionsRequest
from msgspec.structs import replace

from broker.errors import ErrorCode
from broker.limits import DEFAULT_LIMITS
from support.kafka_raw import RawKafka
from support.servers import ServeProcess, served, serving

TOKEN = "a-token-of-thirty-two-characters"
STEP_S = 20.0


def test_the_ready_file_and_the_banner_name_the_kafka_address(
    kafka_server: ServeProcess, kafka: str
) -> None:
    info = json.loads(kafka_server.ready_file.read_text())
    host, _, port = info["kafka"].rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert info["tcp"] != info["kafka"]
    server_json = json.loads((kafka_server.data_dir / "server.json").read_text())
    assert server_json["kafka"] == kafka
    assert f"Kafka clients on {kafka}" in kafka_server.process.line(STEP_S)


def test_without_auto_create_an_unknown_topic_stays_unknown(tmp_path: Path) -> None:
    args = ("--no-unix", "--kafka-listen", "127.0.0.1:0", "--no-kafka-auto-create")
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        admin = AdminClient({"bootstrap.servers": server.kafka})
        listed = admin.list_topics("nowhere", timeout=STEP_S)
        assert listed.topics["nowhere"].error is not None
        assert "nowhere" not in admin.list_topics(timeout=STEP_S).topics


def test_auto_created_topics_take_kafka_partitions(tmp_path: Path) -> None:
    args = ("--no-unix", "--kafka-listen", "127.0.0.1:0", "--kafka-partitions", "3")
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        admin = AdminClient({"bootstrap.servers": server.kafka})
        listed = admin.list_topics("wide", timeout=STEP_S)
        assert sorted(listed.topics["wide"].partitions) == [0, 1, 2]


def test_with_a_token_kafka_clients_log_in_with_sasl_plain(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    args = ("--no-unix", "--kafka-listen", "127.0.0.1:0", "--auth-token-file", str(token_file))
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
        good = Producer(
            {
                "bootstrap.servers": server.kafka,
                **sasl,
                "sasl.username": "me",
                "sasl.password": TOKEN,
            }
        )
        good.produce("secured", value=b"in")
        assert good.flush(STEP_S) == 0

        refused: list[KafkaException] = []
        bad = Producer(
            {
                "bootstrap.servers": server.kafka,
                **sasl,
                "sasl.username": "me",
                "sasl.password": "wrong",
                "error_cb": lambda error: refused.append(KafkaException(error)),
            }
        )
        bad.produce("secured", value=b"never")
        assert bad.flush(3.0) == 1  # never delivered
        assert any("authentication" in str(e).lower() for e in refused), refused
        # the client tries again and again: one warning, the rest counted at debug
        failures = [
            line
            for line in server.stderr_text().splitlines()
            if "SASL/PLAIN authentication failed" in line and " WARNING " in line
        ]
        assert len(failures) == 1, failures

        with socket.create_connection(tuple_of(server.kafka), timeout=STEP_S) as plain:
            # a Metadata v1 request with no SASL first: the connection is closed
            plain.sendall(
                b"\x00\x00\x00\x0e\x00\x03\x00\x01\x00\x00\x00\x07\x00\x00\xff\xff\xff\xff"
            )
            assert closed_unanswered(plain)


def tuple_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "192.0.2.10:9092"])
def test_a_kafka_listener_beyond_loopback_needs_a_token(tmp_path: Path, listen: str) -> None:
    data_dir = tmp_path / "data"
    refused = ServeProcess(
        data_dir, tmp_path / "ready.json", serve_args=("--no-unix", "--kafka-listen", listen)
    )
    try:
        assert refused.process.wait(20) == int(ErrorCode.INVALID_ARGUMENT)
        stderr = refused.stderr_text()
    finally:
        refused.close()
    assert stderr.count("\n") == 1, stderr
    assert "a Kafka listener on" in stderr and "--auth-token-file" in stderr
    assert not data_dir.exists(), "a refused serve leaves no new directory"


def test_a_kafka_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("--no-unix", "--kafka-listen", f"127.0.0.1:{port}")
        refused = ServeProcess(tmp_path / "data", tmp_path / "ready.json", serve_args=args)
        try:
            status = refused.process.wait(20)
            stderr = refused.stderr_text()
        finally:
            refused.close()
    assert status == int(ErrorCode.LISTEN_FAILED), stderr
    assert stderr.count("\n") == 1 and "--kafka-listen" in stderr and str(port) in stderr
    assert not (tmp_path / "ready.json").exists()


@pytest.mark.parametrize("bad", ["9092", "localhost", "127.0.0.1:99999"])
def test_a_kafka_listen_that_is_not_host_port_is_refused(tmp_path: Path, bad: str) -> None:
    args = ("--no-unix", "--kafka-listen", bad)
    refused = ServeProcess(tmp_path / "data", tmp_path / "ready.json", serve_args=args)
    try:
        assert refused.process.wait(20) == int(ErrorCode.INVALID_ARGUMENT)
        stderr = refused.stderr_text()
    finally:
        refused.close()
    assert f"--kafka-listen {bad!r} is not HOST:PORT" in stderr


def test_connections_past_the_limit_are_closed_and_the_rest_go_on(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, connections_max=2)
    with served(data_dir, limits=limits, kafka=True) as server:
        first, second = RawKafka(server.kafka), RawKafka(server.kafka)
        try:
            for held in (first, second):
                assert held.call(ApiVersionsRequest(), 0).error_code == 0
            third = socket.create_connection(tuple_of(server.kafka), timeout=STEP_S)
            with third:
                third.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
                assert closed_unanswered(third)
            assert first.call(ApiVersionsRequest(), 0).error_code == 0
        finally:
            first.close()
            second.close()


def closed_unanswered(sock: socket.socket) -> bool:
    """The peer closed the connection without a byte (a reset counts: it closed with our
    request unread)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
