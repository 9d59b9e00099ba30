"""Reaching a served broker on an event loop: what a session kept alive needs.

- `AsyncConnection` is one TCP or unix connection: HELLO on open, pipelined requests
  (each awaits its reply; replies arrive in request order), heartbeats while idle, and
  error frames turned back into the BrokerError the embedded engine would have raised.
- `AsyncClient` keeps one connection to an address and reconnects with exponential
  backoff when it was lost. A request in flight when the connection drops fails with
  CONNECTION_FAILED: whether it was applied is unknown, and retrying it is the caller's
  (later, the idempotent producer's) decision, never a silent resend.
- `LoopTransport` runs an AsyncClient on a private event loop thread for the sync
  `broker.client.Client`: ServedTransport (served.py) moves to it when a client needs
  heartbeats, pushes or pipelining.

The address, the handshake, the errors and the requests' payloads are served.py's,
shared with its blocking connection.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar, cast

from broker import threads
from broker.client.remote import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    ENDED,
    RETRY_SAFE,
    Address,
    cannot_connect,
    checked_request_timeout,
    cut_short,
    error_of,
    fetch_args,
    fetched_arrow,
    fetched_records,
    hello_args,
    hello_of,
    lost,
    no_reply,
    produce_args,
    request_frame,
    severed,
    wait_s_of,
    worth_retrying,
)
from broker.errors import BrokerError, ErrorCode
from broker.event_loop import BusyPoll, new_event_loop
from broker.limits import DEFAULT_LIMITS, Limits
from broker.protocol import codec
from broker.protocol.frames import NEED_DATA, FrameConnection, Sentinel, TruncatedFrame
from broker.protocol.messages import (
    ARROW_FEATURE,
    CHECKSUM_FEATURE,
    ErrorReply,
    Op,
    Push,
    Reply,
)
from broker.protocol.ops import Operation
from broker.rows import AuditRow, Row
from broker.types import (
    NO_PRODUCER,
    AppendResult,
    Attachment,
    Claimed,
    Fence,
    NewRecord,
    OwnershipInfo,
    ProducerFields,
    Record,
)

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class AsyncConnection(asyncio.Protocol):
    """One connection, driven by the loop's callbacks: replies are matched to their
    requests in data_received, with no reader task between the socket and the caller."""

    def __init__(
        self,
        frame_bytes_max: int,
        on_push: Callable[[Push], None] | None,
        busy_poll: BusyPoll | None = None,
        request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._frames = FrameConnection(frame_bytes_max)
        # (request id, its future, its deadline on the loop's clock, its op)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._request_timeout_s = request_timeout_s
        self._watchdog: asyncio.TimerHandle | None = None
        self._closing = False  # close() was called: an end of our own, not a loss
        self._ids = itertools.count(1)
        self._on_push = on_push
        self._closed: BrokerError | None = None
        self._gone: asyncio.Future[None] = loop.create_future()  # connection_lost ran
        self._writable: asyncio.Future[None] | None = None  # set while writes are paused
        self._out = bytearray()  # frames of this turn of the loop, not yet written
        self._last_sent = loop.time()
        self._heartbeat: asyncio.Task[None] | None = None
        # while replies are awaited, poll rather than sleep (broker.event_loop.BusyPoll)
        self._busy_poll = busy_poll or BusyPoll(0)
        self.session_id = ""
        self.limits = DEFAULT_LIMITS
        self.features: frozenset[str] = frozenset()  # what the server announced in HELLO

    @classmethod
    async def open(
        cls,
        address: Address,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        on_push: Callable[[Push], None] | None = None,
        busy_poll: BusyPoll | None = None,
        request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
    ) -> AsyncConnection:
        loop = asyncio.get_running_loop()
        connection = cls(DEFAULT_LIMITS.frame_bytes_max, on_push, busy_poll, request_timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                if address.scheme == "unix":
                    await loop.create_unix_connection(lambda: connection, address.path)
                else:
                    await loop.create_connection(lambda: connection, address.host, address.port)
        except (OSError, TimeoutError) as exc:
            raise cannot_connect(address, exc) from exc
        try:
            hello = hello_of(await connection.request(Op.HELLO, hello_args(token)), address)
        except BaseException:
            await connection.close()
            raise
        connection.session_id = hello.session_id
        connection.limits = hello.limits
        connection.features = hello.features
        connection._frames.checksummed = CHECKSUM_FEATURE in hello.features
        connection._start_heartbeats()
        return connection

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def request(self, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        frame = request_frame(self._frames, request_id, op, args)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        # a long poll's deadline is its own wait plus the request timeout
        deadline = loop.time() + self._request_timeout_s + wait_s_of(args)
        self._pending.append((request_id, future, deadline, op))
        if self._watchdog is None:
            self._watch()
        # Frames sent in the same turn of the loop (many coroutines, one connection)
        # leave in one write at the end of it.
        self._out += frame
        if len(self._out) == len(frame):
            loop.call_soon(self._flush)
        self._last_sent = loop.time()
        self._busy_poll.kick()
        if self._writable is not None:  # the socket's send buffer is full: wait for room
            await asyncio.shield(self._writable)
        return await future

    def _flush(self) -> None:
        if self._out and self._closed is None and self._transport is not None:
            self._transport.write(bytes(self._out))
        self._out.clear()

    def _start_heartbeats(self) -> None:
        interval_s = self.limits.session_timeout_ms / 3000

        async def beat() -> None:
            loop = asyncio.get_running_loop()
            while self._closed is None:
                await asyncio.sleep(interval_s)
                if loop.time() - self._last_sent >= interval_s and self._closed is None:
                    # Not awaited: its reply may queue behind a long-polling fetch, and
                    # the next heartbeat must still go out on time.
                    beat_task = asyncio.ensure_future(self.request(Op.HEARTBEAT, {}))
                    beat_task.add_done_callback(_ignore_outcome)

        self._heartbeat = asyncio.create_task(beat())

    def _watch(self) -> None:
        """While requests are pending, check once in a while that the oldest (replies
        come in order: it is the one due first) has not outlived its deadline. A peer
        that stops answering without closing (a stopped server, a black-holed link) is
        then a lost connection, as a reset would have been."""
        self._watchdog = None
        if not self._pending or self._closed is not None:
            return
        loop = asyncio.get_running_loop()
        _, _, deadline, op = self._pending[0]
        if loop.time() > deadline:
            self._fail_all(no_reply(op, self._request_timeout_s))
            return
        check_s = min(max(deadline - loop.time(), 0.0) + 0.01, _WATCH_MAX_S)
        self._watchdog = loop.call_later(check_s, self._watch)

    # asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's do not subclass asyncio.Transport)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._frames.receive_data(data)
        self._deliver_all()

    def eof_received(self) -> bool:
        self._frames.receive_data(b"")
        self._deliver_all()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(
            lost(exc)
            if exc is not None
            else BrokerError(ErrorCode.CONNECTION_FAILED, "the broker closed the connection")
        )
        self._wake_writers()
        if not self._gone.done():
            self._gone.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writers()

    def _wake_writers(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # replies --------------------------------------------------------------------------

    def _deliver_all(self) -> None:
        try:
            while not isinstance(message := self._frames.next_message(), Sentinel):
                self._deliver(message)
            if not self._pending:  # nothing more to wait for
                self._busy_poll.stop()
            if message is not NEED_DATA:
                raise BrokerError(ErrorCode.CONNECTION_FAILED, "the broker closed the connection")
        except TruncatedFrame as cut:
            self._fail_all(cut_short(cut))
        except BrokerError as error:
            self._fail_all(error)

    def _deliver(self, message: object) -> None:
        if isinstance(message, Push):
            if message.event == "session_closed":  # severed: nothing more will be answered
                self._closing = True  # the push below tells why; the loss needs no word
                self._fail_all(severed(message))
            if self._on_push is not None:
                self._on_push(message)
            return
        if isinstance(message, ErrorReply) and message.request_id == 0:
            raise error_of(message)  # connection-level: fails everything in flight
        if not isinstance(message, Reply | ErrorReply) or not self._pending:
            raise BrokerError(ErrorCode.PROTOCOL_ERROR, "the broker sent an unexpected frame")
        request_id, future, _, _ = self._pending.popleft()
        if message.request_id != request_id:
            raise BrokerError(ErrorCode.PROTOCOL_ERROR, "the broker answered out of order")
        if future.done():
            return
        if isinstance(message, ErrorReply):
            future.set_exception(error_of(message))
        else:
            future.set_result(message.result)

    def _fail_all(self, error: BrokerError) -> None:
        if self._closed is None:
            self._closed = error
            if self.session_id and not self._closing and self._on_push is not None:
                # The session was this connection: whatever it held (claims, producer
                # access) ended with it, as if severed. Tell the holder, so that
                # `own -- CMD` stops CMD rather than run on without its claim.
                reason = f"ended: the connection to the broker was lost ({error.message})"
                self._on_push(Push(LOST_EVENT, {"reason": reason}))
        while self._pending:
            future = self._pending.popleft()[1]
            if not future.done():
                future.set_exception(error)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._heartbeat is not None and self._heartbeat is not asyncio.current_task():
            self._heartbeat.cancel()
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self._closing = True
        if self._closed is None and not self._pending:
            # A polite goodbye only when nothing is in flight: a reply to it would wait
            # behind a long-polling fetch.
            with contextlib.suppress(BrokerError, TimeoutError):
                await asyncio.wait_for(self.request(Op.GOODBYE, {}), 1.0)
        self._fail_all(BrokerError(ErrorCode.CONNECTION_FAILED, "the connection is closed"))
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, BrokerError):
                await self._heartbeat
        if self._transport is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._gone), 1.0)


_Pending = tuple[int, "asyncio.Future[dict[str, Any]]", float, Op]
# The push a connection gives itself when it is lost with its session (see _fail_all).
LOST_EVENT: Final = "connection_lost"
_WATCH_MAX_S: Final = 1.0  # a pending request's deadline is checked at least this often


def _ignore_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class AsyncClient:
    """One broker address; reconnects with backoff when the connection was lost."""

    def __init__(
        self,
        address: Address,
        *,
        token: str | None = None,
        connect_timeout_s: float = DEFAULT_LIMITS.connect_timeout_ms / 1000,
        on_push: Callable[[Push], None] | None = None,
        busy_poll_us: int = 0,
        request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
    ) -> None:
        self.address = address
        self._request_timeout_s = checked_request_timeout(request_timeout_s)
        self._busy_poll = BusyPoll(busy_poll_us)  # shared by its connections, one at a time
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._on_push = on_push
        self._connection: AsyncConnection | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def connection(self) -> AsyncConnection:
        if self._closed:
            raise BrokerError(
                ErrorCode.CONNECTION_FAILED, "this client is closed", client_closed=True
            )
        if self._connection is not None and not self._connection.closed:
            return self._connection
        async with self._connecting:
            if self._connection is None or self._connection.closed:
                self._connection = await self._connect_with_backoff()
            return self._connection

    async def _connect_with_backoff(self) -> AsyncConnection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout_s
        delay = BACKOFF_FIRST_S
        while True:
            remaining = deadline - loop.time()
            try:
                return await AsyncConnection.open(
                    self.address,
                    token=self._token,
                    timeout_s=max(remaining, 0.05),
                    on_push=self._on_push,
                    busy_poll=self._busy_poll,
                    request_timeout_s=self._request_timeout_s,
                )
            except BrokerError as error:
                if not worth_retrying(error, remaining, delay):
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def limits(self) -> Limits:
        return (await self.connection()).limits

    async def request(self, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        connection = self._connection  # the usual case without a coroutine of its own
        if self._closed or connection is None or connection.closed:
            connection = await self.connection()
        try:
            return await connection.request(op, args)
        except BrokerError as error:
            # The connection ended under the request (lost, or the session severed): a
            # request that is safe to repeat goes once more on a new connection. A produce
            # never does; whether it landed is for the idempotent producer to find out.
            if op not in RETRY_SAFE or not connection.closed or error.code not in ENDED:
                raise
        return await (await self.connection()).request(op, args)

    async def call(self, entry: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """One operation of the table (broker/protocol/ops.py), e.g.
        `await client.call(ops.CREATE_TOPIC, "orders", 4)`."""
        request = entry.args(*args, **kwargs)
        if entry.reply_columns is not None:  # an operation that carries records
            request = codec.with_columns(request, (await self.connection()).features)
        return entry.decode_reply(await self.request(entry.op, request))

    async def close(self) -> None:
        self._closed = True
        if self._connection is not None:
            await self._connection.close()

    # operations -----------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields = NO_PRODUCER,
        fences: Sequence[Fence] = (),
        attachment: int | None = None,
    ) -> Sequence[AppendResult]:
        features = (await self.connection()).features
        args = produce_args(topic, records, producer, fences, attachment, features)
        reply = await self.request(Op.PRODUCE, args)
        return codec.results_from_reply(topic, reply)

    async def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence] = (),
    ) -> list[Record]:
        args = fetch_args(topic, positions, max_records, wait_ms, fences, pages=True)
        return fetched_records(topic, await self.request(Op.FETCH, args))

    async def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int = 0,
        fences: Sequence[Fence] = (),
    ) -> list[Row]:
        args = fetch_args(topic, positions, max_records, wait_ms, fences)
        return codec.rows_of_reply(await self.request(Op.FETCH, args))

    async def fetch_arrow(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        wait_ms: int = 0,
        fences: Sequence[Fence] = (),
    ) -> bytes | None:
        """One partition's page as an Arrow IPC stream, or None: this server does not
        answer FETCH_ARROW (it has no pyarrow), fetch rows instead."""
        if ARROW_FEATURE not in (await self.connection()).features:
            return None
        args = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "max_records": max_records,
            "wait_ms": wait_ms,
            "fences": codec.fences_to_wire(fences),
            "nulls": True,  # a null value may come as a null
        }
        ipc = (await self.request(Op.FETCH_ARROW, args)).get("arrow")
        if not isinstance(ipc, bytes):
            raise BrokerError(ErrorCode.PROTOCOL_ERROR, "a FETCH_ARROW reply without its batch")
        return ipc

    async def own(self, group: str, claims: Sequence[tuple[str, int]]) -> list[Claimed]:
        reply = await self.request(Op.OWN, {"group": group, "claims": list(claims)})
        return codec.claimed_from_wire(reply["claimed"])

    async def release(
        self, group: str, resources: Sequence[str] | None, any_holder: bool = False
    ) -> list[str]:
        args = {
            "group": group,
            "resources": None if resources is None else list(resources),
            "any_holder": any_holder,
        }
        reply = await self.request(Op.RELEASE, args)
        return list(reply["released"])

    async def ownership(self, group: str | None) -> list[OwnershipInfo]:
        reply = await self.request(Op.OWNERSHIP, {"group": group})
        return codec.ownership_from_wire(reply["ownership"])

    async def ownership_history(self, group: str | None, limit: int) -> list[AuditRow]:
        reply = await self.request(Op.OWN_HISTORY, {"group": group, "limit": limit})
        return codec.audit_from_wire(reply["history"])

    async def session_id(self) -> str:
        return (await self.connection()).session_id

    async def backup(self, path: str) -> int:
        return int((await self.request(Op.BACKUP, {"path": path}))["bytes"])

    async def attach(
        self, topic: str, access: str, name: str, epoch: int | None, wait_ms: int
    ) -> Attachment:
        args = {"topic": topic, "access": access, "name": name, "epoch": epoch, "wait_ms": wait_ms}
        connection = await self.connection()
        # A wait for exclusive access may be long: it is not a request to repeat elsewhere.
        return codec.attachment_from_wire(await connection.request(Op.ATTACH, args))

    async def detach(self, topic: str, attachment_id: int) -> None:
        await self.request(Op.DETACH, {"topic": topic, "attachment": attachment_id})


class LoopTransport:
    """The sync face of an AsyncClient, for broker.client.Client."""

    validates_records = False  # the client checks batches before they become frames
    served = True

    def __init__(
        self,
        address: Address,
        *,
        token: str | None = None,
        request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
    ) -> None:
        self._severed_callbacks: list[Callable[[str], None]] = []
        self._loop = new_event_loop()
        self._thread = threads.start(
            threading.Thread(target=self._loop.run_forever, name="fencelog-client", daemon=True)
        )
        self.client = self._call(_make_client(address, token, self._pushed, request_timeout_s))
        try:
            self.limits = self._call(self.client.limits())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _pushed(self, push: Push) -> None:
        if push.event in ("session_closed", LOST_EVENT):
            reason = str(push.data.get("reason", "the server closed the session"))
            for callback in list(self._severed_callbacks):
                callback(reason)

    def on_severed(self, callback: Callable[[str], None]) -> None:
        self._severed_callbacks.append(callback)

    def session_id(self) -> str:
        return self._call(self.client.session_id())

    def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
        attachment: int | None = None,
    ) -> Sequence[AppendResult]:
        return self._call(
            self.client.produce(
                topic, records, producer=producer, fences=fences, attachment=attachment
            )
        )

    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> list[Record]:
        return self._call(self.client.fetch(topic, positions, max_records, wait_ms, fences))

    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        fences: Sequence[Fence],
    ) -> list[Row]:
        return self._call(self.client.fetch_rows(topic, positions, max_records, 0, fences))

    def fetch_arrow(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        fences: Sequence[Fence],
    ) -> pa.RecordBatch:
        """One partition's page from offset as an Arrow batch, built here from the
        page the server sends (remote.fetched_arrow)."""
        return self.fetch_arrow_ahead(topic, partition, offset, max_records, fences)()

    def fetch_arrow_ahead(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        fences: Sequence[Fence],
    ) -> Callable[[], pa.RecordBatch]:
        """fetch_arrow() begun now; the returned call waits for its batch (built here
        from the fetched page, as served.py's transport builds it)."""
        args = fetch_args(topic, {partition: offset}, max_records, 0, fences, pages=True)
        asked = asyncio.run_coroutine_threadsafe(self.client.request(Op.FETCH, args), self._loop)
        return lambda: fetched_arrow(topic, asked.result())

    def fetch_ahead(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> Callable[[], list[Record]]:
        work = self.client.fetch(topic, positions, max_records, wait_ms, fences)
        return asyncio.run_coroutine_threadsafe(work, self._loop).result

    def own(self, group: str, claims: Sequence[tuple[str, int]]) -> list[Claimed]:
        return self._call(self.client.own(group, claims))

    def release(self, group: str, resources: Sequence[str] | None, any_holder: bool) -> list[str]:
        return self._call(self.client.release(group, resources, any_holder))

    def ownership(self, group: str | None) -> list[OwnershipInfo]:
        return self._call(self.client.ownership(group))

    def ownership_history(self, group: str | None, limit: int) -> list[AuditRow]:
        return self._call(self.client.ownership_history(group, limit))

    def backup(self, path: str) -> int:
        return self._call(self.client.backup(os.path.abspath(path)))

    def attach(
        self, topic: str, access: str, name: str, epoch: int | None, wait_ms: int
    ) -> Attachment:
        return self._call(self.client.attach(topic, access, name, epoch, wait_ms))

    def detach(self, topic: str, attachment_id: int) -> None:
        self._call(self.client.detach(topic, attachment_id))

    def call(self, entry: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return self._call(self.client.call(entry, *args, **kwargs))

    def run_async(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on this transport's loop (the pipelined producer's pumps)."""
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(BrokerError):
            self._call(self.client.close())
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


async def _make_client(
    address: Address,
    token: str | None,
    on_push: Callable[[Push], None],
    request_timeout_s: float,
) -> AsyncClient:
    return AsyncClient(address, token=token, on_push=on_push, request_timeout_s=request_timeout_s)
