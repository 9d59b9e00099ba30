"""The Python client: one interface whether the broker is embedded or served.

    from broker.client import connect
    with connect("./.fencelog") as client:          # a data directory: embedded
        client.create_topic("orders", partitions=4)
        client.produce("orders", [b"a", b"b"], key=b"k")
        for record in client.consume("orders", partition=0, start=0, max_records=100):
            ...

`connect()` picks the transport from the target: tcp:// or unix:// reaches `fencelog
serve`; a path opens the data directory in this process (several processes may share
it) or, while a server owns that directory, goes through the server. The consume loop,
batching and argument checks live here once; a transport only supplies the primitive
operations (`_Transport`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import importlib
import operator
import os
import re
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, ParamSpec, Protocol, TypeVar, cast

from broker.client import arguments
from broker.core import records as record_rules
from broker.discovery import find_server
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.protocol import codec, ops
from broker.protocol.ops import Operation
from broker.rows import AuditRow, GroupOffsetRow, Row, SnapshotRow
from broker.types import (
    NO_PRODUCER,
    AccessInfo,
    AppendResult,
    AppendResults,
    Attachment,
    BrokerStatus,
    Claimed,
    Clock,
    Durability,
    Fence,
    Headers,
    KafkaGroup,
    Lease,
    NewRecord,
    OwnershipInfo,
    ProducerEntry,
    ProducerFields,
    Record,
    RecordColumns,
    ResultColumns,
    SessionInfo,
    TopicConfig,
    TopicInfo,
    TxnDetail,
    TxnInfo,
    TxnMember,
    check_durability,
)

if TYPE_CHECKING:  # imported when used: a one-shot embedded command needs neither
    from types import ModuleType

    import pyarrow as pa

    from broker.client.producer import Producer, ProducerState
    from broker.client.transaction import Transaction

DEFAULT_BROKER: Final = "./.fencelog"
# Where a read starts: every chosen partition at the beginning, the end or an offset, or a
# next offset per partition (every chosen partition must have one).
Start = int | Literal["beginning", "end"] | Mapping[int, int]
Value = bytes | str | NewRecord | None  # None: a null value (Kafka's tombstone)
P = ParamSpec("P")
R = TypeVar("R")


class _Transport(Protocol):
    limits: Limits
    validates_records: bool  # True: the engine behind it checks records itself, here
    served: bool  # True: a server answers

    def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
        attachment: int | None = None,
    ) -> Sequence[AppendResult]: ...
    def produce_columns(
        self,
        topic: str,
        records: RecordColumns,
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
    ) -> ResultColumns: ...
    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> list[Record]: ...
    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        fences: Sequence[Fence],
    ) -> list[Row]: ...
    def fetch_ahead(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> Callable[[], list[Record]]: ...
    def session_id(self) -> str: ...
    def on_severed(self, callback: Callable[[str], None]) -> None: ...
    def own(self, group: str, claims: Sequence[tuple[str, int]]) -> list[Claimed]: ...
    def release(
        self, group: str, resources: Sequence[str] | None, any_holder: bool
    ) -> list[str]: ...
    def ownership(self, group: str | None) -> list[OwnershipInfo]: ...
    def ownership_history(self, group: str | None, limit: int) -> list[AuditRow]: ...
    def backup(self, path: str) -> int: ...
    def kafka_groups(self) -> list[KafkaGroup] | None: ...
    def attach(
        self, topic: str, access: str, name: str, epoch: int | None, wait_ms: int
    ) -> Attachment: ...
    def detach(self, topic: str, attachment_id: int) -> None: ...
    def call(self, entry: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...
    def close(self) -> None: ...


class Client:
    """A connection to one broker. Use it as a context manager, or call close()."""

    def __init__(self, transport: _Transport, target: str) -> None:
        self._transport = transport
        self.target = target
        self.limits = transport.limits
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()  # closed with it

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the producers made from this client first, as Producer.close() does
        (each batch in flight is acknowledged or fails, within its delivery timeout),
        then the connection. Once closed, a call is CONNECTION_FAILED."""
        try:
            for producer in list(self._producers):
                with contextlib.suppress(BrokerError):  # each batch's future tells
                    producer.close()
        finally:
            self._transport.close()

    @property
    def served(self) -> bool:
        """True when a server answers (an address, or a directory a server owns)."""
        return self._transport.served

    # topics -------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        owner_group: str | None = None,
        config: TopicConfig | None = None,
        if_not_exists: bool = False,
    ) -> TopicInfo:
        """A new topic; config: its retention and cleanup (TopicConfig), None for none.
        if_not_exists: a topic of that name already there is no error; it is described
        as it is (its partitions and config are left as they are), as `topic create
        --if-not-exists` does."""
        arguments.integer("partitions", partitions)
        try:
            return self._transport.call(
                ops.CREATE_TOPIC, name, partitions, owner_group=owner_group, config=config
            )
        except BrokerError as error:
            if not (if_not_exists and error.code is ErrorCode.TOPIC_EXISTS):
                raise
        return self.describe_topic(name)

    def alter_topic(
        self, name: str, *, partitions: int | None = None, config: TopicConfig | None = None
    ) -> TopicInfo:
        """More partitions (never fewer), and/or a new retention and cleanup (the whole
        TopicConfig: what it leaves None is no limit)."""
        arguments.integer("partitions", partitions, optional=True)
        return self._transport.call(ops.ALTER_TOPIC, name, partitions=partitions, config=config)

    def clean_topic(self, topic: str) -> int:
        """Apply the topic's retention and compaction now; the records deleted."""
        return self._transport.call(ops.CLEAN_TOPIC, topic)

    def delete_topic(self, name: str) -> None:
        self._transport.call(ops.DELETE_TOPIC, name)

    def list_topics(self) -> list[TopicInfo]:
        return self._transport.call(ops.LIST_TOPICS)

    def describe_topic(self, name: str) -> TopicInfo:
        return self._transport.call(ops.DESCRIBE_TOPIC, name)

    def end_offsets(self, topic: str) -> list[int]:
        return [p.end_offset for p in self.describe_topic(topic).partition_details]

    def status(self) -> BrokerStatus:
        return self._transport.call(ops.STATUS)

    # produce ------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        values: Iterable[Value],
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers = (),
        producer: ProducerFields = NO_PRODUCER,
        fences: Sequence[Fence] = (),
        txn: int | None = None,
    ) -> AppendResults:
        """Append values (bytes, str, None for a null value, or NewRecord for per-record
        keys and partitions).

        `key`, `partition` and `headers` apply to every value given as bytes or str.
        Each batch of up to append_records_max records and append_bytes_max bytes is one
        atomic append; results come back in the order of `values`. `fences` (e.g.
        `claimed.fence`) must be current, or the append fails with FENCED and nothing is
        written. With `txn` (a transaction id) the records are journaled into that
        transaction instead: offset -1 each, and no reader sees them until it commits.
        """
        if txn is not None:
            producer = producer._replace(txn_id=txn)
        fences = arguments.fences_of(fences)
        parts: list[Sequence[AppendResult]] = []
        for batch in self._batches(values, key, partition, headers):
            try:
                parts.append(
                    self._transport.produce(topic, batch, producer=producer, fences=fences)
                )
            except (TypeError, ValueError, AttributeError) as exc:  # embedded
                raise arguments.bad_record(batch) or exc from None
            except BrokerError as error:  # served: the server found a field's type wrong
                if error.code is not ErrorCode.PROTOCOL_ERROR:
                    raise
                raise arguments.bad_record(batch) or error from None
            producer = _numbered_on(producer, len(batch))
        return AppendResults.joined(topic, parts)

    def produce_arrow(
        self,
        topic: str,
        batch: pa.RecordBatch | pa.Table,
        *,
        producer: ProducerFields = NO_PRODUCER,
        fences: Sequence[Fence] = (),
        txn: int | None = None,
    ) -> pa.RecordBatch:
        """Append an Arrow batch's rows, column by column (this client makes no Python
        object per row). The batch has a `value` column (binary or string, no nulls) and
        may have `key` (binary or string; null: no key) and `partition` (integers; null:
        the broker chooses); any other column is refused. Batches are split and appended as
        produce() does, with the same `producer`, `fences` and `txn`. The results, one
        row per record in order: partition (int32), offset (int64; -1 in a
        transaction) and duplicate (bool). Needs pyarrow: install fencelog[spark]."""
        columnar = columnar_module("produce_arrow")
        if not isinstance(batch, columnar.pa.RecordBatch | columnar.pa.Table):
            raise arguments.refused(
                f"produce_arrow takes a pyarrow RecordBatch or Table, not {type(batch).__name__}"
            )
        fences = arguments.fences_of(fences)
        if txn is not None:
            producer = producer._replace(txn_id=txn)
        parts = []
        for records in self._batches(columnar.record_columns(batch), None, None, ()):
            parts.append(  # a RecordColumns' batches are RecordColumns (its slices)
                self._transport.produce_columns(
                    topic, cast(RecordColumns, records), producer=producer, fences=fences
                )
            )
            producer = _numbered_on(producer, len(records))
        results: pa.RecordBatch = columnar.results_to_arrow(parts)
        return results

    def _batches(
        self,
        values: Iterable[Value] | RecordColumns,
        key: bytes | str | None,
        partition: int | None,
        headers: Headers,
    ) -> Iterator[Sequence[NewRecord]]:
        """values as records (RecordColumns: as they are), in batches the broker takes
        in one append."""
        records: Sequence[NewRecord]
        if isinstance(values, RecordColumns):
            records = values
        else:
            default_key = None if key is None else arguments.as_bytes(key, "key")
            arguments.integer("partition", partition, optional=True)
            records = arguments.new_records(
                values, default_key, arguments.headers_of(headers), partition
            )
        try:
            batches = record_rules.split_batches(records, self.limits)
        except (TypeError, ValueError, AttributeError) as exc:
            raise arguments.bad_record(records) or exc from None
        for batch in batches:
            if not self._transport.validates_records:
                # The engine's own check, against the limits the broker announced: a batch
                # too large for it fails here as it would embedded, never as a frame error.
                try:
                    record_rules.check_records(batch, self.limits)
                except (TypeError, ValueError, AttributeError) as exc:
                    raise arguments.bad_record(batch) or exc from None
            yield batch

    # consume ------------------------------------------------------------------------

    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        *,
        max_records: int | None = None,
        wait_ms: int = 0,
        fences: Sequence[Fence] = (),
    ) -> list[Record]:
        """One fetch from several partitions ({partition: next offset}); waits up to
        wait_ms for a record when none is there yet (at most the broker's
        fetch_wait_ms_max, 30 s by default, embedded as served: then it answers [])."""
        positions, fences = arguments.positions_of(positions), arguments.fences_of(fences)
        arguments.count("wait_ms", wait_ms)
        arguments.count("max_records", max_records, optional=True)
        if max_records == 0:
            return []
        limit = self._page(max_records)
        return self._transport.fetch(topic, positions, limit, wait_ms, fences)

    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        *,
        max_records: int | None = None,
        fences: Sequence[Fence] = (),
    ) -> list[Row]:
        """fetch() without waiting, as stored rows instead of Records: (partition,
        offset, timestamp_ms, key, value, headers as msgpack, producer_id, generation,
        sequence, epoch, txn_id). For bulk readers that turn pages into columns (the
        Spark connector); `broker.storage.logs.records_of(topic, rows)` makes Records."""
        positions, fences = arguments.positions_of(positions), arguments.fences_of(fences)
        arguments.count("max_records", max_records, optional=True)
        if max_records == 0:
            return []
        limit = self._page(max_records)
        return self._transport.fetch_rows(topic, positions, limit, fences)

    def fetch_arrow(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int | None = None,
        fences: Sequence[Fence] = (),
    ) -> pa.RecordBatch:
        """fetch_rows() of one partition as one Arrow record batch (the columns of
        broker.columnar.ARROW_SCHEMA; no rows: nothing from that offset yet).
        Embedded, SQLite builds the columns without a Python object per record; a
        transport without a columnar fetch (a served broker, for now) fetches rows and
        converts them here. Needs pyarrow: install fencelog[spark]."""
        columnar = columnar_module()
        if max_records == 0:
            return columnar.empty_batch()
        limit = self._page(max_records)
        fetch_arrow: Callable[..., pa.RecordBatch] | None = getattr(
            self._transport, "fetch_arrow", None
        )
        if fetch_arrow is None:
            rows = self._transport.fetch_rows(topic, {partition: offset}, limit, fences)
            return columnar.rows_to_arrow(topic, rows)
        return fetch_arrow(topic, partition, offset, limit, fences)

    def arrow_pages(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        page_records: int | None = None,
        fences: Sequence[Fence] = (),
    ) -> Generator[pa.RecordBatch, None, None]:
        """The records of offsets [start, end) of one partition as Arrow record batches,
        page by page (fetch_arrow). Served, the next page is asked for as soon as this
        one arrives, so the broker reads it while the caller handles this one. A
        partition that ends before `end` is UNKNOWN_PARTITION."""
        ahead: Callable[..., Callable[[], pa.RecordBatch]] | None = getattr(
            self._transport, "fetch_arrow_ahead", None
        )

        def limit(at: int) -> int:
            return min(page_records or end - at, end - at)

        position = start
        next_page: Callable[[], pa.RecordBatch] | None = None  # the page from position
        while position < end:
            if next_page is None:
                batch = self.fetch_arrow(
                    topic, partition, position, max_records=limit(position), fences=fences
                )
            else:
                batch, next_page = next_page(), None
            if batch.num_rows == 0:
                raise BrokerError(
                    ErrorCode.UNKNOWN_PARTITION,
                    f"{topic}/{partition} ends before offset {position}: "
                    "was the topic deleted and created again?",
                    topic=topic,
                    partition=partition,
                )
            position = batch.column("offset")[-1].as_py() + 1
            if ahead is not None and position < end:
                page = self._page(limit(position))
                next_page = ahead(topic, partition, position, page, fences)
            yield batch

    def positions(
        self, topic: str, partitions: int | Sequence[int] | None, start: Start
    ) -> dict[int, int]:
        """The starting offset of each partition to read, from a partition choice and a
        start: "beginning", "end", an offset (applied to every chosen partition), or a
        mapping of partition to offset."""
        info = self.describe_topic(topic)
        if partitions is None:
            chosen: Sequence[int] = range(info.partitions)
        elif isinstance(partitions, int):
            chosen = [partitions]
        else:
            chosen = partitions
        ends = {p.partition: p.end_offset for p in info.partition_details}
        starts = {p.partition: p.start_offset for p in info.partition_details}
        positions = {}
        for partition in chosen:
            if partition not in ends:
                raise BrokerError(
                    ErrorCode.UNKNOWN_PARTITION,
                    f"topic {topic} has partitions 0..{info.partitions - 1}; "
                    f"there is no partition {partition}",
                    topic=topic,
                    partition=partition,
                )
            if isinstance(start, Mapping):
                if partition not in start:
                    raise BrokerError(
                        ErrorCode.INVALID_ARGUMENT, f"no start offset for partition {partition}"
                    )
                positions[partition] = _start_offset(
                    start[partition], starts[partition], ends[partition]
                )
            else:
                positions[partition] = _start_offset(start, starts[partition], ends[partition])
        return positions

    def consume(
        self,
        topic: str,
        *,
        partition: int | Sequence[int] | None = None,
        start: Start = "beginning",
        max_records: int | None = None,
        follow: bool = False,
        timeout_s: float | None = None,
        poll_ms: int = 1_000,
        fences: Sequence[Fence] = (),
    ) -> Iterator[Record]:
        """Records from `start`, partition by partition in fetch order.

        Without `follow` it stops at the end offsets as they were when it started (a
        bounded read); with `follow` it waits for new records until `max_records` have been
        read or `timeout_s` passes with nothing new (None: forever). Following every
        partition (`partition` None), it also reads the partitions added meanwhile, each
        from its beginning; a topic deleted and created again under it is UNKNOWN_TOPIC.
        """
        for batch in self.consume_batches(
            topic,
            partition=partition,
            start=start,
            max_records=max_records,
            follow=follow,
            timeout_s=timeout_s,
            poll_ms=poll_ms,
            fences=fences,
        ):
            yield from batch

    def consume_batches(
        self,
        topic: str,
        *,
        partition: int | Sequence[int] | None = None,
        start: Start = "beginning",
        max_records: int | None = None,
        follow: bool = False,
        timeout_s: float | None = None,
        poll_ms: int = 1_000,
        fences: Sequence[Fence] = (),
    ) -> Iterator[list[Record]]:
        """consume()'s records as the fetches return them, a non-empty list each: a
        consumer that commits offsets commits once a batch is handled."""
        arguments.count("max_records", max_records, optional=True)
        fences = arguments.fences_of(fences)
        positions = self.positions(topic, partition, start)
        if fences:  # a stale fence fails even when there is nothing to read
            self.fetch(topic, {}, max_records=1, fences=fences)
        stop_at = None if follow else self.end_offsets(topic)
        if stop_at is not None:
            positions = {p: o for p, o in positions.items() if o < stop_at[p]}
        remaining = max_records
        idle_deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ahead = _FetchesAhead(self, topic, fences)
        # Followed, the topic is described after each batch and each empty wait: one
        # deleted and created again starts its offsets again (an error), and partitions
        # added by `topic alter` are read from their beginning, as a Kafka consumer of
        # the whole topic reads them.
        watch = _Followed(self, topic, every_partition=partition is None) if follow else None
        while positions and remaining != 0:
            try:
                batch = ahead.take(positions, remaining, _wait_ms(follow, poll_ms, idle_deadline))
            except BrokerError as error:
                if watch is None or error.code is not ErrorCode.UNKNOWN_TOPIC:
                    raise
                raise watch.gone() from None
            if watch is not None:
                positions.update(watch.added(batch=bool(batch)))
            taken = _within_ends(batch, stop_at)[:remaining]
            _advance(positions, taken)
            if stop_at is not None:
                positions = {p: o for p, o in positions.items() if o < stop_at[p]}
            if remaining is not None:
                remaining -= len(taken)
            if batch:
                idle_deadline = None if timeout_s is None else time.monotonic() + timeout_s
            elif not follow or (idle_deadline is not None and time.monotonic() >= idle_deadline):
                return
            if taken and positions and remaining != 0:
                ahead.prepare(positions, remaining, len(batch), stop_at)
            if taken:
                yield taken

    def _page(self, max_records: int | None) -> int:
        """The most records one fetch asks for (None: as many as the broker gives)."""
        return min(max_records or self.limits.read_records_max, self.limits.read_records_max)

    def _fetch_ahead(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int | None,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> Callable[[], list[Record]]:
        """A fetch begun now, whose records the returned call gives (embedded: the fetch
        runs at that call; there is nothing to overlap with in one process)."""
        limit = self._page(max_records)
        return self._transport.fetch_ahead(topic, positions, limit, wait_ms, fences)

    # idempotent producers and offsets -------------------------------------------------

    def producer(
        self,
        topic: str,
        *,
        idempotent: bool = True,
        state: ProducerState | bytes | None = None,
        max_in_flight: int = 5,
        delivery_timeout_s: float = 30.0,
        access: str | None = None,
        name: str | None = None,
        epoch: int | None = None,
        wait_timeout_s: float = 30.0,
        fences: Sequence[Fence] = (),
    ) -> Producer:
        """A producer to topic: idempotent by default (see broker.client.producer).

        fences: the ownership fences (claimed.fence) every batch carries, resends
        included: the broker refuses each batch once one of them is stale (FENCED), so
        an owner that lost its claim never writes again.

        access: None (plain writes), "shared", "exclusive" or "wait-exclusive" (blocks
        up to wait_timeout_s until promoted). `epoch`: the epoch a previous exclusive
        producer held, to re-attach without bumping it.
        """
        from broker.client.producer import Producer, ProducerState

        if isinstance(state, bytes):
            state = ProducerState.from_bytes(state)
        made = Producer(
            self,
            topic,
            idempotent=idempotent,
            state=state,
            max_in_flight=max_in_flight,
            delivery_timeout_s=delivery_timeout_s,
            access=access,
            name=name,
            epoch=epoch,
            wait_timeout_s=wait_timeout_s,
            fences=fences,
        )
        self._producers.add(made)
        return made

    def topic_access(self, topic: str) -> AccessInfo:
        """A topic's epoch, its exclusive producer, shared producers and waiters."""
        return self._transport.call(ops.TOPIC_ACCESS, topic)

    def read_compacted(self, topic: str, partition: int | None = None) -> list[Record]:
        """The newest record of every key (all partitions, or one), in offset order."""
        partitions = (
            range(self.describe_topic(topic).partitions) if partition is None else [partition]
        )
        return [r for p in partitions for r in self._transport.call(ops.READ_COMPACTED, topic, p)]

    def lease_pid(self, topic: str, partition: int, pid: int | None = None) -> Lease:
        """A new producer id for (topic, partition), or an existing pid's state there."""
        arguments.integer("partition", partition)
        arguments.integer("pid", pid, optional=True)
        return self._transport.call(ops.LEASE_PID, topic, partition, pid)

    def producer_states(self, topic: str) -> list[tuple[int, ProducerEntry]]:
        """(partition, state) of every producer id the broker holds for topic."""
        return self._transport.call(ops.PRODUCERS, topic)

    def snapshot_producers(self) -> int:
        """Store a producer-state snapshot with its offset vector; its id."""
        return self._transport.call(ops.PRODUCER_SNAPSHOT)

    def producer_snapshots(self) -> list[SnapshotRow]:
        return self._transport.call(ops.PRODUCER_SNAPSHOTS)

    def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        *,
        producer: Producer | ProducerState | None = None,
        metadata: str | None = None,
    ) -> None:
        """Store a consumer group's next offsets, with a producer's state to resume and
        a metadata text for each partition (as a Kafka consumer's commit carries; None:
        none), which committed_metadata() and a Kafka OffsetFetch answer."""
        self._transport.call(
            ops.COMMIT_OFFSETS, group, topic, dict(offsets), _state_blob(producer), metadata
        )

    def committed_offsets(
        self, group: str, topic: str
    ) -> tuple[dict[int, int], ProducerState | None]:
        """The group's next offsets per partition, and the producer state stored last."""
        from broker.client.producer import ProducerState

        rows = self._transport.call(ops.COMMITTED_OFFSETS, group, topic)
        newest = max(rows, key=lambda r: r.committed_ms, default=None)
        state = None
        if newest is not None and newest.producer_state is not None:
            state = ProducerState.from_bytes(newest.producer_state)
        return {r.partition: r.next_offset for r in rows}, state

    def committed_metadata(self, group: str, topic: str) -> dict[int, str | None]:
        """The metadata committed with the group's offset of each partition (None: none),
        by this client's commit_offsets or a Kafka consumer's commit."""
        rows = self._transport.call(ops.COMMITTED_OFFSETS, group, topic)
        return {r.partition: r.metadata for r in rows}

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The offset of the first record of a partition at or after timestamp_ms,
        whatever the order of its timestamps (as Kafka's offsets_for_times), or None
        when every record is older."""
        found = self._transport.call(ops.OFFSET_FOR_TIME, topic, partition, timestamp_ms)
        return None if found is None else found[0]

    def consumer_groups(self, *, limit: int = 10_000) -> list[GroupOffsetRow]:
        """Every consumer group's next offset on each partition it committed, by group,
        topic and partition (at most limit rows); a partition's lag is its end offset
        minus that."""
        if limit < 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"limit must be >= 0, not {limit}")
        return self._transport.call(ops.CONSUMER_GROUPS, limit)

    def kafka_groups(self) -> list[KafkaGroup] | None:
        """The consumer groups live on the server's Kafka listener, with their state
        and members (soft state, not in the data directory); [] without a Kafka
        listener, None from a server too old to say."""
        return self._transport.kafka_groups()

    def backup(self, path: str | os.PathLike[str]) -> int:
        """Write a consistent one-file copy of the whole broker; its size in bytes."""
        return self._transport.backup(os.fspath(path))

    # transactions -------------------------------------------------------------------

    def transaction(
        self, group: str, *, key: str | None = None, timeout_ms: int | None = None
    ) -> Transaction:
        """A transaction of group; use it in a with-block (commit on exit, abort on an
        exception). It begins in the broker with its first produce, in the same request
        (as Kafka's beginTransaction is local): its timeout counts from there. With a
        key, a transaction already begun under that key (open or committed) is found
        again instead, at once: `existing` is then True on its info."""
        from broker.client.transaction import Transaction

        if key is None:
            return Transaction(self, None, group=group, timeout_ms=timeout_ms)
        return Transaction(self, self.txn_begin(group, key=key, timeout_ms=timeout_ms))

    def join_transaction(self, txn_id: int, member: str) -> Transaction:
        """Write into another process's transaction as a named member. Joining again
        under the same name (a retried task) discards that member's earlier records."""
        from broker.client.transaction import Transaction

        joined = self.txn_join(txn_id, member)
        info = self.txn_show(txn_id, records_max=0).info
        return Transaction(self, info, joined, owner=False)

    def txn_begin(
        self, group: str, *, key: str | None = None, timeout_ms: int | None = None
    ) -> TxnInfo:
        """BEGIN in the group's journal; the new (or, with key, found) transaction."""
        return self._transport.call(ops.TXN_BEGIN, group, key, timeout_ms)

    def txn_begin_produce(
        self,
        group: str,
        topic: str,
        values: Iterable[Value],
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers = (),
        fences: Sequence[Fence] = (),
        timeout_ms: int | None = None,
    ) -> tuple[TxnInfo, AppendResults]:
        """Begin a transaction of group with these records as its first: the BEGIN and
        the first batch are one request and one write, so a failed first batch begins
        nothing. The new transaction and the records' results (offsets -1), as
        produce(..., txn=) gives them."""
        batches = self._batches(values, key, partition, headers)
        first = next(batches, ())
        if not first:
            return self.txn_begin(group, timeout_ms=timeout_ms), AppendResults(topic)
        info, results = self._transport.call(
            ops.TXN_BEGIN_PRODUCE, group, topic, first, timeout_ms, fences
        )
        producer = ProducerFields(txn_id=info.txn_id)
        parts = [results]
        for batch in batches:
            parts.append(self._transport.produce(topic, batch, producer=producer, fences=fences))
        return info, AppendResults.joined(topic, parts)

    def txn_begin_produce_arrow(
        self,
        group: str,
        topic: str,
        batch: pa.RecordBatch | pa.Table,
        *,
        fences: Sequence[Fence] = (),
        timeout_ms: int | None = None,
    ) -> tuple[TxnInfo, pa.RecordBatch]:
        """txn_begin_produce() of an Arrow batch's rows (produce_arrow's columns and
        results): the batch is checked before anything begins."""
        columnar = columnar_module("produce_arrow")
        records = columnar.record_columns(batch)
        info, results = self.txn_begin_produce(
            group, topic, records, fences=fences, timeout_ms=timeout_ms
        )
        arrow: pa.RecordBatch = columnar.results_to_arrow([codec.result_columns(results)])
        return info, arrow

    def txn_join(self, txn_id: int, member: str) -> TxnMember:
        return self._transport.call(ops.TXN_JOIN, txn_id, member)

    def txn_commit(
        self,
        txn_id: int,
        *,
        group: str | None = None,
        members: Mapping[str, int] | None = None,
    ) -> TxnInfo:
        """Commit: PREPARE_COMMIT made durable, then every record copied into its log.
        Committing twice answers the commit again; an aborted one is TXN_ABORTED.
        `members` ({member: generation}) commits only those members' records, as of
        those generations (a coordinator names the attempts that succeeded)."""
        return self._transport.call(ops.TXN_COMMIT, txn_id, group, members)

    def txn_abort(self, txn_id: int, *, group: str | None = None) -> TxnInfo:
        return self._transport.call(ops.TXN_ABORT, txn_id, group)

    def txn_keepalive(self, txn_id: int, timeout_ms: int, *, group: str | None = None) -> TxnInfo:
        """Move an open transaction's deadline to timeout_ms from now: a job that needs
        longer than the timeout it began with calls this while it works."""
        return self._transport.call(ops.TXN_KEEPALIVE, txn_id, group, timeout_ms)

    def txn_list(self, *, include_ended: bool = False, limit: int = 100) -> list[TxnInfo]:
        """Open and committing transactions (with include_ended, the newest of all)."""
        if limit < 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"limit must be >= 0, not {limit}")
        return self._transport.call(ops.TXN_LIST, include_ended, limit)

    def txn_show(self, txn_id: int, *, records_max: int | None = None) -> TxnDetail:
        """A transaction, its journal entries and the records still in its data journals."""
        if records_max is not None and records_max < 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "records_max must be >= 0")
        return self._transport.call(ops.TXN_SHOW, txn_id, records_max)

    def txn_commit_offsets(
        self,
        txn_id: int,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        *,
        producer: Producer | ProducerState | None = None,
    ) -> None:
        """Consumer offsets (and a producer's state) that take effect at the commit."""
        self._transport.call(
            ops.TXN_COMMIT_OFFSETS, txn_id, group, topic, dict(offsets), _state_blob(producer)
        )

    # ownership ----------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """This client's session: a connection (served) or this process (embedded)."""
        return self._transport.session_id()

    def own(
        self, group: str, resources: Mapping[str, int] | Iterable[str], *, generation: int = 1
    ) -> list[Claimed]:
        """Claim resources of a group, all or none (OWNED_BY_HIGHER_GENERATION).

        `resources` maps each resource to its generation, or names resources that all get
        `generation`. Generation 0 resets (always granted, audited). A claim severs an
        older holder; see DESIGN.md section 3.
        """
        if isinstance(resources, Mapping):
            claims = list(resources.items())
        else:
            claims = [(resource, generation) for resource in resources]
        return self._transport.own(group, claims)

    def release(
        self, group: str, resources: Sequence[str] | None = None, *, any_holder: bool = False
    ) -> list[str]:
        """Release this session's claims in group (all of them, or the named ones).

        any_holder=True is an operator's release: a resource held by another session is
        freed by severing that session (UNKNOWN_GROUP, NOT_HELD when there is nothing).
        """
        return self._transport.release(group, resources, any_holder)

    def sessions(self, *, limit: int = 10_000) -> list[SessionInfo]:
        """The sessions the broker knows (at most limit): a server's open connections,
        and the processes that opened the data directory and claimed something, each
        with whether it is live now."""
        if limit < 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"limit must be >= 0, not {limit}")
        return self._transport.call(ops.SESSIONS, limit)

    def ownership(self, group: str | None = None) -> list[OwnershipInfo]:
        """Every (group, resource): generation, holder and whether it is live."""
        return self._transport.ownership(group)

    def ownership_history(self, group: str | None = None, limit: int = 100) -> list[AuditRow]:
        """The newest audit rows: claims, refusals, severings, resets, releases."""
        return self._transport.ownership_history(group, limit)

    def on_severed(self, callback: Callable[[str], None]) -> None:
        """Call callback(reason), from a background thread, when this session is severed."""
        self._transport.on_severed(callback)

    @contextlib.contextmanager
    def holding(
        self, group: str, resources: Mapping[str, int] | Iterable[str], *, generation: int = 1
    ) -> Iterator[list[Claimed]]:
        """Hold a claim for the body of a with-block; released on the way out."""
        claimed = self.own(group, resources, generation=generation)
        try:
            yield claimed
        finally:
            with contextlib.suppress(BrokerError):
                self.release(group, [c.resource for c in claimed])


def _numbered_on(producer: ProducerFields, count: int) -> ProducerFields:
    """The producer fields of the append after one of `count` records: an idempotent
    producer's sequences go on where that append's ended (sent with the same first
    sequence, it was a duplicate of the first, and its records were never written).
    Sequence 0 numbers nothing (a transaction member's records): it stays."""
    if producer.producer_id and producer.first_sequence:
        return producer._replace(first_sequence=producer.first_sequence + count)
    return producer


def _state_blob(producer: Producer | ProducerState | None) -> bytes | None:
    if producer is None:
        return None
    from broker.client.producer import Producer

    state = producer.state() if isinstance(producer, Producer) else producer
    return state.to_bytes()


class _FetchesAhead:
    """A consumer's fetches, begun before they are needed (served: the broker reads the
    next page while the caller handles this one). Each is for exact positions; one
    whose positions turn out not to be the next is dropped. Reading one partition, a
    full page is taken to mean another full page follows, so two are kept ahead. They
    never wait for new records: a consumer that stops leaves nothing long-polling in
    front of its next request."""

    def __init__(self, client: Client, topic: str, fences: Sequence[Fence]) -> None:
        self._client, self._topic, self._fences = client, topic, fences
        self._queue: collections.deque[tuple[dict[int, int], Callable[[], list[Record]]]] = (
            collections.deque()
        )

    def _begin(self, positions: dict[int, int], remaining: int | None, wait_ms: int) -> None:
        fetch = self._client._fetch_ahead(
            self._topic, dict(positions), remaining, wait_ms, self._fences
        )
        self._queue.append((dict(positions), fetch))

    def take(self, positions: dict[int, int], remaining: int | None, wait_ms: int) -> list[Record]:
        while self._queue and self._queue[0][0] != positions:
            self._queue.popleft()  # a wrong guess: its reply is dropped
        if self._queue:
            batch = self._queue.popleft()[1]()
            if batch:
                return batch
            # "Nothing yet", answered before the caller asked: ask again now, waiting as
            # the caller wants, so a following consume sees what came since.
            self._queue.clear()
        self._begin(positions, remaining, wait_ms)
        return self._queue.popleft()[1]()

    def prepare(
        self,
        positions: dict[int, int],
        remaining: int | None,
        last_page: int,
        stop_at: list[int] | None,
    ) -> None:
        if not self._queue or self._queue[0][0] != positions:
            self._queue.clear()
            self._begin(positions, remaining, 0)
        page = self._client._page(remaining)
        if len(positions) != 1 or len(self._queue) > 1 or last_page != page:
            return
        ((partition, offset),) = positions.items()
        guess = {partition: offset + page}
        after = None if remaining is None else remaining - page
        if after != 0 and (stop_at is None or guess[partition] < stop_at[partition]):
            self._begin(guess, after, 0)


class _Followed:
    """The topic a consumer follows, described again as it goes."""

    def __init__(self, client: Client, topic: str, *, every_partition: bool) -> None:
        self._client, self._topic, self._every_partition = client, topic, every_partition
        described = client.describe_topic(topic)
        self._created_ms, self._partitions = described.created_ms, described.partitions

    def gone(self) -> BrokerError:
        """The error of a followed topic that a fetch no longer finds: deleted (and
        perhaps created again) while it was followed."""
        return BrokerError(
            ErrorCode.UNKNOWN_TOPIC,
            f"topic {self._topic} was deleted while it was followed",
            topic=self._topic,
            hint="create it again and follow it from its beginning",
        )

    def added(self, *, batch: bool) -> dict[int, int]:
        """The start of each partition added since the last look (every partition
        followed; none otherwise). A topic deleted and created again is UNKNOWN_TOPIC.
        Described after a batch, and after an empty wait when every partition is
        followed (there is nothing else to notice otherwise)."""
        if not batch and not self._every_partition:
            return {}
        described = self._client.describe_topic(self._topic)
        if described.created_ms != self._created_ms:
            raise BrokerError(
                ErrorCode.UNKNOWN_TOPIC,
                f"topic {self._topic} was deleted and created again while it was followed: "
                "its offsets started again",
                topic=self._topic,
                hint="follow it again, from its beginning",
            )
        if not self._every_partition or described.partitions <= self._partitions:
            return {}
        added = range(self._partitions, described.partitions)
        self._partitions = described.partitions
        return {p: described.partition_details[p].start_offset for p in added}


def _within_ends(batch: list[Record], stop_at: list[int] | None) -> list[Record]:
    if stop_at is None or not batch:
        return batch
    first, last = batch[0], batch[-1]
    if first.partition == last.partition:  # one partition's records, offsets ascending
        if last.offset < stop_at[last.partition]:
            return batch
        stop = stop_at[last.partition]
        return batch[: bisect.bisect_left(batch, stop, key=_OFFSET)]
    return [r for r in batch if r.offset < stop_at[r.partition]]


def _advance(positions: dict[int, int], taken: list[Record]) -> None:
    """Each partition's position past its last record taken."""
    if taken and taken[0].partition == taken[-1].partition:
        positions[taken[-1].partition] = taken[-1].offset + 1
        return
    for record in taken:
        positions[record.partition] = record.offset + 1


_OFFSET = operator.itemgetter(2)  # a Record's offset


def _wait_ms(follow: bool, poll_ms: int, idle_deadline: float | None) -> int:
    if not follow:
        return 0
    if idle_deadline is None:
        return poll_ms
    return max(0, min(poll_ms, int((idle_deadline - time.monotonic()) * 1000)))


def _start_offset(start: Start, log_start: int, end_offset: int) -> int:
    if start == "beginning":
        return log_start
    if start == "end":
        return end_offset
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return start
    raise BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        f"start must be 'beginning', 'end' or an offset >= 0, not {start!r}",
    )


def columnar_module(method: str = "fetch_arrow") -> ModuleType:
    """broker.columnar, or a clear error where pyarrow is not installed."""
    try:
        columnar = importlib.import_module("broker.columnar")
    except ImportError as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{method} needs pyarrow, which this Python cannot import ({exc})",
            hint="install fencelog's spark extra: pip install 'fencelog[spark]'",
        ) from exc
    return columnar


def connect(
    target: str | os.PathLike[str] | None = None,
    *,
    durability: Durability = "full",
    limits: Limits = DEFAULT_LIMITS,
    clock: Clock | None = None,
    token: str | None = None,
    create: bool = True,
    request_timeout_s: float = DEFAULT_LIMITS.request_timeout_ms / 1000,
    connect_timeout_s: float = DEFAULT_LIMITS.connect_timeout_ms / 1000,
) -> Client:
    """Connect to a broker.

    target: tcp://HOST:PORT (or HOST:PORT) or unix://PATH reaches a served broker; a
    data directory path opens it embedded in this process, unless a `fencelog serve`
    owns it, in which case the connection goes through that server. None means
    $FENCELOG_BROKER, or ./.fencelog. A directory that does not exist is created, or
    with create=False refused (DATA_DIR_MISSING). `durability`, `limits` and `clock`
    apply to an embedded open only; `request_timeout_s` to a served one: a request
    without a reply by then (its own wait added for a long poll) closes the connection
    as lost (CONNECTION_FAILED, outcome unknown), which the idempotent producer retries
    within its delivery timeout. `connect_timeout_s` bounds the retries of a refused
    connection (a server may be starting: 5 s by default, at most the request timeout;
    the CLI's `--connect-timeout` is 0.5 s); a connection that cannot succeed by
    waiting (an unknown host, a refused token) fails at once.
    """
    durability = check_durability(durability)
    name = os.fspath(target) if target is not None else None
    name = name or os.environ.get("FENCELOG_BROKER") or DEFAULT_BROKER
    url = address_of(name)
    if url is None:
        path = Path(name)
        server = find_server(path) if path.is_dir() else None
        if server is None:
            if not create and not path.exists():
                raise BrokerError(
                    ErrorCode.DATA_DIR_MISSING,
                    f"data directory {name} does not exist",
                    path=name,
                    hint="check --broker or FENCELOG_BROKER; topic create, produce, "
                    "own, txn-begin, serve and snapshot restore create a new one",
                )
            # the engine is imported only for an embedded open (a served client needs none)
            from broker.client.embedded import EmbeddedTransport

            return Client(EmbeddedTransport.open(path, durability, limits, clock), name)
        url = server.url()
    # asyncio and the served transport cost an embedded open (a one-shot CLI
    # command) about 60 ms to import: only here, when served.
    from broker.client.served import Address, ServedTransport

    transport = ServedTransport(
        Address.parse(url),
        token=token,
        request_timeout_s=request_timeout_s,
        # connecting (its retries while the port refuses) waits no longer than a request
        connect_timeout_s=min(connect_timeout_s, request_timeout_s),
    )
    return Client(transport, name)


# HOST:PORT without a scheme: a name, an IPv4 address or a bracketed IPv6 one, and digits.
_HOST_PORT: Final = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*)):[0-9]{1,5}")
_SCHEMES: Final = ("tcp", "unix")


def address_of(target: str) -> str | None:
    """The broker URL that target names, or None when it is a data directory path.

    tcp://HOST:PORT and unix://PATH are addresses, and so is a bare HOST:PORT (the form
    `fencelog serve --listen` takes), never a directory of that name: write ./NAME for
    one. Any other scheme is an error rather than a path."""
    scheme, separator, _ = target.partition("://")
    if separator:
        if scheme not in _SCHEMES:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{target!r}: unknown scheme {scheme + '://'!r}",
                hint="use tcp://HOST:PORT, unix://PATH, or a data directory path",
            )
        return target
    if _HOST_PORT.fullmatch(target):
        return f"tcp://{target}"
    return None
