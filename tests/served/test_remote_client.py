"""broker/client/served.py and broker/client/client.py against a served broker: the same Client, the
same results and the same BrokerError codes as embedded; a data directory that a server
owns is reached through that server; pipelining on AsyncClient; reconnecting with backoff
after a restart; a request in flight when the connection drops fails, never resends."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from msgspec.structs import replace

from broker.client.async_client import AsyncClient
from broker.client.client import Client, connect
from broker.client.embedded import EmbeddedTransport
from broker.client.served import Address, ServedTransport
from broker.discovery import find_server
from broker.errors import BrokerError, ErrorCode
from broker.limits import BUSY_POLL_US_MAX, DEFAULT_LIMITS
from broker.protocol import ops
from broker.protocol.messages import Op, Push
from broker.types import NO_PRODUCER, NewRecord, Record
from cli.main import command
from support.servers import HOST, ServerThread, served, serving
from support.values import present
from support.waiting import wait_until

T = TypeVar("T")


def run(work: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(30):
            return await work

    return asyncio.run(bounded())


def values_of(client: Client, topic: str) -> list[bytes]:
    return [present(record.value) for record in client.consume(topic)]


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fencelog-client"]


@pytest.fixture
def server(data_dir: Path) -> Iterator[ServerThread]:
    with served(data_dir) as started:
        yield started


@pytest.fixture
def client(server: ServerThread) -> Iterator[Client]:
    opened = connect(server.address)
    try:
        yield opened
    finally:
        opened.close()


# the transport a target picks -------------------------------------------------------------


def test_an_address_is_reached_through_a_served_transport(
    server: ServerThread, client: Client
) -> None:
    assert isinstance(client._transport, ServedTransport)
    assert client.target == server.address
    assert client.limits.frame_bytes_max == DEFAULT_LIMITS.frame_bytes_max
    client.create_topic("t", partitions=3)
    results = client.produce("t", [b"a", b"b", b"c"], key=b"k")
    assert len({r.partition for r in results}) == 1  # one key, one partition
    assert values_of(client, "t") == [b"a", b"b", b"c"]
    assert [t.name for t in client.list_topics()] == ["t"]
    assert client.describe_topic("t").records == 3
    status = client.status()
    assert status.data_dir == str(server.data_dir.resolve())
    assert [t.name for t in status.topics] == ["t"]
    client.delete_topic("t")
    assert client.list_topics() == []


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_data_directory_a_server_owns_is_opened_through_the_server(
    data_dir: Path, unix: bool
) -> None:
    with served(data_dir, unix=unix) as server:
        info = find_server(data_dir)
        assert info is not None
        assert info == server.server.info
        assert info.url().startswith("unix://" if unix else "tcp://")
        with connect(data_dir) as through_path, connect(server.address) as over_tcp:
            assert isinstance(through_path._transport, ServedTransport)
            assert str(through_path._transport.client.address) == info.url()
            through_path.create_topic("shared")
            through_path.produce("shared", [b"via the path"])
            assert values_of(over_tcp, "shared") == [b"via the path"]
            over_tcp.produce("shared", [b"via tcp"])
            assert values_of(through_path, "shared") == [b"via the path", b"via tcp"]
    assert find_server(data_dir) is None
    with connect(data_dir) as embedded:
        assert isinstance(embedded._transport, EmbeddedTransport)
        assert values_of(embedded, "shared") == [b"via the path", b"via tcp"]


def test_client_limits_come_from_hello_and_batches_are_split_to_fit(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, append_records_max=10)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        assert client.limits.append_records_max == 10
        client.create_topic("small")
        results = client.produce("small", [f"v{n}".encode() for n in range(25)], partition=0)
        assert [r.offset for r in results] == list(range(25))
        assert values_of(client, "small") == [f"v{n}".encode() for n in range(25)]


def test_a_served_transport_that_cannot_say_hello_leaves_no_thread(data_dir: Path) -> None:
    before = len(client_threads())
    with served(data_dir, auth_token="0123456789abcdef0123") as server:
        with pytest.raises(BrokerError) as excinfo:
            connect(server.address, token="the wrong token entirely")
        assert excinfo.value.code is ErrorCode.AUTH_FAILED
        with connect(server.address, token="0123456789abcdef0123") as client:
            assert client.list_topics() == []
    wait_until(
        lambda: len(client_threads()) <= before,
        10,
        message=lambda: f"the client's loop threads gone; still {client_threads()}",
    )
    assert len(client_threads()) == before


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("tcp://127.0.0.1:7420", Address("tcp", host="127.0.0.1", port=7420)),
        ("tcp://[::1]:9", Address("tcp", host="::1", port=9)),
        ("unix:///tmp/x.sock", Address("unix", path="/tmp/x.sock")),
    ],
)
def test_address_parse(url: str, expected: Address) -> None:
    assert Address.parse(url) == expected
    assert Address.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "url", ["tcp://127.0.0.1", "tcp://:80", "tcp://h:0", "tcp://h:65536", "http://h:1", "unix://"]
)
def test_address_parse_refuses_what_is_not_an_address(url: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        Address.parse(url)
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT


# the same outcome embedded and served -----------------------------------------------------

PARITY_LIMITS = replace(DEFAULT_LIMITS, record_value_bytes_max=1000)


@dataclass(frozen=True)
class Case:
    name: str
    work: Callable[[Client], object]


PARITY_CASES = [
    Case("describe a missing topic", lambda c: c.describe_topic("missing")),
    Case("delete a missing topic", lambda c: c.delete_topic("missing")),
    Case("produce to a missing topic", lambda c: c.produce("missing", [b"x"])),
    Case("fetch from a missing topic", lambda c: c.fetch("missing", {0: 0})),
    Case("produce to a missing partition", lambda c: c.produce("t", [b"x"], partition=2)),
    Case("produce to a negative partition", lambda c: c.produce("t", [b"x"], partition=-1)),
    Case("fetch a missing partition", lambda c: c.fetch("t", {7: 0})),
    Case("consume a missing partition", lambda c: list(c.consume("t", partition=9))),
    Case("create an existing topic", lambda c: c.create_topic("t")),
    Case("create a topic with a bad name", lambda c: c.create_topic("no spaces")),
    Case("create a topic with a long name", lambda c: c.create_topic("x" * 250)),
    Case("create a topic with 0 partitions", lambda c: c.create_topic("z", partitions=0)),
    Case("create a topic with -1 partitions", lambda c: c.create_topic("z", partitions=-1)),
    Case("produce a value over the limit", lambda c: c.produce("t", [b"x" * 1001])),
    Case("produce a value at the limit", lambda c: c.produce("t", [b"x" * 1000], partition=1)),
    Case(
        "produce with an empty header name",
        lambda c: c.produce("t", [NewRecord(b"x", headers=(("", b"v"),))]),
    ),
    Case("fetch with a negative offset", lambda c: c.fetch("t", {0: -1})),
    Case("fetch no partitions", lambda c: c.fetch("t", {})),
    Case("fetch with a negative wait", lambda c: c.fetch("t", {0: 0}, wait_ms=-1)),
    Case("fetch past the end", lambda c: c.fetch("t", {0: 99})),
    Case("fetch from the start", lambda c: [r[2:] for r in c.fetch("t", {0: 0, 1: 0})]),
    Case("consume from a bad start", lambda c: list(c.consume("t", start=-1))),
]

# Arguments of the wrong type or past 64 bits: a TypeError, OverflowError or raw SQLite
# error embedded, PROTOCOL_ERROR or INTERNAL served; INVALID_ARGUMENT now, both alike.
BAD_ARGUMENT_CASES = [
    Case("produce None", lambda c: c.produce("t", None)),  # type: ignore[arg-type]
    Case("produce one bytes value", lambda c: c.produce("t", b"abc")),  # type: ignore[arg-type]
    Case("produce an int value", lambda c: c.produce("t", [5])),  # type: ignore[list-item]
    Case("produce an int key", lambda c: c.produce("t", [b"a"], key=5)),  # type: ignore[arg-type]
    Case("produce a headers dict", lambda c: c.produce("t", [b"a"], headers={"a": b"1"})),  # type: ignore[arg-type]
    Case("produce a text partition", lambda c: c.produce("t", [b"a"], partition="1")),  # type: ignore[arg-type]
    Case("produce a record of text", lambda c: c.produce("t", [NewRecord("abc")])),  # type: ignore[arg-type]
    Case(
        "produce a float timestamp",
        lambda c: c.produce("t", [NewRecord(b"a", timestamp_ms=1.5e12)]),  # type: ignore[arg-type]
    ),
    Case(
        "produce a timestamp past 64 bits",
        lambda c: c.produce("t", [NewRecord(b"a", timestamp_ms=2**63)]),
    ),
    Case(
        "produce a header name that is no Unicode",
        lambda c: c.produce("t", [b"a"], headers=(("\ud800", b"1"),)),
    ),
    Case("produce with a text fence", lambda c: c.produce("t", [b"a"], fences=["g:r:1"])),  # type: ignore[list-item]
    Case("fetch a list", lambda c: c.fetch("t", [0])),  # type: ignore[arg-type]
    Case("fetch a text offset", lambda c: c.fetch("t", {0: "0"})),  # type: ignore[dict-item]
    Case("fetch past 64 bits", lambda c: c.fetch("t", {0: 2**63})),
    Case("fetch -1 records", lambda c: c.fetch("t", {0: 0}, max_records=-1)),
    Case("create a topic of text partitions", lambda c: c.create_topic("u", partitions="2")),  # type: ignore[arg-type]
    Case("lease a pid of a text partition", lambda c: c.lease_pid("t", "0")),  # type: ignore[arg-type]
    Case("produce_arrow None", lambda c: c.produce_arrow("t", None)),
]
PARITY_CASES += BAD_ARGUMENT_CASES


def outcome(client: Client, case: Case) -> tuple[str, Any]:
    """What a user of either transport sees: the result, or the error's code and text."""
    client.create_topic("t", partitions=2)
    client.produce("t", [NewRecord(b"first", key=b"k", partition=0, timestamp_ms=5)])
    try:
        result = case.work(client)
    except BrokerError as error:
        details = {k: v for k, v in error.details.items() if v is not None}
        return "error", (error.code, error.message, details)
    return "result", result


@pytest.mark.parametrize("case", PARITY_CASES, ids=[case.name for case in PARITY_CASES])
def test_served_and_embedded_give_the_same_outcome(tmp_path: Path, case: Case) -> None:
    with connect(tmp_path / "embedded", limits=PARITY_LIMITS) as embedded:
        expected = outcome(embedded, case)
    with (
        served(tmp_path / "served", limits=PARITY_LIMITS) as server,
        connect(server.address) as remote,
    ):
        got = outcome(remote, case)
    assert got == expected


@pytest.mark.parametrize("case", BAD_ARGUMENT_CASES, ids=[case.name for case in BAD_ARGUMENT_CASES])
def test_a_bad_argument_is_invalid_argument_and_writes_nothing(tmp_path: Path, case: Case) -> None:
    with connect(tmp_path / "embedded", limits=PARITY_LIMITS) as client:
        kind, (code, message, _) = outcome(client, case)
        assert (kind, code) == ("error", ErrorCode.INVALID_ARGUMENT), message
        assert client.end_offsets("t") == [1, 0]


def test_a_batch_larger_than_a_frame_is_split_alike_embedded_and_served(tmp_path: Path) -> None:
    # The default ratio: a frame holds a little more than the largest batch the engine takes.
    limits = replace(
        DEFAULT_LIMITS, frame_bytes_max=16_384, append_bytes_max=8192, record_value_bytes_max=4096
    )
    batch = [b"%d" % i + b"x" * 3999 for i in range(8)]  # 32,000 bytes: over one append
    with connect(tmp_path / "embedded", limits=limits) as embedded:
        embedded.create_topic("t")
        expected = embedded.produce("t", batch)
    assert [r.offset for r in expected] == list(range(8))
    with served(tmp_path / "served", limits=limits) as server, connect(server.address) as remote:
        remote.create_topic("t")
        assert remote.produce("t", batch) == expected  # appends within the frame, in order
        assert [r.value for r in remote.consume("t")] == batch
        with pytest.raises(BrokerError) as too_large:
            remote.produce("t", [b"x" * 4097])  # one record over its own limit
        assert too_large.value.code is ErrorCode.RECORD_TOO_LARGE
        assert remote.describe_topic("t").records == 8


def test_a_full_server_refuses_a_new_client_with_too_many_requests(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = len(client_threads())
    limits = replace(DEFAULT_LIMITS, connections_max=1)
    with served(data_dir, limits=limits) as server, connect(server.address) as held:
        attempts: list[object] = []
        accept = server.server._connection_made

        def counted(*args: Any) -> Any:
            attempts.append(args)
            return accept(*args)

        monkeypatch.setattr(server.server, "_connection_made", counted)
        with pytest.raises(BrokerError) as excinfo:
            connect(server.address)
        assert excinfo.value.code is ErrorCode.TOO_MANY_REQUESTS
        assert len(attempts) == 1  # refused once, not retried as if unreachable
        held.create_topic("still-served")
        assert [t.name for t in held.list_topics()] == ["still-served"]
    assert len(client_threads()) == before


def test_a_request_error_leaves_the_served_client_usable(client: Client) -> None:
    with pytest.raises(BrokerError) as excinfo:
        client.describe_topic("missing")
    assert excinfo.value.code is ErrorCode.UNKNOWN_TOPIC
    assert excinfo.value.hint == "create it with: fencelog topic create missing"
    client.create_topic("missing")
    assert client.describe_topic("missing").name == "missing"


@pytest.mark.parametrize(
    "work",
    [
        lambda c: c.fetch("t", {0: 2**64}),
        lambda c: c.produce("t", [NewRecord(b"x", partition=2**70)]),
    ],
    ids=["offset", "partition"],
)
def test_a_request_too_big_to_encode_fails_alone_and_the_client_goes_on(
    client: Client, work: Callable[[Client], object]
) -> None:
    client.create_topic("t")
    with pytest.raises(BrokerError):
        work(client)
    assert client.describe_topic("t").name == "t"  # its reply is not taken for another's
    client.produce("t", [b"after"])
    assert values_of(client, "t") == [b"after"]


# consume ----------------------------------------------------------------------------------


def test_consume_reads_to_the_end_offsets_and_follow_waits_for_more(
    server: ServerThread, client: Client
) -> None:
    client.create_topic("f", partitions=2)
    client.produce("f", [NewRecord(b"a", partition=0), NewRecord(b"b", partition=1)])
    assert sorted(values_of(client, "f")) == [b"a", b"b"]
    followed: list[bytes] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            with connect(server.address) as follower:
                for record in follower.consume("f", follow=True, max_records=4, timeout_s=20):
                    followed.append(present(record.value))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        wait_until(
            lambda: len(followed) >= 2 or failures,
            10,
            message=lambda: f"the follower read what was there; got {followed}",
        )
        client.produce("f", [NewRecord(b"c", partition=1), NewRecord(b"d", partition=0)])
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert failures == []
    assert sorted(followed) == [b"a", b"b", b"c", b"d"]


def test_a_follower_reads_a_partition_added_while_it_waits(
    server: ServerThread, client: Client
) -> None:
    client.create_topic("grows", partitions=1)
    followed: list[tuple[int, bytes]] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            with connect(server.address) as follower:
                for record in follower.consume(
                    "grows", follow=True, max_records=2, timeout_s=20, poll_ms=200
                ):
                    followed.append((record.partition, present(record.value)))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        client.produce("grows", [NewRecord(b"first", partition=0)])
        wait_until(lambda: followed or failures, 10, message="the follower read the first")
        client.alter_topic("grows", partitions=2)
        client.produce("grows", [NewRecord(b"added", partition=1)])
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert failures == []
    assert followed == [(0, b"first"), (1, b"added")]


def test_a_fetch_that_waits_longer_than_the_session_timeout_keeps_its_session(
    data_dir: Path,
) -> None:
    # Defaults allow it too: fetch_wait_ms_max (30 s) is twice session_timeout_ms (15 s).
    limits = replace(DEFAULT_LIMITS, session_timeout_ms=600, fetch_wait_ms_max=5_000)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        client.create_topic("slow")
        transport = client._transport
        assert isinstance(transport, ServedTransport)
        session = transport.session_id()
        fetched: list[list[Record]] = []
        fetching = threading.Thread(
            target=lambda: fetched.append(client.fetch("slow", {0: 0}, wait_ms=2_000))
        )
        fetching.start()
        try:
            time.sleep(1.0)  # on purpose: the 600 ms session timeout passes while it waits
            assert fetching.is_alive(), "the fetch ended before the session timeout passed"
        finally:
            fetching.join(timeout=30)
        assert fetched == [[]]
        assert transport.session_id() == session
        assert server.session_ids() == {session}


# the blocking connection, and what moves a client to the event loop -----------------------


def test_plain_requests_go_over_a_blocking_connection_without_a_loop_thread(
    server: ServerThread,
) -> None:
    before = len(client_threads())
    with connect(server.address) as client:
        client.create_topic("plain", partitions=2)
        client.produce("plain", [b"a", b"b"], partition=1)
        assert values_of(client, "plain") == [b"a", b"b"]
        assert client.describe_topic("plain").records == 2
        transport = client._transport
        assert isinstance(transport, ServedTransport)
        assert transport._loop is None
        assert len(client_threads()) == before
        assert len(server.session_ids()) == 1


@pytest.mark.parametrize("timeout_s", [0, -1.5])
def test_a_request_timeout_that_is_not_positive_is_refused(
    server: ServerThread, timeout_s: float
) -> None:
    before = len(client_threads())
    with pytest.raises(BrokerError) as refused:
        connect(server.address, request_timeout_s=timeout_s)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert f"the request timeout must be positive, not {timeout_s}" in refused.value.message
    assert server.session_ids() == set()  # refused before connecting
    assert len(client_threads()) == before


def test_a_client_idle_past_the_session_timeout_goes_on_with_a_new_connection(
    data_dir: Path,
) -> None:
    limits = replace(DEFAULT_LIMITS, session_timeout_ms=600)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        client.create_topic("idle")
        client.produce("idle", [b"before"])
        first = server.session_ids()
        # on purpose: longer than the session timeout, which the server then enforces
        wait_until(lambda: not server.session_ids(), 10, message="the idle session closed")
        client.produce("idle", [b"after"])  # not a lost connection: a new one
        assert values_of(client, "idle") == [b"before", b"after"]
        assert server.session_ids().isdisjoint(first)


def test_a_blocking_fetch_in_flight_when_the_session_is_severed_is_asked_again(
    server: ServerThread,
) -> None:
    with connect(server.address) as client, connect(server.address) as producer:
        client.create_topic("sev")
        transport = client._transport
        assert isinstance(transport, ServedTransport)
        session = transport._connection.hello.session_id
        fetched: list[list[Record]] = []
        fetching = threading.Thread(
            target=lambda: fetched.append(client.fetch("sev", {0: 0}, wait_ms=20_000))
        )
        fetching.start()
        try:
            server.wait_fetch_parked("sev")
            server.call(lambda: server.server.sever(session, "test says so"))
            wait_until(
                lambda: server.session_ids() - {session, *producer_sessions(producer)},
                message="the waiting fetch's new session",
            )
            producer.produce("sev", [b"after"])
        finally:
            fetching.join(timeout=30)
        assert [[r.value for r in records] for records in fetched] == [[b"after"]]
        assert transport._loop is None


def test_a_request_interrupted_in_the_callers_thread_leaves_the_client_usable(
    server: ServerThread,
) -> None:
    """Ctrl-C while a blocking fetch waits (here a timer's signal raises instead): the
    reply it abandoned cannot be told from the next one's, so that connection is given
    up, and the next request goes out on a new one."""

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    with connect(server.address) as client:
        client.create_topic("cut")
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                client.fetch("cut", {0: 0}, wait_ms=10_000)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        client.produce("cut", [b"after"])
        assert values_of(client, "cut") == [b"after"]


def producer_sessions(client: Client) -> set[str]:
    transport = client._transport
    assert isinstance(transport, ServedTransport)
    return {transport._connection.hello.session_id}


def test_a_second_thread_is_not_held_behind_a_waiting_fetch(server: ServerThread) -> None:
    """While one thread waits on a long poll, another's produce goes out at once (the
    client moves to the event loop, where both are in flight together): the waiting
    fetch is woken by that very record, not ended by its wait."""
    with connect(server.address) as client:
        client.create_topic("both")
        fetched: list[list[Record]] = []
        fetching = threading.Thread(
            target=lambda: fetched.append(client.fetch("both", {0: 0}, wait_ms=20_000))
        )
        fetching.start()
        try:
            server.wait_fetch_parked("both")
            client.produce("both", [b"woke it"])
        finally:
            fetching.join(timeout=30)
        assert [[r.value for r in records] for records in fetched] == [[b"woke it"]]
        client.produce("both", [b"later"])
        assert values_of(client, "both") == [b"woke it", b"later"]


def test_what_needs_a_live_session_moves_the_client_to_the_event_loop(
    server: ServerThread,
) -> None:
    before = len(client_threads())
    with connect(server.address) as client:
        client.create_topic("kept")
        client.produce("kept", [b"blocking"])
        transport = client._transport
        assert isinstance(transport, ServedTransport)
        severed: list[str] = []
        client.on_severed(severed.append)  # a callback needs the session kept alive
        assert transport._loop is not None
        assert len(client_threads()) == before + 1
        session = transport.session_id()
        client.produce("kept", [b"on the loop"])
        assert values_of(client, "kept") == [b"blocking", b"on the loop"]
        assert transport.session_id() == session
        assert server.session_ids() == {session}  # the blocking connection is gone
        server.call(lambda: server.server.sever(session, "test says so"))
        wait_until(lambda: severed, 10, message="the severed callback")
        assert severed == ["test says so"]
    wait_until(lambda: len(client_threads()) <= before, 10, message="the loop thread ended")


# AsyncClient: pipelining, reconnecting, dropped connections -------------------------------


def test_async_client_pipelines_many_requests_each_with_its_own_result(
    server: ServerThread,
) -> None:
    async def scenario() -> None:
        client = AsyncClient(Address("tcp", HOST, server.port))
        try:
            await asyncio.gather(
                *(client.call(ops.CREATE_TOPIC, f"t{n}", n + 1) for n in range(10))
            )
            described = await asyncio.gather(
                *(client.call(ops.DESCRIBE_TOPIC, f"t{n}") for n in range(10))
            )
            assert [(t.name, t.partitions) for t in described] == [
                (f"t{n}", n + 1) for n in range(10)
            ]
            values = [f"v{n}".encode() for n in range(200)]
            produced = await asyncio.gather(
                *(client.produce("t0", [NewRecord(v)], producer=NO_PRODUCER) for v in values)
            )
            offsets = [results[0].offset for results in produced]
            assert sorted(offsets) == list(range(200))
            fetched = await asyncio.gather(
                *(client.fetch("t0", {0: offset}, 1, 0) for offset in offsets)
            )
            assert [records[0].value for records in fetched] == values
        finally:
            await client.close()

    run(scenario())


def test_a_client_reconnects_after_the_server_restarts_on_the_same_port(data_dir: Path) -> None:
    first = ServerThread(data_dir).start()
    port = first.port
    second: ServerThread | None = None
    try:
        with connect(first.address) as client:
            client.create_topic("r")
            client.produce("r", [b"before"])
            first.stop()
            second = ServerThread(data_dir, port=port).start()
            client.produce("r", [b"after"])
            assert values_of(client, "r") == [b"before", b"after"]
            assert len(second.session_ids()) == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_request_while_the_server_is_down_waits_with_backoff_for_it(data_dir: Path) -> None:
    first = ServerThread(data_dir).start()
    port = first.port
    restarted: list[ServerThread] = []

    restarting = threading.Event()

    def restart_later() -> None:
        time.sleep(0.5)  # on purpose: the server stays down while the request is made
        restarting.set()
        restarted.append(ServerThread(data_dir, port=port).start())

    restarter = threading.Thread(target=restart_later)
    try:
        with connect(first.address) as client:
            client.create_topic("b")
            first.stop()
            restarter.start()
            client.produce("b", [b"after the restart"])
            assert restarting.is_set(), "answered while the server was down"
            assert values_of(client, "b") == [b"after the restart"]
    finally:
        first.stop()
        if restarter.is_alive() or restarter.ident is not None:
            restarter.join(timeout=30)
        for server in restarted:
            server.stop()


def test_connecting_to_nothing_fails_with_connection_failed_after_the_timeout() -> None:
    with socket.socket() as placeholder:
        placeholder.bind((HOST, 0))
        port = placeholder.getsockname()[1]  # closed below: nobody listens there

    async def scenario() -> BrokerError:
        client = AsyncClient(Address("tcp", HOST, port), connect_timeout_s=0.5)
        with pytest.raises(BrokerError) as excinfo:
            await client.call(ops.LIST_TOPICS)
        return excinfo.value

    error = run(scenario())  # within run()'s bound: it gives up, it does not hang
    assert error.code is ErrorCode.CONNECTION_FAILED


def test_a_fetch_in_flight_when_the_session_is_severed_goes_on_with_a_new_session(
    server: ServerThread,
) -> None:
    # A read is safe to repeat: the client tells the severed callback, then carries the
    # waiting fetch over to a new session (a fence on it would be checked again there).
    pushes: list[Push] = []

    async def scenario() -> None:
        client = AsyncClient(Address("tcp", HOST, server.port), on_push=pushes.append)
        try:
            await client.call(ops.CREATE_TOPIC, "sev", 1)
            first_session = (await client.connection()).session_id
            waiting = asyncio.ensure_future(client.fetch("sev", {0: 0}, 10, 20_000))
            await asyncio.to_thread(server.wait_fetch_parked, "sev")
            server.call(lambda: server.server.sever(first_session, "test says so"))
            # the fetch, carried over, opens the client's next session
            await asyncio.to_thread(
                wait_until,
                lambda: server.session_ids() - {first_session},
                message="the waiting fetch's new session",
            )
            assert not waiting.done()
            await client.produce("sev", [NewRecord(b"after", partition=0)])
            records = await asyncio.wait_for(waiting, 10)
            assert [r.value for r in records] == [b"after"]
            assert pushes == [Push("session_closed", {"reason": "test says so"})]
            assert (await client.connection()).session_id != first_session
        finally:
            await client.close()

    run(scenario())


def test_a_produce_in_flight_when_the_session_is_severed_fails_as_severed(
    server: ServerThread,
) -> None:
    # A produce is never repeated by the connection: whether it landed is unknown.
    async def scenario() -> None:
        client = AsyncClient(Address("tcp", HOST, server.port))
        try:
            await client.call(ops.CREATE_TOPIC, "sev", 1)
            connection = await client.connection()
            server.call(lambda: server.server.sever(connection.session_id, "test says so"))
            await asyncio.to_thread(
                wait_until, lambda: connection.closed, 10, message="the severed connection closed"
            )
            with pytest.raises(BrokerError) as excinfo:
                await connection.request(Op.PRODUCE, {})
            assert excinfo.value.code is ErrorCode.SEVERED
            assert "test says so" in excinfo.value.message
        finally:
            await client.close()

    run(scenario())


def test_closing_a_client_while_a_fetch_waits_in_another_thread_is_clean(
    server: ServerThread,
) -> None:
    before = len(client_threads())
    client = connect(server.address)
    client.create_topic("w")
    outcome: dict[str, object] = {}

    def wait_for_a_record() -> None:
        try:
            outcome["records"] = client.fetch("w", {0: 0}, wait_ms=2_500)
        except BrokerError as error:
            outcome["error"] = error

    waiter = threading.Thread(target=wait_for_a_record)
    waiter.start()
    try:
        server.wait_fetch_parked("w")
        client.close()  # e.g. Ctrl-C or SIGTERM during `consume --follow`
    finally:
        waiter.join(timeout=30)
    assert not waiter.is_alive()
    wait_until(
        lambda: len(client_threads()) <= before,
        10,
        message=lambda: f"the client's loop threads gone; still {client_threads()}",
    )
    assert len(client_threads()) == before, "close() left the client's loop thread running"


def test_a_server_of_another_protocol_version_is_refused_with_both_versions_named(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.server.server

    monkeypatch.setattr(broker.server.server, "PROTOCOL_VERSION", 1)  # what an older server says
    with pytest.raises(BrokerError) as caught:
        connect(server.address)
    assert caught.value.code is ErrorCode.PROTOCOL_ERROR
    assert "speaks protocol 1; this client speaks 2" in caught.value.message
    assert caught.value.hint == "run the same fencelog version on both sides"
    shown = CliRunner().invoke(command(), ["--broker", server.address, "topic", "list"])
    assert shown.exit_code == int(ErrorCode.PROTOCOL_ERROR)
    assert "this client speaks 2 (run the same fencelog version" in shown.stderr


# busy polling ---------------------------------------------------------------------------


@pytest.mark.parametrize("busy_poll_us", [-1, BUSY_POLL_US_MAX + 1])
def test_an_async_client_refuses_a_busy_poll_window_out_of_range(busy_poll_us: int) -> None:
    with pytest.raises(BrokerError) as caught:
        AsyncClient(Address.parse("tcp://127.0.0.1:7420"), busy_poll_us=busy_poll_us)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert f"not {busy_poll_us}" in caught.value.message


def test_an_async_client_polls_while_it_awaits_a_reply_for_at_most_its_window(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """busy_poll_us=100_000: while a fetch long-polls 3 s, the client's loop polls for
    its 100 ms window, then sleeps until the reply; once answered, it polls no more. A
    client without a window sleeps the whole time. (The server, a process of its own,
    does not poll.) Counted in the loop turns the client's BusyPoll asks for, not in
    CPU time, which depends on the machine."""

    async def polls_around_a_long_poll(address: str, busy_poll_us: int) -> dict[str, int]:
        client = AsyncClient(Address.parse(address), busy_poll_us=busy_poll_us)
        busy = client._busy_poll
        polls = 0
        poll = busy._poll

        def counted() -> None:
            nonlocal polls
            polls += 1
            poll()

        monkeypatch.setattr(busy, "_poll", counted)
        await client.call(ops.CREATE_TOPIC, "quiet", 1)
        await asyncio.to_thread(wait_until, lambda: not busy._polling, message="polls ended")
        before = polls
        waiting = asyncio.ensure_future(client.fetch("quiet", {0: 0}, 10, 3_000))
        window_ended = before
        if busy_poll_us:  # it polls, then stops by itself while the reply is awaited
            await asyncio.to_thread(
                wait_until,
                lambda: polls > before and not busy._polling,
                message="a window of polling that ends",
            )
            assert not waiting.done(), "answered within the window: no sign it would stop"
            window_ended = polls
        assert not await waiting  # nothing to fetch
        answered = polls
        await asyncio.sleep(0.3)  # on purpose: a while with nothing awaited
        idle = polls - answered
        await client.call(ops.DELETE_TOPIC, "quiet")
        await client.close()
        after_its_window = answered - window_ended
        return {"awaiting": answered - before, "after its window": after_its_window, "idle": idle}

    with serving(data_dir, tmp_path / "ready.json", serve_args=("--busy-poll", "0")) as server:
        address = f"tcp://{server.tcp}"
        polling = run(polls_around_a_long_poll(address, 100_000))
        sleeping = run(polls_around_a_long_poll(address, 0))
    assert polling["awaiting"] > 0, polling
    assert polling["after its window"] == 0, polling
    assert polling["idle"] == 0, polling
    assert sleeping == {"awaiting": 0, "after its window": 0, "idle": 0}


def test_a_transactions_first_produce_travels_as_columns_and_lands_whole(client: Client) -> None:
    """TXN_BEGIN_PRODUCE (a transaction's first produce) sends a plain batch as columns
    and is answered with its results as columns: the same results, the same records."""
    from broker.protocol import ops
    from broker.protocol.messages import COLUMNS_FEATURE

    transport = client._transport
    assert isinstance(transport, ServedTransport)
    assert COLUMNS_FEATURE in transport._connection.hello.features
    assert ops.TXN_BEGIN_PRODUCE.reply_columns is not None
    client.create_topic("t", 2)
    values = [b"v%d" % i for i in range(40)]
    with client.transaction("g") as txn:
        results = txn.produce("t", values, partition=1)
    assert [(r.topic, r.partition, r.offset, r.duplicate) for r in results] == [
        ("t", 1, -1, False)
    ] * 40
    assert [r.value for r in client.fetch("t", {1: 0}, max_records=100)] == values


# connecting: what is retried, and for how long ---------------------------------------


class _Clock:
    """time.monotonic and time.sleep for broker.client.remote: sleeping moves it on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _attempts(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException, connect_timeout_s: float
) -> tuple[int, _Clock]:
    from broker.client import remote

    clock = _Clock()
    monkeypatch.setattr(remote, "time", clock)
    tries = 0

    def open_once(_timeout_s: float) -> None:
        nonlocal tries
        tries += 1
        raise remote.cannot_connect(Address.parse("tcp://127.0.0.1:1"), exc)

    with pytest.raises(BrokerError) as failed:
        remote.connect_with_backoff(open_once, connect_timeout_s)
    assert failed.value.code is ErrorCode.CONNECTION_FAILED
    return tries, clock


def test_a_refused_connection_is_retried_only_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries, clock = _attempts(monkeypatch, ConnectionRefusedError(111, "refused"), 0.5)
    assert tries > 1  # a server about to listen is waited for
    assert sum(clock.slept) < 0.5


def test_an_unknown_host_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    tries, clock = _attempts(monkeypatch, socket.gaierror(-2, "Name or service not known"), 30)
    assert (tries, clock.slept) == (1, [])


def test_the_cli_waits_for_a_refused_port_as_connect_timeout_says(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's default is short (a command against a port nobody listens on fails at
    once); --connect-timeout and FENCELOG_CONNECT_TIMEOUT set it."""
    from broker.client import remote

    waits: list[float] = []
    real = remote.connect_with_backoff

    def spy(open_once: Callable[[float], Any], connect_timeout_s: float) -> Any:
        waits.append(connect_timeout_s)
        return real(open_once, 0)

    monkeypatch.setattr("broker.client.served.connect_with_backoff", spy)
    for argv, env in [
        ([], {}),
        (["--connect-timeout", "3s"], {}),
        ([], {"FENCELOG_CONNECT_TIMEOUT": "2s"}),
    ]:
        args = ["--broker", "tcp://127.0.0.1:1", *argv, "topic", "list"]
        result = runner.invoke(command(args), args, env=env)
        assert result.exit_code == ErrorCode.CONNECTION_FAILED, result.stderr
    assert waits == [0.5, 3.0, 2.0]


def test_a_connect_timeout_that_is_not_a_duration_is_refused(runner: CliRunner) -> None:
    args = ["--connect-timeout", "soon", "--broker", "tcp://127.0.0.1:1", "topic", "list"]
    result = runner.invoke(command(args), args)
    assert result.exit_code == ErrorCode.INVALID_ARGUMENT
    assert result.stderr == (
        "error: 'soon' is not a duration (use e.g. 500ms, 30s, 2m, 1h, 7d or a number of "
        "seconds) [INVALID_ARGUMENT]\n"
    )
