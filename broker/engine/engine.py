"""The one place where broker/core's decisions meet storage.

Every operation follows the same shape: validate the input (core), open one SQLite
transaction, load what the decision needs, decide (core), write, COMMIT, and only then
answer. A failed operation rolls back and leaves nothing behind. The engine holds no
state that another process sharing the data directory could make stale: what it needs it
reads inside the transaction, except what the WriteCache (write_cache.py) knows for
certain nobody else has changed (the topic rows, log ends and epochs produces read).
"""

from __future__ import annotations

import functools
import operator
import os
import shlex
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar, cast

from broker import rows
from broker.core import ownership as ownership_rules
from broker.core import producers as producer_rules
from broker.core import records as record_rules
from broker.core import txn as txn_rules
from broker.core.producers import Batch, Verdict
from broker.engine.exclusive_access import Exclusives
from broker.engine.ownership import Heartbeats, Owners
from broker.engine.producer_table import ProducerTable, Staged, write_snapshot
from broker.engine.transactions import Transactions
from broker.engine.write_cache import WriteCache
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, INT64_MAX, Limits
from broker.storage import logs, pages, timestamps
from broker.storage import producers as producer_store
from broker.storage import txns as txn_store
from broker.storage.database import SCHEMA_VERSION, Database
from broker.types import (
    NO_OFFSET_METADATA,
    NO_PRODUCER,
    Access,
    AccessInfo,
    AppendResult,
    AppendResults,
    Attachment,
    BrokerStatus,
    Clock,
    Durability,
    Fence,
    Lease,
    NewRecord,
    OffsetMetadata,
    ProducerEntry,
    ProducerFields,
    Record,
    SessionInfo,
    TopicConfig,
    TopicInfo,
    TxnDetail,
    TxnInfo,
    TxnMember,
    any_unnamed,
    check_durability,
    keys_of,
    partitions_of,
    value_size,
    value_sizes,
)

if TYPE_CHECKING:  # pyarrow comes with the spark extra; fetch_arrow imports it
    import pyarrow as pa

    from broker.engine.cleaner import Cleaner, Step
    from broker.engine.kafka_producers import KafkaProducers
    from broker.engine.sessions import Pulse

T = TypeVar("T")


class ProduceRequest(NamedTuple):
    """One produce request of a group commit (a NamedTuple: one is built per request)."""

    topic: str
    records: Sequence[NewRecord]
    producer: ProducerFields = NO_PRODUCER
    fences: Sequence[Fence] = ()
    attachment: int | None = None  # an exclusive or shared producer's attachment
    # a Kafka producer's: a new generation restarts sequences; bounded as Kafka bounds it
    kafka_epochs: bool = False


ProduceOutcome = Sequence[AppendResult] | BrokerError
_ROW_KEY = operator.itemgetter(rows.ROW_KEY)
_ROW_VALUE = operator.itemgetter(rows.ROW_VALUE)
_KEY = operator.itemgetter(1)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Engine:
    """A data directory opened in this process."""

    def __init__(self, database: Database, limits: Limits, clock: Clock) -> None:
        self.database = database
        self.limits = limits
        self.clock = clock
        self._round_robin = int.from_bytes(os.urandom(4)) >> 2  # spreading: 30 random bits
        self.owners = Owners(database, limits, clock, served_sessions=tuple)
        self.producers = ProducerTable(limits)
        self._hot = WriteCache(database)
        self.exclusives = Exclusives(database, self.owners, clock)
        self.producers.defer(self._load_producers)
        self.txns = Transactions(
            database, limits, clock, self.producers, self.owners, self.exclusives
        )
        # finish every commit a killed broker had prepared; which ones, for the log
        self.recovered = self.txns.recover()

    def _load_producers(self) -> None:
        """The producer table's deferred load: inside the transaction already open on
        this connection, if any (a first use during a write), else in a read of its own."""
        conn = self.database.conn
        if conn.in_transaction:
            self.producers.load(conn)
            return
        with self.database.read() as reading:
            self.producers.load(reading)

    # Made when first used: a one-shot CLI command needs neither (nor their imports).

    @functools.cached_property
    def kafka(self) -> KafkaProducers:
        from broker.engine.kafka_producers import KafkaProducers

        return KafkaProducers(self.database, self.producers, self.txns, self.limits, self.clock)

    @functools.cached_property
    def cleaner(self) -> Cleaner:
        from broker.engine.cleaner import Cleaner

        return Cleaner(
            self.database, self.producers, self.limits, self.clock, self.snapshot_producers
        )

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        durability: Durability = "full",
        limits: Limits = DEFAULT_LIMITS,
        clock: Clock = wall_clock_ms,
    ) -> Engine:
        database = Database.open(Path(path), check_durability(durability), limits.busy_timeout_ms)
        try:
            return cls(database, limits, clock)
        except BaseException:  # a bad FENCELOG_FAILPOINT, or a recovery that failed
            database.close()
            raise

    def close(self) -> None:
        self.database.close()

    def heartbeats(self) -> Heartbeats:
        """Heartbeats for this process's session on a connection of their own, so that a
        beat never waits behind this engine's writes (the heartbeat thread's)."""
        database = Database.open(
            self.database.data_dir.path, self.database.durability, self.limits.busy_timeout_ms
        )
        return Heartbeats(Owners(database, self.limits, self.clock, served_sessions=tuple))

    def pulse(self, session_id: str) -> Pulse:
        """The pulse of this process's session (engine/sessions.py): beaten by a thread
        of the caller's, never waiting for SQLite's lock."""
        from broker.engine.sessions import Pulse

        return Pulse(
            self.database.data_dir.path, session_id, self.clock, self.limits.session_timeout_ms
        )

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # topics -------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        owner_group: str | None = None,
        config: TopicConfig | None = None,
    ) -> TopicInfo:
        record_rules.check_topic_name(name, self.limits)
        record_rules.check_partition_count(partitions, self.limits)
        if owner_group is not None:
            ownership_rules.check_name("owner group", owner_group)
        if config is not None:
            record_rules.check_topic_config(config)
        with self.database.write() as conn:
            if logs.topic_by_name(conn, name) is not None:
                raise BrokerError(
                    ErrorCode.TOPIC_EXISTS,
                    f"topic {name} already exists",
                    topic=name,
                    hint=f"fencelog topic describe {shlex.quote(name)} shows it; "
                    "topic create --if-not-exists accepts it as it is",
                )
            row = logs.insert_topic(conn, name, partitions, self.clock(), owner_group)
            if config is not None:
                logs.put_topic_config(conn, row.topic_id, config)
            return self._topic_info(conn, row)

    def alter_topic(
        self, name: str, *, partitions: int | None = None, config: TopicConfig | None = None
    ) -> TopicInfo:
        """More partitions (never fewer: keyed records then route by the new count, as in
        Kafka), and/or a new retention and cleanup."""
        if partitions is not None:
            record_rules.check_partition_count(partitions, self.limits)
        if config is not None:
            record_rules.check_topic_config(config)
        with self.database.write() as conn:
            row = self._topic(conn, name)
            if partitions is not None:
                record_rules.check_more_partitions(name, row.partitions, partitions)
                if partitions > row.partitions:
                    logs.add_partitions(conn, row, partitions)
            if config is not None:
                logs.put_topic_config(conn, row.topic_id, config)
            return self._topic_info(conn, self._topic(conn, name))

    def clean_step(self, topic: str, partition: int) -> Step:
        """One bounded step of retention and compaction (broker/engine/cleaner.py)."""
        return self.cleaner.step(topic, partition)

    def clean_topic(self, topic: str) -> int:
        """Clean topic now, every partition to the end; the records deleted."""
        with self.database.read() as conn:
            self._topic(conn, topic)
        return self.cleaner.clean(topic)

    def delete_records_below(self, topic: str, partition: int, offset: int) -> int:
        """Delete partition's records below offset (-1: its end), moving its log start
        there as retention does (Kafka's DeleteRecords); the log start offset after.
        An offset past the end is OFFSET_OUT_OF_RANGE."""
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            end = logs.end_offset(conn, row, partition)
        before = end if offset == -1 else offset
        if not 0 <= before <= end:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{topic}/{partition}: records are deleted below an offset from 0 to the "
                f"end offset {end} (or -1: the end), not {offset}",
                topic=topic,
                partition=partition,
            )
        return self.cleaner.cut_below(topic, partition, before)

    def cleanable(self) -> list[tuple[str, int]]:
        """(topic, partitions) of every topic with a retention or compaction."""
        with self.database.read() as conn:
            return [
                (row.name, row.partitions)
                for row in logs.all_topics(conn)
                if logs.topic_config(conn, row.topic_id) != TopicConfig()
            ]

    def delete_topic(self, name: str) -> None:
        with self.database.write() as conn:
            logs.delete_topic(conn, self._topic(conn, name))

    def data_dir(self) -> Path:
        """The data directory, as an absolute path."""
        return self.database.data_dir.path.resolve()

    def list_topics(self) -> list[TopicInfo]:
        with self.database.read() as conn:
            return [self._topic_info(conn, row) for row in logs.all_topics(conn)]

    def describe_topic(self, name: str) -> TopicInfo:
        with self.database.read() as conn:
            return self._topic_info(conn, self._topic(conn, name))

    def end_offsets(self, topic: str) -> list[int]:
        return [p.end_offset for p in self.describe_topic(topic).partition_details]

    # records ------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields = NO_PRODUCER,
        fences: Sequence[Fence] = (),
        attachment: int | None = None,
        kafka: bool = False,
    ) -> AppendResults:
        """Append records, each to its own or a chosen partition, in one transaction.

        Every fence must be current (else FENCED); a topic with an owner group also needs,
        for each partition P written, the fence of TOPIC/P in that group. Results come
        back in the order of `records`. kafka: a Kafka producer's record batch (its
        bounds and rules: ProduceRequest.kafka_epochs).
        """
        request = ProduceRequest(topic, records, producer, fences, attachment, kafka)
        record_rules.check_records(records, self.limits, kafka=kafka)
        staged = self.producers.stage()
        appends = logs.Appends()
        with self.database.write() as conn:
            self._hot.begin()
            results = self._produce_in(conn, request, staged, appends)
            appends.flush(conn)
        self._hot.kept()
        staged.commit()
        if producer.txn_id is not None:
            self.txns.failpoints.reached("data")
        self._snapshot_when_due()
        return AppendResults.joined(topic, [results])

    def txn_begin_produce(
        self,
        group: str,
        topic: str,
        records: Sequence[NewRecord],
        timeout_ms: int | None = None,
        fences: Sequence[Fence] = (),
    ) -> tuple[TxnInfo, Sequence[AppendResult]]:
        """Begin a transaction of group with its first records, in one write: the BEGIN
        and the journaled records commit together or not at all. (Kafka's
        beginTransaction is local in the same way: a transaction starts with its first
        write.) The new transaction and the records' results, offsets -1."""
        timeout = self.txns.checked(group, timeout_ms)
        record_rules.check_records(records, self.limits)
        staged = self.producers.stage()
        appends = logs.Appends()
        with self.txns.begin_write() as conn:
            self._hot.begin()
            now_ms = self.clock()
            txn_id = self.txns.begin_in(conn, group, None, timeout, now_ms)
            producer = ProducerFields(txn_id=txn_id)
            request = ProduceRequest(topic, records, producer, fences, None)
            results = self._produce_in(conn, request, staged, appends)
            info = self.txns.info(conn, txn_id, now_ms)
        self._hot.kept()
        staged.commit()
        self.txns.begun()
        self.txns.failpoints.reached("data")
        return info, results

    def produce_group(self, requests: Sequence[ProduceRequest]) -> list[ProduceOutcome]:
        """Several produce requests in one transaction (the server's group commit).

        A request that fails leaves nothing and the others still commit; its outcome is
        the BrokerError instead of results. Every check of a plain or idempotent request
        comes before its first write, so only a transactional one (whose journal writes
        interleave with checks) needs a SAVEPOINT to undo.
        """
        outcomes: list[ProduceOutcome] = []
        staged = self.producers.stage()
        appends = logs.Appends()
        with self.database.write() as conn:
            self._hot.begin()
            for request in requests:
                outcomes.append(self._produce_one(conn, request, staged, appends))
            appends.flush(conn)
        self._hot.kept()
        staged.commit()
        if any(request.producer.txn_id is not None for request in requests):
            self.txns.failpoints.reached("data")
        self._snapshot_when_due()
        return outcomes

    def _produce_one(
        self,
        conn: sqlite3.Connection,
        request: ProduceRequest,
        staged: Staged,
        appends: logs.Appends,
    ) -> ProduceOutcome:
        """One request of a group: its results, or the error that left nothing."""
        if request.producer.txn_id is not None:
            appends.flush(conn)
            conn.execute("SAVEPOINT request")
            mark = staged.mark()
            try:
                record_rules.check_records(request.records, self.limits, kafka=request.kafka_epochs)
                outcome: ProduceOutcome = self._produce_in(conn, request, staged, appends)
            except BrokerError as error:
                conn.execute("ROLLBACK TO request")
                staged.restore(mark)
                outcome = error
            conn.execute("RELEASE request")
            return outcome
        changes, held = conn.total_changes, len(appends)
        try:
            record_rules.check_records(request.records, self.limits, kafka=request.kafka_epochs)
            return self._produce_in(conn, request, staged, appends)
        except BrokerError as error:
            if (conn.total_changes, len(appends)) != (changes, held):
                # a check after a write: a bug; undo the whole group
                raise BrokerError(
                    ErrorCode.INTERNAL, f"a produce failed after writing: {error.message}"
                ) from error
            return error

    def _produce_in(
        self,
        conn: sqlite3.Connection,
        request: ProduceRequest,
        staged: Staged,
        appends: logs.Appends,
    ) -> Sequence[AppendResult]:
        topic, records, producer = request.topic, request.records, request.producer
        if producer is not NO_PRODUCER:
            producer_rules.check_stored_range(producer)
        row = self._hot.topic(topic, lambda: self._topic(conn, topic))
        by_partition = self._route(row, records)
        if row.cleanup == "compact":
            record_rules.check_keyed(topic, records)
        if request.fences or row.owner_group is not None:
            self._check_fences(conn, row, by_partition, request.fences)
        epoch = self._write_epoch(conn, row.topic_id, request.attachment)
        if epoch != producer.epoch:  # every record carries the epoch it was written under
            producer = producer._replace(epoch=epoch)
            request = request._replace(producer=producer)
        now_ms = self.clock()
        if producer.txn_id is not None:  # into the data journals, not the log
            return self.txns.journal(
                conn, row, by_partition, records, producer, now_ms, request.fences
            )
        if producer.producer_id:
            return self._produce_idempotent(
                conn, row, by_partition, request, staged, appends, now_ms
            )
        count = len(records)
        partitions: list[int] = [0] * count
        offsets: list[int] = [0] * count
        for partition, indexes in by_partition.items():
            batch = records if len(indexes) == count else [records[i] for i in indexes]
            base_offset = self._hot.end(conn, row, partition)
            appends.add(row.topic_id, partition, base_offset, batch, now_ms, producer)
            end = base_offset + len(batch)
            self._hot.appended(row.topic_id, partition, end)
            staged.advanced(row.topic_id, partition, base_offset, end)
            if len(indexes) == count:
                return appended_results(topic, partition, base_offset, count)
            if isinstance(indexes, range):
                partitions[indexes.start : indexes.stop : indexes.step] = [partition] * len(indexes)
                offsets[indexes.start : indexes.stop : indexes.step] = range(base_offset, end)
            else:
                for index, offset in zip(indexes, range(base_offset, end), strict=True):
                    partitions[index] = partition
                    offsets[index] = offset
        return AppendResults(topic, [(count, partitions, offsets, False)])

    def _write_epoch(self, conn: sqlite3.Connection, topic_id: int, attachment: int | None) -> int:
        """The epoch a write to the topic carries, once exclusivity allows it."""
        if attachment is None and (epoch := self._hot.epoch(topic_id)) is not None:
            return epoch
        epoch, unattached = self.exclusives.check_write(conn, topic_id, attachment)
        if unattached:
            self._hot.unattached(topic_id, epoch)
        return epoch

    def _produce_idempotent(
        self,
        conn: sqlite3.Connection,
        row: logs.TopicRow,
        by_partition: dict[int, Sequence[int]],
        request: ProduceRequest,
        staged: Staged,
        appends: logs.Appends,
        now_ms: int,
    ) -> Sequence[AppendResult]:
        """One partition's batch from an idempotent producer: append or duplicate.

        An append writes only its records (and, for a pid's first batch on the
        partition, its lease row); the producer state is in memory and in the records."""
        producer, records = request.producer, request.records
        count = len(records)
        if len(by_partition) != 1 or any_unnamed(records):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                "an idempotent batch goes to one named partition (sequences are per partition)",
                producer_id=producer.producer_id,
            )
        (partition,) = by_partition
        producer_id, generation, first_sequence = producer[:3]
        topic_id = row.topic_id
        end = self._hot.end(conn, row, partition)
        key = (topic_id, partition, producer_id)
        lease_ms = self.limits.pid_lease_ms
        if not staged.appended_usual(key, generation, first_sequence, count, end, now_ms, lease_ms):
            batch = Batch(producer_id, generation, first_sequence, count)
            entry = staged.entry(conn, key, end)
            if entry is None or not producer_rules.continues(entry, batch, now_ms, lease_ms):
                producer_rules.check_batch_fields(batch)
                judged = entry
                if entry is None:  # never wrote here, or evicted from memory: ask the log
                    entry = judged = self.producers.entry_from_log(
                        conn, topic_id, partition, producer_id
                    )
                    if entry is None:  # its first batch here: judged against the pid as issued
                        judged = self.producers.first_batch(conn, producer_id, now_ms)
                verdict = producer_rules.decide(
                    judged, batch, now_ms, lease_ms, restarts=request.kafka_epochs
                )
                if verdict is _DUPLICATE:
                    assert entry is not None, "only a pid with state has duplicates"
                    return self._duplicates(conn, row, partition, entry, batch, appends)
            if entry is None:
                appends.add_lease(topic_id, partition, producer_id, end, now_ms)
            staged.appended(key, entry, batch, end, now_ms)
        appends.add(topic_id, partition, end, records, now_ms, producer)
        self._hot.appended(topic_id, partition, end + count)
        return appended_results(row.name, partition, end, count)

    def _duplicates(
        self,
        conn: sqlite3.Connection,
        row: logs.TopicRow,
        partition: int,
        entry: ProducerEntry,
        batch: Batch,
        appends: logs.Appends,
    ) -> Sequence[AppendResult]:
        """The original offsets of a batch that is already in the log, found in the
        records (a duplicate is the rare path: it pays for a search so that an append
        keeps nothing in memory but the pid's state)."""
        appends.flush(conn)  # the original may be earlier in this transaction
        offsets = self.producers.original_offsets(conn, row.topic_id, partition, entry, batch)
        return [AppendResult(row.name, partition, offset, duplicate=True) for offset in offsets]

    # producers ----------------------------------------------------------------------

    def lease_pid(self, topic: str, partition: int, producer_id: int | None = None) -> Lease:
        """A new pid for (topic, partition), or an existing pid's state there."""
        if producer_id is not None and not 0 < producer_id <= INT64_MAX:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "producer ids are 1..2^63-1")
        staged = self.producers.stage()
        with self.database.write() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            staged.catch_up(conn, row.topic_id, partition, logs.end_offset(conn, row, partition))
            lease = self.producers.lease(
                conn, staged, row.topic_id, partition, producer_id, self.clock()
            )
        staged.commit()
        return lease

    def producer_states(self, topic: str) -> list[tuple[int, ProducerEntry]]:
        """(partition, state) of every producer the table holds for topic."""
        staged = self.producers.stage()
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            for partition in range(row.partitions):
                end = logs.end_offset(conn, row, partition)
                staged.catch_up(conn, row.topic_id, partition, end)
        staged.commit()
        return sorted(
            self.producers.entries_of(row.topic_id), key=lambda item: (item[0], item[1].producer_id)
        )

    def snapshot_producers(self) -> int:
        """Store the producer table with its offset vector; the snapshot's id."""
        return write_snapshot(self.database, self.producers, self.clock, self._catch_up_all)

    def backup(self, out: str | Path) -> int:
        """A consistent one-file copy of the whole broker, taken online; its bytes."""
        from broker.engine import backup

        return backup.take(self.database.conn, Path(out))

    def producer_snapshots(self) -> list[rows.SnapshotRow]:
        with self.database.read() as conn:
            return producer_store.snapshots(conn)

    def _catch_up_all(self, conn: sqlite3.Connection, staged: Staged) -> None:
        rows = logs.all_topics(conn)
        self.producers.retain_topics({row.topic_id for row in rows})
        for row in rows:
            for partition in range(row.partitions):
                end = logs.end_offset(conn, row, partition)
                staged.catch_up(conn, row.topic_id, partition, end)

    def _snapshot_when_due(self) -> None:
        if self.producers.records_since_snapshot >= self.limits.producer_snapshot_every_records:
            self.snapshot_producers()

    # consumer offsets ---------------------------------------------------------------

    def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        producer_state: bytes | None = None,
        metadata: str | None = None,
    ) -> None:
        """Store a consumer group's next offsets, with the producer state to resume and
        a metadata text for every partition (None: none)."""
        details = {partition: OffsetMetadata(metadata) for partition in offsets}
        self.commit_offset_details(group, topic, offsets, details, producer_state)

    def commit_offset_details(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        details: Mapping[int, OffsetMetadata],
        producer_state: bytes | None = None,
    ) -> None:
        """commit_offsets() with each partition's own metadata and leader epoch (a
        Kafka consumer's OffsetCommit); a partition details lacks has none."""
        with self.database.write() as conn:
            row = self._offsets_topic(conn, group, topic, offsets, details)
            now_ms = self.clock()
            for partition, offset in offsets.items():
                detail = details.get(partition, NO_OFFSET_METADATA)
                producer_store.commit_offset(
                    conn, group, row.topic_id, partition, offset, producer_state, now_ms, detail
                )
            if producer_state is not None:
                producer_store.set_group_state(conn, group, row.topic_id, producer_state)

    def txn_commit_offsets(
        self,
        txn_id: int,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        producer_state: bytes | None = None,
    ) -> None:
        """Consumer offsets that take effect when transaction txn_id commits."""
        self.txn_commit_offset_details(txn_id, group, topic, offsets, {}, producer_state)

    def txn_commit_offset_details(
        self,
        txn_id: int,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        details: Mapping[int, OffsetMetadata],
        producer_state: bytes | None = None,
    ) -> None:
        """txn_commit_offsets() with each partition's metadata and leader epoch (a Kafka
        producer's TxnOffsetCommit)."""
        with self.database.write() as conn:
            row = self._offsets_topic(conn, group, topic, offsets, details)
            self.txns.add_offsets(
                conn, txn_id, group, row.topic_id, offsets, producer_state, details
            )

    def _offsets_topic(
        self,
        conn: sqlite3.Connection,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        details: Mapping[int, OffsetMetadata],
    ) -> logs.TopicRow:
        """The topic of an offset commit, once the group, partitions, offsets and
        metadata are valid."""
        ownership_rules.check_name("consumer group", group)
        row = self._topic(conn, topic)
        for partition, offset in offsets.items():
            record_rules.check_partition(topic, partition, row.partitions)
            if offset < 0:
                raise BrokerError(ErrorCode.INVALID_ARGUMENT, "offsets are >= 0")
        for detail in details.values():
            record_rules.check_offset_metadata(detail.metadata, self.limits)
        return row

    def delete_group(self, group: str) -> int:
        """Forget a consumer group's committed offsets (Kafka's DeleteGroups); how many
        there were (0: no such group)."""
        ownership_rules.check_name("consumer group", group)
        with self.database.write() as conn:
            return producer_store.delete_group_offsets(conn, group)

    def delete_offsets(self, group: str, topic: str, partitions: Sequence[int]) -> None:
        """Forget a consumer group's committed offsets of some partitions of topic
        (Kafka's OffsetDelete)."""
        ownership_rules.check_name("consumer group", group)
        with self.database.write() as conn:
            row = self._topic(conn, topic)
            for partition in partitions:
                record_rules.check_partition(topic, partition, row.partitions)
                producer_store.delete_offset(conn, group, row.topic_id, partition)

    def committed_offsets(self, group: str, topic: str) -> list[rows.OffsetRow]:
        ownership_rules.check_name("consumer group", group)
        with self.database.read() as conn:
            return producer_store.offsets_of(conn, group, self._topic(conn, topic).topic_id)

    def pending_offsets(self, group: str, topic: str) -> list[int]:
        """The partitions of topic whose offsets for group an open or prepared
        transaction holds: committed_offsets() of them changes when it ends (Kafka's
        OffsetFetch require_stable asks about them)."""
        ownership_rules.check_name("consumer group", group)
        with self.database.read() as conn:
            topic_id = self._topic(conn, topic).topic_id
            held = txn_store.pending_offsets(conn, group, topic_id)
        now_ms = self.clock()
        return sorted(
            {
                p
                for p, state, deadline in held
                if txn_rules.holds_pending_offsets(state, deadline, now_ms)
            }
        )

    def consumer_groups(self, limit: int = 10_000) -> list[rows.GroupOffsetRow]:
        """Every consumer group's next offsets, by group, topic and partition (at most
        limit rows): what lag is measured against."""
        _check_limit(limit)
        with self.database.read() as conn:
            return producer_store.all_group_offsets(conn, limit)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int | None = None,
    ) -> list[Record]:
        """Records of one partition from `offset`, at most max_records and about
        read_bytes_max bytes (always at least one record when there is one)."""
        return self.fetch(topic, {partition: offset}, max_records)

    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int | None,
        fences: Sequence[Fence] = (),
    ) -> list[Record]:
        """Records from several partitions ({partition: next offset}), partition by
        partition, at most max_records in all (and about read_bytes_max bytes from each
        partition). Every fence must be current."""
        chunks = self.fetch_pages(topic, positions, max_records, fences)
        return rows.records_of_chunks(topic, chunks)

    def fetch_pages(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int | None,
        fences: Sequence[Fence] = (),
    ) -> list[rows.Chunk]:
        """fetch() as pages (broker/storage/pages.py), one per partition read; a
        partition SQLite cannot page is given as its rows."""
        bytes_max = self.limits.read_bytes_max

        def page(
            conn: sqlite3.Connection, row: logs.TopicRow, partition: int, offset: int, limit: int
        ) -> tuple[rows.Chunk, int]:
            found = pages.read_page(conn, row, partition, offset, limit, bytes_max)
            if found is None:
                rows = _within_bytes(logs.read_rows(conn, row, partition, offset, limit), bytes_max)
                return rows, len(rows)
            return found, found.record_count

        return self._read_partitions(topic, positions, max_records, fences, page)

    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int | None,
        fences: Sequence[Fence] = (),
    ) -> list[rows.Row]:
        """fetch() as stored rows, for whoever sends or converts them without Records."""
        bytes_max = self.limits.read_bytes_max

        def stored_rows(
            conn: sqlite3.Connection, row: logs.TopicRow, partition: int, offset: int, limit: int
        ) -> tuple[list[rows.Row], int]:
            found = _within_bytes(logs.read_rows(conn, row, partition, offset, limit), bytes_max)
            return found, len(found)

        chunks = self._read_partitions(topic, positions, max_records, fences, stored_rows)
        return [row for chunk in chunks for row in chunk]

    def _read_partitions(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int | None,
        fences: Sequence[Fence],
        read: Callable[[sqlite3.Connection, logs.TopicRow, int, int, int], tuple[T, int]],
    ) -> list[T]:
        """read(conn, topic, partition, offset, records left) -> (what it read, records),
        partition by partition in one snapshot, until max_records have been read; every
        fence checked first."""
        limit = _bounded(max_records, self.limits.read_records_max)
        found: list[T] = []
        taken = 0
        with self.database.read() as conn:
            if fences:
                self.owners.check_fences(conn, fences)
            row = self._topic(conn, topic)
            for partition, offset in positions.items():
                record_rules.check_partition(topic, partition, row.partitions)
                record_rules.check_offset(offset)
                if offset < (start := logs.start_offset(conn, row, partition)):
                    raise _below_start(topic, partition, offset, start)
                chunk, count = read(conn, row, partition, offset, limit - taken)
                if count:
                    found.append(chunk)
                    taken += count
                if taken >= limit:
                    break
        return found

    def fetch_kafka_page(
        self, topic: str, partition: int, offset: int, max_records: int, bytes_max: int
    ) -> rows.Page | None:
        """The page of up to max_records records from offset within bytes_max of keys
        and values (at least one): the stored columns a Kafka record batch is encoded
        from without a row per record. None: the partition's records from there are
        read as rows (fetch_kafka_rows), as where compaction left gaps."""
        limit = _bounded(max_records, self.limits.read_records_max)
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            record_rules.check_offset(offset)
            return pages.read_page(conn, row, partition, offset, limit, max(0, bytes_max))

    def fetch_kafka_rows(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[rows.KafkaRow]:
        """(offset, timestamp_ms, key, value, stored headers) of up to max_records
        records from offset: what the Kafka listener puts in a record batch."""
        limit = _bounded(max_records, self.limits.read_records_max)
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            record_rules.check_offset(offset)
            return logs.read_kafka_rows(conn, row, partition, offset, limit)

    def fetch_arrow(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int | None,
        fences: Sequence[Fence] = (),
    ) -> pa.RecordBatch:
        """fetch_rows() of one partition as an Arrow record batch
        (broker/columnar.py ARROW_SCHEMA), built by SQLite without a Python
        object per record; no rows past the end. Needs pyarrow (the spark extra)."""
        from broker import columnar  # pyarrow: only for columnar readers

        chunks = self.fetch_pages(topic, {partition: offset}, max_records, fences)
        return columnar.chunks_to_arrow(topic, chunks)

    # transactions -------------------------------------------------------------------

    def txn_begin(
        self, group: str, key: str | None = None, timeout_ms: int | None = None
    ) -> TxnInfo:
        return self.txns.begin(group, key, timeout_ms)

    def txn_join(self, txn_id: int, member: str) -> TxnMember:
        return self.txns.join(txn_id, member)

    def txn_commit(
        self, txn_id: int, group: str | None = None, members: Mapping[str, int] | None = None
    ) -> TxnInfo:
        return self.txns.commit(txn_id, group, members)

    def txn_abort(self, txn_id: int, group: str | None = None) -> TxnInfo:
        return self.txns.abort(txn_id, group)

    def txn_keepalive(self, txn_id: int, group: str | None, timeout_ms: int) -> TxnInfo:
        return self.txns.keep_alive(txn_id, group, timeout_ms)

    def txn_list(self, include_ended: bool = False, limit: int = 100) -> list[TxnInfo]:
        return self.txns.list(include_ended, limit)

    def txn_show(self, txn_id: int, records_max: int | None = None) -> TxnDetail:
        return self.txns.show(txn_id, records_max)

    # sessions -----------------------------------------------------------------------

    def sessions(self, limit: int = 10_000) -> list[SessionInfo]:
        """The sessions the broker knows (at most limit): the server's connections and
        the processes that claimed something, each with whether it is live."""
        _check_limit(limit)
        return self.owners.sessions(limit)

    def session_closed(self, session_id: str) -> None:
        """A client session ended (disconnect, missed heartbeats, or severed).

        The server calls this for every session that ends, an embedded client when it
        closes; everything the session holds is released.
        """
        self.owners.session_closed(session_id)
        with self.database.write() as conn:
            self.exclusives.session_closed(conn, session_id)

    # exclusive producers --------------------------------------------------------------

    def attach_producer(
        self,
        topic: str,
        session_id: str,
        access: Access,
        name: str,
        epoch: int | None = None,
    ) -> Attachment:
        """Attach a producer to topic with an access mode (Exclusive may wait)."""
        with self.database.read() as conn:
            row = self._topic(conn, topic)
        return self.exclusives.attach(row.topic_id, topic, session_id, access, name, epoch)

    def poll_attachment(self, attachment_id: int, topic: str) -> Attachment:
        return self.exclusives.poll(attachment_id, topic)

    def detach_producer(self, attachment_id: int) -> None:
        self.exclusives.detach(attachment_id)

    def topic_access(self, topic: str) -> AccessInfo:
        """Epoch, exclusive producer, shared producers and waiters (dead ones dropped)."""
        with self.database.write() as conn:
            row = self._topic(conn, topic)
            self.exclusives.reconcile(conn, row.topic_id)
            return self.exclusives.info(conn, row.topic_id)

    def offset_for_time(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """The first record of a partition at or after timestamp_ms: (offset, its
        timestamp), or None when every record is older, whatever the order of the
        timestamps, as Kafka's (a binary search over the log's time index:
        broker/storage/timestamps.py)."""
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            start = logs.start_offset(conn, row, partition)
            end = logs.end_offset(conn, row, partition)
            return timestamps.offset_for_time(
                conn, row.topic_id, partition, (start, end), timestamp_ms
            )

    def offset_of_greatest_time(self, topic: str, partition: int) -> tuple[int, int] | None:
        """The record of a partition with its greatest timestamp, the first of them on a
        tie: (offset, its timestamp), or None when the partition holds no record (Kafka's
        ListOffsets MAX_TIMESTAMP; broker/storage/timestamps.py)."""
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            start = logs.start_offset(conn, row, partition)
            return timestamps.offset_of_greatest_time(conn, row.topic_id, partition, start)

    def read_compacted(self, topic: str, partition: int) -> list[Record]:
        """The newest record of every key in one partition, in offset order."""
        with self.database.read() as conn:
            row = self._topic(conn, topic)
            record_rules.check_partition(topic, partition, row.partitions)
            return logs.read_compacted(
                conn, row, partition, logs.start_offset(conn, row, partition)
            )

    # status -------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        topics = tuple(self.list_topics())
        staged = self.producers.stage()
        with self.database.read() as conn:
            self._catch_up_all(conn, staged)
        staged.commit()
        database_bytes, wal_bytes = self.database.file_sizes()
        return BrokerStatus(
            data_dir=str(self.data_dir()),
            schema_version=SCHEMA_VERSION,
            durability=self.database.durability,
            database_bytes=database_bytes,
            wal_bytes=wal_bytes,
            topics=topics,
            producer_ids=len(self.producers.entries),
            producer_evictions=self.producers.evictions,
        )

    # helpers ------------------------------------------------------------------------

    def _topic(self, conn: sqlite3.Connection, name: str) -> logs.TopicRow:
        row = logs.topic_by_name(conn, name)
        if row is None:
            record_rules.check_topic_name(name, self.limits)  # a name no topic can have
            raise BrokerError(
                ErrorCode.UNKNOWN_TOPIC,
                f"topic {name} does not exist",
                topic=name,
                hint=f"create it with: fencelog topic create {shlex.quote(name)}",
            )
        return row

    def _topic_info(self, conn: sqlite3.Connection, row: logs.TopicRow) -> TopicInfo:
        return TopicInfo(
            name=row.name,
            partitions=row.partitions,
            created_ms=row.created_ms,
            owner_group=row.owner_group,
            partition_details=logs.partition_infos(conn, row),
            config=logs.topic_config(conn, row.topic_id),
        )

    def _check_fences(
        self,
        conn: sqlite3.Connection,
        row: logs.TopicRow,
        by_partition: dict[int, Sequence[int]],
        fences: Sequence[Fence],
    ) -> None:
        self.owners.check_fences(conn, fences)
        ownership_rules.check_owner_fences(row.owner_group, row.name, by_partition, fences)

    def _route(self, row: logs.TopicRow, records: Sequence[NewRecord]) -> dict[int, Sequence[int]]:
        """Each record's partition, as {partition: [indexes into records]}."""
        if len(records) == 1 and (partition := records[0].partition) is not None:
            if not 0 <= partition < row.partitions:
                record_rules.check_partition(row.name, partition, row.partitions)
            return {partition: _ONE}
        partitions = partitions_of(records)
        if partitions is None and keys_of(records) is None:
            return self._round_robin_ranges(row.partitions, len(records))
        named = {None} if partitions is None else set(partitions)
        if len(named) == 1 and (partition := named.pop()) is not None:  # all to one
            if not 0 <= partition < row.partitions:
                record_rules.check_partition(row.name, partition, row.partitions)
            return {partition: range(len(records))}
        by_partition: dict[int, list[int]] = {}
        keys = keys_of(records) or [None] * len(records)
        given = partitions or [None] * len(records)
        for index, (key, named_partition) in enumerate(zip(keys, given, strict=True)):
            partition = named_partition
            if partition is None:
                partition = record_rules.choose_partition(key, row.partitions, self._round_robin)
                self._round_robin += key is None
            elif not 0 <= partition < row.partitions:
                record_rules.check_partition(row.name, partition, row.partitions)
            by_partition.setdefault(partition, []).append(index)
        return cast(dict[int, Sequence[int]], by_partition)

    def _round_robin_ranges(self, partitions: int, count: int) -> dict[int, Sequence[int]]:
        """Records without key or partition, each to the next partition in turn (as
        choose_partition would send them one by one), as ranges of indexes."""
        first = self._round_robin
        self._round_robin += count
        by_partition = {
            (first + start) % partitions: range(start, count, partitions)
            for start in range(min(partitions, count))
        }
        return cast(dict[int, Sequence[int]], by_partition)


def appended_results(topic: str, partition: int, first: int, count: int) -> AppendResults:
    """The results of `count` records appended from offset `first`: a run, each result
    made only when it is read."""
    return AppendResults.run(topic, partition, first, count)


_ONE: Final = range(1)
_DUPLICATE = Verdict.DUPLICATE


def _bounded(max_records: int | None, records_max: int) -> int:
    if max_records is None:
        return records_max
    if max_records < 0:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, f"max_records must be >= 0, not {max_records}"
        )
    return min(max_records, records_max)


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"limit must be >= 0, not {limit}")


def _below_start(topic: str, partition: int, offset: int, start: int) -> BrokerError:
    return BrokerError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"offset {offset} of {topic}/{partition} is gone: retention or compaction deleted "
        f"the records below the log start offset {start}",
        topic=topic,
        partition=partition,
        offset=offset,
        start_offset=start,
        hint="read from the beginning (the log start) or a later offset",
    )


def _within_bytes(found: list[rows.Row], bytes_max: int) -> list[rows.Row]:
    """The first rows within bytes_max of keys and values (at least one)."""
    size = sum(value_sizes(list(map(_ROW_VALUE, found))))
    if any(map(_ROW_KEY, found)):
        size += sum(len(key) for key in map(_ROW_KEY, found) if key)
    if size <= bytes_max:
        return found
    total = 0
    for index, (_, _, _, key, value, *_) in enumerate(found):
        total += value_size(value) + (len(key) if key else 0)
        if total > bytes_max and index > 0:
            return found[:index]
    return found
