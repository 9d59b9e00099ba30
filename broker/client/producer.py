"""The idempotent producer: pids, sequences, pipelining, ordered retries, saved state.

    producer = client.producer("orders")              # idempotent by default
    producer.send([b"a", b"b"], partition=0)          # waits for the acknowledgement
    futures = [producer.send_async([v], partition=0) for v in values]   # pipelined
    producer.flush()
    saved = producer.state().to_bytes()               # store with your input offsets

Rules (DESIGN.md section 4):
- per partition it leases a pid (random generation, sequence 0) and numbers records
  from 1; every batch goes to one partition;
- it keeps up to max_in_flight batches in flight per partition (served brokers). When
  one fails with an error that says nothing was decided (the connection was lost, the
  session severed, the storage busy), every later batch of that partition is let finish,
  then each unacknowledged batch is resent in order, one at a time, until acknowledged
  or delivery_timeout_s passes. A batch that had landed answers as a duplicate with its
  original offsets, so the log never holds M1, M3, M2;
- delivery_timeout_s, counted from the send, bounds a batch even while an attempt waits
  on a broker that does not answer (stopped): the batch fails (CONNECTION_FAILED, its
  outcome unknown), with the later ones in flight, and the partition starts again with
  a new pid;
- FENCED, INVALID_GENERATION, PID_EXPIRED and the like fail the batch and every later
  one of that partition; a fenced producer never sends again;
- it leases a new pid before its lease runs out (renew_before_ms), between batches;
- `state()` exports (pid, generation, acknowledged sequence) per partition; a producer
  built with `state=` resumes those pids one generation up, which fences the old
  instance, and its replays of already-written records are answered as duplicates.
- idempotent=False opts out (pid 0): no numbering, no retries.
- access="shared" | "exclusive" | "wait-exclusive" attaches the producer to the topic
  (PIP-68); a producer that lost exclusive access raises ProducerFenced on its next
  send, and every send after it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import msgpack
from msgspec import Struct

from broker.core import records as record_rules
from broker.errors import BrokerError, ErrorCode
from broker.types import (
    NO_PRODUCER,
    AppendResult,
    Attachment,
    Fence,
    Headers,
    Lease,
    NewRecord,
    ProducerFields,
)

if TYPE_CHECKING:
    from broker.client.client import Client

RETRIABLE: Final = frozenset(
    {
        ErrorCode.CONNECTION_FAILED,
        ErrorCode.SEVERED,
        ErrorCode.STORAGE_BUSY,
        ErrorCode.BROKER_SHUTTING_DOWN,
        ErrorCode.TOO_MANY_REQUESTS,
    }
)
_SESSION_ENDED: Final = frozenset({ErrorCode.CONNECTION_FAILED, ErrorCode.SEVERED})
_LEASE_RETRIABLE: Final = RETRIABLE - {ErrorCode.SEVERED}
_BACKOFF_FIRST_S: Final = 0.02
_BACKOFF_MAX_S: Final = 1.0


class PartitionState(Struct, frozen=True):
    producer_id: int
    generation: int
    sequence: int  # the last acknowledged sequence


class ProducerState(Struct, frozen=True):
    """What a producer needs to resume: save it together with your input offsets."""

    topic: str
    partitions: dict[int, PartitionState] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        rows = [(p, s.producer_id, s.generation, s.sequence) for p, s in self.partitions.items()]
        packed: bytes = msgpack.packb({"topic": self.topic, "partitions": rows})
        return packed

    @classmethod
    def from_bytes(cls, data: bytes) -> ProducerState:
        try:
            raw = msgpack.unpackb(data)
            partitions = {
                int(p): PartitionState(pid, gen, seq) for p, pid, gen, seq in raw["partitions"]
            }
            return cls(str(raw["topic"]), partitions)
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"not a producer state: {exc}") from exc


class ProducerFenced(BrokerError):
    """This producer lost its topic access for good: it can never send again."""

    def __init__(self, error: BrokerError) -> None:
        message = error.message
        if error.code is not ErrorCode.PRODUCER_FENCED:  # its session ended under it
            message = f"this producer lost its topic access: {error.message}"
        super().__init__(ErrorCode.PRODUCER_FENCED, message, **error.details)


class _Partition:
    """One partition's numbering: the lease and the next sequence to hand out."""

    def __init__(self, lease: Lease, next_sequence: int, renew_before_ms: int) -> None:
        self.lease = lease
        self.received = time.monotonic()
        # Renew renew_before_ms before the end, or a tenth of the lease, if that is less.
        margin_ms = min(renew_before_ms, (lease.expire_ms - lease.now_ms) // 10)
        self.renew_at_ms = lease.expire_ms - margin_ms
        self.next_sequence = next_sequence
        self.acknowledged = next_sequence - 1

    def broker_now_ms(self) -> int:
        """The broker's clock, estimated from its answer to the lease and time since."""
        return self.lease.now_ms + int((time.monotonic() - self.received) * 1000)

    def fields(self, count: int) -> ProducerFields:
        first = self.next_sequence
        self.next_sequence += count
        return ProducerFields(self.lease.producer_id, self.lease.generation, first)


@dataclass
class _Batch:
    records: list[NewRecord]
    done: concurrent.futures.Future[Sequence[AppendResult]]
    deadline: float  # time.monotonic() by which it is acknowledged, or failed
    fields: ProducerFields = NO_PRODUCER
    attempt: asyncio.Future[Sequence[AppendResult]] | None = None

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def _undelivered(batch: _Batch, timeout_s: float) -> BrokerError:
    return BrokerError(
        ErrorCode.CONNECTION_FAILED,
        f"a batch of {len(batch.records)} records was not acknowledged within "
        f"delivery_timeout_s ({timeout_s:g} s): it may or may not have been appended",
        hint="the broker did not answer in time (stopped, or unreachable); "
        "a larger delivery_timeout_s waits longer",
    )


Send = Callable[[list[NewRecord], ProducerFields], Awaitable[Sequence[AppendResult]]]


class Producer:
    def __init__(
        self,
        client: Client,
        topic: str,
        *,
        idempotent: bool = True,
        state: ProducerState | None = None,
        max_in_flight: int = 5,
        delivery_timeout_s: float = 30.0,
        renew_before_ms: int = 60_000,
        access: str | None = None,
        name: str | None = None,
        epoch: int | None = None,
        wait_timeout_s: float = 30.0,
        fences: Sequence[Fence] = (),
    ) -> None:
        if max_in_flight < 1:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "max_in_flight must be >= 1")
        if not 0 < delivery_timeout_s < math.inf:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"delivery_timeout_s is a number of seconds > 0, not {delivery_timeout_s!r}",
            )
        if state is not None and state.topic != topic:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT, f"the state is for topic {state.topic}, not {topic}"
            )
        self.client = client
        self.topic = topic
        self.fences = tuple(fences)  # checked by the broker on every batch, resends too
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self.delivery_timeout_s = delivery_timeout_s
        self.renew_before_ms = renew_before_ms
        self.partition_count = client.describe_topic(topic).partitions
        self._partitions: dict[int, _Partition] = {}
        self._queues: dict[int, collections.deque[_Batch]] = {}
        self._pumps: dict[int, concurrent.futures.Future[None]] = {}
        self._pumping = threading.Lock()
        self._running: set[int] = set()
        self._round_robin = 0
        self._fenced: BrokerError | None = None
        if state is not None:
            for partition, saved in state.partitions.items():
                self._resume(partition, saved)
        self.access = access
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self._attachment: Attachment | None = None
        self._closed = False
        if access is not None:
            if wait_timeout_s < 0:
                raise BrokerError(ErrorCode.INVALID_ARGUMENT, "wait_timeout_s must be >= 0")
            self._attachment = client._transport.attach(
                topic, access, self.name, epoch, int(wait_timeout_s * 1000)
            )

    @property
    def epoch(self) -> int | None:
        """The topic epoch this producer holds (exclusive or shared access), else None."""
        return None if self._attachment is None else self._attachment.epoch

    @property
    def attachment_id(self) -> int | None:
        return None if self._attachment is None else self._attachment.attachment_id

    # sending ----------------------------------------------------------------------------

    def send(
        self,
        values: Iterable[bytes | str | NewRecord],
        *,
        partition: int | None = None,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> list[AppendResult]:
        """Send and wait: results in the order of `values`."""
        futures = self._submit(values, partition, key, headers)
        results: dict[int, AppendResult] = {}
        for indexes, future in futures.values():
            results.update(zip(indexes, future.result(), strict=True))
        return [results[i] for i in sorted(results)]

    def send_async(
        self,
        values: Iterable[bytes | str | NewRecord],
        *,
        partition: int,
        key: bytes | str | None = None,
        headers: Headers = (),
    ) -> concurrent.futures.Future[Sequence[AppendResult]]:
        """Queue one batch for one partition; keeps up to max_in_flight in flight."""
        futures = self._submit(values, partition, key, headers)
        ((_, future),) = futures.values()
        return future

    def flush(self) -> None:
        """Wait until every batch sent so far is acknowledged or failed."""
        for pump in list(self._pumps.values()):
            pump.result()

    def close(self) -> None:
        """Wait for what is in flight, then give up the topic access (if any)."""
        self._closed = True
        try:
            self.flush()
        finally:
            attached, self._attachment = self._attachment, None
            if attached is not None and self._fenced is None:
                with contextlib.suppress(BrokerError):
                    self.client._transport.detach(self.topic, attached.attachment_id)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def state(self) -> ProducerState:
        """(pid, generation, acknowledged sequence) of every partition sent to."""
        return ProducerState(
            self.topic,
            {
                p: PartitionState(s.lease.producer_id, s.lease.generation, s.acknowledged)
                for p, s in self._partitions.items()
            },
        )

    def _submit(
        self,
        values: Iterable[bytes | str | NewRecord],
        partition: int | None,
        key: bytes | str | None,
        headers: Headers,
    ) -> dict[int, tuple[list[int], concurrent.futures.Future[Sequence[AppendResult]]]]:
        if self._fenced is not None:
            raise self._fenced
        if self._closed:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "this producer is closed")
        by_partition: dict[int, list[tuple[int, NewRecord]]] = {}
        for index, value in enumerate(values):
            record = self._record(value, partition, key, headers)
            by_partition.setdefault(record.partition or 0, []).append((index, record))
        if not by_partition:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "nothing to send: no values")
        submitted = {}
        for target, items in by_partition.items():
            records = [record for _, record in items]
            record_rules.check_records(records, self.client.limits)
            done: concurrent.futures.Future[Sequence[AppendResult]] = concurrent.futures.Future()
            self._enqueue(target, _Batch(records, done, time.monotonic() + self.delivery_timeout_s))
            submitted[target] = ([index for index, _ in items], done)
        return submitted

    def _record(
        self,
        value: bytes | str | NewRecord,
        partition: int | None,
        key: bytes | str | None,
        headers: Headers,
    ) -> NewRecord:
        if isinstance(value, NewRecord):
            record = value
        else:
            data = value.encode() if isinstance(value, str) else value
            raw_key = key.encode() if isinstance(key, str) else key
            record = NewRecord(data, raw_key, headers, partition)
        if record.partition is None:
            chosen = record_rules.choose_partition(
                record.key, self.partition_count, self._round_robin
            )
            self._round_robin += record.key is None
            record = NewRecord(
                record.value, record.key, record.headers, chosen, record.timestamp_ms
            )
        record_rules.check_partition(self.topic, record.partition or 0, self.partition_count)
        return record

    # the pipeline -------------------------------------------------------------------------

    def _enqueue(self, partition: int, batch: _Batch) -> None:
        with self._pumping:  # a pump that is about to exit sees this batch, or none runs
            queue = self._queues.setdefault(partition, collections.deque())
            queue.append(batch)
            start = partition not in self._running
            if start:
                self._running.add(partition)
        if start:
            self._pumps[partition] = self._start_pump(partition)

    def _start_pump(self, partition: int) -> concurrent.futures.Future[None]:
        runner = getattr(self.client._transport, "run_async", None)
        if runner is None:  # embedded: one batch at a time, in the caller's thread
            self._pump_sync(partition)
            finished: concurrent.futures.Future[None] = concurrent.futures.Future()
            finished.set_result(None)
            return finished
        result: concurrent.futures.Future[None] = runner(self._pump(partition))
        return result

    def _pump_may_exit(self, partition: int, queue: collections.deque[_Batch]) -> bool:
        with self._pumping:
            if queue:
                return False
            self._running.discard(partition)
            return True

    def _pump_sync(self, partition: int) -> None:
        queue = self._queues[partition]
        while not self._pump_may_exit(partition, queue):
            batch = queue.popleft()
            try:
                state = self._partition_for(partition)
                batch.fields = state.fields(len(batch.records)) if self.idempotent else NO_PRODUCER
                results = self._retry_sync(batch)
            except BrokerError as error:
                self._fail(partition, batch, error)
                continue
            except BaseException as error:  # a bug or an interrupt: not this batch's answer
                self._stop_pump(partition, [batch], error)
                raise
            self._acknowledge(partition, batch, results)

    def _stop_pump(self, partition: int, batches: Sequence[_Batch], error: BaseException) -> None:
        """A pump ended by an exception that is no broker's answer: its batches and
        every one queued behind them fail with it (outcome unknown), and the partition
        takes new batches again, numbered by a new pid."""
        failed = BrokerError(
            ErrorCode.INTERNAL,
            f"the producer stopped on {type(error).__name__}: {error}; this batch may or "
            "may not have been appended",
        )
        with self._pumping:
            queue = self._queues.get(partition, collections.deque())
            doomed = [*batches, *queue]
            queue.clear()
            self._running.discard(partition)
        self._partitions.pop(partition, None)
        for each in doomed:
            if not each.done.done():
                each.done.set_exception(failed)

    def _retry_sync(self, batch: _Batch) -> Sequence[AppendResult]:
        deadline = batch.deadline
        delay = _BACKOFF_FIRST_S
        while True:
            try:
                return self.client._transport.produce(
                    self.topic,
                    batch.records,
                    producer=batch.fields,
                    fences=self.fences,
                    attachment=self.attachment_id,
                )
            except BrokerError as error:
                if not self._may_retry(error) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)

    async def _pump(self, partition: int) -> None:
        """Send this partition's queue with up to max_in_flight batches outstanding."""
        inflight: collections.deque[_Batch] = collections.deque()
        try:
            await self._pump_inflight(partition, inflight)
        except BaseException as error:  # a bug, or the loop going away: fail, never hang
            self._stop_pump(partition, list(inflight), error)
            raise

    async def _pump_inflight(self, partition: int, inflight: collections.deque[_Batch]) -> None:
        queue = self._queues[partition]
        send = self._async_send()
        while inflight or not self._pump_may_exit(partition, queue):
            while (
                queue
                and len(inflight) < self.max_in_flight
                # renewal due: let the old pid's batches finish, then lease a new one
                and not (inflight and self._needs_lease(partition))
            ):
                batch = queue.popleft()
                try:
                    if self._needs_lease(partition) and not inflight:
                        state = await asyncio.to_thread(self._partition_for, partition)
                    else:
                        state = self._partition_for(partition, may_lease=False)
                except BrokerError as error:
                    self._fail(partition, batch, error)
                    continue
                batch.fields = state.fields(len(batch.records)) if self.idempotent else NO_PRODUCER
                batch.attempt = asyncio.ensure_future(send(batch.records, batch.fields))
                batch.attempt.add_done_callback(_retrieved)
                inflight.append(batch)
            if not inflight:
                continue
            oldest = inflight[0]
            assert oldest.attempt is not None
            try:
                results = await self._within_deadline(oldest, oldest.attempt)
            except _Expired:
                self._expire(partition, inflight)
                continue
            except BrokerError as error:
                if not self._may_retry(error):
                    inflight.popleft()
                    self._fail(partition, oldest, error)
                    self._fail_all(partition, inflight, error)
                    continue
                await self._resend_in_order(partition, inflight, send)
                continue
            inflight.popleft()
            self._acknowledge(partition, oldest, results)

    async def _resend_in_order(
        self, partition: int, inflight: collections.deque[_Batch], send: Send
    ) -> None:
        """Let every in-flight batch finish, then resend the unacknowledged ones in order."""
        settled = asyncio.gather(
            *(b.attempt for b in inflight if b.attempt), return_exceptions=True
        )
        await asyncio.wait([settled], timeout=inflight[0].remaining_s())
        while inflight:
            batch = inflight[0]
            assert batch.attempt is not None
            if batch.attempt.done() and batch.attempt.exception() is None:
                inflight.popleft()
                self._acknowledge(partition, batch, batch.attempt.result())
                continue
            delay = _BACKOFF_FIRST_S
            while True:
                if batch.remaining_s() <= 0:
                    self._expire(partition, inflight)
                    return
                attempt = asyncio.ensure_future(send(batch.records, batch.fields))
                attempt.add_done_callback(_retrieved)
                try:
                    results = await self._within_deadline(batch, attempt)
                    break
                except _Expired:
                    self._expire(partition, inflight)
                    return
                except BrokerError as error:
                    if not self._may_retry(error) or time.monotonic() + delay > batch.deadline:
                        inflight.popleft()
                        self._fail(partition, batch, error)
                        self._fail_all(partition, inflight, error)
                        return
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
            inflight.popleft()
            self._acknowledge(partition, batch, results)

    async def _within_deadline(
        self, batch: _Batch, attempt: asyncio.Future[Sequence[AppendResult]]
    ) -> Sequence[AppendResult]:
        """The attempt's results; _Expired once the batch's delivery deadline passes
        first (the attempt goes on, its outcome unknown and unheard)."""
        if attempt.done():
            return attempt.result()
        try:
            return await asyncio.wait_for(asyncio.shield(attempt), batch.remaining_s())
        except TimeoutError:
            raise _Expired from None

    def _expire(self, partition: int, inflight: collections.deque[_Batch]) -> None:
        """The oldest batch's delivery deadline passed with its outcome unknown: it and
        every later batch in flight fail (they wait on the same broker), and the
        partition's numbering starts again with a new pid, so that the batches still
        queued are not refused as out of order behind a batch that may never have
        landed."""
        error = _undelivered(inflight[0], self.delivery_timeout_s)
        while inflight:
            self._fail(partition, inflight.popleft(), error)
        self._partitions.pop(partition, None)

    def _async_send(self) -> Send:
        client = self.client._transport.client  # type: ignore[attr-defined]
        topic, attachment, fences = self.topic, self.attachment_id, self.fences

        async def send(records: list[NewRecord], fields: ProducerFields) -> Sequence[AppendResult]:
            results: Sequence[AppendResult] = await client.produce(
                topic, records, producer=fields, fences=fences, attachment=attachment
            )
            return results

        return send

    # outcomes -----------------------------------------------------------------------------

    def _may_retry(self, error: BrokerError) -> bool:
        if error.details.get("client_closed"):
            return False  # closed here (close() from another thread): no retry reaches it
        if self._attachment is not None and error.code in _SESSION_ENDED:
            return False  # the attachment went with the session: a retry is fenced
        return self.idempotent and error.code in RETRIABLE

    def _acknowledge(self, partition: int, batch: _Batch, results: Sequence[AppendResult]) -> None:
        state = self._partitions.get(partition)
        if state is not None and batch.fields.producer_id:
            last = batch.fields.first_sequence + len(batch.records) - 1
            state.acknowledged = max(state.acknowledged, last)
        if not batch.done.done():
            batch.done.set_result(results)

    def _fail(self, partition: int, batch: _Batch, error: BrokerError) -> None:
        if error.code is ErrorCode.PRODUCER_FENCED or (
            self._attachment is not None and error.code in _SESSION_ENDED
        ):
            # An attachment belongs to its session: when the session ends, so does access.
            error = ProducerFenced(error)
        if error.code in (
            ErrorCode.FENCED,
            ErrorCode.INVALID_GENERATION,
            ErrorCode.PRODUCER_FENCED,
        ):
            self._fenced = error
        if batch.fields.producer_id and error.code not in RETRIABLE:
            # sequences already handed out past this batch are void: start a new pid
            self._partitions.pop(partition, None)
        if not batch.done.done():
            batch.done.set_exception(error)

    def _fail_all(
        self, partition: int, batches: collections.deque[_Batch], error: BrokerError
    ) -> None:
        while batches:
            self._fail(partition, batches.popleft(), error)
        queue = self._queues.get(partition, collections.deque())
        while queue:
            self._fail(partition, queue.popleft(), error)

    # leases -------------------------------------------------------------------------------

    def _needs_lease(self, partition: int) -> bool:
        state = self._partitions.get(partition)
        if state is None:
            return self.idempotent
        clock = getattr(self.client._transport, "broker_now_ms", None)  # embedded: exact
        now_ms = clock() if clock is not None else state.broker_now_ms()
        return self.idempotent and now_ms >= state.renew_at_ms

    def _partition_for(self, partition: int, *, may_lease: bool = True) -> _Partition:
        """The partition's numbering; a new pid when due and allowed (never with batches
        of the old pid still in flight: they keep its sequences)."""
        state = self._partitions.get(partition)
        if self.idempotent and may_lease and (state is None or self._needs_lease(partition)):
            lease = self._lease(partition)
            state = _Partition(lease, 1, self.renew_before_ms)
            self._partitions[partition] = state
        if state is None:
            assert not self.idempotent
            return _Partition(Lease(0, 0, 0, 0, 0), 1, 0)
        return state

    def _lease(self, partition: int) -> Lease:
        """A new pid, leased again after a failure without a decision (the connection
        lost, storage busy) until the delivery timeout: a lease whose answer was lost
        only leaves an unused pid behind."""
        deadline = time.monotonic() + self.delivery_timeout_s
        delay = _BACKOFF_FIRST_S
        while True:
            try:
                return self.client.lease_pid(self.topic, partition)
            except BrokerError as error:
                if (
                    error.code not in _LEASE_RETRIABLE
                    or error.details.get("client_closed")
                    or time.monotonic() + delay > deadline
                ):
                    raise
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)

    def _resume(self, partition: int, saved: PartitionState) -> None:
        lease = self.client.lease_pid(self.topic, partition, saved.producer_id)
        # One generation above the broker's: the instance this state came from is fenced
        # from our first new record on; replays of what it wrote answer as duplicates.
        resumed = Lease(
            lease.producer_id, lease.generation + 1, saved.sequence, lease.expire_ms, lease.now_ms
        )
        self._partitions[partition] = _Partition(resumed, saved.sequence + 1, self.renew_before_ms)


class _Expired(Exception):
    """A batch's delivery deadline passed while an attempt was in flight."""


def _retrieved(attempt: asyncio.Future[Sequence[AppendResult]]) -> None:
    """An attempt's outcome is read by the pump, or dropped once its batch failed."""
    if not attempt.cancelled():
        attempt.exception()
