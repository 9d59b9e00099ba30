"""The Kafka listener of `fencelog serve --kafka-listen`: bytes in, the same engine's
operations, bytes out.

Each connection reads length-prefixed frames (the length checked against the frame
limit before anything is allocated), starts each request as it arrives and sends the
answers in request order, as Kafka clients expect of a pipelined connection. A request
that cannot be read costs only its connection: ApiVersions of an unknown version gets
Kafka's UNSUPPORTED_VERSION answer, another API's unknown version an error answer where
its response can carry one, garbage or a request that breaks its API's spec (a null
where the spec allows none, a length past the end: wire.py, schema.py) a closed
connection, before any handler runs; the broker goes on. Each refusal is logged, at
WARNING only for the first of its kind from a client host in a while (refusals.py).

When the listener is not on loopback, a connection must authenticate with SASL/PLAIN
first, its password being the server's auth token (the native listener's rule).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from broker.kafka import refusals, wire
from broker.kafka.options import KafkaListen

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi

__all__ = ["KafkaConnection", "KafkaListen", "close_all"]
log = logging.getLogger("fencelog.kafka")
_LENGTH: Final = struct.Struct(">i")
_PRE_AUTH: Final = frozenset({wire.API_VERSIONS_KEY, 17, 36})  # SaslHandshake, SaslAuthenticate
Answer = bytes | list[bytes] | None  # a framed answer, or its parts; None: close
# what became of a fetch's read ahead (the fencelog_kafka_fetch_read_ahead_total metric)
READ_AHEAD_USED: Final = "used"
READ_AHEAD_STALE: Final = "stale"  # a topic it read was deleted, or created again, since
READ_AHEAD_FAILED: Final = "failed"
READ_AHEAD_DROPPED: Final = "dropped"  # the next fetch asked for other offsets, or none came
_READ_PAUSE_ANSWERS: Final = 64  # unanswered requests before the socket is not read


class KafkaConnection(asyncio.Protocol):
    def __init__(self, api: KafkaApi) -> None:
        self.api = api
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._answers: collections.deque[asyncio.Future[Answer]] = collections.deque()
        self._closing = False
        self._paused = False
        self.authenticated = api.auth_token is None
        self.sasl_mechanism: str | None = None
        self.client_id = ""  # the last request's client id (Kafka names members after it)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.active_at = asyncio.get_running_loop().time()  # the last request read or answered
        # KafkaApi.fetch's read of the next fetch: to start once this answer is written,
        # then started; (what it is for, it)
        self._ahead_to_start: tuple[object, Callable[[], Awaitable[Any]]] | None = None
        self._read_ahead: tuple[object, asyncio.Future[Any]] | None = None

    # asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if len(self.api.connections) >= self.api.connections_max:
            self._refuse(
                refusals.REFUSED_FULL,
                f"the listener holds its limit of {self.api.connections_max}",
            )
            return
        self.api.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._ahead_to_start = None
        self.take_read_ahead(None)
        self.api.connections.discard(self)
        for answer in self._answers:
            answer.cancel()
        self._answers.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._buffer += data
        limit = self.api.frame_bytes_max
        while len(self._buffer) >= 4 and not self._closing:
            (size,) = _LENGTH.unpack_from(self._buffer)
            if size < 0 or size > limit:
                self._refuse(
                    refusals.REFUSED_TOO_LARGE, f"a frame of {size} bytes (the limit is {limit})"
                )
                return
            if len(self._buffer) < 4 + size:
                break
            with memoryview(self._buffer) as view:  # one copy of the frame, not two
                frame = bytes(view[4 : 4 + size])
            del self._buffer[: 4 + size]
            self.active_at = asyncio.get_running_loop().time()
            self._start(frame)
        if len(self._answers) >= _READ_PAUSE_ANSWERS and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    # requests -------------------------------------------------------------------------

    def _start(self, frame: bytes) -> None:
        try:
            request = wire.read_request(frame)
        except wire.MalformedRequest as exc:
            self._refuse(refusals.REFUSED_MALFORMED, str(exc))
            return
        header = request.header
        self.client_id = header.client_id or ""
        if not self.authenticated and header.api_key not in _PRE_AUTH:
            asked = wire.unknown_api_message(header) if request.api is None else request.api.name
            self._refuse(
                refusals.REFUSED_UNAUTHENTICATED,
                f"{asked} before SASL authentication",
                error="AUTH_FAILED",
            )
            return
        if request.body is None:
            self._queue(self._done(self._unanswerable(request)))
            return
        if header.api_key == producer_key and request.body.acks == 0:
            task = asyncio.ensure_future(self.api.handle(self, request))
            task.add_done_callback(_log_failure)
            return  # acks=0: no answer at all
        self._queue(asyncio.ensure_future(self._answer(request)))

    def read_ahead_after_answer(self, key: object, read: Callable[[], Awaitable[Any]]) -> None:
        """Start read() once the answer being made is written (before, it would take
        Python's lock from the writing of it), held for a fetch of `key`."""
        self._ahead_to_start = (key, read)

    def take_read_ahead(self, key: object) -> asyncio.Future[Any] | None:
        """The read started ahead for a fetch of this key, if that is the one held; any
        other is dropped."""
        held, self._read_ahead = self._read_ahead, None
        if held is None:
            return None
        if held[0] == key:
            return held[1]
        held[1].cancel()
        self.api.backend.read_ahead(READ_AHEAD_DROPPED)
        return None

    def _start_read_ahead(self) -> None:
        if self._ahead_to_start is None:
            return
        (key, read), self._ahead_to_start = self._ahead_to_start, None
        self.take_read_ahead(None)
        started = asyncio.ensure_future(read())
        started.add_done_callback(_retrieved)
        self._read_ahead = (key, started)

    def _refuse(self, kind: str, why: str, error: str | None = None) -> None:
        """Close this connection, saying why (log_refusal)."""
        self.log_refusal(kind, f"closing Kafka connection {self.peer}: {why}", error)
        self._close()

    def log_refusal(self, kind: str, what: str, error: str | None = None) -> None:
        """Log a refusal: at WARNING for the first of its kind from its host, then at
        DEBUG, counted, for a while (refusals.py)."""
        host = refusals.host_of(self.peer)
        verdict = self.api.refusals.refused(host, kind, asyncio.get_running_loop().time())
        level, more = logging.DEBUG, ""
        if verdict.warn:
            level = logging.WARNING
            interval_s = self.api.refusals.warn_interval_s
            more = f"; more such from {host} within {interval_s:.0f} s are logged at debug"
            if verdict.unwarned:
                more = f"; {verdict.unwarned} more since the last warning were logged at debug"
        extra = {"event": "refused_frame", "client": self.peer}
        if error is not None:
            extra["error"] = error
        log.log(level, "%s%s", what, more, extra=extra)

    def _unanswerable(self, request: wire.Request) -> bytes | None:
        header = request.header
        log.info("Kafka connection %s: %s", self.peer, wire.unknown_api_message(header))
        if header.api_key == wire.API_VERSIONS_KEY:
            return wire.unsupported_version_answer(header)
        if request.api is not None:
            return wire.error_answer(header, request.api, wire.UNSUPPORTED_VERSION)
        return None

    async def _answer(self, request: wire.Request) -> Answer:
        assert request.api is not None
        loop = asyncio.get_running_loop()
        began = loop.time()
        operation = f"kafka_{request.api.name.lower()}"
        try:
            body = await self.api.handle(self, request)
            self.api.backend.answered(operation, loop.time() - began, None)
        except Exception:
            self.api.backend.answered(operation, loop.time() - began, "INTERNAL")
            log.exception(
                "a Kafka %s v%d request from %s failed",
                request.api.name,
                request.header.api_version,
                self.peer,
            )
            return None  # closes the connection: the client reconnects and retries
        if body is None:
            return None
        if request.api.key == wire.FETCH_KEY:
            return wire.encode_fetch_response(request.header, request.api, body)
        return wire.encode_response(request.header, request.api, body)

    def _done(self, answer: Answer) -> asyncio.Future[Answer]:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        future.set_result(answer)
        return future

    def _queue(self, answer: asyncio.Future[Answer]) -> None:
        self._answers.append(answer)
        answer.add_done_callback(self._send_ready)

    def _send_ready(self, _: object = None) -> None:
        out: list[bytes] = []  # written as they are: a fetch's answer can be megabytes
        close = False
        while self._answers and self._answers[0].done():
            answer = self._answers.popleft()
            if answer.cancelled():
                continue
            data = answer.result() if answer.exception() is None else None
            if data is None:
                close = True
                break
            if isinstance(data, list):
                out += data
            else:
                out.append(data)
        if self.transport is not None and out and not self._closing:
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)
            self.active_at = asyncio.get_running_loop().time()
            self._start_read_ahead()
        if close:
            self._close()
        elif self._paused and len(self._answers) < _READ_PAUSE_ANSWERS // 2 and self.transport:
            self._paused = False
            self.transport.resume_reading()

    def idle_for(self, now: float) -> float:
        """Seconds without a request read or answered, and nothing in flight (0: busy)."""
        return 0.0 if self._answers else now - self.active_at

    def _close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # SASL -----------------------------------------------------------------------------

    def authenticate(self, auth_bytes: bytes) -> bool:
        """SASL/PLAIN: authzid NUL authcid NUL password; the password is the token."""
        token = self.api.auth_token
        parts = auth_bytes.split(b"\x00")
        if token is None or len(parts) != 3:
            return token is None
        ok = hmac.compare_digest(parts[2], token.encode())
        self.authenticated = ok
        return ok


producer_key: Final = 0  # Produce's API key


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a Kafka produce with acks=0 failed", exc_info=task.exception())


async def close_idle(connections: set[KafkaConnection], idle_s: float) -> None:
    """Close, from now until cancelled, each connection idle for idle_s (Kafka's
    connections.max.idle.ms), so that clients gone quiet, or stalled halfway through a
    frame, do not keep the listener's connections."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(min(max(idle_s / 4, 0.05), 10.0))
        now = loop.time()
        for connection in list(connections):
            idle = connection.idle_for(now)
            if idle >= idle_s:
                log.info(
                    "closing Kafka connection %s: no request for %.0f s",
                    connection.peer,
                    idle,
                    extra={"event": "idle_closed", "client": connection.peer},
                )
                connection._close()


async def close_all(connections: set[KafkaConnection], grace_s: float) -> None:
    """Close every connection, after the answers already started (stop())."""
    pending = list(connections)
    for connection in pending:
        connection._close()
    if pending:
        await asyncio.wait([c.closed for c in pending], timeout=grace_s)
    for connection in pending:
        with contextlib.suppress(Exception):
            connection.abort()


def _retrieved(read: asyncio.Future[Any]) -> None:
    """A read ahead that failed: the fetch that takes it reads again; none is logged."""
    if not read.cancelled():
        read.exception()
