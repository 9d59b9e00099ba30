"""What operators see of `fencelog serve`: /healthz, /readyz and /metrics
(`--http-listen`), JSON logs (`--log-format json`), and `fencelog wait-ready`."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from broker.client.client import connect
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from support.helpers import fencelog_script, user_env
from support.servers import ServeProcess, serving

STEP_S = 20.0
TOKEN = "a-token-of-thirty-two-characters"
HTTP_ARGS = ("--no-unix", "--http-listen", "127.0.0.1:0")


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=STEP_S) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return int(refused.code), refused.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_probes_and_metrics_tell_what_the_broker_did(tmp_path: Path) -> None:
    args = (*HTTP_ARGS, "--kafka-listen", "127.0.0.1:0")
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        http = f"http://{server.info['http']}"
        assert get(f"{http}/healthz") == (200, "ok\n")
        assert get(f"{http}/readyz") == (200, "ready\n")
        with connect(server.address) as client:
            client.create_topic("orders", 2)
            client.produce("orders", [b"a", b"bb", b"ccc"], partition=1)
            assert len(client.fetch("orders", {1: 0})) == 3
            client.commit_offsets("billing", "orders", {1: 1})
            open_txn = client.txn_begin("copier")
            with client.transaction("copier") as txn:  # begun by its first produce
                txn.produce("orders", [b"eeeee"], partition=0)
                txn.produce("orders", [b"f"], partition=0)
        producer = Producer({"bootstrap.servers": server.kafka})
        producer.produce("orders", value=b"dddd", partition=0)
        assert producer.flush(STEP_S) == 0

        status, text = get(f"{http}/metrics")
        assert status == 200
        found = samples(text)
        assert found[("fencelog_records_in_total", (("topic", "orders"),))] == 6
        assert found[("fencelog_bytes_in_total", (("topic", "orders"),))] == 16
        assert found[("fencelog_records_out_total", (("topic", "orders"),))] == 3
        assert found[("fencelog_requests_total", (("operation", "produce"),))] == 2
        assert found[("fencelog_requests_total", (("operation", "kafka_produce"),))] >= 1
        assert found[("fencelog_request_duration_seconds_count", (("operation", "fetch"),))] == 1
        # durations finer than the event loop's clock (uvloop's moves in whole ms, which
        # put every sub-millisecond request at 0 or at 1 ms)
        produced_s = found[("fencelog_request_duration_seconds_sum", (("operation", "produce"),))]
        assert abs(produced_s * 1000 - round(produced_s * 1000)) > 1e-6, produced_s
        end = "fencelog_partition_end_offset"
        assert found[(end, (("partition", "0"), ("topic", "orders")))] == 3
        assert found[(end, (("partition", "1"), ("topic", "orders")))] == 3
        assert found[("fencelog_transactions", (("state", "open"),))] == 1
        assert found[("fencelog_group_commit_requests_count", ())] >= 2
        assert found[("fencelog_kafka_connections", ())] >= 1
        assert found[("fencelog_wal_bytes", ())] > 0
        lag = (
            "fencelog_consumer_group_lag",
            (("group", "billing"), ("partition", "1"), ("topic", "orders")),
        )
        assert found[lag] == 2  # end offset 3, committed 1
        with connect(server.address) as client:
            client.txn_abort(open_txn.txn_id)
            client.create_topic("other")  # fails below: already counted as an error
            with pytest.raises(Exception, match="already exists"):
                client.create_topic("other")
        found = samples(get(f"{http}/metrics")[1])
        assert found[("fencelog_transactions", (("state", "open"),))] == 0
        errors = (
            "fencelog_request_errors_total",
            (("code", "TOPIC_EXISTS"), ("operation", "create_topic")),
        )
        assert found[errors] == 1


def test_metrics_need_the_token_and_the_probes_do_not(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    args = (*HTTP_ARGS, "--auth-token-file", str(token_file))
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        http = f"http://{server.info['http']}"
        assert get(f"{http}/healthz")[0] == 200
        assert get(f"{http}/readyz")[0] == 200
        assert get(f"{http}/metrics")[0] == 401
        assert get(f"{http}/metrics", {"Authorization": "Bearer wrong"})[0] == 401
        status, text = get(f"{http}/metrics", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and "fencelog_sessions" in text


def test_other_requests_get_http_errors_and_the_listener_goes_on(tmp_path: Path) -> None:
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=HTTP_ARGS) as server:
        http = f"http://{server.info['http']}"
        assert get(f"{http}/nowhere")[0] == 404
        post = urllib.request.Request(f"{http}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=STEP_S)
        refused.value.close()
        assert refused.value.code == 405
        host, _, port = str(server.info["http"]).rpartition(":")
        with socket.create_connection((host, int(port)), timeout=STEP_S) as raw:
            raw.sendall(b"\x00\x01garbage\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 400")
        assert get(f"{http}/healthz")[0] == 200


def test_an_http_listener_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    refused = ServeProcess(
        data_dir, tmp_path / "ready.json", serve_args=("--http-listen", "0.0.0.0:0")
    )
    try:
        assert refused.process.wait(20) == int(ErrorCode.INVALID_ARGUMENT)
        stderr = refused.stderr_text()
    finally:
        refused.close()
    assert stderr.count("\n") == 1 and "an HTTP listener on 0.0.0.0" in stderr
    assert not data_dir.exists()


def test_json_logs_are_one_object_per_event_and_never_hold_values_or_tokens(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    args = ("--no-unix", "--log-format", "json", "--auth-token-file", str(token_file))
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args) as server:
        with connect(server.address, token=TOKEN) as client:
            client.create_topic("logged")
            client.produce("logged", [b"SECRET-VALUE"])
            with client.transaction("g") as txn:
                txn.produce("logged", [b"SECRET-VALUE-2"])
            client.own("leaders", {"logged/0": 1})
        server.stop()
        lines = server.stderr_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "event", "message"} <= set(e) for e in events)
    names = [e["event"] for e in events]
    for expected in (
        "start",
        "connection_open",
        "txn_begin",
        "txn_commit",
        "claim",
        "connection_close",
        "stop",
    ):
        assert expected in names, names
    claim = next(e for e in events if e["event"] == "claim")
    assert (claim["group"], claim["resource"], claim["generation"]) == ("leaders", "logged/0", 1)
    text = "\n".join(lines)
    assert "SECRET-VALUE" not in text and TOKEN not in text


def wait_ready(*args: str) -> subprocess.CompletedProcess[str]:
    """`fencelog --broker X wait-ready ...` from args: the root's options first."""
    root, rest = list(args[:2]), list(args[2:])
    return subprocess.run(
        [str(fencelog_script()), *root, "wait-ready", *rest],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        env=user_env(),
        check=False,
    )


def test_wait_ready_waits_for_a_server_that_is_still_starting(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    started: list[ServeProcess] = []
    starter = threading.Timer(
        0.5, lambda: started.append(ServeProcess(data_dir, tmp_path / "ready.json"))
    )
    starter.start()
    try:
        done = wait_ready("--broker", str(data_dir), "--timeout", "15s")
    finally:
        starter.join()
        for server in started:
            server.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ready: ")


def test_wait_ready_gives_up_with_connection_failed(tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = wait_ready("--broker", f"tcp://127.0.0.1:{port}")
    assert done.returncode != 0
    late = subprocess.run(
        [
            str(fencelog_script()),
            "--broker",
            f"127.0.0.1:{port}",
            "wait-ready",
            "--timeout",
            "300ms",
        ],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        env=user_env(),
        check=False,
    )
    assert late.returncode == int(ErrorCode.CONNECTION_FAILED)
    assert late.stderr.count("\n") == 1
    assert f"no server answered at tcp://127.0.0.1:{port} within 300ms" in late.stderr


def test_a_refused_port_is_given_up_within_the_time_asked(tmp_path: Path) -> None:
    """Connecting retried a refused port for its own 5 s whatever the command was given
    (`wait-ready --timeout 1s` took 8.7 s): no connect outlasts the request timeout."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    script, broker = str(fencelog_script()), f"tcp://127.0.0.1:{port}"
    commands = [
        [script, "--broker", broker, "wait-ready", "--timeout", "1s"],
        [script, "--broker", broker, "--request-timeout", "1s", "status"],
    ]
    for command in commands:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=4.5, env=user_env(), check=False
        )  # the old retries took 5 s or more; a subprocess.TimeoutExpired fails the test
        assert done.returncode == int(ErrorCode.CONNECTION_FAILED), done.stderr


def prepared_commit(data_dir: Path) -> int:
    """A transaction of one record in topic t, prepared by a `fencelog txn-commit` that
    was killed before applying it; its id."""
    env = user_env()

    def fencelog(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(fencelog_script()), "--broker", str(data_dir), *args],
            capture_output=True,
            text=True,
            timeout=STEP_S,
            env=env | extra,
            check=False,
        )

    assert fencelog("topic", "create", "t").returncode == 0
    begun = fencelog("txn-begin", "--group", "g", "--json")
    txn_id = int(json.loads(begun.stdout)["txn_id"])
    assert fencelog("produce", "t", "--txn", str(txn_id), "--value", "v").returncode == 0
    killed = fencelog("txn-commit", str(txn_id), FENCELOG_FAILPOINT="prepare")
    assert killed.returncode == -9  # killed after PREPARE_COMMIT, before it was applied
    return txn_id


def test_a_commit_finished_at_start_is_logged_as_recovery(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    txn_id = prepared_commit(data_dir)
    args = ("--no-unix", "--log-format", "json")
    with serving(data_dir, tmp_path / "ready.json", serve_args=args) as server:
        with connect(server.address) as client:
            assert [r.value for r in client.fetch("t", {0: 0})] == [b"v"]
        server.stop()
        events = [json.loads(line) for line in server.stderr_text().splitlines()]
    (recovery,) = [e for e in events if e["event"] == "recovery"]
    assert recovery["txn_id"] == txn_id
    assert [e["event"] for e in events].index("recovery") < [e["event"] for e in events].index(
        "start"
    )


def test_a_prepared_commit_with_damaged_data_is_logged_and_the_server_serves(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    txn_id = prepared_commit(data_dir)
    damaged = sqlite3.connect(data_dir / DB_FILE)
    with damaged:
        damaged.execute("UPDATE log SET vals = X'c1c1c1' WHERE topic_id <= 0")
    damaged.close()
    args = ("--no-unix", "--log-format", "json")
    with serving(data_dir, tmp_path / "ready.json", serve_args=args) as server:
        with connect(server.address) as client:
            client.produce("t", ["plain"])
            assert [r.value for r in client.fetch("t", {0: 0})] == [b"plain"]
        server.stop()
        events = [json.loads(line) for line in server.stderr_text().splitlines()]
    (failed,) = [e for e in events if e["event"] == "recovery_failed"]
    assert failed["txn_id"] == txn_id and failed["level"] == "error"
    assert f"transaction {txn_id} stays prepared" in failed["message"]
    assert not [e for e in events if e["event"] == "recovery"]


def test_a_damaged_database_met_by_a_request_is_logged_as_an_error(tmp_path: Path) -> None:
    """The client was told DATA_CORRUPT, and the server's log said nothing of it."""
    data_dir = tmp_path / "data"
    with connect(data_dir) as client:
        client.create_topic("t")
        for _ in range(5):
            client.produce("t", [b"x" * 1000] * 1000)
    size = (data_dir / DB_FILE).stat().st_size
    with (data_dir / DB_FILE).open("r+b") as file:  # the log's pages, not the schema's
        file.seek(size // 2)
        file.write(b"\xa5" * 65536)
    args = ("--no-unix", "--log-format", "json")
    with serving(data_dir, tmp_path / "ready.json", serve_args=args) as server:
        with connect(server.address) as client, pytest.raises(BrokerError) as damaged:
            offset = 0
            while offset < 5000:  # every record, up to the damage
                offset += len(client.fetch("t", {0: offset}))
        assert damaged.value.code is ErrorCode.DATA_CORRUPT
        server.stop()
        events = [json.loads(line) for line in server.stderr_text().splitlines()]
    (logged,) = [e for e in events if e["event"] == "data_corrupt"]
    assert logged["level"] == "error" and "damaged" in logged["message"]
