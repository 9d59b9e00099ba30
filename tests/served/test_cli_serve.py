"""fencelog serve as a real process, and every CLI command against it.

What a user relies on: the same commands and the same output through
--broker tcp://HOST:PORT as embedded; a data directory a server owns is reached through the
server; binding beyond loopback needs a token, and a wrong token is exit 82; SIGTERM and
SIGINT answer what is in flight, close SQLite cleanly and exit 0; kill -9 during a produce
storm loses no acknowledged record, and clients reconnect to the restarted server."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import broker.server.server
from broker.client.client import connect
from broker.client.served import ServedTransport
from broker.discovery import DB_FILE, INFO_FILE, LOCK_FILE, SOCKET_FILE, find_server
from broker.errors import BrokerError, ErrorCode
from broker.protocol.messages import Push
from cli.main import command
from support.helpers import Invoke, Processes, expect, json_lines
from support.servers import RawClient, ServeProcess, served, serving
from support.values import present
from support.waiting import wait_until

TOKEN = "3f9a1c0e5b7d2a4c6e8f0a1b2c3d4e5f"
WRONG_TOKEN = "00000000000000000000000000000000"


def fencelog(
    runner: CliRunner,
    broker: str | Path,
    *args: str,
    input: str | None = None,
    token_file: Path | None = None,
) -> Result:
    options = ["--broker", str(broker)]
    if token_file is not None:
        options += ["--auth-token-file", str(token_file)]
    return runner.invoke(command(), [*options, *args], input=input)


def token_file(directory: Path, token: str, name: str = "token") -> Path:
    path = directory / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def server(tmp_path: Path, data_dir: Path) -> Iterator[ServeProcess]:
    """A real server on the test's data directory, with --durability normal: an embedded
    open with the default --durability full would report full instead."""
    with serving(data_dir, tmp_path / "ready.json", global_args=("--durability", "normal")) as s:
        yield s


def assert_closed_cleanly(data_dir: Path) -> None:
    assert find_server(data_dir) is None
    assert not (data_dir / INFO_FILE).exists()
    assert not (data_dir / LOCK_FILE).exists(), "a clean stop leaves no server.lock"
    assert not (data_dir / SOCKET_FILE).exists()
    wal = data_dir / (DB_FILE + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "SQLite was not closed cleanly"


# the process and its addresses ------------------------------------------------------------


def test_serve_announces_its_addresses_and_keeps_its_files_private(
    server: ServeProcess, data_dir: Path
) -> None:
    assert server.info["pid"] == server.pid
    assert server.info["url"] == f"tcp://{server.tcp}"
    assert server.tcp.startswith("127.0.0.1:") and server.port > 0
    assert server.info["unix"] == str((data_dir / SOCKET_FILE).resolve())
    announced = server.process.line(timeout_s=10)
    assert announced.startswith(f"fencelog serving {data_dir} on tcp://{server.tcp}")
    assert f"(pid {server.pid})" in announced
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for name in (DB_FILE, INFO_FILE):
        assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((data_dir / SOCKET_FILE).stat().st_mode) & 0o077 == 0


def test_a_second_server_on_the_same_directory_is_refused(
    server: ServeProcess, tmp_path: Path, data_dir: Path
) -> None:
    second = ServeProcess(data_dir, tmp_path / "second.json")
    try:
        assert second.process.wait(20) == int(ErrorCode.DATA_DIR_IN_USE)
        assert f"pid {server.pid}" in second.stderr_text()
        assert not (tmp_path / "second.json").exists()
    finally:
        second.close()
    assert find_server(data_dir) is not None  # the first one still owns it
    # a second serve given the first's ready file leaves it (it removed it at start)
    ready = json.loads(server.ready_file.read_text())
    third = subprocess.run(
        [
            "fencelog",
            "--broker",
            str(data_dir),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(server.ready_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert third.returncode == int(ErrorCode.DATA_DIR_IN_USE), third.stderr
    assert json.loads(server.ready_file.read_text()) == ready


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.10:7420"])
def test_listening_beyond_loopback_without_a_token_is_refused(
    tmp_path: Path, data_dir: Path, listen: str
) -> None:
    refused = ServeProcess(data_dir, tmp_path / "ready.json", listen=listen)
    try:
        assert refused.process.wait(20) == int(ErrorCode.INVALID_ARGUMENT)
        stderr = refused.stderr_text()
        assert stderr.count("\n") == 1, stderr
        assert stderr.startswith("error: listening on ")
        assert "--auth-token-file" in stderr and "INVALID_ARGUMENT" in stderr
        assert not (tmp_path / "ready.json").exists()
        assert not data_dir.exists() or find_server(data_dir) is None
    finally:
        refused.close()


def test_a_port_in_use_is_a_one_line_error_not_a_traceback(tmp_path: Path) -> None:
    new = tmp_path / "new" / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = ServeProcess(new, tmp_path / "ready.json", listen=f"127.0.0.1:{port}")
        try:
            status = refused.process.wait(20)
            stderr = refused.stderr_text()
        finally:
            refused.close()
    assert "Traceback" not in stderr, stderr
    assert status >= 10, "exit 1 means a bug inside fencelog"
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert str(port) in stderr
    assert not (tmp_path / "ready.json").exists()
    assert not (tmp_path / "new").exists(), "a refused serve leaves no new directory"


def test_serve_needs_a_data_directory_not_an_address(runner: CliRunner) -> None:
    result = expect(fencelog(runner, "tcp://127.0.0.1:7420", "serve"), 10)
    assert "serve needs a data directory" in result.stderr


@pytest.mark.parametrize("listen", ["7420", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000"])
def test_serve_refuses_a_listen_that_is_not_host_port(
    runner: CliRunner, data_dir: Path, listen: str
) -> None:
    result = expect(fencelog(runner, data_dir, "serve", "--listen", listen), 10)
    assert "is not HOST:PORT" in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [("soon", "'soon' is not a duration"), ("2s", "--busy-poll 2s is longer than 100ms")],
)
def test_serve_refuses_a_busy_poll_that_is_not_a_short_duration(
    runner: CliRunner, data_dir: Path, value: str, message: str
) -> None:
    result = expect(fencelog(runner, data_dir, "serve", "--busy-poll", value), 10)
    assert message in result.stderr


class _ServerMade(Exception):
    """What the stand-in for Server raises: `serve` got as far as making its server."""


@pytest.mark.parametrize(("busy_poll", "window_us"), [("100ms", 100_000), ("0", 0)])
def test_busy_poll_polls_between_requests_and_not_once_idle(
    runner: CliRunner,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    busy_poll: str,
    window_us: int,
) -> None:
    """A server polls for the --busy-poll window after each request instead of sleeping;
    once requests stop, it sleeps. `serve --busy-poll` hands its window to the Server;
    a Server with that window (in a thread, to be watched) is then counted polling: the
    loop turns its BusyPoll asks for, not CPU time, which depends on the machine."""
    handed: list[int] = []

    def made(*args: Any, busy_poll_us: int, **kwargs: Any) -> None:
        handed.append(busy_poll_us)
        raise _ServerMade

    with monkeypatch.context() as patch:
        patch.setattr(broker.server.server, "Server", made)
        result = fencelog(runner, data_dir, "serve", "--busy-poll", busy_poll)
    assert isinstance(result.exception, _ServerMade), result.output
    assert handed == [window_us]

    with served(data_dir, busy_poll_us=window_us) as server, connect(server.address) as client:
        busy = server.server.busy_poll
        polls = 0
        poll = busy._poll

        def counted() -> None:
            nonlocal polls
            polls += 1
            poll()

        monkeypatch.setattr(busy, "_poll", counted)
        for _ in range(16):
            client.list_topics()
            time.sleep(0.05)  # pacing: a request every 50 ms, within a 100 ms window
        between = polls
        wait_until(lambda: not busy._polling, message="the last window ended")
        settled = polls
        time.sleep(0.8)  # on purpose: a while without requests
        idle = polls - settled
    assert idle == 0, f"an idle server polled {idle} times"
    if window_us:
        assert between > 0, "a polling server did not poll between requests"
    else:
        assert between == 0, f"a server that does not poll polled {between} times"


# every command against a server -----------------------------------------------------------

SCRIPT: list[tuple[Sequence[str], str | None]] = [
    (("topic", "create", "orders", "--partitions", "3", "--json"), None),
    (("topic", "create", "orders", "--json"), None),
    (("topic", "create", "orders", "--if-not-exists", "--json"), None),
    (("topic", "create", "bad name", "--json"), None),
    (("produce", "orders", "--value", "a", "--value", "b", "--key", "k", "--json"), None),
    (("produce", "orders", "--partition", "2", "--json"), "x\ny\nz\n"),
    (("produce", "orders", "--key-separator", ":", "--json"), "k1:v1\nk2:v2\n"),
    (("produce", "orders", "--partition", "7", "--value", "lost", "--json"), None),
    (("produce", "missing", "--value", "lost", "--json"), None),
    (("produce", "orders", "--partition", "1", "--value", "plain"), None),
    (("topic", "list", "--json"), None),
    (("topic", "list"), None),
    (("topic", "describe", "orders", "--json"), None),
    (("topic", "describe", "orders"), None),
    (("consume", "orders", "--json"), None),
    (("consume", "orders", "--partition", "2", "--from", "1", "--max", "1", "--json"), None),
    (("consume", "orders", "--from", "end", "--json"), None),
    (("consume", "orders", "--format", "base64"), None),
    (("consume", "orders", "--follow", "--max", "4", "--json"), None),
    (("consume", "orders", "--partition", "2", "--follow", "--timeout", "300ms", "--json"), None),
    (("consume", "orders", "--partition", "9", "--json"), None),
    (("status", "--json"), None),
    (("topic", "delete", "orders", "--json"), None),
    (("topic", "describe", "orders", "--json"), None),
    (("consume", "orders", "--json"), None),
    (("topic", "list", "--json"), None),
]
EXPECTED_STATUSES = [0, 22, 0, 12, 0, 0, 0, 21, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 21, 0, 0, 20]
EXPECTED_STATUSES += [20, 0]
# What differs between two brokers by nature, not by mode: clocks, paths, file sizes.
UNSTABLE_KEYS = {"created_ms", "timestamp_ms", "data_dir", "database_bytes", "wal_bytes"}


def stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in UNSTABLE_KEYS}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def seen(result: Result) -> tuple[int, Any, Any]:
    """What the user saw, less what differs by nature: status, stdout, stderr."""

    def lines(text: str) -> Any:
        try:
            return [stable(obj) for obj in json_lines(text)]
        except json.JSONDecodeError:
            return text

    return result.exit_code, lines(result.stdout), lines(result.stderr)


def run_script(runner: CliRunner, broker: str | Path) -> list[tuple[int, Any, Any]]:
    return [seen(fencelog(runner, broker, *args, input=stdin)) for args, stdin in SCRIPT]


def test_every_command_gives_the_same_result_through_a_server_as_embedded(
    runner: CliRunner, tmp_path: Path
) -> None:
    embedded = run_script(runner, tmp_path / "embedded")
    with serving(tmp_path / "served", tmp_path / "ready.json") as server:
        through_server = run_script(runner, server.address)
        assert server.process.popen.poll() is None
    for (args, _), want, got in zip(SCRIPT, embedded, through_server, strict=True):
        assert got == want, f"fencelog {' '.join(args)}"
    statuses = [status for status, _, _ in through_server]
    assert statuses == EXPECTED_STATUSES
    consumed = through_server[14][1]
    assert [(r["partition"], r["value"]) for r in consumed if r["partition"] == 2] == [
        (2, "x"),
        (2, "y"),
        (2, "z"),
    ]


def test_consume_follow_through_a_server_prints_records_as_they_arrive(
    server: ServeProcess, processes: Processes, runner: CliRunner
) -> None:
    expect(fencelog(runner, server.address, "topic", "create", "live", "--partitions", "2"), 0)
    follower = processes.fencelog(
        "--broker", server.address, "consume", "live", "--follow", "--json", "--timeout", "20s"
    )
    expect(fencelog(runner, server.address, "produce", "live", "-p", "1", "--value", "one"), 0)
    first = json.loads(follower.line(timeout_s=10))
    assert (first["partition"], first["offset"], first["value"]) == (1, 0, "one")
    expect(fencelog(runner, server.address, "produce", "live", "-p", "0", "--value", "two"), 0)
    second = json.loads(follower.line(timeout_s=10))
    assert (second["partition"], second["offset"], second["value"]) == (0, 0, "two")
    assert follower.popen.poll() is None
    time.sleep(0.3)  # on purpose: stop it mid-wait, as a user would, not as it sends a fetch
    follower.signal(signal.SIGTERM)
    assert follower.wait(timeout_s=10) == 0, follower.stderr_text()
    assert follower.remaining_lines() == []
    assert server.process.popen.poll() is None


def test_a_data_directory_a_server_owns_goes_through_the_server(
    server: ServeProcess, runner: CliRunner, data_dir: Path
) -> None:
    status = json_lines(expect(fencelog(runner, data_dir, "status", "--json"), 0).stdout)
    assert status[0]["durability"] == "normal"  # the server's, not this process's "full"
    assert find_server(data_dir) is not None
    expect(fencelog(runner, data_dir, "topic", "create", "via-path"), 0)
    expect(fencelog(runner, data_dir, "produce", "via-path", "--value", "hello"), 0)
    consumed = json_lines(
        expect(fencelog(runner, server.address, "consume", "via-path", "--json"), 0).stdout
    )
    assert [r["value"] for r in consumed] == ["hello"]
    with connect(data_dir) as client:
        assert isinstance(client._transport, ServedTransport)
        assert [r.value for r in client.consume("via-path")] == [b"hello"]
    assert server.stop() == 0
    status = json_lines(expect(fencelog(runner, data_dir, "status", "--json"), 0).stdout)
    assert status[0]["durability"] == "full"  # embedded again once the server is gone
    assert [t["topic"] for t in status[0]["topics"]] == ["via-path"]


# auth -------------------------------------------------------------------------------------


def test_a_token_server_refuses_a_missing_or_wrong_token_with_exit_82(
    tmp_path: Path, data_dir: Path, runner: CliRunner
) -> None:
    right = token_file(tmp_path, TOKEN)
    wrong = token_file(tmp_path, WRONG_TOKEN, "wrong")
    with serving(
        data_dir, tmp_path / "ready.json", serve_args=("--auth-token-file", str(right), "--verbose")
    ) as server:
        for broker in (server.address, data_dir):
            for given in (None, wrong):
                result = expect(
                    fencelog(runner, broker, "topic", "list", "--json", token_file=given),
                    int(ErrorCode.AUTH_FAILED),
                )
                assert json.loads(result.stderr)["error"] == "AUTH_FAILED"
                assert TOKEN not in result.stderr
            result = expect(fencelog(runner, broker, "topic", "list", token_file=right), 0)
        # wait-ready too: it waited out its whole --timeout, then said CONNECTION_FAILED
        refused = fencelog(
            runner, server.address, "wait-ready", "--timeout", "1h", token_file=wrong
        )
        expect(refused, int(ErrorCode.AUTH_FAILED))
        expect(fencelog(runner, server.address, "wait-ready", token_file=right), 0)
        expect(fencelog(runner, server.address, "topic", "create", "t", token_file=right), 0)
        with RawClient(server.port) as raw:  # the protocol level agrees
            raw.hello(token=TOKEN)
        stopped = server.stop()
        stderr = server.stderr_text()
    assert stopped == 0
    assert "authentication failed" in stderr  # --verbose logs the refusals...
    assert TOKEN not in stderr  # ...but never the token
    assert WRONG_TOKEN not in stderr


def test_a_short_token_file_is_refused(tmp_path: Path, data_dir: Path) -> None:
    short = token_file(tmp_path, "tooshort")
    refused = ServeProcess(
        data_dir, tmp_path / "ready.json", serve_args=("--auth-token-file", str(short))
    )
    try:
        assert refused.process.wait(20) == int(ErrorCode.INVALID_ARGUMENT)
        assert "shorter than 16 characters" in refused.stderr_text()
        assert "tooshort" not in refused.stderr_text()
    finally:
        refused.close()


def test_a_token_file_that_is_not_text_is_one_line_error(tmp_path: Path, invoke: Invoke) -> None:
    binary = tmp_path / "token"
    binary.write_bytes(b"\xff\xfe" + b"0123456789abcdef")
    refused = expect(
        invoke("--auth-token-file", str(binary), "topic", "list"), int(ErrorCode.INVALID_ARGUMENT)
    )
    assert "is not UTF-8 text" in refused.stderr and refused.stderr.count("\n") == 1


# sessions ---------------------------------------------------------------------------------


def test_session_timeout_closes_a_silent_session_but_not_a_heartbeating_client(
    tmp_path: Path, data_dir: Path
) -> None:
    timeout_args = ("--session-timeout", "1s")
    with (
        serving(data_dir, tmp_path / "ready.json", serve_args=timeout_args) as s,
        connect(s.address) as client,
    ):
        client.create_topic("hb")
        assert client.limits.session_timeout_ms == 1000
        with RawClient(s.port) as raw:
            raw.hello()
            messages = raw.receive_all(timeout_s=15)  # closed, and told why, in time
        assert messages == [Push("session_closed", {"reason": "missed heartbeats"})]
        transport = client._transport
        assert isinstance(transport, ServedTransport)
        session_before = transport.session_id()
        time.sleep(1.5)  # on purpose: idle past the timeout; heartbeats keep it open
        client.produce("hb", [b"still here"])
        assert [r.value for r in client.consume("hb")] == [b"still here"]
        assert transport.session_id() == session_before


# stopping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_answers_the_request_in_flight_closes_sqlite_and_exits_0(
    tmp_path: Path, data_dir: Path, signum: signal.Signals
) -> None:
    outcome: dict[str, Any] = {}
    server = ServeProcess(data_dir, tmp_path / "ready.json")
    waiter: threading.Thread | None = None
    try:
        server.wait_ready()
        client = connect(server.address)
        try:
            client.create_topic("s")
            client.produce("s", [b"kept"])

            def wait_for_more() -> None:
                try:
                    outcome["records"] = client.fetch("s", {0: 1}, wait_ms=30_000)
                except BrokerError as error:
                    outcome["error"] = error

            waiter = threading.Thread(target=wait_for_more)
            waiter.start()
            # Kept: a server in another process cannot be asked whether the fetch waits
            # inside it yet (in-process, test_server's twin waits until it is parked).
            time.sleep(0.5)
            assert waiter.is_alive()
            status = server.stop(signum, timeout_s=20)
            # answered at the stop, not when its 30 s wait ends
            waiter.join(timeout=20)
            assert not waiter.is_alive(), "the fetch was not answered at the stop"
        finally:
            client.close()
    finally:
        if waiter is not None:
            waiter.join(timeout=30)
        server.close()
    assert status == 0, server.stderr_text()
    assert outcome.get("error") is None, outcome
    assert outcome["records"] == []  # answered, not cut off
    assert "Traceback" not in server.stderr_text()
    assert_closed_cleanly(data_dir)
    # gone with its server: README's `until [ -s ready.json ]` run again read the old one
    assert not (tmp_path / "ready.json").exists()
    with connect(data_dir) as embedded:
        assert [r.value for r in embedded.consume("s")] == [b"kept"]


def test_after_kill_9_the_directory_opens_embedded_and_serves_again(
    tmp_path: Path, data_dir: Path
) -> None:
    with serving(data_dir, tmp_path / "first.json") as first:
        with connect(first.address) as client:
            client.create_topic("k")
            client.produce("k", [b"acknowledged"])
        first.kill9()
    assert find_server(data_dir) is None  # the lock died with the process
    with connect(data_dir) as embedded:
        assert not isinstance(embedded._transport, ServedTransport)
        assert [r.value for r in embedded.consume("k")] == [b"acknowledged"]
    with serving(data_dir, tmp_path / "second.json") as second:
        with connect(data_dir) as through_server:
            assert isinstance(through_server._transport, ServedTransport)
            through_server.produce("k", [b"again"])
            assert [r.value for r in through_server.consume("k")] == [b"acknowledged", b"again"]
        assert second.stop() == 0
    assert_closed_cleanly(data_dir)


def count(acked: Mapping[int, list[bytes]]) -> int:
    return sum(len(values) for values in acked.values())


def test_kill_9_during_a_produce_storm_loses_no_acknowledged_record(
    tmp_path: Path, data_dir: Path
) -> None:
    producers, batch_size = 4, 5
    acked: dict[int, list[bytes]] = {n: [] for n in range(producers)}
    unknown: dict[int, list[bytes]] = {n: [] for n in range(producers)}
    failures: list[BaseException] = []
    stop = threading.Event()
    first = ServeProcess(data_dir, tmp_path / "first.json")
    second: ServeProcess | None = None
    threads: list[threading.Thread] = []

    def produce(n: int, address: str) -> None:
        try:
            with connect(address) as client:
                sequence = 0
                while not stop.is_set():
                    batch = [f"p{n}-{sequence + k}".encode() for k in range(batch_size)]
                    sequence += batch_size
                    try:
                        client.produce("storm", batch)
                    except BrokerError as error:
                        if error.code is not ErrorCode.CONNECTION_FAILED:
                            raise
                        unknown[n] += batch  # in flight when the server died: either way
                    else:
                        acked[n] += batch
        except BaseException as error:
            failures.append(error)

    try:
        first.wait_ready()
        port = first.port
        with connect(first.address) as admin:
            admin.create_topic("storm", partitions=2)
        threads = [
            threading.Thread(target=produce, args=(n, first.address)) for n in range(producers)
        ]
        for thread in threads:
            thread.start()
        wait_until(lambda: count(acked) >= 400 or failures, 30, message="acknowledgements")
        first.kill9()
        acked_before_kill = count(acked)
        second = ServeProcess(data_dir, tmp_path / "second.json", listen=f"127.0.0.1:{port}")
        second.wait_ready()
        wait_until(
            lambda: count(acked) >= acked_before_kill + 200 or failures,
            30,
            message="acknowledgements from the restarted server",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        first.close()
        if second is not None:
            assert second.stop() == 0, second.stderr_text()
            second.close()
    assert failures == []
    assert all(not thread.is_alive() for thread in threads)
    assert count(acked) >= acked_before_kill + 200  # the clients reconnected by themselves
    with connect(data_dir) as client:
        stored = list(client.consume("storm"))
    for partition in (0, 1):
        offsets = [r.offset for r in stored if r.partition == partition]
        assert offsets == list(range(len(offsets))), f"partition {partition} has gaps"
    values = [r.value for r in stored]
    assert len(values) == len(set(values)), "a record was stored twice"
    all_acked = {value for batch in acked.values() for value in batch}
    all_unknown = {value for batch in unknown.values() for value in batch}
    lost = all_acked - set(values)
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:3]}"
    assert set(values) <= all_acked | all_unknown, "a record nobody sent"
    for n in range(producers):  # each producer's records keep its order within a partition
        for partition in (0, 1):
            mine = [
                r.value
                for r in stored
                if r.partition == partition and present(r.value).startswith(b"p%d-" % n)
            ]
            numbers = [int(present(v).split(b"-")[1]) for v in mine]
            assert numbers == sorted(numbers)
