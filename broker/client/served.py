"""Reaching a served broker from a sync `broker.client.Client`: `ServedTransport`.

It answers a Client's plain requests (produce, fetch, the table of operations) over a
BlockingConnection (remote.py) in the caller's thread: no event loop, no thread, and no
asyncio to import, which costs a one-shot CLI command about a fifth of its start
(bench/RESULTS.md "CLI start"). What needs a session kept alive between requests (own,
attach, a callback when the session is severed, the pipelined producer) or two threads
at once moves it, for good, to the event loop transport (async_client.py), which
heartbeats and pipelines.

A BlockingConnection holds no session state, so it may be replaced at any time: one idle
for half the session timeout (the server would close it unheard) or closed by the
server is replaced before the next request rather than written to.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from broker.client.remote import (
    ENDED,
    RETRY_SAFE,
    Address,
    BlockingConnection,
    checked_request_timeout,
    connect_with_backoff,
    fetch_args,
    fetched_arrow,
    fetched_records,
    produce_args,
)
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.protocol import codec
from broker.protocol.messages import KAFKA_GROUPS_FEATURE, Op
from broker.protocol.ops import Operation
from broker.rows import AuditRow, Row
from broker.types import (
    AppendResult,
    Attachment,
    Claimed,
    Fence,
    KafkaGroup,
    NewRecord,
    OwnershipInfo,
    ProducerFields,
    Record,
    RecordColumns,
    ResultColumns,
)

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Coroutine

    import pyarrow as pa

    from broker.client.async_client import AsyncClient, LoopTransport

__all__ = ["Address", "ServedTransport"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_CLOSE_WAIT_S: Final = 1.0  # close() waits this long for another thread's request


class ServedTransport:
    """A served broker for broker.client.Client: plain requests over a
    BlockingConnection in the caller's thread, until something needs the event loop
    transport (see the module's docstring)."""

    validates_records = False  # the client checks batches before they become frames
    served = True

    def __init__(
        self,
        address: Address,
        *,
        token: str | None = None,
        request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
        connect_timeout_s: float = DEFAULT_LIMITS.connect_timeout_ms / 1000,
    ) -> None:
        self.address = address
        self._token = token
        self._request_timeout_s = checked_request_timeout(request_timeout_s)
        self._connect_timeout_s = connect_timeout_s
        self._using = threading.Lock()  # held by the thread using the connection
        self._loop: LoopTransport | None = None
        self._closed = False
        self._connection = self._connect()
        self.limits = self._connection.hello.limits

    def _connect(self) -> BlockingConnection:
        def open_once(timeout_s: float) -> BlockingConnection:
            return BlockingConnection.open(
                self.address,
                token=self._token,
                timeout_s=timeout_s,
                request_timeout_s=self._request_timeout_s,
            )

        return connect_with_backoff(open_once, self._connect_timeout_s)

    # plain requests -------------------------------------------------------------------

    def _request(self, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        return self._later(op, args)()

    def _later(self, op: Op, args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """Send a request now; the returned call gives its reply. On the event loop once
        moved there, or while another thread is using the connection."""
        if self._loop is None and self._using.acquire(blocking=False):
            try:
                return self._send(op, args)
            finally:
                self._using.release()
        loop = self._looped()
        return loop.run_async(loop.client.request(op, args)).result

    def _send(self, op: Op, args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """Send on the connection (the caller holds it); the call that reads the reply."""
        connection, request_id = self._sent(op, args)

        def reply() -> dict[str, Any]:
            with self._using:
                return self._reply(connection, request_id, op, args)

        return reply

    def _sent(self, op: Op, args: dict[str, Any]) -> tuple[BlockingConnection, int]:
        if self._closed:
            raise BrokerError(
                ErrorCode.CONNECTION_FAILED, "this client is closed", client_closed=True
            )
        connection = self._connection
        if connection.closed or self._stale(connection):
            connection.close()
            connection = self._connection = self._connect()
        return connection, connection.send(op, args)

    def _reply(
        self, connection: BlockingConnection, request_id: int, op: Op, args: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            return connection.reply(request_id)
        except BrokerError as error:
            # The connection ended under the request: one that is safe to repeat goes once
            # more on a new connection. A produce never does; whether it landed is for the
            # idempotent producer to find out.
            if op not in RETRY_SAFE or not connection.closed or error.code not in ENDED:
                raise
        finally:
            if self._loop is not None and not connection.pending:
                connection.close()  # moved to the event loop: nothing more comes here
        if self._loop is not None:
            return self._loop.run_async(self._loop.client.request(op, args)).result()
        again, request_id = self._sent(op, args)
        return again.reply(request_id)

    def _stale(self, connection: BlockingConnection) -> bool:
        """Not to be written to: idle for half the session timeout (the server may close
        it unheard meanwhile; what is still in flight on it is then asked again on the
        next), or ended by the server."""
        idle_s = time.monotonic() - connection.last_sent
        if idle_s >= connection.hello.limits.session_timeout_ms / 2000:
            return True
        return connection.ended_by_peer()

    def call(self, entry: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        request = entry.args(*args, **kwargs)
        if entry.reply_columns is not None:  # an operation that carries records
            request = codec.with_columns(request, self._connection.hello.features)
        return entry.decode_reply(self._request(entry.op, request))

    def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
        attachment: int | None = None,
    ) -> Sequence[AppendResult]:
        features = self._connection.hello.features
        reply = self._request(
            Op.PRODUCE, produce_args(topic, records, producer, fences, attachment, features)
        )
        return codec.results_from_reply(topic, reply)

    def produce_columns(
        self,
        topic: str,
        records: RecordColumns,
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
    ) -> ResultColumns:
        features = self._connection.hello.features
        reply = self._request(
            Op.PRODUCE, produce_args(topic, records, producer, fences, None, features)
        )
        return codec.result_columns_of_reply(reply)

    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> list[Record]:
        return self.fetch_ahead(topic, positions, max_records, wait_ms, fences)()

    def fetch_ahead(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> Callable[[], list[Record]]:
        """A fetch sent now, whose records the returned call reads."""
        args = fetch_args(topic, positions, max_records, wait_ms, fences, pages=True)
        reply = self._later(Op.FETCH, args)
        return lambda: fetched_records(topic, reply())

    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        fences: Sequence[Fence],
    ) -> list[Row]:
        reply = self._request(Op.FETCH, fetch_args(topic, positions, max_records, 0, fences))
        return codec.rows_of_reply(reply)

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
        """fetch_arrow() sent now; the returned call reads its batch."""
        args = fetch_args(topic, {partition: offset}, max_records, 0, fences, pages=True)
        reply = self._later(Op.FETCH, args)
        return lambda: fetched_arrow(topic, reply())

    def ownership(self, group: str | None) -> list[OwnershipInfo]:
        reply = self._request(Op.OWNERSHIP, {"group": group})
        return codec.ownership_from_wire(reply["ownership"])

    def ownership_history(self, group: str | None, limit: int) -> list[AuditRow]:
        reply = self._request(Op.OWN_HISTORY, {"group": group, "limit": limit})
        return codec.audit_from_wire(reply["history"])

    def backup(self, path: str) -> int:
        return int(self._request(Op.BACKUP, {"path": os.path.abspath(path)})["bytes"])

    def kafka_groups(self) -> list[KafkaGroup] | None:
        """None: the server is too old to say."""
        if KAFKA_GROUPS_FEATURE not in self._connection.hello.features:
            return None
        return codec.kafka_groups_from_wire(self._request(Op.KAFKA_GROUPS, {})["groups"])

    # what needs a session kept alive: the event loop transport ------------------------

    def _looped(self) -> LoopTransport:
        if self._closed:
            raise BrokerError(
                ErrorCode.CONNECTION_FAILED, "this client is closed", client_closed=True
            )
        if self._loop is None:
            from broker.client.async_client import LoopTransport

            self._loop = LoopTransport(
                self.address, token=self._token, request_timeout_s=self._request_timeout_s
            )
            if self._using.acquire(blocking=False):
                try:  # nothing of the connection's is in flight: it is done with
                    if not self._connection.pending:
                        self._connection.close()
                finally:
                    self._using.release()
        return self._loop

    @property
    def client(self) -> AsyncClient:
        """The event loop transport's client (the pipelined producer's sends)."""
        return self._looped().client

    def run_async(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on the event loop transport (the pipelined producer's pumps)."""
        return self._looped().run_async(work)

    def on_severed(self, callback: Callable[[str], None]) -> None:
        self._looped().on_severed(callback)

    def session_id(self) -> str:
        return self._looped().session_id()

    def own(self, group: str, claims: Sequence[tuple[str, int]]) -> list[Claimed]:
        return self._looped().own(group, claims)

    def release(self, group: str, resources: Sequence[str] | None, any_holder: bool) -> list[str]:
        return self._looped().release(group, resources, any_holder)

    def attach(
        self, topic: str, access: str, name: str, epoch: int | None, wait_ms: int
    ) -> Attachment:
        return self._looped().attach(topic, access, name, epoch, wait_ms)

    def detach(self, topic: str, attachment_id: int) -> None:
        self._looped().detach(topic, attachment_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.close()
        if self._using.acquire(timeout=_CLOSE_WAIT_S):
            try:
                self._connection.close()
            finally:
                self._using.release()
        else:  # another thread waits on a reply (a long poll): wake it, with an error
            self._connection.abort()
