"""`fencelog serve`: moves bytes between sockets and the engine. It decides nothing.

Shape:
- One asyncio loop accepts connections (TCP on 127.0.0.1 by default, and a unix socket in
  the data directory). Each connection is a session: HELLO first (with the auth token
  when one is configured), then pipelined requests; replies go back in request order.
- Two engines on the same data directory: the writer (every change) and the reader
  (fetch, list, describe, status, on the reader thread). In WAL mode readers never wait
  for the writer. Produce groups use the writer on the event loop itself; every other
  change uses it on the writer thread; an asyncio lock keeps them one at a time.
- Group commit: produce requests queue up (no task each) while the writer commits the
  previous group, then go into one SQLite transaction together. A request is answered
  only after that COMMIT returns; the replies of one group leave in one write.
- Fetch long-polls: with nothing to return it waits, up to the request's wait_ms, for
  the writer to commit to that topic.
- Sessions end on disconnect, on a protocol error, or after session_timeout_ms without
  any frame (clients send HEARTBEAT when idle); the engine hears each end.
- Bad input costs only its own connection: an error frame, then close.
- stop(): stop accepting, answer every request already read, close SQLite cleanly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hmac
import importlib.util
import ipaddress
import itertools
import logging
import operator
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

from broker import __version__
from broker.core.exclusive import ExclusiveWait, GiveUp, parse_access
from broker.discovery import SOCKET_FILE, ServerInfo, ServerLock
from broker.engine.engine import Engine, ProduceRequest, wall_clock_ms
from broker.engine.sessions import connection_session_id, new_server_run
from broker.errors import BrokerError, ErrorCode
from broker.event_loop import BusyPoll
from broker.limits import DEFAULT_LIMITS, Limits, limits_for_client
from broker.protocol import codec
from broker.protocol.frames import NEED_DATA, FrameConnection, ProtocolError, Sentinel
from broker.protocol.messages import (
    ARROW_FEATURE,
    PROTOCOL_VERSION,
    ErrorReply,
    Op,
    Push,
    Reply,
    Request,
)
from broker.types import Clock, Durability, NewRecord, check_durability

log = logging.getLogger("fencelog.server")
T = TypeVar("T")
_UNIX_PATH_BYTES_MAX: Final = 100
Handler = Callable[["Session", dict[str, Any]], Awaitable[dict[str, Any]]]
_Pending = tuple[int, Op, "_Answer"]


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


class _Answer(Protocol):
    """What a connection waits on for each request, in order: an asyncio future (a
    handler's task) or a produce's place in the group commit."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class _PendingProduce:
    """A produce waiting for its group commit: an _Answer with no future, no callback
    and no task; the commit loop fills in the outcome, then sends the session's replies."""

    request: ProduceRequest
    size: int
    session: Session
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


class Server:
    def __init__(
        self,
        data_dir: Path,
        *,
        durability: Durability = "full",
        limits: Limits = DEFAULT_LIMITS,
        auth_token: str | None = None,
        clock: Clock = wall_clock_ms,
        drop_acks: float = 0.0,
        busy_poll_us: int = 0,  # fencelog serve's default is BUSY_POLL_US_DEFAULT
    ) -> None:
        if not 0.0 <= drop_acks < 1.0:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT, f"drop_acks is a rate in [0, 1), not {drop_acks}"
            )
        self.busy_poll = BusyPoll(busy_poll_us)
        self._drop_acks = drop_acks
        self.data_dir = data_dir
        self.durability = check_durability(durability)
        self.limits = limits
        self._auth_token = auth_token
        self._clock = clock
        self.sessions: dict[str, Session] = {}
        self._session_ids = itertools.count(1)
        self._servers: list[asyncio.Server] = []
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._connections: set[_Connection] = set()
        self._ending: set[asyncio.Future[None]] = set()  # sessions being ended in the engine
        self._produce_pending: list[_PendingProduce] = []
        self._produce_ready = asyncio.Event()
        # The writer engine's one connection: produce groups run on the event loop, every
        # other write on the writer thread; the lock keeps them one at a time.
        self._writer_lock = asyncio.Lock()
        self._topic_events: dict[str, asyncio.Event] = {}
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="fencelog-writer")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="fencelog-reader")
        self._background: list[asyncio.Task[None]] = []
        self._lock: ServerLock | None = None
        self.info: ServerInfo | None = None
        self._handlers: dict[Op, Handler] = {
            Op.HEARTBEAT: self._heartbeat,
            Op.GOODBYE: self._heartbeat,
            Op.CREATE_TOPIC: self._create_topic,
            Op.DELETE_TOPIC: self._delete_topic,
            Op.LIST_TOPICS: self._list_topics,
            Op.DESCRIBE_TOPIC: self._describe_topic,
            Op.STATUS: self._status,
            Op.FETCH: self._fetch,
            Op.FETCH_ARROW: self._fetch_arrow,
            Op.OWN: self._own,
            Op.RELEASE: self._release,
            Op.OWNERSHIP: self._ownership,
            Op.OWN_HISTORY: self._own_history,
            Op.LEASE_PID: self._lease_pid,
            Op.PRODUCERS: self._producers,
            Op.PRODUCER_SNAPSHOT: self._producer_snapshot,
            Op.PRODUCER_SNAPSHOTS: self._producer_snapshots,
            Op.COMMIT_OFFSETS: self._commit_offsets,
            Op.COMMITTED_OFFSETS: self._committed_offsets,
            Op.BACKUP: self._backup,
            Op.ATTACH: self._attach,
            Op.DETACH: self._detach,
            Op.TOPIC_ACCESS: self._topic_access,
            Op.READ_COMPACTED: self._read_compacted,
            Op.TXN_BEGIN: self._txn_begin,
            Op.TXN_JOIN: self._txn_join,
            Op.TXN_COMMIT: self._txn_commit,
            Op.TXN_ABORT: self._txn_abort,
            Op.TXN_LIST: self._txn_list,
            Op.TXN_SHOW: self._txn_show,
            Op.TXN_COMMIT_OFFSETS: self._txn_commit_offsets,
        }
        self._access_changed: dict[str, asyncio.Event] = {}
        self._run = new_server_run()

    # life cycle ---------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 7420, unix: bool = True) -> None:
        if not _is_loopback(host) and self._auth_token is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"listening on {host} exposes the broker beyond this machine",
                hint="pass --auth-token-file, or listen on 127.0.0.1",
            )
        writer = Engine.open(
            self.data_dir, durability=self.durability, limits=self.limits, clock=self._clock
        )
        self._lock = ServerLock(self.data_dir)
        self._writer = writer
        self._reader = Engine.open(
            self.data_dir, durability=self.durability, limits=self.limits, clock=self._clock
        )
        for engine in (self._writer, self._reader):
            engine.owners.served_sessions = self.sessions.keys
        loop = asyncio.get_running_loop()
        try:
            tcp = await loop.create_server(partial(_Connection, self), host, port)
        except OSError as exc:
            self._release_start()
            raise BrokerError(
                ErrorCode.LISTEN_FAILED,
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                hint="pick another --listen address, or port 0 for any free port",
            ) from exc
        self._servers.append(tcp)
        bound = tcp.sockets[0].getsockname()
        unix_path = self._unix_path() if unix else None
        if unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                unix_path.unlink()
            old_umask = os.umask(0o077)
            try:
                self._servers.append(
                    await loop.create_unix_server(partial(_Connection, self), unix_path)
                )
            finally:
                os.umask(old_umask)
        self.info = ServerInfo(
            os.getpid(), f"{bound[0]}:{bound[1]}", str(unix_path) if unix_path else None
        )
        self._lock.publish(self.info)
        self._background = [
            asyncio.create_task(self._commit_loop(), name="group-commit"),
            asyncio.create_task(self._reap_sessions(), name="session-reaper"),
            asyncio.create_task(self._expire_txns(), name="txn-expiry"),
        ]
        log.info("serving %s on tcp://%s", self.data_dir, self.info.tcp)

    def _release_start(self) -> None:
        self._writer.close()
        self._reader.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _unix_path(self) -> Path | None:
        path = (self.data_dir / SOCKET_FILE).resolve()
        if len(os.fsencode(path)) > _UNIX_PATH_BYTES_MAX:
            log.warning("data directory path too long for a unix socket; TCP only")
            return None
        return path

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop accepting, finish what was read, close SQLite cleanly."""
        if self._stopping.is_set():
            await self._stopped.wait()
            return
        self._stopping.set()
        self.busy_poll.stop()
        for server in self._servers:
            server.close()
        for event in self._topic_events.values():
            event.set()
        grace_s = self.limits.shutdown_grace_ms / 1000
        connections = list(self._connections)
        for connection in connections:
            connection.finish()  # answer what was read, then close
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=grace_s)
        for connection in connections:
            connection.abort()  # past the grace period; connection_lost follows
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=grace_s)
        if self._ending:  # the sessions those connections held end in the engine first
            await asyncio.wait(self._ending, timeout=grace_s)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await self._write(self._writer.close)
        await loop.run_in_executor(self._reader_pool, self._reader.close)
        self._writer_pool.shutdown()
        self._reader_pool.shutdown()
        if self.info and self.info.unix:
            with contextlib.suppress(FileNotFoundError):
                Path(self.info.unix).unlink()
        if self._lock:
            self._lock.release()
        self._stopped.set()
        log.info("stopped")

    def _drop_ack(self) -> bool:
        return self._drop_acks > 0 and random.random() < self._drop_acks  # noqa: S311

    # connections --------------------------------------------------------------------

    def _connection_made(
        self,
        transport: asyncio.Transport,
        reply_now: Callable[[], None],
    ) -> Session | None:
        """A new connection becomes a session, or is refused (at the limit, stopping)."""
        if len(self.sessions) >= self.limits.connections_max or self._stopping.is_set():
            with contextlib.suppress(ConnectionError, OSError):
                transport.write(
                    FrameConnection(1).send(
                        ErrorReply(
                            0,
                            int(ErrorCode.TOO_MANY_REQUESTS),
                            f"the server holds its limit of {self.limits.connections_max}"
                            " connections",
                            {},
                        )
                    )
                )
            transport.close()
            return None
        session = Session(
            connection_session_id(self._run, next(self._session_ids)),
            _peer(transport),
            transport,
            asyncio.get_running_loop().time(),
            reply_now,
            authenticated=self._auth_token is None,
        )
        self.sessions[session.session_id] = session
        return session

    def _start(self, session: Session, request: Request) -> _Answer:
        if request.op is Op.HELLO:
            return _done(self._hello(session, request.args))
        if not session.said_hello or not session.authenticated:
            raise ProtocolError("the first request on a connection is HELLO")
        if request.op is Op.PRODUCE:
            return self._enqueue_produce(session, request.args)
        handler = self._handlers.get(request.op)
        if handler is None:
            raise ProtocolError(f"op {request.op.name} is not served")
        return asyncio.ensure_future(self._guarded(handler, session, request.args))

    async def _guarded(
        self, handler: Handler, session: Session, args: dict[str, Any]
    ) -> dict[str, Any]:
        if self.sessions.get(session.session_id) is not session:
            # Severed (or timed out) after this request was read: it must not act.
            raise _closed_before_run()
        session.inflight += 1
        try:
            return await handler(session, args)
        finally:
            session.inflight -= 1
            session.last_seen = asyncio.get_running_loop().time()

    def _replied(self, op: Op, message: Reply | ErrorReply) -> bool:
        """After a reply is queued: False drops the connection here (--drop-acks)."""
        if op is Op.PRODUCE and isinstance(message, Reply) and self._drop_ack():
            log.info("dropping the acknowledgement of request %d (--drop-acks)", message.request_id)
            return False
        return True

    def _connection_ended(self, session: Session) -> None:
        """The peer is gone: the session ends now, and what it held (claims, a place in
        a wait-exclusive queue) is released, before its slowest request finishes."""
        if self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
        task = asyncio.ensure_future(self._end_session(session))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end_session(self, session: Session) -> None:
        self.sessions.pop(session.session_id, None)
        session.close()
        with contextlib.suppress(RuntimeError):  # the writer pool is gone when stopping
            await self._write(partial(self._writer.session_closed, session.session_id))
        self._access_wake()

    async def _reap_sessions(self) -> None:
        loop = asyncio.get_running_loop()
        timeout_s = self.limits.session_timeout_ms / 1000
        while True:
            await asyncio.sleep(timeout_s / 4)
            now = loop.time()
            for session in list(self.sessions.values()):
                if session.inflight == 0 and now - session.last_seen > timeout_s:
                    log.info("session %s missed heartbeats; closing", session.session_id)
                    await self.sever(session.session_id, "missed heartbeats")

    async def _expire_txns(self) -> None:
        """Abort transactions past their timeout, about once a second."""
        while True:
            await asyncio.sleep(min(1.0, self.limits.txn_timeout_ms / 4000))
            try:
                expired = await self._write(self._writer.txns.expire)
            except BrokerError as error:  # busy storage: the next round tries again
                log.warning("transaction expiry: %s", error.message)
                continue
            for txn_id in expired:
                log.info("transaction %d timed out; aborted", txn_id)

    async def sever(self, session_id: str, reason: str) -> None:
        """End a session now: tell it why, then close its connection."""
        session = self.sessions.pop(session_id, None)  # no longer live, from this instant
        if session is None:
            return
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            session.transport.write(
                FrameConnection(self.limits.frame_bytes_max).send(
                    Push("session_closed", {"reason": reason})
                )
            )
        session.close()

    # handlers -----------------------------------------------------------------------

    def _hello(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        if self._auth_token is not None:
            token = args.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(
                token.encode(), self._auth_token.encode()
            ):
                # never echo or log the token
                raise BrokerError(
                    ErrorCode.AUTH_FAILED,
                    "authentication failed",
                    hint="check the token file the server was given",
                )
            session.authenticated = True
        session.said_hello = True
        return {
            "session_id": session.session_id,
            "server": f"fencelog {__version__}",
            "protocol": PROTOCOL_VERSION,
            "limits": limits_for_client(self.limits),
            "features": sorted(_features()),
        }

    async def _heartbeat(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def _create_topic(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        name = codec.field(args, "name", str)
        partitions = codec.field(args, "partitions", int)
        owner_group = codec.field(args, "owner_group", str, optional=True)
        info = await self._write(
            lambda: self._writer.create_topic(name, partitions, owner_group=owner_group)
        )
        return codec.topic_to_wire(info)

    async def _delete_topic(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        name = codec.field(args, "name", str)
        await self._write(lambda: self._writer.delete_topic(name))
        self._wake(name)
        return {}

    async def _list_topics(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topics = await self._read(self._reader.list_topics)
        return {"topics": [codec.topic_to_wire(t) for t in topics]}

    async def _describe_topic(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        name = codec.field(args, "name", str)
        return codec.topic_to_wire(await self._read(lambda: self._reader.describe_topic(name)))

    async def _status(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        return codec.status_to_wire(await self._read(self._reader.status))

    def _enqueue_produce(self, session: Session, args: dict[str, Any]) -> _Answer:
        """A produce joins the next group commit at once, with no task of its own: the
        group's COMMIT answers it (in _commit_loop)."""
        try:
            if self.sessions.get(session.session_id) is not session:
                raise _closed_before_run()
            # the usual request (a topic, no fences, no attachment) without the general
            # checks, which still judge anything else
            topic = args.get("topic")
            fences = args.get("fences")
            attachment = args.get("attachment")
            if type(topic) is not str:
                topic = codec.field(args, "topic", str)
            records = codec.new_records_from_wire(args.get("records"))
            producer = codec.producer_from_wire(args.get("producer"))
            if fences is not None and fences != ():
                fences = codec.fences_from_wire(fences)
            if attachment is not None:
                attachment = codec.field(args, "attachment", int)
            request = ProduceRequest(topic, records, producer, fences or (), attachment)
        except BrokerError as error:
            return _failed(error)
        session.inflight += 1
        pending = _PendingProduce(request, _value_bytes(records), session)
        self._produce_pending.append(pending)
        self._produce_ready.set()
        return pending

    async def _fetch(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        positions = codec.positions_from_wire(args.get("positions"))
        max_records, wait_ms = self._fetch_bounds(args)
        fences = codec.fences_from_wire(args.get("fences"))
        if not codec.field(args, "pages", bool, optional=True):  # a client before pages
            rows = await self._long_poll(
                topic,
                wait_ms,
                lambda: self._reader.fetch_rows(topic, positions, max_records, fences),
                bool,
            )
            return {"rows": rows}
        chunks = await self._long_poll(
            topic,
            wait_ms,
            lambda: self._reader.fetch_pages(topic, positions, max_records, fences),
            bool,
        )
        return {"pages": codec.chunks_to_wire(chunks)}

    async def _fetch_arrow(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        """FETCH of one partition, answered as one Arrow record batch in IPC stream
        format, built on the reader thread without a Python object per record."""
        if ARROW_FEATURE not in _features():
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                "this server cannot answer FETCH_ARROW: pyarrow is not installed here",
                hint="install fencelog's spark extra where the server runs",
            )
        topic = codec.field(args, "topic", str)
        partition = codec.field(args, "partition", int)  # range checks: the engine's
        offset = codec.field(args, "offset", int)
        max_records, wait_ms = self._fetch_bounds(args)
        fences = codec.fences_from_wire(args.get("fences"))
        reader = self._reader

        def page() -> tuple[int, bytes]:
            from broker import columnar  # pyarrow: only for columnar readers

            batch = reader.fetch_arrow(topic, partition, offset, max_records, fences)
            return batch.num_rows, columnar.batch_to_ipc(batch)

        _, ipc = await self._long_poll(topic, wait_ms, page, operator.itemgetter(0))
        return {"arrow": ipc}

    def _fetch_bounds(self, args: dict[str, Any]) -> tuple[int, int]:
        """A fetch's max_records and wait_ms, within the server's limits."""
        max_records = codec.non_negative(args, "max_records")
        wait_ms = codec.non_negative(args, "wait_ms")
        return (
            max(1, min(max_records, self.limits.read_records_max)),
            min(wait_ms, self.limits.fetch_wait_ms_max),
        )

    async def _long_poll(
        self, topic: str, wait_ms: int, read: Callable[[], T], found: Callable[[T], object]
    ) -> T:
        """read() on the reader thread until found() says it found something, or for up
        to wait_ms, woken each time the writer commits to the topic."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            appended = self._topic_events.setdefault(topic, asyncio.Event())
            result = await self._read(read)
            remaining = deadline - loop.time()
            if found(result) or remaining <= 0 or self._stopping.is_set():
                return result
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(appended.wait(), remaining)

    async def _own(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str)
        claims = codec.claims_from_wire(args.get("claims"))
        result = await self._write(
            lambda: self._writer.owners.own(session.session_id, group, claims)
        )
        for severed in result.severed:
            reason = f"severed: {group} claimed by session {session.session_id}"
            await self.sever(severed, reason)
        return {"claimed": codec.claimed_to_wire(result.claimed), "severed": list(result.severed)}

    async def _release(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str)
        resources = codec.strings_from_wire("resources", args.get("resources"))
        any_holder = codec.field(args, "any_holder", bool, optional=True) or False
        result = await self._write(
            lambda: self._writer.owners.release(
                session.session_id, group, resources, any_holder=any_holder
            )
        )
        for severed in result.severed:
            await self.sever(severed, f"severed: {group} released by session {session.session_id}")
        return {"released": list(result.released), "severed": list(result.severed)}

    async def _ownership(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str, optional=True)
        rows = await self._read(lambda: self._reader.owners.holdings(group))
        return {"ownership": codec.ownership_to_wire(rows), "session_id": session.session_id}

    async def _own_history(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str, optional=True)
        limit = codec.non_negative(args, "limit")
        rows = await self._read(lambda: self._reader.owners.history(group, limit))
        return {"history": codec.audit_to_wire(rows)}

    async def _lease_pid(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        partition = codec.field(args, "partition", int)
        pid = codec.field(args, "pid", int, optional=True)
        lease = await self._write(lambda: self._writer.lease_pid(topic, partition, pid))
        return codec.lease_to_wire(lease)

    async def _producers(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        entries = await self._write(lambda: self._writer.producer_states(topic))
        return {"producers": codec.entries_to_wire(entries)}

    async def _producer_snapshot(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        return {"snapshot_id": await self._write(self._writer.snapshot_producers)}

    async def _producer_snapshots(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        rows = await self._read(self._reader.producer_snapshots)
        return {"snapshots": codec.snapshots_to_wire(rows)}

    async def _commit_offsets(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str)
        topic = codec.field(args, "topic", str)
        offsets = codec.offset_map_from_wire(args.get("offsets"))
        state = codec.field(args, "producer_state", bytes, optional=True)
        await self._write(lambda: self._writer.commit_offsets(group, topic, offsets, state))
        return {}

    async def _committed_offsets(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str)
        topic = codec.field(args, "topic", str)
        rows = await self._read(lambda: self._reader.committed_offsets(group, topic))
        return {"offsets": codec.offsets_to_wire(rows)}

    async def _backup(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        out = codec.field(args, "path", str)
        if not os.path.isabs(out):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a served broker writes snapshots to absolute paths, not {out!r}",
            )
        return {"bytes": await self._read(lambda: self._reader.backup(out))}

    async def _attach(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        access = parse_access(codec.field(args, "access", str))
        name = codec.field(args, "name", str)
        epoch = codec.field(args, "epoch", int, optional=True)
        wait_ms = codec.field(args, "wait_ms", int, optional=True) or 0
        wait = ExclusiveWait(topic, wait_ms, recheck_s=1.0)
        attached = await self._write(
            lambda: self._writer.attach_producer(topic, session.session_id, access, name, epoch)
        )
        self._access_wake(topic)
        loop = asyncio.get_running_loop()
        deadline = wait.deadline(loop.time())
        while step := wait.step(
            attached.mode, deadline, loop.time(), stopping=self._stopping.is_set()
        ):
            if isinstance(step, GiveUp):
                await self._write(partial(self._writer.detach_producer, attached.attachment_id))
                self._access_wake(topic)
                raise step.error
            changed = self._access_changed.setdefault(topic, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), step.timeout_s)
            attached = await self._write(
                partial(self._writer.poll_attachment, attached.attachment_id, topic)
            )
        return codec.attachment_to_wire(attached)

    async def _detach(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        attachment_id = codec.field(args, "attachment", int)
        topic = codec.field(args, "topic", str)
        await self._write(lambda: self._writer.detach_producer(attachment_id))
        self._access_wake(topic)
        return {}

    async def _topic_access(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        return codec.access_to_wire(await self._write(lambda: self._writer.topic_access(topic)))

    async def _read_compacted(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        partition = codec.field(args, "partition", int)
        found = await self._read(lambda: self._reader.read_compacted(topic, partition))
        return {"records": codec.records_to_wire(found)}

    async def _txn_begin(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        group = codec.field(args, "group", str)
        key = codec.field(args, "key", str, optional=True)
        timeout_ms = codec.field(args, "timeout_ms", int, optional=True)
        info = await self._write(lambda: self._writer.txn_begin(group, key, timeout_ms))
        return codec.txn_to_wire(info)

    async def _txn_join(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        txn_id = codec.txn_id_from_wire(args)
        member = codec.field(args, "member", str)
        joined = await self._write(lambda: self._writer.txn_join(txn_id, member))
        return codec.member_to_wire(joined)

    async def _txn_commit(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        txn_id = codec.txn_id_from_wire(args)
        group = codec.field(args, "group", str, optional=True)
        members = codec.members_from_wire(args.get("members"))
        info = await self._write(lambda: self._writer.txn_commit(txn_id, group, members))
        for part in info.partitions:
            if part.topic is not None:
                self._wake(part.topic)
        return codec.txn_to_wire(info)

    async def _txn_abort(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        txn_id = codec.txn_id_from_wire(args)
        group = codec.field(args, "group", str, optional=True)
        return codec.txn_to_wire(await self._write(lambda: self._writer.txn_abort(txn_id, group)))

    async def _txn_list(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        include_ended = codec.field(args, "all", bool, optional=True) or False
        limit = codec.non_negative(args, "limit")
        found = await self._write(lambda: self._writer.txn_list(include_ended, limit))
        return {"txns": [codec.txn_to_wire(info) for info in found]}

    async def _txn_show(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        txn_id = codec.txn_id_from_wire(args)
        records_max = codec.non_negative(args, "records_max", optional=True)
        detail = await self._write(lambda: self._writer.txn_show(txn_id, records_max))
        return codec.detail_to_wire(detail)

    async def _txn_commit_offsets(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        txn_id = codec.txn_id_from_wire(args)
        group = codec.field(args, "group", str)
        topic = codec.field(args, "topic", str)
        offsets = codec.offset_map_from_wire(args.get("offsets"))
        state = codec.field(args, "producer_state", bytes, optional=True)
        await self._write(
            lambda: self._writer.txn_commit_offsets(txn_id, group, topic, offsets, state)
        )
        return {}

    def _access_wake(self, topic: str | None = None) -> None:
        """Waiters for exclusive access look again (one topic, or all of them)."""
        topics = [topic] if topic is not None else list(self._access_changed)
        for name in topics:
            event = self._access_changed.pop(name, None)
            if event is not None:
                event.set()

    # the writer and the reader --------------------------------------------------------

    async def _write(self, work: Callable[[], T]) -> T:
        async with self._writer_lock:
            return await asyncio.get_running_loop().run_in_executor(self._writer_pool, work)

    async def _read(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reader_pool, work)

    async def _commit_loop(self) -> None:
        """Group commit. Each round takes every produce read since the last one (up to
        the group limits) into one SQLite transaction, run right here on the event loop:
        a hand-off to a thread and back would cost more than a small group's COMMIT.
        While it runs, new requests wait in the sockets; they make the next group. A
        group's replies leave as soon as its COMMIT returns, not a turn of the loop later."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        while True:
            await self._produce_ready.wait()
            self._produce_ready.clear()
            async with self._writer_lock:
                while self._produce_pending:
                    group = self._take_group(limits)
                    requests = [pending.request for pending in group]
                    try:
                        outcomes = self._writer.produce_group(requests)
                    except BrokerError as error:
                        outcomes = [error] * len(group)
                    except Exception as exc:  # a bug of ours: answer, and keep committing
                        log.exception("a group commit of %d produces failed", len(group))
                        outcomes = [BrokerError(ErrorCode.INTERNAL, repr(exc))] * len(group)
                    now = loop.time()
                    for pending, outcome in zip(group, outcomes, strict=True):
                        pending.answer(
                            outcome
                            if isinstance(outcome, BrokerError)
                            else {"results": codec.results_to_wire(outcome)},
                            now,
                        )
                    for topic in {request.topic for request in requests}:
                        self._wake(topic)
                    for session in {pending.session for pending in group}:
                        session.reply_now()

    def _take_group(self, limits: Limits) -> list[_PendingProduce]:
        """The next group: every waiting produce, up to the group limits, or half of
        them when at least twice group_commit_split_requests wait. The first half's
        replies then leave while the second half commits, so a client with a window
        of requests in flight refills it while the server works, instead of the two
        taking turns (one-record requests, 32 in flight: about 17k to 23k records/s)."""
        pending = self._produce_pending
        requests_max = limits.group_commit_requests_max
        if len(pending) >= 2 * limits.group_commit_split_requests:
            requests_max = min(requests_max, (len(pending) + 1) // 2)
        count, size = 0, 0
        while (
            count < len(pending) and count < requests_max and size < limits.group_commit_bytes_max
        ):
            size += pending[count].size
            count += 1
        group = pending[:count]
        del pending[:count]
        return group

    def _wake(self, topic: str) -> None:
        event = self._topic_events.pop(topic, None)
        if event is not None:
            event.set()


@functools.cache
def _features() -> frozenset[str]:
    """What this server can answer beyond the protocol version: FETCH_ARROW needs pyarrow
    (the spark extra), which a server without it does not announce."""
    return frozenset({ARROW_FEATURE}) if importlib.util.find_spec("pyarrow") else frozenset()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unix"


def _reply_of(request_id: int, future: _Answer) -> Reply | ErrorReply:
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


class _Connection(asyncio.Protocol):
    """One connection's bytes, with no task of its own: data_received parses frames and
    starts their requests; as requests finish, their replies leave in request order,
    those ready together in one write.

    Back pressure: at inflight_requests_max unanswered requests, or while the socket's
    send buffer is full, frames wait undecoded and the socket is not read.
    """

    def __init__(self, server: Server) -> None:
        self._server = server
        self._frames = FrameConnection(server.limits.frame_bytes_max)
        self._pending: collections.deque[_Pending] = collections.deque()
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
                self._pending.append((message.request_id, message.op, answer))
                if isinstance(answer, asyncio.Future):  # a produce wakes us itself
                    answer.add_done_callback(self._finished)
                if message.op is Op.GOODBYE:
                    self._reading = False
            else:
                self._pause()
        except BrokerError as error:  # malformed input or failed authentication
            log.info("session %s (%s): %s", session.session_id, session.peer, error.message)
            self._reading = False
            self._pending.append((0, Op.NONE, _failed(error)))
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
        while pending and pending[0][2].done():
            request_id, op, future = pending.popleft()
            if every_ack and type(future) is _PendingProduce and type(future.outcome) is dict:
                out += frames.send_reply(request_id, future.outcome)  # a stored produce
                continue
            message = _reply_of(request_id, future)
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


def _closed_before_run() -> BrokerError:
    return BrokerError(
        ErrorCode.SEVERED,
        "this session was closed before the request ran",
        hint="the client reconnects with a new session",
    )


def _value_bytes(records: Sequence[NewRecord]) -> int:
    if len(records) == 1:  # the usual produce, without the passes
        return len(records[0].value)
    return sum(map(len, map(_VALUE, records)))


_VALUE = operator.itemgetter(0)


def _done(result: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


def _failed(error: BrokerError) -> asyncio.Future[dict[str, Any]]:
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
