"""Group commit: concurrent produce requests share one SQLite transaction.

Each round takes every produce read since the last one (up to the group limits) into
one writer transaction, run right on the event loop: a hand-off to a thread and back
would cost more than a small group's COMMIT. While it runs, new requests wait in the
sockets; they make the next group. A request is answered only after its group's COMMIT
returns, and the group's replies leave at once, not a turn of the loop later.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable, Sequence
from time import perf_counter

from broker.engine.engine import Engine, ProduceOutcome, ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.protocol import codec
from broker.server.connection import PendingProduce, Session
from broker.server.metrics import Metrics
from broker.types import NewRecord, sizes_of, value_size

log = logging.getLogger("fencelog.server")


class GroupCommit:
    """The produces waiting for the next group, and the loop that commits them."""

    def __init__(
        self,
        writer: Engine,
        writer_lock: asyncio.Lock,
        limits: Limits,
        wake: Callable[[str], None],
        metrics: Metrics,
    ) -> None:
        self._writer = writer
        self._writer_lock = writer_lock  # the writer's one connection: one user at a time
        self.limits = limits
        self._wake = wake  # long-polling fetches of a topic look again
        self._metrics = metrics
        self._pending: list[PendingProduce | _Submitted] = []
        self._ready = asyncio.Event()

    @property
    def waiting(self) -> int:
        """Produces read and not yet in a group."""
        return len(self._pending)

    def enqueue(
        self, request: ProduceRequest, session: Session, result_columns: bool
    ) -> PendingProduce:
        """The produce joins the next group; its COMMIT answers it."""
        pending = PendingProduce(request, value_bytes(request.records), session, result_columns)
        self._pending.append(pending)
        self._ready.set()
        return pending

    def submit(self, request: ProduceRequest) -> asyncio.Future[ProduceOutcome]:
        """The produce joins the next group; the future is its outcome (the Kafka
        listener's produces, which have no native session)."""
        pending = _Submitted(request, value_bytes(request.records))
        self._pending.append(pending)
        self._ready.set()
        return pending.future

    async def run(self) -> None:
        """Commit groups as produces come, until cancelled."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            self._ready.clear()
            async with self._writer_lock:
                while self._pending:
                    group = self._take_group(limits)
                    requests = [pending.request for pending in group]
                    began = perf_counter()  # not loop.time(): uvloop's moves in whole ms
                    try:
                        outcomes = self._writer.produce_group(requests)
                    except BrokerError as error:
                        outcomes = [error] * len(group)
                    except Exception as exc:  # a bug of ours: answer, and keep committing
                        log.exception("a group commit of %d produces failed", len(group))
                        outcomes = [BrokerError(ErrorCode.INTERNAL, repr(exc))] * len(group)
                    now = loop.time()  # the sessions' clock (last_seen), not a duration
                    metrics = self._metrics
                    metrics.group_committed(len(group), perf_counter() - began)
                    for pending, outcome in zip(group, outcomes, strict=True):
                        if not isinstance(outcome, BrokerError):
                            metrics.produced(
                                pending.request.topic, len(pending.request.records), pending.size
                            )
                        if isinstance(pending, _Submitted):
                            if not pending.future.done():  # cancelled: its connection is gone
                                pending.future.set_result(outcome)
                            continue
                        pending.answer(
                            outcome
                            if isinstance(outcome, BrokerError)
                            else codec.results_reply(outcome, pending.result_columns),
                            now,
                        )
                    for topic in {request.topic for request in requests}:
                        self._wake(topic)
                    for session in {p.session for p in group if not isinstance(p, _Submitted)}:
                        session.reply_now()

    def _take_group(self, limits: Limits) -> list[PendingProduce | _Submitted]:
        """The next group: every waiting produce, up to the group limits, or half of
        them when at least twice group_commit_split_requests wait. The first half's
        replies then leave while the second half commits, so a client with a window
        of requests in flight refills it while the server works, instead of the two
        taking turns (one-record requests, 32 in flight: about 17k to 23k records/s)."""
        pending = self._pending
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


class _Submitted:
    """A produce submitted with a future for its outcome."""

    __slots__ = ("future", "request", "size")

    def __init__(self, request: ProduceRequest, size: int) -> None:
        self.request = request
        self.size = size
        self.future: asyncio.Future[ProduceOutcome] = asyncio.get_running_loop().create_future()


def value_bytes(records: Sequence[NewRecord]) -> int:
    """The bytes of the records' values (what the produce metrics count)."""
    if len(records) == 1:  # the usual produce, without the passes
        return value_size(records[0].value)
    return sum(sizes_of(records))


_VALUE = operator.itemgetter(0)
