"""The engine's transactions: double journaling with a local copy (DESIGN.md section 6).

    begin    BEGIN(txn) is appended to the group's journal partition J(G)
    produce  records go to their partitions' data journals, tagged with the txn id: a
             batch a produce, packed into a row of the log's table under a hidden key
             (storage/txns.py journal_records)
    commit   PREPARE_COMMIT(txn, partitions) is appended to J(G) and COMMITted: the
             commit point. Then APPLY_COMMIT moves each partition's journaled batches
             into its log, in journal order, giving each row its key and offsets in
             place (the "local copy" of the proposal, without writing the records
             again; up to txn_apply_records_max records per SQLite transaction, the
             last one with COMPLETE), and only then is the commit answered, so a
             caller that reads after txn-commit sees the records.
    abort    ABORT(txn); the journaled records, members and pending offsets are dropped

Under durability full two writes are not synced on their own. PREPARE_COMMIT's: the
caller is answered only after APPLY_COMMIT's first write, whose sync covers it (one WAL,
in order). And the one that BEGINs a transaction (with its first records, when they come
with it), unless it takes a new block of ids: lost in a power loss, the transaction never
existed, and a request naming it is refused as unknown. Its id came from a block whose
counter was synced, so it is never handed out again. Any later write of the transaction
is synced, and with it everything before it, so a transaction that outlives a power loss
holds every record it was answered for.

Every step is its own SQLite transaction, so a broker killed anywhere leaves a state that
`recover()` finishes: a prepared transaction is applied (skipping the partitions already
copied, whose base offsets are stored), one that never prepared stays out of the logs and
times out. Commits of one group are applied in journal order: before a transaction is
applied, every earlier prepared one of its journal is.

Failure points for crash tests: FENCELOG_FAILPOINT=STEP[:N] kills this process with
SIGKILL the Nth time it reaches STEP, as `kill -9` would: begin (after BEGIN), data
(after a produce into a transaction), prepare (after PREPARE_COMMIT), apply (after a
partition's copy, before its SQLite transaction commits), complete (every partition
copied, before COMPLETE commits); the server adds ack (after the commit's reply).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from broker import failpoints
from broker.core import txn as rules
from broker.core.txn import CommitAction, Entry, TxnState, TxnView
from broker.engine.exclusive_access import Exclusives
from broker.engine.ownership import Owners
from broker.engine.producer_table import ProducerTable
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.storage import logs
from broker.storage import producers as producer_store
from broker.storage import txns as store
from broker.storage.database import Database
from broker.types import (
    NO_OFFSET_METADATA,
    AppendResult,
    AppendResults,
    Fence,
    JournalEntryInfo,
    NewRecord,
    OffsetMetadata,
    ProducerFields,
    TxnDetail,
    TxnInfo,
    TxnMember,
    TxnPartition,
    is_columns,
)

FAILPOINT_ENV: Final = "FENCELOG_FAILPOINT"
FAILPOINT_STEPS: Final = ("begin", "data", "prepare", "apply", "complete", "ack")


class Transactions:
    def __init__(
        self,
        database: Database,
        limits: Limits,
        clock: Callable[[], int],
        producers: ProducerTable,
        owners: Owners,
        exclusives: Exclusives,
    ) -> None:
        self.database = database
        self.limits = limits
        self.clock = clock
        self.producers = producers
        self.owners = owners
        self.exclusives = exclusives
        self.failpoints = failpoints.from_environment(FAILPOINT_ENV, FAILPOINT_STEPS)
        self._ids = (0, 0)  # this process's block of txn ids: [next, end)
        self._pending_ids = self._ids  # the block once the BEGIN being written commits
        self.damaged: dict[int, str] = {}  # prepared, left by recover(): id -> why

    # begin, join, produce, offsets ------------------------------------------------------

    def begin(self, group: str, key: str | None = None, timeout_ms: int | None = None) -> TxnInfo:
        """A new transaction of group; with a key, the one already begun under it if any
        (open, prepared or committed: a replayed begin finds its transaction again)."""
        if key is not None:
            rules.check_key(key)
        timeout = self.checked(group, timeout_ms)
        now_ms = self.clock()
        with self.begin_write() as conn:
            if key is not None:
                found = store.by_key(conn, group, key)
                if found is not None:
                    view = self._current(conn, found, now_ms)
                    if view.state is not TxnState.ABORTED:
                        return self.info(conn, found.txn_id, now_ms, existing=True)
            txn_id = self.begin_in(conn, group, key, timeout, now_ms)
            info = self.info(conn, txn_id, now_ms)
        self.begun()
        return info

    def begin_write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """The writer transaction to BEGIN a transaction in: synced only when it takes a
        new block of ids (the module's docstring says why the others need not be)."""
        start, end = self._ids
        return self.database.write_unsynced() if start < end else self.database.write()

    def begin_in(
        self, conn: sqlite3.Connection, group: str, key: str | None, timeout_ms: int, now_ms: int
    ) -> int:
        """BEGIN a new transaction inside the caller's SQLite transaction (begin_write's);
        its id. The caller calls begun() once that transaction has committed."""
        txn_id, self._pending_ids, fresh = self._next_id(conn)
        journal = rules.journal_of(group, self.limits.txn_journals)
        store.insert(conn, txn_id, group, key, journal, now_ms, now_ms + timeout_ms)
        store.journal_append(conn, journal, txn_id, Entry.BEGIN, now_ms, {"key": key})
        if fresh:  # once per block: every process prunes, even one-shot CLI commands
            store.prune(conn, self.limits.txn_history_max)
        return txn_id

    def begun(self) -> None:
        """The BEGIN of begin_in is durable: its id is spent."""
        self._ids = self._pending_ids
        self.failpoints.reached("begin")

    def checked(self, group: str, timeout_ms: int | None) -> int:
        """A new transaction's group checked; its timeout (the default if None), checked."""
        rules.check_group(group)
        timeout = self.limits.txn_timeout_ms if timeout_ms is None else timeout_ms
        rules.check_timeout(timeout, self.limits.txn_timeout_max_ms)
        return timeout

    def join(self, txn_id: int, member: str) -> TxnMember:
        """Join a transaction as a named member: a pid and generation to produce with.
        Joining again under the same name (a retried task) fences the earlier attempt."""
        rules.check_member(member)
        now_ms = self.clock()
        with self.database.write() as conn:
            view = self._current(conn, self._row(conn, txn_id), now_ms, persist=False)
            rules.check_writable(view)
            found = store.member(conn, txn_id, member)
            discarded = 0
            if found is None:
                producer_id, generation = self.producers.new_pid(conn, 1, now_ms), 1
            else:
                producer_id, generation = found[0], found[1] + 1
                discarded = store.fence_older(conn, txn_id, producer_id, generation)
            store.put_member(conn, txn_id, member, producer_id, generation)
        return TxnMember(txn_id, member, producer_id, generation, discarded)

    def journal(
        self,
        conn: sqlite3.Connection,
        topic: logs.TopicRow,
        by_partition: Mapping[int, Sequence[int]],
        records: Sequence[NewRecord],
        producer: ProducerFields,
        now_ms: int,
        fences: Sequence[Fence] = (),
    ) -> Sequence[AppendResult]:
        """Records of a produce into a transaction, to their partitions' data journals.
        Called by the engine inside its produce transaction, after the fences and the
        topic's access were checked; they are checked again at commit. The records get
        their offsets at commit."""
        assert producer.txn_id is not None
        txn_id = rules.parse_txn_id(producer.txn_id)
        view = self._current(conn, self._row(conn, txn_id), now_ms, persist=False)
        rules.check_writable(view)
        if producer.producer_id:
            found = store.member_by_pid(conn, txn_id, producer.producer_id)
            rules.check_member_generation(
                txn_id,
                producer.producer_id,
                None if found is None else found[1],
                producer.generation,
            )
        store.put_fences(conn, txn_id, ((f.group, f.resource, f.generation) for f in fences))
        results: list[AppendResult] = [_PENDING] * len(records)
        for partition, indexes in by_partition.items():
            if producer.first_sequence and not self._in_sequence(
                conn, txn_id, topic.topic_id, partition, producer.first_sequence, len(indexes)
            ):
                continue  # a retry of records journaled already: answered, not repeated
            store.journal_records(
                conn,
                txn_id,
                topic.topic_id,
                partition,
                _pick(records, indexes),
                now_ms,
                producer.producer_id,
                producer.generation,
                producer.epoch,
            )
            if len(indexes) == len(records):  # the usual batch: its results as columns
                return AppendResults(topic.name, [(len(records), partition, -1, False)])
            pending = AppendResult(topic.name, partition, -1)  # offsets come at commit
            if isinstance(indexes, range):
                results[indexes.start : indexes.stop : indexes.step] = [pending] * len(indexes)
            else:
                for index in indexes:
                    results[index] = pending
        return results

    def view(self, txn_id: int) -> TxnView | None:
        """txn_id as the rules see it now (open past its deadline: aborted, timed out);
        None: no such transaction."""
        with self.database.read() as conn:
            row = store.by_id(conn, txn_id)
            return None if row is None else self._current(conn, row, self.clock(), persist=False)

    def _in_sequence(
        self,
        conn: sqlite3.Connection,
        txn_id: int,
        topic_id: int,
        partition: int,
        first: int,
        count: int,
    ) -> bool:
        """A sequenced produce into a transaction (the Kafka listener's): True when its
        records continue the partition's journal, False when they repeat records
        journaled already (a retry); OUT_OF_ORDER_SEQUENCE otherwise. The first one
        sets where the partition's sequences start in this transaction."""
        start, journaled = store.journal_sequence(conn, txn_id, topic_id, partition)
        if start is None:
            store.set_first_sequence(conn, txn_id, topic_id, partition, first)
            return True
        expected = start + journaled
        if first == expected:
            return True
        if first < expected and first + count <= expected:
            return False
        raise BrokerError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE,
            f"transaction {txn_id} expected sequence {expected} on partition {partition}, "
            f"not {first}",
            txn_id=txn_id,
            expected_sequence=expected,
            received_sequence=first,
        )

    def add_offsets(
        self,
        conn: sqlite3.Connection,
        txn_id: int,
        group: str,
        topic_id: int,
        offsets: Mapping[int, int],
        producer_state: bytes | None,
        details: Mapping[int, OffsetMetadata] | None = None,
    ) -> None:
        """Consumer offsets (with their metadata and leader epochs) that take effect
        when the transaction commits."""
        view = self._current(conn, self._row(conn, txn_id), self.clock(), persist=False)
        rules.check_writable(view)
        for partition, offset in offsets.items():
            detail = details.get(partition, NO_OFFSET_METADATA) if details else NO_OFFSET_METADATA
            store.put_offset(
                conn, txn_id, group, topic_id, partition, offset, producer_state, detail
            )

    # commit, abort, expiry, recovery ----------------------------------------------------

    def commit(
        self,
        txn_id: int,
        group: str | None = None,
        members: Mapping[str, int] | None = None,
    ) -> TxnInfo:
        """PREPARE_COMMIT (durable), then APPLY_COMMIT; the committed transaction.
        Committing a committed transaction answers it again; an aborted one fails.

        members (name -> generation): commit only these members' records, as of that
        generation, and discard every other writer's (a coordinator such as Spark's
        driver names the task attempts that succeeded)."""
        now_ms = self.clock()
        refused: BrokerError | None = None
        action: CommitAction | None = None
        pending: list[int] = []
        # Not synced on its own: the caller hears of the commit only after _apply's
        # first write, whose sync makes this PREPARE_COMMIT durable with it.
        with self.database.write_unsynced() as conn:
            row = self._row(conn, txn_id)
            view = self._current(conn, row, now_ms)
            try:
                action = rules.commit_action(view, group)
            except BrokerError as error:
                refused = error  # an expiry just written still commits
            if action is CommitAction.PREPARE:
                if members is not None:
                    joined = store.members_of(conn, txn_id)
                    store.keep_writers(conn, txn_id, rules.writers_to_keep(txn_id, joined, members))
                self._check_still_writable(conn, txn_id)
                store.drop_empty(conn, txn_id)
                parts = store.partitions_of(conn, txn_id)
                body = {
                    "partitions": [[p.topic_id, p.partition, p.records] for p in parts],
                    "offsets": store.apply_offsets(conn, txn_id, now_ms),
                }
                position = store.journal_append(
                    conn, row.journal, txn_id, Entry.PREPARE_COMMIT, now_ms, body
                )
                store.set_prepared(conn, txn_id, position)
            elif action is CommitAction.APPLY:
                assert row.prepare_position is not None
                position = row.prepare_position
            elif action is CommitAction.DONE:
                return self.info(conn, txn_id, now_ms)
            if action is not None:  # this one and, first, the earlier ones of its journal
                pending = store.prepared(conn, row.journal, position)
        if refused is not None:
            raise refused
        self.failpoints.reached("prepare")
        try:
            for earlier in pending:
                if earlier != txn_id:
                    self._apply(earlier)
            return self._apply(txn_id)
        except BrokerError as error:
            if error.code not in (ErrorCode.STORAGE_FAILED, ErrorCode.STORAGE_BUSY):
                raise
            raise BrokerError(
                error.code,
                f"transaction {txn_id} is prepared: its commit is decided, but moving it "
                f"into the logs failed ({error.message}); the move is done when its group "
                "next commits or the broker next opens the directory",
                txn_id=txn_id,
                decided=True,
                hint=f"fencelog txn show {txn_id} says when it is committed",
            ) from error

    def keep_alive(self, txn_id: int, group: str | None, timeout_ms: int) -> TxnInfo:
        """Move an open transaction's deadline to timeout_ms from now (a job still at
        work on it); one that ended already is refused as a write to it would be."""
        rules.check_timeout(timeout_ms, self.limits.txn_timeout_max_ms)
        now_ms = self.clock()
        with self.database.write() as conn:
            row = self._row(conn, txn_id)
            view = self._current(conn, row, now_ms)
            rules.check_group_matches(view, group)
            rules.check_alive(view)
            store.set_deadline(conn, txn_id, now_ms + timeout_ms)
            return self.info(conn, txn_id, now_ms)

    def abort(self, txn_id: int, group: str | None = None) -> TxnInfo:
        """Discard an open transaction (aborting an aborted one answers it again)."""
        now_ms = self.clock()
        with self.database.write() as conn:
            row = self._row(conn, txn_id)
            view = self._current(conn, row, now_ms)
            if rules.abort_allowed(view, group):
                self._abort_in(conn, row, now_ms, rules.BY_REQUEST)
            return self.info(conn, txn_id, now_ms)

    def expire(self) -> list[int]:
        """Abort every open transaction past its deadline; their ids."""
        now_ms = self.clock()
        with self.database.read() as conn:
            if not store.expired(conn, now_ms):
                return []
        with self.database.write() as conn:
            due = store.expired(conn, now_ms)
            for txn_id in due:
                row = store.by_id(conn, txn_id)
                assert row is not None
                self._abort_in(conn, row, now_ms, rules.TIMED_OUT)
        return due

    def recover(self) -> list[int]:
        """Finish every prepared transaction (a start after a crash); their ids. One
        whose journaled data is damaged (DATA_CORRUPT) stays prepared, and so do the
        later ones of its journal, which land only after it: `damaged` says which and
        why, and the broker opens."""
        with self.database.read() as conn:
            pending = [(txn_id, self._row(conn, txn_id).journal) for txn_id in store.prepared(conn)]
        applied: list[int] = []
        blocked: set[int] = set()
        for txn_id, journal in pending:
            if journal in blocked:
                continue
            try:
                self._apply(txn_id)
            except BrokerError as error:
                if error.code is not ErrorCode.DATA_CORRUPT:
                    raise
                self.damaged[txn_id] = error.message
                blocked.add(journal)
                continue
            applied.append(txn_id)
        return applied

    # reading ------------------------------------------------------------------------------

    def list(self, include_ended: bool = False, limit: int = 100) -> list[TxnInfo]:
        """Open and prepared transactions (and with include_ended, the newest ended)."""
        self.expire()
        now_ms = self.clock()
        with self.database.read() as conn:
            rows = store.recent(conn, limit) if include_ended else store.live(conn)[:limit]
            return [self.info(conn, row.txn_id, now_ms) for row in rows]

    def show(self, txn_id: int, records_max: int | None = None) -> TxnDetail:
        self.expire()
        limit = self.limits.txn_show_records_max if records_max is None else records_max
        now_ms = self.clock()
        with self.database.read() as conn:
            info = self.info(conn, txn_id, now_ms)
            journal = tuple(
                JournalEntryInfo(e.journal, e.position, e.kind, e.at_ms, e.body)
                for e in store.journal_of(conn, txn_id)
            )
            records = tuple(store.data_records(conn, txn_id, max(0, limit)))
        return TxnDetail(info, journal, records)

    # internals ----------------------------------------------------------------------------

    def _check_still_writable(self, conn: sqlite3.Connection, txn_id: int) -> None:
        """At the commit point, the records must still be allowed to land: every fence
        they were produced under is current (else FENCED), and no other producer holds
        a topic exclusively (else PRODUCER_BUSY). A refused commit leaves the
        transaction open: abort it, or commit again later."""
        fences = [Fence(g, r, n) for g, r, n in store.fences_of(conn, txn_id)]
        self.owners.check_fences(conn, fences)
        for topic_id in store.topics_of(conn, txn_id):
            self.exclusives.check_write(conn, topic_id, None)

    def _apply(self, txn_id: int) -> TxnInfo:
        """APPLY_COMMIT: copy the partitions not yet copied, up to txn_apply_records_max
        records per SQLite transaction, then COMPLETE (with the last of them); the
        transaction as it then is. Safe to run twice and from several processes at once:
        each partition's base offset says it was copied."""
        while True:
            try:
                with self.database.write() as conn:
                    row = self._row(conn, txn_id)
                    if row.state != TxnState.PREPARED:  # completed already, here or elsewhere
                        return self.info(conn, txn_id, self.clock())
                    parts = [p for p in store.partitions_of(conn, txn_id) if p.base_offset is None]
                    chunk: list[store.TxnPartitionRow] = []
                    records = 0
                    for part in parts:
                        if chunk and records + part.records > self.limits.txn_apply_records_max:
                            break
                        chunk.append(part)
                        records += part.records
                    # only batches journaled before schema 017 are copied: new bytes
                    self.database.hold_pages(conn, store.bytes_to_copy(conn, txn_id))
                    for part in chunk:
                        self._copy(conn, txn_id, part)
                        self.failpoints.reached("apply")
                    if len(chunk) == len(parts):
                        self.failpoints.reached("complete")
                        self._complete(conn, row)
                        return self.info(conn, txn_id, self.clock())
            finally:
                self.database.release_pages()

    def _copy(self, conn: sqlite3.Connection, txn_id: int, part: store.TxnPartitionRow) -> None:
        """Copy one partition not yet copied (read in this same SQLite transaction)."""
        row = logs.topic_by_id(conn, part.topic_id)
        if row is None:  # deleted since: nothing to copy into
            store.mark_applied(conn, txn_id, part.topic_id, part.partition, -1)
            return
        base_offset = logs.end_offset(conn, row, part.partition)
        epoch = self.exclusives.epoch(conn, part.topic_id)
        copied = store.apply_partition(
            conn, txn_id, part.topic_id, part.partition, base_offset, epoch
        )
        logs.advance(conn, row, part.partition, copied, part.bytes)
        store.mark_applied(conn, txn_id, part.topic_id, part.partition, base_offset)

    def _complete(self, conn: sqlite3.Connection, row: store.TxnRow) -> None:
        now_ms = self.clock()
        store.journal_append(conn, row.journal, row.txn_id, Entry.COMPLETE, now_ms, None)
        store.set_state(conn, row.txn_id, TxnState.COMMITTED, now_ms, None)
        store.discard(conn, row.txn_id)

    def _abort_in(
        self, conn: sqlite3.Connection, row: store.TxnRow, now_ms: int, reason: str
    ) -> None:
        store.discard(conn, row.txn_id)
        store.drop_partitions(conn, row.txn_id)
        store.journal_append(conn, row.journal, row.txn_id, Entry.ABORT, now_ms, {"reason": reason})
        store.set_state(conn, row.txn_id, TxnState.ABORTED, now_ms, reason)

    def _current(
        self, conn: sqlite3.Connection, row: store.TxnRow, now_ms: int, *, persist: bool = True
    ) -> TxnView:
        """The transaction as the rules see it now: an open one past its deadline is
        aborted as timed out (written too, when persist and the caller commits)."""
        view = TxnView(row.txn_id, row.group, TxnState(row.state), row.deadline_ms, row.reason)
        if not rules.is_expired(view, now_ms):
            return view
        if persist:
            self._abort_in(conn, row, now_ms, rules.TIMED_OUT)
        return TxnView(row.txn_id, row.group, TxnState.ABORTED, row.deadline_ms, rules.TIMED_OUT)

    def _row(self, conn: sqlite3.Connection, txn_id: int) -> store.TxnRow:
        row = store.by_id(conn, rules.parse_txn_id(txn_id))
        if row is None:
            raise rules.unknown(txn_id)
        return row

    def info(
        self, conn: sqlite3.Connection, txn_id: int, now_ms: int, *, existing: bool = False
    ) -> TxnInfo:
        row = self._row(conn, txn_id)
        parts = (
            store.journaled(conn, txn_id)
            if row.state == TxnState.OPEN
            else store.partitions_of(conn, txn_id)
        )
        end_ms = row.ended_ms if row.ended_ms is not None else now_ms
        return TxnInfo(
            txn_id=row.txn_id,
            group=row.group,
            key=row.key,
            state=row.state,
            journal=row.journal,
            began_ms=row.began_ms,
            deadline_ms=row.deadline_ms,
            ended_ms=row.ended_ms,
            reason=row.reason,
            age_ms=max(0, end_ms - row.began_ms),
            partitions=tuple(
                TxnPartition(p.topic, p.partition, p.records, p.bytes, p.base_offset) for p in parts
            ),
            existing=existing,
        )

    def _next_id(self, conn: sqlite3.Connection) -> tuple[int, tuple[int, int], bool]:
        """A txn id from this process's block, or from a new block of the persistent
        counter: the id, the block as it will be once this transaction commits, and
        whether the block is new."""
        start, end = self._ids
        fresh = start >= end
        if fresh:
            start = producer_store.counter(conn, store.TXN_COUNTER) or 1
            end = start + self.limits.txn_id_block_size
            producer_store.set_counter(conn, store.TXN_COUNTER, end)
        return start, (start + 1, end), fresh


_PENDING = AppendResult("", -1, -1)


def _pick(records: Sequence[NewRecord], indexes: Sequence[int]) -> Sequence[NewRecord]:
    """records[i] for i in indexes; a range of them (records routed in turn) in one slice."""
    if is_columns(records):
        return records.picked(indexes)
    if isinstance(indexes, range):
        return records[indexes.start : indexes.stop : indexes.step]
    return [records[i] for i in indexes]
