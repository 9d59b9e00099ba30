"""One connection of `fencelog serve`: its session, and its bytes in and replies out.

A Connection has no task of its own: data_received parses frames and starts their
requests on the server (`Server._start`); as requests finish, their replies leave in
request order, those ready together in one write. Back pressure: at
inflight_requests_max unanswered requests, or while the socket's send buffer is full,
frames wait undecoded and the socket is not read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from broker.errors import BrokerError, ErrorCode
from broker.protocol.frames import NEED_DATA, FrameConnection, ProtocolError, Sentinel
from broker.protocol.messages import ErrorReply, Op, Reply, Request

if TYPE_CHECKING:
    from broker.engine.engine import ProduceRequest

if TYPE_CHECKING:
    from broker.server.server import Server

log = logging.getLogger("fencelog.server")


@dataclass(eq=False)
class Session:
    session_id: str
    peer: str
    transport: asyncio.Transport
    last_seen: float
    reply_now: Callable[[], None]  # send the replies that are ready, in this turn
    authenticated: bool = False
    said_hello: bool = False
    inflight: int = 0  # requests read and not yet answered: a waiting session is not idle

    def close(self) -> None:
        self.transport.close()


class Answer(Protocol):
    """What a connection waits on for each request, in order: an asyncio future (a
    handler's task) or a produce's place in the group commit."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class PendingProduce:
    """A produce waiting for its group commit: an Answer with no future, no callback
    and no task; the commit loop fills in the outcome, then sends the session's replies."""

    request: ProduceRequest
    size: int
    session: Session
    result_columns: bool  # the client reads results as columns (codec.results_reply)
    outcome: dict[str, Any] | BrokerError | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return self.outcome if isinstance(self.outcome, BrokerError) else None

    def result(self) -> dict[str, Any]:
        if isinstance(self.outcome, BrokerError):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome

    def answer(self, outcome: dict[str, Any] | BrokerError, now: float) -> None:
        self.outcome = outcome
        session = self.session
        session.inflight -= 1
        session.last_seen = now


Pending = tuple[int, Op, Answer, float]  # request id, op, its answer, when it was read
_NAMES = {op: op.name.lower() for op in Op}  # an operation's metric label
# After a larger reply (a page of records) the client takes longer than the busy-poll
# window to ask again: the server sleeps at once instead of spinning through it.
_POLL_AFTER_REPLY_BYTES_MAX: Final = 64 << 10
_PRODUCE = _NAMES[Op.PRODUCE]


class Connection(asyncio.Protocol):
    """One connection's bytes, with no task of its own: data_received parses frames and
    starts their requests; as requests finish, their replies leave in request order,
    those ready together in one write.

    Back pressure: at inflight_requests_max unanswered requests, or while the socket's
    send buffer is full, frames wait undecoded and the socket is not read.
    """

    def __init__(self, server: Server) -> None:
        self._server = server
        self._frames = FrameConnection(server.limits.frame_bytes_max)
        self._pending: collections.deque[Pending] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._session: Session | None = None
        self._reading = True  # False once no more requests will be taken
        self._paused = False  # the transport is not being read
        self._write_blocked = False
        self._pump_scheduled = False
        self._eof = False
        self._ended = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's do not subclass asyncio.Transport)
        self._transport = stream = cast(asyncio.Transport, transport)
        self._session = self._server._connection_made(stream, self._pump)
        if self._session is None:
            self._reading = False
        else:
            self._server._connections.add(self)

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return
        self._server.busy_poll.kick()
        self._frames.receive_data(data)
        self._take_requests()

    def eof_received(self) -> bool:
        # The peer closed its side: what it sent is still answered, then we close.
        self._eof = True
        if self._reading:
            self._frames.receive_data(b"")
            self._take_requests()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._reading = False
        self._server._connections.discard(self)
        self._end_session()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_blocked = True
        self._pause()

    def resume_writing(self) -> None:
        self._write_blocked = False
        self._take_requests()

    # requests in, replies out -------------------------------------------------------

    def finish(self) -> None:
        """Take no more requests; close once those already taken are answered."""
        self._reading = False
        self._pause()
        self._schedule_pump()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _end_session(self) -> None:
        if self._session is not None and not self._ended:
            self._ended = True
            self._server._connection_ended(self._session)

    def _take_requests(self) -> None:
        session, server = self._session, self._server
        if session is None:
            return
        room = server.limits.inflight_requests_max
        loop_time = asyncio.get_running_loop().time
        try:
            while self._reading and len(self._pending) < room and not self._write_blocked:
                message = self._frames.next_message()
                if message is NEED_DATA:
                    if self._frames.buffered_bytes > server.limits.connection_buffer_bytes_max:
                        raise ProtocolError("connection buffer limit exceeded")
                    self._resume()
                    break
                if isinstance(message, Sentinel):  # the peer closed cleanly
                    self._reading = False
                    self._end_session()
                    break
                if not isinstance(message, Request):
                    raise ProtocolError("a client sends requests only")
                session.last_seen = loop_time()
                answer = server._start(session, message)
                # request durations on the performance counter: uvloop's clock moves in
                # whole milliseconds, which the latency histograms cannot tell apart
                self._pending.append((message.request_id, message.op, answer, perf_counter()))
                if isinstance(answer, asyncio.Future):  # a produce wakes us itself
                    answer.add_done_callback(self._finished)
                if message.op is Op.GOODBYE:
                    self._reading = False
            else:
                self._pause()
        except BrokerError as error:  # malformed input or failed authentication
            log.info(
                "session %s (%s): %s",
                session.session_id,
                session.peer,
                error.message,
                extra={
                    "event": "refused_frame",
                    "connection": session.session_id,
                    "client": session.peer,
                    "error": error.code.name,
                },
            )
            self._reading = False
            self._pending.append((0, Op.NONE, failed(error), 0.0))
        self._schedule_pump()

    def _finished(self, _future: asyncio.Future[dict[str, Any]]) -> None:
        self._schedule_pump()

    def _schedule_pump(self) -> None:
        # Every request finished in one turn of the loop is answered by one pump, in one
        # write. (A group commit pumps as soon as its COMMIT returns: Session.reply_now.)
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        if self._pump_scheduled:  # not already done by a pump since it was scheduled
            self._pump()

    def _pump(self) -> None:
        self._pump_scheduled = False
        transport = self._transport
        assert transport is not None
        pending, frames, out = self._pending, self._frames, bytearray()
        close = False
        every_ack = not self._server._drop_acks
        answered = self._server.metrics.answered
        now = perf_counter()
        while pending and pending[0][2].done():
            request_id, op, future, started = pending.popleft()
            if every_ack and type(future) is PendingProduce and type(future.outcome) is dict:
                out += frames.send_reply(request_id, future.outcome)  # a stored produce
                answered(_PRODUCE, now - started, None)
                continue
            message = reply_of(request_id, future)
            answered(
                _NAMES[op],
                now - started,
                _code_name(message.code) if isinstance(message, ErrorReply) else None,
            )
            if not self._server._replied(op, message):
                close = True
                break
            out += frames.send(message)
            # FENCELOG_FAILPOINT=ack: die once a commit's reply has left
            if op is Op.TXN_COMMIT and isinstance(message, Reply):
                failpoints = self._server._writer.txns.failpoints
                if failpoints.step == "ack":
                    transport.write(bytes(out))
                    out.clear()
                    failpoints.reached("ack")
            if (isinstance(message, ErrorReply) and request_id == 0) or op is Op.GOODBYE:
                close = True  # nothing more on this connection
                break
        if out and not transport.is_closing():
            transport.write(bytes(out))
            if len(out) <= _POLL_AFTER_REPLY_BYTES_MAX:
                self._server.busy_poll.kick()  # the client is likely to send again soon
        if close or (not self._reading and not pending):
            self._reading = False
            transport.close()
        elif self._reading and self._paused:
            self._take_requests()

    def _pause(self) -> None:
        if not self._paused and self._transport is not None and not self._eof:
            self._paused = True
            with contextlib.suppress(RuntimeError):  # already closing
                self._transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            with contextlib.suppress(RuntimeError):
                self._transport.resume_reading()


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def peer_of(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unix"


def reply_of(request_id: int, future: Answer) -> Reply | ErrorReply:
    """The reply to a finished request."""
    if future.cancelled():
        return ErrorReply(
            request_id, int(ErrorCode.BROKER_SHUTTING_DOWN), "the server stopped first", {}
        )
    error = future.exception()
    if error is None:
        return Reply(request_id, future.result())
    if isinstance(error, BrokerError):
        return ErrorReply(request_id, int(error.code), error.message, dict(error.details))
    # a bug of ours: the session still gets an answer
    log.error("request %d failed", request_id, exc_info=error)
    return ErrorReply(request_id, int(ErrorCode.INTERNAL), repr(error), {})


def closed_before_run() -> BrokerError:
    return BrokerError(
        ErrorCode.SEVERED,
        "this session was closed before the request ran",
        hint="the client reconnects with a new session",
    )


def done(result: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


def failed(error: BrokerError) -> asyncio.Future[dict[str, Any]]:
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
