"""`fencelog serve`: moves bytes between sockets and the engine. It decides nothing.

Shape:
- One asyncio loop accepts connections (TCP on 127.0.0.1 by default, and a unix socket in
  the data directory). Each connection is a session: HELLO first (with the auth token
  when one is configured), then pipelined requests; replies go back in request order.
- Two engines on the same data directory: the writer (every change) and the reader
  (fetch, list, describe, status, on the reader thread). In WAL mode readers never wait
  for the writer. Produce groups use the writer on the event loop itself; every other
  change uses it on the writer thread; an asyncio lock keeps them one at a time.
- Group commit (group_commit.py): produce requests queue up (no task each) while the
  writer commits the previous group, then go into one SQLite transaction together. A
  request is answered only after that COMMIT returns; the replies of one group leave in
  one write.
- A connection's bytes, its session and its replies in order: connection.py.
- The requests that are a plain engine call are the table's (broker/protocol/ops.py)
  and share one handler; the rest (HELLO, FETCH, OWN, ATTACH...) have their own here.
- Fetch long-polls: with nothing to return it waits, up to the request's wait_ms, for
  the writer to commit to that topic.
- Sessions end on disconnect, on a protocol error, or after session_timeout_ms without
  any frame (clients send HEARTBEAT when idle); the engine hears each end.
- Bad input costs only its own connection: an error frame, then close.
- stop(): stop accepting, answer every request already read, close SQLite cleanly.
"""

from __future__ import annotations

import asyncio
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
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from broker import __version__
from broker.core.exclusive import ExclusiveWait, GiveUp, parse_access
from broker.discovery import SOCKET_FILE, ServerInfo, ServerLock
from broker.engine.engine import Engine, ProduceOutcome, ProduceRequest, wall_clock_ms
from broker.engine.sessions import connection_session_id, new_server_run
from broker.errors import BrokerError, ErrorCode
from broker.event_loop import BusyPoll
from broker.kafka.options import KafkaListen
from broker.limits import DEFAULT_LIMITS, Limits, limits_for_client
from broker.protocol import codec, ops
from broker.protocol.frames import FrameConnection, ProtocolError
from broker.protocol.messages import (
    ARROW_FEATURE,
    CHECKSUM_FEATURE,
    COLUMNS_FEATURE,
    KAFKA_GROUPS_FEATURE,
    NULL_VALUES_FEATURE,
    PROTOCOL_VERSION,
    ErrorReply,
    Op,
    Push,
    Reply,
    Request,
)
from broker.rows import Page, row_without_null, without_nulls
from broker.server.connection import (
    Answer,
    Connection,
    Session,
    closed_before_run,
    done,
    failed,
    peer_of,
)
from broker.server.group_commit import GroupCommit, value_bytes
from broker.server.http import HEAD_BYTES_MAX, HttpEndpoints
from broker.server.metrics import Metrics, State
from broker.types import Clock, Durability, check_durability

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi

log = logging.getLogger("fencelog.server")
T = TypeVar("T")
_UNIX_PATH_BYTES_MAX: Final = 100
_CORRUPT_LOG_EVERY_S: Final = 60.0  # a damaged database is logged at most this often
Handler = Callable[[Session, dict[str, Any]], Awaitable[dict[str, Any]]]


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
        kafka: KafkaListen | None = None,
        http: tuple[str, int] | None = None,  # /healthz, /readyz, /metrics (http.py)
    ) -> None:
        if not 0.0 <= drop_acks < 1.0:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT, f"drop_acks is a rate in [0, 1), not {drop_acks}"
            )
        self.busy_poll = BusyPoll(busy_poll_us)
        self._drop_acks = drop_acks
        self._corrupt_logged_at = -_CORRUPT_LOG_EVERY_S  # when DATA_CORRUPT was last logged
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
        self._connections: set[Connection] = set()
        self._ending: set[asyncio.Future[None]] = set()  # sessions being ended in the engine
        # The writer engine's one connection: produce groups run on the event loop, every
        # other write on the writer thread; the lock keeps them one at a time.
        self._writer_lock = asyncio.Lock()
        self._topic_events: dict[str, asyncio.Event] = {}
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="fencelog-writer")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="fencelog-reader")
        # fetches take turns between the reader and a second one, each with its own
        # SQLite connection and thread: SQLite reads with the GIL released, so two
        # consumers' pages (a Spark read's tasks) are read at once
        self._fetcher_pool = ThreadPoolExecutor(1, thread_name_prefix="fencelog-fetcher")
        self._fetch_turn = 0
        self._background: list[asyncio.Task[None]] = []
        self._lock: ServerLock | None = None
        self.info: ServerInfo | None = None
        self._handlers: dict[Op, Handler] = {
            entry.op: self._operation(entry) for entry in ops.OPERATIONS
        }
        self._handlers |= {
            Op.HEARTBEAT: self._heartbeat,
            Op.GOODBYE: self._heartbeat,
            Op.FETCH: self._fetch,
            Op.FETCH_ARROW: self._fetch_arrow,
            Op.OWN: self._own,
            Op.RELEASE: self._release,
            Op.OWNERSHIP: self._ownership,
            Op.OWN_HISTORY: self._own_history,
            Op.BACKUP: self._backup,
            Op.KAFKA_GROUPS: self._kafka_groups,
            Op.ATTACH: self._attach,
            Op.DETACH: self._detach,
        }
        self._access_changed: dict[str, asyncio.Event] = {}
        self._run = new_server_run()
        self._kafka_listen = kafka
        self.kafka: KafkaApi | None = None
        self._http_listen = http
        self._ready = False  # started: recovery done, every listener up
        self.metrics = Metrics(self._metrics_state)

    # life cycle ---------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 7420, unix: bool = True) -> None:
        if not _is_loopback(host) and self._auth_token is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"listening on {host} exposes the broker beyond this machine",
                hint="pass --auth-token-file, or listen on 127.0.0.1",
            )
        http = self._http_listen
        if http is not None and not _is_loopback(http[0]) and self._auth_token is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"an HTTP listener on {http[0]} exposes the broker's metrics beyond this machine",
                hint="pass --auth-token-file (scrapers then send Authorization: Bearer TOKEN), "
                "or listen on 127.0.0.1",
            )
        kafka = self._kafka_listen
        if kafka is not None and not _is_loopback(kafka.host) and self._auth_token is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a Kafka listener on {kafka.host} exposes the broker beyond this machine",
                hint="pass --auth-token-file (Kafka clients then log in with SASL/PLAIN), "
                "or listen on 127.0.0.1",
            )
        self._open_engines()
        for engine in (self._writer, self._reader, self._fetcher):
            engine.owners.served_sessions = self.sessions.keys
        self._group_commit = GroupCommit(
            self._writer, self._writer_lock, self.limits, self._wake, self.metrics
        )
        loop = asyncio.get_running_loop()
        try:
            tcp = await loop.create_server(partial(Connection, self), host, port)
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
                    await loop.create_unix_server(partial(Connection, self), unix_path)
                )
            finally:
                os.umask(old_umask)
        kafka_address = await self._start_kafka() if self._kafka_listen else None
        http_address = await self._start_http() if self._http_listen else None
        self.info = ServerInfo(
            os.getpid(),
            f"{bound[0]}:{bound[1]}",
            str(unix_path) if unix_path else None,
            kafka_address,
            http_address,
        )
        assert self._lock is not None  # _open_engines took it
        self._lock.publish(self.info)
        self._background += [
            asyncio.create_task(self._group_commit.run(), name="group-commit"),
            asyncio.create_task(self._reap_sessions(), name="session-reaper"),
            asyncio.create_task(self._expire_txns(), name="txn-expiry"),
            asyncio.create_task(self._clean_topics(), name="cleaner"),
        ]
        for txn_id in self._writer.recovered:
            log.info(
                "recovery: applied transaction %d, prepared before a stop",
                txn_id,
                extra={"event": "recovery", "txn_id": txn_id},
            )
        for txn_id, why in self._writer.txns.damaged.items():
            log.error(
                "recovery: transaction %d stays prepared: %s",
                txn_id,
                why,
                extra={"event": "recovery_failed", "txn_id": txn_id},
            )
        self._ready = True
        log.info(
            "serving %s on tcp://%s",
            self.data_dir,
            self.info.tcp,
            extra={"event": "start", "address": self.info.tcp},
        )

    async def _start_http(self) -> str:
        """/healthz, /readyz and /metrics (broker/server/http.py); its HOST:PORT."""
        assert self._http_listen is not None
        host, port = self._http_listen
        endpoints = HttpEndpoints(
            ready=lambda: self._ready,
            stopping=self._stopping.is_set,
            metrics=lambda: self._read(self.metrics.exposition),
            auth_token=self._auth_token,
        )
        try:
            server = await asyncio.start_server(endpoints.serve, host, port, limit=HEAD_BYTES_MAX)
        except OSError as exc:
            for started in self._servers:
                started.close()
            self._release_start()
            raise BrokerError(
                ErrorCode.LISTEN_FAILED,
                f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}",
                hint="pick another --http-listen address, or port 0 for any free port",
            ) from exc
        self._servers.append(server)
        bound_host, bound_port = server.sockets[0].getsockname()[:2]
        return f"{bound_host}:{bound_port}"

    def _metrics_state(self) -> State:
        kafka = len(self.kafka.connections) if self.kafka is not None else 0
        return State(len(self.sessions), kafka, self._reader)

    async def _start_kafka(self) -> str:
        """The Kafka listener beside the native one (broker/kafka/); its HOST:PORT."""
        listen = self._kafka_listen
        assert listen is not None
        from broker.kafka.api import KafkaApi  # the Kafka codec: only with a Kafka listener
        from broker.kafka.listener import KafkaConnection, close_idle

        cluster_id = await self._write(self._writer.kafka.cluster_id)
        api = KafkaApi(
            self,
            host=listen.host,
            port=listen.port,
            auth_token=self._auth_token,  # the native rule: a token given binds every client
            auto_create=listen.auto_create,
            default_partitions=listen.partitions,
            cluster_id=cluster_id,
        )
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: KafkaConnection(api), listen.host, listen.port
            )
        except OSError as exc:
            for started in self._servers:
                started.close()
            self._release_start()
            raise BrokerError(
                ErrorCode.LISTEN_FAILED,
                f"cannot listen for Kafka clients on {listen.host}:{listen.port}: "
                f"{exc.strerror or exc}",
                hint="pick another --kafka-listen address, or port 0 for any free port",
            ) from exc
        self._servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        api.host, api.port = listen.advertised or host, port
        api.coordinator.start()
        idle_s = self.limits.kafka_idle_ms / 1000
        self._background.append(
            asyncio.create_task(close_idle(api.connections, idle_s), name="kafka-idle")
        )
        self.kafka = api
        log.info("Kafka listener on %s:%d", host, port)
        return f"{host}:{port}"

    def _open_engines(self) -> None:
        """The writer, the server's lock on the directory, the reader and the fetcher;
        on a failure, what was opened is closed and the lock released."""
        writer = Engine.open(
            self.data_dir, durability=self.durability, limits=self.limits, clock=self._clock
        )
        try:
            self._lock = ServerLock(self.data_dir)
        except BaseException:
            writer.close()
            raise
        self._writer = writer
        opened = [writer]
        try:
            for _ in range(2):
                opened.append(
                    Engine.open(
                        self.data_dir,
                        durability=self.durability,
                        limits=self.limits,
                        clock=self._clock,
                    )
                )
        except BaseException:
            for engine in opened:
                engine.close()
            self._lock.release()
            self._lock = None
            raise
        self._reader, self._fetcher = opened[1:]

    def _release_start(self) -> None:
        for task in self._background:  # a Kafka listener's, started before the failure
            task.cancel()
        self._writer.close()
        self._reader.close()
        self._fetcher.close()
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
        self._ready = False
        self.busy_poll.stop()
        for server in self._servers:
            server.close()
        for event in self._topic_events.values():
            event.set()
        grace_s = self.limits.shutdown_grace_ms / 1000
        if self.kafka is not None:
            from broker.kafka.listener import close_all

            await self.kafka.stop()
            await close_all(self.kafka.connections, grace_s)
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
        await loop.run_in_executor(self._fetcher_pool, self._fetcher.close)
        self._writer_pool.shutdown()
        self._reader_pool.shutdown()
        self._fetcher_pool.shutdown()
        if self.info and self.info.unix:
            with contextlib.suppress(FileNotFoundError):
                Path(self.info.unix).unlink()
        if self._lock:
            self._lock.release()
        self._stopped.set()
        log.info("stopped", extra={"event": "stop"})

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
            peer_of(transport),
            transport,
            asyncio.get_running_loop().time(),
            reply_now,
            authenticated=self._auth_token is None,
        )
        self.sessions[session.session_id] = session
        log.info(
            "connection %s from %s",
            session.session_id,
            session.peer,
            extra={
                "event": "connection_open",
                "connection": session.session_id,
                "client": session.peer,
            },
        )
        return session

    def _start(self, session: Session, request: Request) -> Answer:
        if request.op is Op.HELLO:
            return done(self._hello(session, request.args))
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
            raise closed_before_run()
        session.inflight += 1
        try:
            return await handler(session, args)
        finally:
            session.inflight -= 1
            session.last_seen = asyncio.get_running_loop().time()

    def _replied(self, op: Op, message: Reply | ErrorReply) -> bool:
        """After a reply is queued: False drops the connection here (--drop-acks). A
        damaged database met by a request is logged, once a minute at most: the
        operator, not only the client, must hear of it."""
        if op is Op.PRODUCE and isinstance(message, Reply) and self._drop_ack():
            log.info("dropping the acknowledgement of request %d (--drop-acks)", message.request_id)
            return False
        if isinstance(message, ErrorReply) and message.code == ErrorCode.DATA_CORRUPT:
            now = time.monotonic()
            if now - self._corrupt_logged_at >= _CORRUPT_LOG_EVERY_S:
                self._corrupt_logged_at = now
                log.error(
                    "%s met a damaged database: %s",
                    op.name,
                    message.message,
                    extra={"event": "data_corrupt", "error": "DATA_CORRUPT"},
                )
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
        log.info(
            "connection %s from %s closed",
            session.session_id,
            session.peer,
            extra={
                "event": "connection_close",
                "connection": session.session_id,
                "client": session.peer,
            },
        )
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
                    log.info(
                        "session %s missed heartbeats; closing",
                        session.session_id,
                        extra={
                            "event": "session_expired",
                            "connection": session.session_id,
                            "client": session.peer,
                        },
                    )
                    await self.sever(session.session_id, "missed heartbeats")

    async def _clean_topics(self) -> None:
        """Retention and compaction, every clean_interval_ms: each step one short write
        transaction (broker/engine/cleaner.py), then a pause as long, the writer free for
        produces."""
        while True:
            await asyncio.sleep(self.limits.clean_interval_ms / 1000)
            try:
                for topic, partitions in await self._read(self._reader.cleanable):
                    for partition in range(partitions):
                        await self._clean_partition(topic, partition)
            except BrokerError as error:
                log.warning("cleaning: %s", error.message, extra={"event": "clean_failed"})

    async def _clean_partition(self, topic: str, partition: int) -> None:
        deleted = 0
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            step = await self._write(partial(self._writer.clean_step, topic, partition))
            deleted += step.deleted
            if not step.more or self._stopping.is_set():
                break
            # as long again without the writer: produces waiting behind a step go first,
            # and the ones after find it free (cleaning takes at most half the writer)
            await asyncio.sleep(loop.time() - began)
        if deleted:
            self.metrics.cleaned(topic, deleted)
            self._access_wake(topic)
            log.info(
                "cleaned %d records of %s/%d",
                deleted,
                topic,
                partition,
                extra={"event": "clean", "topic": topic},
            )

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
                log.info(
                    "transaction %d timed out; aborted",
                    txn_id,
                    extra={"event": "txn_timeout", "txn_id": txn_id},
                )

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

    def _operation(self, entry: ops.Operation[Any, Any]) -> Handler:
        """The handler of a table operation: decode, call the engine method it names on
        the writer or the reader, wake the fetches it wrote for, encode."""
        on_writer = entry.side is ops.Side.WRITE

        async def handle(session: Session, args: dict[str, Any]) -> dict[str, Any]:
            call_args = entry.decode_args(args)
            if on_writer:
                method = getattr(self._writer, entry.method)
                result = await self._write(lambda: method(**call_args))
            else:
                method = getattr(self._reader, entry.method)
                result = await self._read(lambda: method(**call_args))
            if entry.wakes is not None:
                for topic in entry.wakes(args, result):
                    self._wake(topic)
            if entry.op is Op.TXN_BEGIN_PRODUCE:  # a produce, as the group commit counts it
                records = call_args["records"]
                self.metrics.produced(call_args["topic"], len(records), value_bytes(records))
            if entry.op in _LOGGED_TXN_OPS:
                info = result[0] if entry.op is Op.TXN_BEGIN_PRODUCE else result
                txn_id = getattr(info, "txn_id", None)
                event = _LOGGED_TXN_OPS[entry.op]
                log.info(
                    "transaction %s: %s",
                    txn_id,
                    event.removeprefix("txn_"),
                    extra={"event": event, "txn_id": txn_id, "connection": session.session_id},
                )
            if entry.reply_columns is not None and args.get("result_columns") is True:
                return entry.reply_columns(result)
            return entry.reply(result)

        return handle

    def _enqueue_produce(self, session: Session, args: dict[str, Any]) -> Answer:
        """A produce joins the next group commit at once, with no task of its own: the
        group's COMMIT answers it (broker/server/group_commit.py)."""
        try:
            if self.sessions.get(session.session_id) is not session:
                raise closed_before_run()
            # the usual request (a topic, no fences, no attachment) without the general
            # checks, which still judge anything else
            topic = args.get("topic")
            fences = args.get("fences")
            attachment = args.get("attachment")
            if type(topic) is not str:
                topic = codec.field(args, "topic", str)
            records = codec.records_from_args(args)
            producer = codec.producer_from_wire(args.get("producer"))
            if fences is not None and fences != ():
                fences = codec.fences_from_wire(fences)
            if attachment is not None:
                attachment = codec.field(args, "attachment", int)
            request = ProduceRequest(topic, records, producer, fences or (), attachment)
        except BrokerError as error:
            return failed(error)
        session.inflight += 1
        columns = args.get("result_columns") is True
        return self._group_commit.enqueue(request, session, columns)

    async def _fetch(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        topic = codec.field(args, "topic", str)
        positions = codec.positions_from_wire(args.get("positions"))
        max_records, wait_ms = self._fetch_bounds(args)
        fences = codec.fences_from_wire(args.get("fences"))
        nulls = bool(codec.field(args, "nulls", bool, optional=True))  # a client before nulls
        if not codec.field(args, "pages", bool, optional=True):  # a client before pages
            rows = await self._long_poll(
                topic,
                wait_ms,
                lambda engine: engine.fetch_rows(topic, positions, max_records, fences),
                bool,
            )
            if not nulls:
                rows = [row_without_null(row) for row in rows]
            self.metrics.fetched(topic, len(rows), sum(len(row[4] or b"") for row in rows))
            return {"rows": rows}
        chunks = await self._long_poll(
            topic,
            wait_ms,
            lambda engine: engine.fetch_pages(topic, positions, max_records, fences),
            bool,
        )
        for chunk in chunks:
            if isinstance(chunk, Page):
                self.metrics.fetched(topic, chunk.record_count, len(chunk.values))
            else:
                self.metrics.fetched(topic, len(chunk), sum(len(row[4] or b"") for row in chunk))
        if not nulls:
            chunks = [
                without_nulls(chunk)
                if isinstance(chunk, Page)
                else [row_without_null(row) for row in chunk]
                for chunk in chunks
            ]
        runs = bool(codec.field(args, "runs", bool, optional=True))  # a client before runs
        return {"pages": codec.chunks_to_wire(chunks, runs)}

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
        nulls = bool(codec.field(args, "nulls", bool, optional=True))  # a client before nulls

        def page(reader: Engine) -> tuple[int, bytes]:
            from broker import columnar  # pyarrow: only for columnar readers

            batch = reader.fetch_arrow(topic, partition, offset, max_records, fences)
            if not nulls:
                batch = columnar.without_nulls(batch)
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
        self,
        topic: str,
        wait_ms: int,
        read: Callable[[Engine], T],
        found: Callable[[T], object],
    ) -> T:
        """read(engine) on a fetching reader's thread (the reader and the fetcher take
        turns) until found() says it found something, or for up to wait_ms, woken each
        time the writer commits to the topic."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            appended = self._topic_events.setdefault(topic, asyncio.Event())
            result = await self._fetch_read(read)
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
        for claimed in result.claimed:
            log.info(
                "session %s holds %s/%s at generation %d",
                session.session_id,
                claimed.group,
                claimed.resource,
                claimed.generation,
                extra={
                    "event": "claim",
                    "connection": session.session_id,
                    "group": claimed.group,
                    "resource": claimed.resource,
                    "generation": claimed.generation,
                },
            )
        for severed in result.severed:
            reason = f"severed: {group} claimed by session {session.session_id}"
            log.info(
                "session %s %s",
                severed,
                reason,
                extra={"event": "sever", "connection": severed, "group": group},
            )
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
        if result.released:
            log.info(
                "session %s released %s of %s",
                session.session_id,
                ", ".join(result.released),
                group,
                extra={"event": "release", "connection": session.session_id, "group": group},
            )
        for severed in result.severed:
            log.info(
                "session %s severed: %s released by %s",
                severed,
                group,
                session.session_id,
                extra={"event": "sever", "connection": severed, "group": group},
            )
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

    async def _backup(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        out = codec.field(args, "path", str)
        if not os.path.isabs(out):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a served broker writes snapshots to absolute paths, not {out!r}",
            )
        return {"bytes": await self._read(lambda: self._reader.backup(out))}

    async def _kafka_groups(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        """The Kafka listener's live groups (none without one): members are soft state
        in its coordinator, not in the data directory."""
        if self.kafka is None:
            return {"groups": []}
        from broker.kafka.groups_admin import kafka_groups  # only with a Kafka listener

        return {"groups": codec.kafka_groups_to_wire(kafka_groups(self.kafka.coordinator))}

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
        log.info(
            "session %s attached to %s as %s (epoch %d)",
            session.session_id,
            topic,
            attached.mode,
            attached.epoch,
            extra={
                "event": "exclusive_grant" if attached.mode == "exclusive" else "attach",
                "connection": session.session_id,
                "topic": topic,
                "generation": attached.epoch,
            },
        )
        return codec.attachment_to_wire(attached)

    async def _detach(self, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        attachment_id = codec.field(args, "attachment", int)
        topic = codec.field(args, "topic", str)
        await self._write(lambda: self._writer.detach_producer(attachment_id))
        self._access_wake(topic)
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

    async def _fetch_read(self, read: Callable[[Engine], T]) -> T:
        """read(engine) for a fetch, on the reader's or the fetcher's thread: they take
        turns, so two fetches read at once (SQLite reads with Python's lock released)."""
        self._fetch_turn ^= 1
        engine, pool = (
            (self._fetcher, self._fetcher_pool)
            if self._fetch_turn
            else (self._reader, self._reader_pool)
        )
        return await asyncio.get_running_loop().run_in_executor(pool, read, engine)

    def _wake(self, topic: str) -> None:
        event = self._topic_events.pop(topic, None)
        if event is not None:
            event.set()

    # the Kafka listener's Backend (broker/kafka/api.py) -------------------------------

    @property
    def writer(self) -> Engine:
        return self._writer

    @property
    def reader(self) -> Engine:
        return self._reader

    async def write(self, work: Callable[[], T]) -> T:
        return await self._write(work)

    async def read(self, work: Callable[[], T]) -> T:
        return await self._read(work)

    async def fetch_read(self, read: Callable[[Engine], T]) -> T:
        return await self._fetch_read(read)

    async def produce(self, request: ProduceRequest) -> ProduceOutcome:
        return await self._group_commit.submit(request)

    def appended(self, topic: str) -> asyncio.Event:
        """Set when the writer next commits to topic."""
        return self._topic_events.setdefault(topic, asyncio.Event())

    def wake(self, topic: str | None = None) -> None:
        for name in [topic] if topic is not None else list(self._topic_events):
            self._wake(name)

    def stopping(self) -> bool:
        return self._stopping.is_set()

    def answered(self, operation: str, seconds: float, error: str | None) -> None:
        self.metrics.answered(operation, seconds, error)

    def produced(self, topic: str, records: int, size: int) -> None:
        self.metrics.produced(topic, records, size)

    def fetched(self, topic: str, records: int, size: int) -> None:
        self.metrics.fetched(topic, records, size)

    def read_ahead(self, outcome: str) -> None:
        self.metrics.read_ahead[outcome] += 1


_LOGGED_TXN_OPS: Final = {
    Op.TXN_BEGIN: "txn_begin",
    Op.TXN_BEGIN_PRODUCE: "txn_begin",
    Op.TXN_COMMIT: "txn_commit",
    Op.TXN_ABORT: "txn_abort",
}


@functools.cache
def _features() -> frozenset[str]:
    """What this server can answer beyond the protocol version: PRODUCE's records as
    columns; KAFKA_GROUPS; FETCH_ARROW, which needs pyarrow (the spark extra): a server without it
    does not announce it."""
    arrow = {ARROW_FEATURE} if importlib.util.find_spec("pyarrow") else set()
    return frozenset(
        {COLUMNS_FEATURE, CHECKSUM_FEATURE, KAFKA_GROUPS_FEATURE, NULL_VALUES_FEATURE, *arrow}
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
