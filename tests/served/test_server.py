"""broker/server/server.py in-process: a Server on 127.0.0.1 port 0 in its own thread and loop,
reached through raw sockets (exact bytes in, exact frames out) and AsyncConnection.

Bad input costs only its own connection: an error frame, then close, while the server and
every other session go on. Also: HELLO first, limits, sessions and their timeout,
pipelining, group commit, long-poll fetch, auth, and a clean stop."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import tracemalloc
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pytest
from msgspec.structs import replace

from broker.client.async_client import AsyncConnection
from broker.client.client import Client, connect
from broker.client.served import Address
from broker.discovery import DB_FILE, find_server
from broker.engine.engine import Engine, ProduceOutcome, ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.limits import BUSY_POLL_US_MAX, DEFAULT_LIMITS
from broker.protocol import codec
from broker.protocol.frames import encode
from broker.protocol.messages import ErrorReply, Message, Op, Push, Reply, Request
from broker.server.server import Server
from broker.types import NO_PRODUCER, NewRecord
from support.servers import HOST, STEP_TIMEOUT_S, RawClient, ServerThread, served
from support.values import present
from support.waiting import wait_until

T = TypeVar("T")
TEST_TIMEOUT_S = 30.0


def run(work: Coroutine[Any, Any, T]) -> T:
    """asyncio.run with an overall deadline, so a hang fails the test instead of pytest."""

    async def bounded() -> T:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            return await work

    return asyncio.run(bounded())


async def open_connection(server: ServerThread, **kwargs: Any) -> AsyncConnection:
    return await AsyncConnection.open(Address("tcp", HOST, server.port), **kwargs)


def sent(connection: AsyncConnection, requests: int) -> bool:
    """The connection awaits the replies to `requests` requests, and every one of them
    has left it for the server's socket."""
    transport = connection._transport
    return (
        len(connection._pending) == requests
        and not connection._out
        and transport is not None
        and not transport.get_write_buffer_size()
    )


def produce_args(topic: str, *values: bytes, partition: int | None = 0) -> dict[str, Any]:
    return {
        "topic": topic,
        "records": codec.new_records_to_wire([NewRecord(v, partition=partition) for v in values]),
        "producer": codec.producer_to_wire(NO_PRODUCER),
    }


def fetch_args(topic: str, offset: int = 0, *, wait_ms: int = 0) -> dict[str, Any]:
    return {"topic": topic, "positions": ((0, offset),), "max_records": 1000, "wait_ms": wait_ms}


def frame_of(body: object) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(packed)) + packed


def connection_error(messages: Sequence[Message]) -> ErrorReply:
    """The one connection-level error frame a refused connection gets before it closes."""
    assert len(messages) == 1, messages
    error = messages[0]
    assert isinstance(error, ErrorReply), error
    assert error.request_id == 0
    return error


@pytest.fixture
def server(data_dir: Path) -> Iterator[ServerThread]:
    with served(data_dir) as started:
        yield started


@pytest.fixture
def bystander(server: ServerThread) -> Iterator[Client]:
    """A session opened before the test's misbehaving one; it must keep working."""
    client = connect(server.address)
    client.create_topic("bystander")
    client.produce("bystander", [b"before"])
    try:
        yield client
    finally:
        client.close()


def assert_still_serving(server: ServerThread, bystander: Client) -> None:
    bystander.produce("bystander", [b"after"])
    assert [r.value for r in bystander.fetch("bystander", {0: 0})] == [b"before", b"after"]
    with RawClient(server.port) as fresh:
        fresh.hello()
        request_id = fresh.request(Op.LIST_TOPICS)
        reply = fresh.receive()
        assert isinstance(reply, Reply) and reply.request_id == request_id
        assert [t["name"] for t in reply.result["topics"]] == ["bystander"]


# HELLO and requests -----------------------------------------------------------------------


def test_hello_names_the_session_and_tells_the_client_limits(server: ServerThread) -> None:
    with RawClient(server.port) as raw:
        hello = raw.hello()
        assert hello.result["protocol"] == 2
        assert hello.result["session_id"] in server.session_ids()
        assert hello.result["limits"]["frame_bytes_max"] == DEFAULT_LIMITS.frame_bytes_max
        assert hello.result["limits"]["session_timeout_ms"] == DEFAULT_LIMITS.session_timeout_ms


@pytest.mark.parametrize("busy_poll_us", [-1, BUSY_POLL_US_MAX + 1])
def test_a_busy_poll_window_out_of_range_is_refused(data_dir: Path, busy_poll_us: int) -> None:
    with pytest.raises(BrokerError) as caught:
        Server(data_dir, busy_poll_us=busy_poll_us)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert f"busy polling lasts 0 to {BUSY_POLL_US_MAX} us, not {busy_poll_us}" in str(caught.value)


def test_an_unknown_durability_is_refused_by_the_server_before_it_starts(data_dir: Path) -> None:
    with pytest.raises(BrokerError) as caught:
        Server(data_dir, durability="sometimes")  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert caught.value.message == "unknown durability 'sometimes'"


def test_a_request_before_hello_is_refused_and_closed(
    server: ServerThread, bystander: Client
) -> None:
    with RawClient(server.port) as raw:
        raw.request(Op.LIST_TOPICS)
        error = connection_error(raw.receive_all())
        assert error.code == ErrorCode.PROTOCOL_ERROR
        assert "HELLO" in error.message
    server.wait_sessions(1)
    assert_still_serving(server, bystander)


def test_a_request_error_is_answered_with_its_id_and_the_session_goes_on(
    server: ServerThread,
) -> None:
    with RawClient(server.port) as raw:
        raw.hello()
        missing = raw.request(Op.DESCRIBE_TOPIC, {"name": "nope"})
        reply = raw.receive()
        assert isinstance(reply, ErrorReply)
        assert (reply.request_id, reply.code) == (missing, ErrorCode.UNKNOWN_TOPIC)
        assert reply.details["topic"] == "nope"
        created = raw.request(Op.CREATE_TOPIC, {"name": "t", "partitions": 2})
        reply = raw.receive()
        assert isinstance(reply, Reply) and reply.request_id == created
        assert reply.result["partitions"] == 2


def test_a_payload_with_a_wrong_field_gets_a_protocol_error_naming_it(
    server: ServerThread, bystander: Client
) -> None:
    with RawClient(server.port) as raw:
        raw.hello()
        request_id = raw.request(Op.CREATE_TOPIC, {"name": 5, "partitions": 1})
        reply = raw.receive()
        assert isinstance(reply, ErrorReply)
        assert (reply.request_id, reply.code) == (request_id, ErrorCode.PROTOCOL_ERROR)
        assert "'name'" in reply.message
    assert_still_serving(server, bystander)


# malformed, truncated, oversized and unknown frames ---------------------------------------

BAD_FRAMES = {
    "not msgpack": struct.pack(">I", 1) + b"\xc1",
    "not an array": frame_of({"kind": 0}),
    "unknown kind": frame_of((7, 5, int(Op.STATUS), {})),
    "unknown op": frame_of((0, 5, 99, {})),
    "request without an op": frame_of((0, 5, 0, {})),
    "payload not a map": frame_of((0, 5, int(Op.STATUS), (1, 2))),
    "a reply from the client": encode(Reply(5, {})),
    "a push from the client": encode(Push("hello", {})),
    "empty frame": struct.pack(">I", 0),
    "oversized header": struct.pack(">I", 1 << 30),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_gets_an_error_frame_and_only_its_connection_closes(
    server: ServerThread, bystander: Client, name: str
) -> None:
    with RawClient(server.port) as raw:
        raw.hello()
        raw.send_bytes(BAD_FRAMES[name])
        error = connection_error(raw.receive_all())
        assert error.code == ErrorCode.PROTOCOL_ERROR
    server.wait_sessions(1)
    assert_still_serving(server, bystander)


def test_a_frame_cut_off_by_the_client_closing_gets_an_error_frame(
    server: ServerThread, bystander: Client
) -> None:
    frame = encode(Request(2, Op.PRODUCE, produce_args("bystander", b"never")))
    with RawClient(server.port) as raw:
        raw.hello()
        raw.send_bytes(frame[: len(frame) // 2])
        raw.sock.shutdown(socket.SHUT_WR)
        error = connection_error(raw.receive_all())
        assert error.code == ErrorCode.PROTOCOL_ERROR
        assert "mid-frame" in error.message
    server.wait_sessions(1)
    assert [r.value for r in bystander.fetch("bystander", {0: 0})] == [b"before"]
    assert_still_serving(server, bystander)


def test_requests_before_a_bad_frame_are_answered_first(server: ServerThread) -> None:
    with RawClient(server.port) as raw:
        raw.hello()
        good = [Request(n, Op.STATUS, {}) for n in (2, 3, 4)]
        raw.send_bytes(b"".join(encode(m) for m in good) + BAD_FRAMES["unknown op"])
        messages = raw.receive_all()
    assert [type(m) for m in messages] == [Reply, Reply, Reply, ErrorReply]
    assert [m.request_id for m in messages if isinstance(m, Reply)] == [2, 3, 4]
    assert connection_error(messages[3:]).code == ErrorCode.PROTOCOL_ERROR


def test_a_one_gib_length_header_is_refused_without_allocating_it(
    server: ServerThread, bystander: Client
) -> None:
    with RawClient(server.port) as raw:
        raw.hello()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            raw.send_bytes(struct.pack(">I", 1 << 30))  # the header alone, no body at all
            error = connection_error(raw.receive_all())
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert error.code == ErrorCode.PROTOCOL_ERROR
    assert error.details["frame_bytes"] == 1 << 30
    assert error.details["frame_bytes_max"] == DEFAULT_LIMITS.frame_bytes_max
    assert peak_bytes < 16 * 1024 * 1024
    assert_still_serving(server, bystander)


def test_a_frame_over_a_small_frame_limit_is_refused(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, frame_bytes_max=4096)
    with served(data_dir, limits=limits) as server, RawClient(server.port) as raw:
        hello = raw.hello()
        assert hello.result["limits"]["frame_bytes_max"] == 4096
        raw.send(Request(2, Op.PRODUCE, produce_args("t", b"x" * 5000)))
        error = connection_error(raw.receive_all())
        assert error.code == ErrorCode.PROTOCOL_ERROR
        assert error.details["frame_bytes_max"] == 4096


# connections and sessions -----------------------------------------------------------------


def test_the_connection_over_connections_max_is_refused_and_the_others_go_on(
    data_dir: Path,
) -> None:
    limits = replace(DEFAULT_LIMITS, connections_max=2)
    with served(data_dir, limits=limits) as server:
        with RawClient(server.port) as first, RawClient(server.port) as second:
            first.hello()
            second.hello()
            with RawClient(server.port) as third:
                error = connection_error(third.receive_all())
                assert error.code == ErrorCode.TOO_MANY_REQUESTS
            assert len(server.session_ids()) == 2
            for raw in (first, second):
                request_id = raw.request(Op.STATUS)
                reply = raw.receive()
                assert isinstance(reply, Reply) and reply.request_id == request_id
        server.wait_sessions(0)
        with RawClient(server.port) as later:
            later.hello()


def test_sessions_reflect_open_connections(server: ServerThread) -> None:
    async def scenario() -> None:
        first = await open_connection(server)
        second = await open_connection(server)
        assert first.session_id != second.session_id
        assert server.session_ids() == {first.session_id, second.session_id}
        await first.close()
        assert await asyncio.to_thread(server.wait_sessions, 1) == {second.session_id}
        await second.close()
        await asyncio.to_thread(server.wait_sessions, 0)

    run(scenario())


def test_a_silent_session_is_closed_after_the_timeout_and_a_heartbeating_one_stays(
    data_dir: Path,
) -> None:
    limits = replace(DEFAULT_LIMITS, session_timeout_ms=400)

    def silent(port: int) -> list[Message]:
        with RawClient(port) as raw:
            raw.hello()
            return raw.receive_all(timeout_s=10)  # closed, and told why, in time

    async def scenario(server: ServerThread) -> None:
        beating = await open_connection(server)
        assert beating.limits.session_timeout_ms == 400
        messages = await asyncio.to_thread(silent, server.port)
        assert messages == [Push("session_closed", {"reason": "missed heartbeats"})]
        # on purpose: well past the timeout again; heartbeats keep it open
        await asyncio.sleep(0.8)
        assert server.session_ids() == {beating.session_id}
        assert "topics" in await beating.request(Op.LIST_TOPICS, {})
        await beating.close()

    with served(data_dir, limits=limits) as server:
        run(scenario(server))


def test_a_connection_that_never_says_hello_is_closed_after_the_timeout(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, session_timeout_ms=300)
    with served(data_dir, limits=limits) as server, RawClient(server.port) as raw:
        server.wait_sessions(1)
        assert raw.receive_all(timeout_s=10) == [
            Push("session_closed", {"reason": "missed heartbeats"})
        ]
        server.wait_sessions(0)


# pipelining, group commit, long-poll ------------------------------------------------------


def test_pipelined_requests_are_answered_in_order_each_with_its_own_result(
    server: ServerThread,
) -> None:
    topics = [f"t{n}" for n in range(20)]
    with RawClient(server.port) as raw:
        raw.hello()
        creates = [
            Request(10 + n, Op.CREATE_TOPIC, {"name": topic, "partitions": n + 1})
            for n, topic in enumerate(topics)
        ]
        raw.send_bytes(b"".join(encode(r) for r in creates))
        created = [raw.receive() for _ in creates]
        requests: list[Request] = []
        for n, topic in enumerate(topics):
            requests.append(Request(100 + 3 * n, Op.PRODUCE, produce_args(topic, topic.encode())))
            requests.append(Request(101 + 3 * n, Op.DESCRIBE_TOPIC, {"name": topic}))
            requests.append(Request(102 + 3 * n, Op.DESCRIBE_TOPIC, {"name": f"missing{n}"}))
        raw.send_bytes(b"".join(encode(r) for r in requests))
        replies = [raw.receive() for _ in requests]
    assert [getattr(m, "request_id", None) for m in created] == [r.request_id for r in creates]
    assert [getattr(m, "request_id", None) for m in replies] == [r.request_id for r in requests]
    for n, topic in enumerate(topics):
        create = created[n]
        assert isinstance(create, Reply) and create.result["name"] == topic
        produced, described, missing = replies[3 * n : 3 * n + 3]
        assert isinstance(produced, Reply) and produced.result["results"] == ((0, 0, False),)
        assert isinstance(described, Reply) and described.result["name"] == topic
        assert described.result["partitions"] == n + 1
        assert isinstance(missing, ErrorReply) and missing.code == ErrorCode.UNKNOWN_TOPIC
        assert missing.details["topic"] == f"missing{n}"


def test_pipelined_requests_on_one_async_connection_get_their_own_replies(
    server: ServerThread,
) -> None:
    async def scenario() -> None:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "p", "partitions": 1})
        values = [f"v{n}".encode() for n in range(300)]
        produced = await asyncio.gather(
            *(connection.request(Op.PRODUCE, produce_args("p", v)) for v in values)
        )
        offsets = [reply["results"][0][1] for reply in produced]
        assert sorted(offsets) == list(range(300))
        fetched = await asyncio.gather(
            *(
                connection.request(Op.FETCH, {**fetch_args("p", o), "max_records": 1})
                for o in offsets
            )
        )
        assert [reply["rows"][0][4] for reply in fetched] == values  # rows: no topic
        await connection.close()

    run(scenario())


def test_a_produce_that_arrives_while_another_write_holds_the_writer_commits_after_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Produce groups and the other writes (here CREATE_TOPIC, on the writer thread)
    never use the writer at once: a produce read meanwhile is committed once it is free."""
    steps: list[str] = []
    creating, release = threading.Event(), threading.Event()
    real_create, real_produce_group = Engine.create_topic, Engine.produce_group

    def slow_create(engine: Engine, name: str, partitions: int, **kwargs: Any) -> Any:
        steps.append("create begins")
        creating.set()
        release.wait(timeout=30)
        info = real_create(engine, name, partitions, **kwargs)
        steps.append("create ends")
        return info

    def logged(engine: Engine, requests: Sequence[ProduceRequest]) -> list[ProduceOutcome]:
        steps.append("produce group")
        return real_produce_group(engine, requests)

    async def scenario(server: ServerThread) -> list[Any]:
        setup = await open_connection(server)
        await setup.request(Op.CREATE_TOPIC, {"name": "a", "partitions": 1})
        monkeypatch.setattr(Engine, "create_topic", slow_create)
        monkeypatch.setattr(Engine, "produce_group", logged)
        loop = asyncio.get_running_loop()
        create = asyncio.ensure_future(
            setup.request(Op.CREATE_TOPIC, {"name": "b", "partitions": 1})
        )
        await loop.run_in_executor(None, creating.wait, 30)
        producer = await open_connection(server)
        produce = asyncio.ensure_future(producer.request(Op.PRODUCE, produce_args("a", b"v")))
        await asyncio.to_thread(
            wait_until,
            lambda: server.server._group_commit.waiting,
            interval_s=0.001,
            message="the produce read, and waiting for the writer",
        )
        release.set()
        replies = [await produce, await create]
        await producer.close()
        await setup.close()
        return replies

    with served(data_dir) as server:
        produced, created = run(scenario(server))
    assert produced["results"] == ((0, 0, False),)
    assert created["name"] == "b"
    assert steps == ["create begins", "create ends", "produce group"]


def test_a_group_commit_that_fails_unexpectedly_is_answered_and_the_next_one_commits(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the engine (not a BrokerError) fails its group's produces with INTERNAL;
    the commit loop goes on and the next produce is stored."""
    real_produce_group = Engine.produce_group
    failures = [RuntimeError("a bug")]

    def failing_once(engine: Engine, requests: Sequence[ProduceRequest]) -> list[ProduceOutcome]:
        if failures:
            raise failures.pop()
        return real_produce_group(engine, requests)

    async def scenario(server: ServerThread) -> tuple[BrokerError, dict[str, Any]]:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "b", "partitions": 1})
        monkeypatch.setattr(Engine, "produce_group", failing_once)
        with pytest.raises(BrokerError) as failed:
            await connection.request(Op.PRODUCE, produce_args("b", b"lost"))
        stored = await connection.request(Op.PRODUCE, produce_args("b", b"kept"))
        await connection.close()
        return failed.value, stored

    with served(data_dir) as server:
        error, stored = run(scenario(server))
    assert error.code is ErrorCode.INTERNAL and "a bug" in error.message
    assert stored["results"] == ((0, 0, False),)


def test_concurrent_produce_requests_are_group_committed_exactly_once(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group_sizes: list[int] = []
    real_produce_group = Engine.produce_group

    def counting(engine: Engine, requests: Sequence[ProduceRequest]) -> list[ProduceOutcome]:
        group_sizes.append(len(requests))
        return real_produce_group(engine, requests)

    monkeypatch.setattr(Engine, "produce_group", counting)
    connections_count, requests_each, records_each = 8, 25, 4

    async def producer(server: ServerThread, name: int) -> list[tuple[bytes, int]]:
        connection = await open_connection(server)
        batches = [
            [f"c{name}-r{n}-{k}".encode() for k in range(records_each)]
            for n in range(requests_each)
        ]
        replies = await asyncio.gather(
            *(connection.request(Op.PRODUCE, produce_args("g", *batch)) for batch in batches)
        )
        await connection.close()
        acked = []
        for batch, reply in zip(batches, replies, strict=True):
            acked += [(value, row[1]) for value, row in zip(batch, reply["results"], strict=True)]
        return acked

    async def storm(server: ServerThread) -> list[tuple[bytes, int]]:
        setup = await open_connection(server)
        await setup.request(Op.CREATE_TOPIC, {"name": "g", "partitions": 1})
        await setup.close()
        results = await asyncio.gather(*(producer(server, n) for n in range(connections_count)))
        return [pair for acked in results for pair in acked]

    with served(data_dir, durability="full") as server:
        acked = run(storm(server))
    total = connections_count * requests_each * records_each
    assert len(acked) == total
    with Engine.open(data_dir) as engine:
        stored = engine.read("g", 0, 0, max_records=total + 1)
    assert [r.offset for r in stored] == list(range(total))  # contiguous, nothing extra
    assert sorted(present(r.value) for r in stored) == sorted(
        value for value, _ in acked
    )  # each once
    assert {r.offset: r.value for r in stored} == {o: v for v, o in acked}  # acks are right
    assert sum(group_sizes) == connections_count * requests_each
    assert max(group_sizes) > 1, "concurrent produce requests never shared a transaction"


def test_a_pile_of_produces_commits_in_halves_and_each_is_acknowledged_in_order(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 produces that arrive while a commit runs (at least twice
    group_commit_split_requests) commit as two groups of 20: the first group's
    acknowledgements need not wait for the second's COMMIT."""
    group_sizes: list[int] = []
    inside, release = threading.Event(), threading.Event()
    real_produce_group = Engine.produce_group

    def held_once(engine: Engine, requests: Sequence[ProduceRequest]) -> list[ProduceOutcome]:
        group_sizes.append(len(requests))
        if len(group_sizes) == 1:
            inside.set()
            release.wait(STEP_TIMEOUT_S)  # the server's loop waits here: the pile grows
        return real_produce_group(engine, requests)

    async def scenario(server: ServerThread) -> list[dict[str, Any]]:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "h", "partitions": 1})
        monkeypatch.setattr(Engine, "produce_group", held_once)
        first = asyncio.ensure_future(connection.request(Op.PRODUCE, produce_args("h", b"0")))
        assert await asyncio.to_thread(inside.wait, STEP_TIMEOUT_S)
        pile = [
            asyncio.ensure_future(connection.request(Op.PRODUCE, produce_args("h", b"%d" % n)))
            for n in range(1, 41)
        ]
        await asyncio.to_thread(
            wait_until,
            lambda: sent(connection, 1 + len(pile)),
            message="the pile sent to the server's socket (one write)",
        )
        release.set()
        replies = await asyncio.gather(first, *pile)
        await connection.close()
        return replies

    with served(data_dir) as server:
        replies = run(scenario(server))
    assert group_sizes == [1, 20, 20]
    assert [reply["results"] for reply in replies] == [((0, n, False),) for n in range(41)]
    with Engine.open(data_dir) as engine:
        stored = engine.read("h", 0, 0, max_records=100)
    assert [r.value for r in stored] == [b"%d" % n for n in range(41)]


def test_a_failing_produce_in_a_group_costs_only_itself(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, record_value_bytes_max=100)

    def args_for(connection: int, n: int) -> tuple[dict[str, Any], ErrorCode | None]:
        value = f"c{connection}-{n}".encode()
        match n % 4:
            case 1:
                return produce_args("missing", value), ErrorCode.UNKNOWN_TOPIC
            case 2:
                return produce_args("g", value, partition=5), ErrorCode.UNKNOWN_PARTITION
            case 3:
                return produce_args("g", value, b"x" * 101), ErrorCode.RECORD_TOO_LARGE
            case _:
                return produce_args("g", value, value + b"+"), None

    async def producer(server: ServerThread, connection: int) -> list[bytes]:
        client = await open_connection(server)
        cases = [args_for(connection, n) for n in range(40)]
        outcomes = await asyncio.gather(
            *(client.request(Op.PRODUCE, args) for args, _ in cases), return_exceptions=True
        )
        await client.close()
        stored: list[bytes] = []
        for (args, expected), got in zip(cases, outcomes, strict=True):
            if expected is None:
                assert isinstance(got, dict), got
                stored += [row[0] for row in args["records"]]
            else:
                assert isinstance(got, BrokerError) and got.code is expected, got
        return stored

    async def storm(server: ServerThread) -> list[bytes]:
        setup = await open_connection(server)
        await setup.request(Op.CREATE_TOPIC, {"name": "g", "partitions": 1})
        await setup.close()
        results = await asyncio.gather(*(producer(server, n) for n in range(4)))
        return [value for values in results for value in values]

    with served(data_dir, limits=limits) as server:
        acked = run(storm(server))
    with Engine.open(data_dir) as engine:
        stored = engine.read("g", 0, 0)
    assert [r.offset for r in stored] == list(range(len(acked)))
    assert sorted(present(r.value) for r in stored) == sorted(acked)


def test_a_waiting_fetch_returns_as_soon_as_another_client_produces(
    server: ServerThread,
) -> None:
    async def scenario() -> None:
        consumer = await open_connection(server)
        producer = await open_connection(server)
        await producer.request(Op.CREATE_TOPIC, {"name": "lp", "partitions": 1})
        waiting = asyncio.ensure_future(
            consumer.request(Op.FETCH, fetch_args("lp", wait_ms=20_000))
        )
        await asyncio.to_thread(server.wait_fetch_parked, "lp")
        assert not waiting.done()
        await producer.request(Op.PRODUCE, produce_args("lp", b"wake up"))
        # the record wakes it, long before its 20 s deadline
        reply = await asyncio.wait_for(waiting, 10)
        assert [row[4] for row in reply["rows"]] == [b"wake up"]
        await consumer.close()
        await producer.close()

    run(scenario())


def test_a_waiting_fetch_with_nothing_new_returns_empty_at_its_deadline(
    server: ServerThread,
) -> None:
    async def scenario() -> None:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "quiet", "partitions": 1})
        await connection.request(Op.PRODUCE, produce_args("quiet", b"old"))
        asked = fetch_args("quiet", 1, wait_ms=400)
        reply = await asyncio.wait_for(connection.request(Op.FETCH, asked), 10)
        assert reply["rows"] == ()
        # something there: no waiting at all, let alone its 20 s
        asked = fetch_args("quiet", 0, wait_ms=20_000)
        reply = await asyncio.wait_for(connection.request(Op.FETCH, asked), 10)
        assert [row[4] for row in reply["rows"]] == [b"old"]
        await connection.close()

    run(scenario())


def test_a_waiting_fetch_learns_at_once_that_its_topic_was_deleted(
    server: ServerThread,
) -> None:
    async def scenario() -> None:
        consumer = await open_connection(server)
        admin = await open_connection(server)
        await admin.request(Op.CREATE_TOPIC, {"name": "doomed", "partitions": 1})
        waiting = asyncio.ensure_future(
            consumer.request(Op.FETCH, fetch_args("doomed", wait_ms=20_000))
        )
        await asyncio.to_thread(server.wait_fetch_parked, "doomed")
        await admin.request(Op.DELETE_TOPIC, {"name": "doomed"})
        with pytest.raises(BrokerError) as excinfo:
            await asyncio.wait_for(waiting, 10)  # at once, not at its 20 s deadline
        assert excinfo.value.code is ErrorCode.UNKNOWN_TOPIC
        assert "topics" in await consumer.request(Op.LIST_TOPICS, {})  # still connected
        await consumer.close()
        await admin.close()

    run(scenario())


def test_fetch_waits_no_longer_than_fetch_wait_ms_max(data_dir: Path) -> None:
    limits = replace(DEFAULT_LIMITS, fetch_wait_ms_max=300)

    async def scenario(server: ServerThread) -> None:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "capped", "partitions": 1})
        asked = fetch_args("capped", wait_ms=600_000)
        # answered at the 300 ms cap: well within 10 s, let alone the 600 s asked
        reply = await asyncio.wait_for(connection.request(Op.FETCH, asked), 10)
        assert reply["rows"] == ()
        await connection.close()

    with served(data_dir, limits=limits) as server:
        run(scenario(server))


# auth and where it listens ----------------------------------------------------------------

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("token", [None, "", "wrong-token-wrong-token", TOKEN + "x"])
def test_hello_without_the_right_token_is_auth_failed_and_closed(
    data_dir: Path, token: str | None
) -> None:
    with served(data_dir, auth_token=TOKEN) as server:
        with RawClient(server.port) as raw:
            raw.request(Op.HELLO, {"client": "raw", "token": token})
            error = connection_error(raw.receive_all())
            assert error.code == ErrorCode.AUTH_FAILED
            assert TOKEN not in repr(error)
        with RawClient(server.port) as raw:
            raw.request(Op.STATUS)  # no HELLO at all
            assert connection_error(raw.receive_all()).code == ErrorCode.PROTOCOL_ERROR
        with RawClient(server.port) as raw:
            raw.hello(token=TOKEN)
            request_id = raw.request(Op.LIST_TOPICS)
            reply = raw.receive()
            assert isinstance(reply, Reply) and reply.request_id == request_id


def test_async_connection_with_a_wrong_token_raises_auth_failed(data_dir: Path) -> None:
    async def scenario(server: ServerThread) -> None:
        with pytest.raises(BrokerError) as excinfo:
            await open_connection(server, token="not the token at all")
        assert excinfo.value.code is ErrorCode.AUTH_FAILED
        connection = await open_connection(server, token=TOKEN)
        assert "topics" in await connection.request(Op.LIST_TOPICS, {})
        await connection.close()

    with served(data_dir, auth_token=TOKEN) as server:
        run(scenario(server))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_listening_beyond_loopback_without_a_token_is_refused(data_dir: Path, host: str) -> None:
    async def start() -> None:
        await Server(data_dir).start(host, 0, unix=False)

    with pytest.raises(BrokerError) as excinfo:
        asyncio.run(start())
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert "--auth-token-file" in (excinfo.value.hint or "")
    assert not data_dir.exists() or find_server(data_dir) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_addresses_need_no_token(data_dir: Path, host: str) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")

    async def start_and_stop() -> str:
        server = Server(data_dir)
        try:
            await server.start(host, 0, unix=False)
        except OSError as exc:  # e.g. IPv6 compiled in but not configured
            pytest.skip(f"cannot listen on {host}: {exc}")
        assert server.info is not None and server.info.tcp is not None
        await server.stop()
        return server.info.tcp

    assert run(start_and_stop())


def test_the_unix_socket_and_data_directory_are_private(data_dir: Path) -> None:
    with served(data_dir, unix=True) as server:
        assert server.server.info is not None and server.server.info.unix is not None
        socket_path = Path(server.server.info.unix)
        assert socket_path.stat().st_mode & 0o077 == 0
        assert data_dir.stat().st_mode & 0o777 == 0o700
        client = connect(f"unix://{socket_path}")
        try:
            client.create_topic("over-unix")
            assert [t.name for t in client.list_topics()] == ["over-unix"]
        finally:
            client.close()
    assert not socket_path.exists()


def test_a_data_directory_too_deep_for_a_unix_socket_is_served_over_tcp(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with served(deep, unix=True) as server:
        assert server.server.info is not None and server.server.info.unix is None
        found = find_server(deep)
        assert found is not None and found.url() == server.address
        with connect(deep) as client:
            client.create_topic("deep")
            assert [t.name for t in client.list_topics()] == ["deep"]


# stopping ---------------------------------------------------------------------------------


def test_stop_answers_the_request_in_flight_and_closes_sqlite_cleanly(data_dir: Path) -> None:
    server = ServerThread(data_dir, unix=True).start()
    stopper: threading.Thread | None = None
    try:

        async def scenario() -> tuple[dict[str, Any], BaseException | None]:
            nonlocal stopper
            connection = await open_connection(server)
            await connection.request(Op.CREATE_TOPIC, {"name": "s", "partitions": 1})
            await connection.request(Op.PRODUCE, produce_args("s", b"kept"))
            waiting = asyncio.ensure_future(
                connection.request(Op.FETCH, fetch_args("s", 1, wait_ms=20_000))
            )
            await asyncio.to_thread(server.wait_fetch_parked, "s")
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            reply = await asyncio.wait_for(waiting, 10)  # at the stop, not at 20 s
            after: BaseException | None = None
            try:
                await connection.request(Op.STATUS, {})
            except BrokerError as error:
                after = error
            await connection.close()
            return reply, after

        reply, after = run(scenario())
        assert reply == {"rows": ()}
        assert isinstance(after, BrokerError) and after.code is ErrorCode.CONNECTION_FAILED
    finally:
        if stopper is not None:
            stopper.join(timeout=30)
        server.stop()
    assert find_server(data_dir) is None
    assert not (data_dir / "server.json").exists()
    assert not (data_dir / "fencelog.sock").exists()
    wal = data_dir / (DB_FILE + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "SQLite was not closed cleanly"
    with Engine.open(data_dir) as engine:
        assert [r.value for r in engine.read("s", 0, 0)] == [b"kept"]


def test_stop_answers_every_produce_already_read_and_keeps_each_acknowledged_one(
    data_dir: Path,
) -> None:
    server = ServerThread(data_dir).start()
    stopper = threading.Thread(target=server.stop)
    try:
        with RawClient(server.port) as raw:
            raw.hello()
            raw.request(Op.CREATE_TOPIC, {"name": "inflight", "partitions": 1})
            assert isinstance(raw.receive(), Reply)
            requests = [
                Request(100 + n, Op.PRODUCE, produce_args("inflight", b"v%d" % n))
                for n in range(50)
            ]
            raw.send_bytes(b"".join(encode(r) for r in requests))  # one write, read at once
            first = raw.receive()
            stopper.start()
            replies = [first, *raw.receive_all()]
    finally:
        if stopper.ident is not None:
            stopper.join(timeout=30)
        server.stop()
    assert [getattr(m, "request_id", None) for m in replies] == [r.request_id for r in requests]
    assert all(isinstance(m, Reply) for m in replies), replies
    with Engine.open(data_dir) as engine:
        stored = {r.offset: r.value for r in engine.read("inflight", 0, 0)}
    acked = {
        m.result["results"][0][1]: b"v%d" % n for n, m in enumerate(replies) if isinstance(m, Reply)
    }
    assert stored == acked


def test_a_stopped_server_refuses_new_connections(data_dir: Path) -> None:
    with served(data_dir) as server:
        port = server.port
    with pytest.raises(OSError):
        socket.create_connection((HOST, port), timeout=5).close()


def test_a_second_server_on_the_same_directory_is_refused(server: ServerThread) -> None:
    async def start() -> None:
        await Server(server.data_dir).start(HOST, 0, unix=False)

    with pytest.raises(BrokerError) as excinfo:
        asyncio.run(start())
    assert excinfo.value.code is ErrorCode.DATA_DIR_IN_USE


@pytest.mark.parametrize(
    ("field", "wire", "message"),
    [
        ("records", "not records", "field 'records' must be an array"),
        ("records", [[1, None, [], 0, None]], "record 0: value and key must be binary or nil"),
        ("producer", [1, 2], "field 'producer' is not [pid, generation, sequence, epoch, txn]"),
        ("producer", [1, 2, 3, 4, "x"], "producer txn must be an integer or nil"),
    ],
)
def test_a_malformed_produce_is_refused_and_its_neighbours_are_stored(
    server: ServerThread, field: str, wire: object, message: str
) -> None:
    """A produce whose fields cannot be decoded is answered with a protocol error in its
    place; the produces pipelined around it on the same connection are stored, and the
    connection stays open."""

    async def run() -> list[object]:
        connection = await open_connection(server)
        await connection.request(Op.CREATE_TOPIC, {"name": "m", "partitions": 1})
        bad = {**produce_args("m", b"never"), field: wire}
        outcomes = await asyncio.gather(
            connection.request(Op.PRODUCE, produce_args("m", b"before")),
            connection.request(Op.PRODUCE, bad),
            connection.request(Op.PRODUCE, produce_args("m", b"after")),
            return_exceptions=True,
        )
        fetched = await connection.request(Op.FETCH, fetch_args("m"))
        await connection.close()
        return [*outcomes, [row[4] for row in fetched["rows"]]]

    before, refused, after, stored = asyncio.run(run())
    assert isinstance(before, dict) and isinstance(after, dict)
    assert isinstance(refused, BrokerError)
    assert refused.code is ErrorCode.PROTOCOL_ERROR
    assert refused.message == message
    assert stored == [b"before", b"after"]


def test_a_start_that_fails_to_open_its_engines_leaves_the_directory_free(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that fails to open (a reader's, here) closes the ones opened before
    it and releases the server's lock: the next start is not refused as in use."""
    opened: list[int] = []
    real_open = Engine.open

    def open_third_fails(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        if len(opened) == 3:
            raise BrokerError(ErrorCode.STORAGE_BUSY, "the third engine cannot open")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Engine, "open", open_third_fails)

    async def start() -> None:
        await Server(data_dir).start(HOST, 0, unix=False)

    with pytest.raises(BrokerError, match="the third engine cannot open"):
        asyncio.run(start())
    monkeypatch.setattr(Engine, "open", real_open)
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic("t", 1)
        assert client.list_topics()[0].name == "t"
