"""The engine's producer state: which (pid, partition) is at which generation and
sequence, derived from the log's records (their producer fields) and the lease rows.

- The state lives in memory (`ProducerTable`) together with the offset each partition
  has been replayed to. Before every decision on a partition, inside the writer
  transaction, the table replays the records it has not seen yet (one row per pid: its
  newest record is its state); that is how a start rebuilds it (from the newest
  snapshot, or from offset 0) and how a process sees what other processes sharing the
  data directory appended.
- An idempotent commit writes nothing but its records, except a pid's first batch on a
  partition, which also writes the pid's lease row (when its lease began and its first
  offset): the records cannot say when the broker appended them.
- A duplicate's original offsets are looked up in the records, between the pid's first
  offset and the highest offset its sequences can have (see `original_offsets`). That
  search is the price of the rare path; an append keeps nothing in memory but state.
- Changes are staged (`Staged`) during the transaction, per request with savepoints,
  and reach the table only after COMMIT returns.
- At most producer_ids_max entries are kept in memory; the one that entered first goes
  first, and every eviction is counted (fencelog status shows it). Eviction bounds
  memory, not what the broker knows: an evicted pid is rebuilt from its lease row and
  its newest record.
- A snapshot stores the table with its offset vector; losing every snapshot costs only
  replay time.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator

import msgpack

from broker.core.producers import Batch, after_append, latest_offset, next_entry
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.storage import producers as store
from broker.storage.database import Database
from broker.types import Lease, ProducerEntry

Key = tuple[int, int, int]  # topic_id, partition, producer_id
Part = tuple[int, int]  # topic_id, partition
_Mark = tuple[dict[Key, ProducerEntry], dict[Key, int], dict[Part, int], int]
PID_COUNTER = "next_producer_id"
PID_WRAP = 1 << 31
_GENERATION_START_MAX = 1 << 20


class ProducerTable:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.entries: OrderedDict[Key, ProducerEntry] = OrderedDict()
        # Eviction takes the pid that entered the table first (first seen, or back after
        # an eviction): (entered ms, key) in a heap whose stale items are skipped.
        self._last_ms: dict[Key, int] = {}
        self._by_age: list[tuple[int, int, Key]] = []  # (entered ms, order, key)
        self._order = itertools.count()
        self.replayed: dict[Part, int] = {}
        self.evictions = 0
        self.records_since_snapshot = 0
        self._pid_next = 0
        self._pid_end = 0
        self._issued: dict[int, store.IssuedPid] = {}
        self._deferred: Callable[[], None] | None = None

    # start ----------------------------------------------------------------------------

    def defer(self, load: Callable[[], None]) -> None:
        """Load (through `load`, which calls load(conn)) when the table is first used:
        a process that only reads records never pays for 100,000 pids."""
        self._deferred = load

    def ready(self) -> None:
        """The table as the newest snapshot left it (a deferred load done now)."""
        if self._deferred is not None:
            load, self._deferred = self._deferred, None
            load()

    def load(self, conn: sqlite3.Connection) -> int | None:
        """Load the newest snapshot; the log after it is replayed as partitions are used.
        The cyclic garbage collector is off meanwhile: it would walk the 100,000s of new
        tuples again and again, for nothing (a third of the load)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._load(conn)
        finally:
            if collecting:
                gc.enable()

    def _load(self, conn: sqlite3.Connection) -> int | None:
        newest = store.newest_snapshot(conn)
        if newest is None:
            return None
        snapshot_id, _, body = newest
        decoded = msgpack.unpackb(body, use_list=False, strict_map_key=False)
        # 100,000 pids are a restart's cost (bench/RESULTS.md, "Growth curves"): built
        # by C loops (zip, map), not a Python statement per pid
        rows = decoded["entries"]
        keys = [(t, p, e[0]) for t, p, e in rows]
        values = map(ProducerEntry._make, [e for _, _, e in rows])
        self.entries = OrderedDict(zip(keys, values, strict=True))
        self.replayed = {(t, p): offset for t, p, offset in decoded["replayed"]}
        last = {(t, p, pid): ms for t, p, pid, ms in decoded.get("last_ms", ())}
        if last.keys() != self.entries.keys():  # a snapshot from before last_ms, or partial
            last = {k: last.get(k, e.first_record_ms) for k, e in self.entries.items()}
        self._last_ms = last
        self._by_age = list(zip(last.values(), self._order, last.keys(), strict=False))
        heapq.heapify(self._by_age)
        self.evictions = int(decoded["evictions"])
        return snapshot_id

    def snapshot_body(self) -> bytes:
        self.ready()
        body: bytes = msgpack.packb(
            {
                "entries": [
                    (
                        t,
                        p,
                        (
                            e.producer_id,
                            e.generation,
                            e.high_water_sequence,
                            e.first_record_ms,
                            e.last_offset,
                        ),
                    )
                    for (t, p, _), e in self.entries.items()
                ],
                "replayed": [(t, p, o) for (t, p), o in self.replayed.items()],
                "evictions": self.evictions,
                "last_ms": [(*key, ms) for key, ms in self._last_ms.items()],
            }
        )
        return body

    # pids -----------------------------------------------------------------------------

    def new_pid(self, conn: sqlite3.Connection, generation: int, now_ms: int) -> int:
        """A fresh pid from the persistent counter, taken in blocks, and recorded as
        issued at generation: a pid already issued (or written by a directory from
        before schema 8) is skipped, so no pid is ever handed out twice."""
        while True:
            if self._pid_next >= self._pid_end:
                start = store.counter(conn, PID_COUNTER) or 1
                end = start + self.limits.pid_block_size
                if end >= PID_WRAP:
                    start, end = 1, 1 + self.limits.pid_block_size
                store.set_counter(conn, PID_COUNTER, end)
                self._pid_next, self._pid_end = start, end
            pid = self._pid_next
            self._pid_next += 1
            if store.issue_pid(conn, pid, generation, now_ms):
                return pid

    def issued(self, conn: sqlite3.Connection, pid: int) -> store.IssuedPid | None:
        """How pid was issued, or None if it never was (a row once read stays valid:
        an issued pid is never taken back)."""
        found = self._issued.get(pid)
        if found is None:
            found = store.issued_pid(conn, pid)
            if found is not None:
                if len(self._issued) >= self.limits.producer_ids_max:
                    self._issued.clear()
                self._issued[pid] = found
        return found

    def first_batch(self, conn: sqlite3.Connection, pid: int, now_ms: int) -> ProducerEntry | None:
        """The state a pid's first batch on a partition is judged against: its issued
        generation with nothing written, its lease starting now (None for a pid issued
        before schema 8: its batch sets the generation). UNKNOWN_PID for a pid that was
        never issued."""
        issued = self.issued(conn, pid)
        if issued is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_PID,
                f"producer id {pid} was never leased",
                producer_id=pid,
                hint="lease a pid (fencelog lease-pid) and start at sequence 1",
            )
        if issued.generation is None:
            return None
        return ProducerEntry(pid, issued.generation, 0, now_ms, -1)

    def lease(
        self,
        conn: sqlite3.Connection,
        staged: Staged,
        topic_id: int,
        partition: int,
        pid: int | None,
        now_ms: int,
    ) -> Lease:
        self.ready()
        if pid is None:
            generation = (
                int.from_bytes(os.urandom(4)) % (_GENERATION_START_MAX - 1) + 1
            )  # not secret
            lease_end = now_ms + self.limits.pid_lease_ms
            return Lease(self.new_pid(conn, generation, now_ms), generation, 0, lease_end, now_ms)
        entry = staged.get((topic_id, partition, pid))
        if entry is None:  # evicted from memory? the log still knows it
            entry = self.entry_from_log(conn, topic_id, partition, pid)
        if entry is None:  # leased and not written here yet: its lease as issued
            entry = self.first_batch(conn, pid, now_ms)
            if entry is None:
                raise BrokerError(
                    ErrorCode.PID_EXPIRED,
                    f"producer id {pid} has no state on this partition (it was leased "
                    "before this data directory's upgrade and never wrote here)",
                    producer_id=pid,
                    hint="lease a new pid",
                )
        expire_ms = entry.expires_ms(self.limits.pid_lease_ms)
        if now_ms >= expire_ms:
            raise BrokerError(
                ErrorCode.PID_EXPIRED,
                f"producer id {pid}'s lease ended at {expire_ms}",
                producer_id=pid,
                expired_ms=expire_ms,
                hint="lease a new pid",
            )
        return Lease(pid, entry.generation, entry.high_water_sequence, expire_ms, now_ms)

    # the log ----------------------------------------------------------------------------

    def entry_from_log(
        self, conn: sqlite3.Connection, topic_id: int, partition: int, pid: int
    ) -> ProducerEntry | None:
        """A pid's state rebuilt from its lease row and newest record, or None if it never
        wrote to the partition: eviction from memory never makes the broker forget what a
        pid wrote, so a late retry is still a duplicate. A rare path: the search runs back
        from the log end, at worst to the pid's first record."""
        self.ready()
        lease = store.lease_of(conn, topic_id, partition, pid)
        if lease is None:
            return None
        last = store.last_record_of(conn, topic_id, partition, pid, lease.first_offset)
        assert last is not None, "a lease row is written with the pid's first records"
        return ProducerEntry(pid, last.generation, last.sequence, lease.first_ms, last.offset)

    def original_offsets(
        self,
        conn: sqlite3.Connection,
        topic_id: int,
        partition: int,
        entry: ProducerEntry,
        batch: Batch,
    ) -> list[int]:
        """A duplicate batch's original offsets, found in the records: the search runs
        down from the latest offset its last sequence can have (core latest_offset) to
        the pid's first offset, and stops once it has every sequence of the batch."""
        self.ready()
        lease = store.lease_of(conn, topic_id, partition, batch.producer_id)
        assert lease is not None, "a pid with state on a partition has a lease row there"
        highest = latest_offset(entry, batch.last_sequence)
        found = store.offsets_of_sequences(
            conn,
            topic_id,
            partition,
            batch.producer_id,
            (batch.first_sequence, batch.last_sequence),
            (lease.first_offset, highest),
        )
        # Retention or compaction may have deleted originals: those answer offset -1
        # (the retry is still a duplicate: nothing is appended twice).
        return [found.get(s, -1) for s in range(batch.first_sequence, batch.last_sequence + 1)]

    # changes --------------------------------------------------------------------------

    def stage(self) -> Staged:
        self.ready()
        return Staged(self)

    def _commit(self, staged: Staged) -> None:
        entries = self.entries
        for key, entry in staged.changes.items():
            if key not in entries:  # enters the table now (first seen, or came back)
                entered_ms = staged.last_ms.get(key, entry.first_record_ms)
                self._last_ms[key] = entered_ms
                heapq.heappush(self._by_age, (entered_ms, next(self._order), key))
            entries[key] = entry
        if staged.replayed:
            self.replayed.update(staged.replayed)
        self.records_since_snapshot += staged.appended_records
        while len(entries) > self.limits.producer_ids_max:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        """Out goes the pid that entered the table first, whatever order it was seen in."""
        while self._by_age:
            last_ms, _, key = heapq.heappop(self._by_age)
            if key in self.entries and self._last_ms.get(key) == last_ms:
                del self.entries[key]
                del self._last_ms[key]
                self.evictions += 1
                return
        key, _ = self.entries.popitem(last=False)  # the heap never runs dry first
        self._last_ms.pop(key, None)
        self.evictions += 1

    def retain_topics(self, topic_ids: set[int]) -> None:
        """Forget the producers of topics that no longer exist (ids are never reused)."""
        self.ready()
        for key in [k for k in self.entries if k[0] not in topic_ids]:
            del self.entries[key]
            self._last_ms.pop(key, None)
        for part in [p for p in self.replayed if p[0] not in topic_ids]:
            del self.replayed[part]

    def entries_of(self, topic_id: int) -> Iterator[tuple[int, ProducerEntry]]:
        self.ready()
        for (t, partition, _), entry in self.entries.items():
            if t == topic_id:
                yield partition, entry


class Staged:
    """The table as this transaction sees it; reaches the table only via commit()."""

    def __init__(self, table: ProducerTable) -> None:
        self.table = table
        self.changes: dict[Key, ProducerEntry] = {}
        self.last_ms: dict[Key, int] = {}
        self.replayed: dict[Part, int] = {}
        self.appended_records = 0

    def get(self, key: Key) -> ProducerEntry | None:
        return self.changes.get(key) or self.table.entries.get(key)

    def entry(self, conn: sqlite3.Connection, key: Key, end: int) -> ProducerEntry | None:
        """The pid's entry once the table has replayed its partition up to end (the log
        end); None if the table does not hold it (new here, or evicted)."""
        part = (key[0], key[1])
        replayed = self.replayed.get(part)
        if (self.table.replayed.get(part, 0) if replayed is None else replayed) != end:
            self.catch_up(conn, key[0], key[1], end)
        return self.changes.get(key) or self.table.entries.get(key)

    def catch_up(self, conn: sqlite3.Connection, topic_id: int, partition: int, end: int) -> None:
        """Replay the records of this partition that the table has not seen: each pid's
        newest one is its state."""
        part = (topic_id, partition)
        start = self.replayed.get(part, self.table.replayed.get(part, 0))
        if start < end:
            for last in store.last_records_after(conn, topic_id, partition, start):
                self._replay(conn, topic_id, partition, last)
            self.appended_records += end - start  # a snapshot keeps this scan's result
        self.replayed[part] = max(start, end)

    def _replay(
        self, conn: sqlite3.Connection, topic_id: int, partition: int, last: store.LastRecord
    ) -> None:
        key = (topic_id, partition, last.producer_id)
        entry = self.get(key)
        if entry is not None:
            first_ms = entry.first_record_ms
        else:  # new here, or evicted earlier: its lease began at its first record
            lease = store.lease_of(conn, topic_id, partition, last.producer_id)
            # (no lease row: a log written without one; its newest record's time is all)
            first_ms = last.timestamp_ms if lease is None else lease.first_ms
        self.changes[key] = ProducerEntry(
            last.producer_id, last.generation, last.sequence, first_ms, last.offset
        )
        if key not in self.table.entries:
            self.last_ms.setdefault(key, last.timestamp_ms)  # when it enters the table

    def appended_usual(
        self,
        key: Key,
        generation: int,
        first_sequence: int,
        count: int,
        end: int,
        now_ms: int,
        pid_lease_ms: int,
    ) -> bool:
        """The usual batch of a pid that goes on writing, staged at end (the log end) in
        one step: the table holds the pid's state up to end and core's next_entry says
        the batch continues it. False: nothing staged; judge the batch in full."""
        part = key[:2]
        replayed = self.replayed.get(part)
        if (self.table.replayed.get(part, 0) if replayed is None else replayed) != end:
            return False
        entry = self.changes.get(key) or self.table.entries.get(key)
        if entry is None:
            return False
        after = next_entry(
            entry, generation, first_sequence, count, now_ms, pid_lease_ms, end + count - 1
        )
        if after is None:
            return False
        self.changes[key] = after
        if key not in self.table.entries:
            self.last_ms.setdefault(key, now_ms)
        self.replayed[part] = end + count
        self.appended_records += count
        return True

    def appended(
        self, key: Key, entry: ProducerEntry | None, batch: Batch, base_offset: int, now_ms: int
    ) -> None:
        """A batch this transaction appends at base_offset, the log end; entry is the
        pid's state before it."""
        count = batch.record_count
        end = base_offset + count
        self.changes[key] = after_append(entry, batch, now_ms, end - 1)
        if key not in self.table.entries:
            self.last_ms.setdefault(key, now_ms)  # when it enters the table
        self.replayed[(key[0], key[1])] = end
        self.appended_records += count

    def advanced(self, topic_id: int, partition: int, base_offset: int, end: int) -> None:
        """A non-idempotent append moved the partition from base_offset to end: if the
        table had replayed up to base_offset, there is still nothing to replay."""
        part = (topic_id, partition)
        if self.replayed.get(part, self.table.replayed.get(part, 0)) == base_offset:
            self.replayed[part] = end
            # counted toward the next snapshot too: a restart replays from the newest
            # snapshot, and plain records after it would be scanned again (bench/RESULTS.md,
            # "Growth curves")
            self.appended_records += end - base_offset

    def mark(self) -> _Mark:
        return dict(self.changes), dict(self.last_ms), dict(self.replayed), self.appended_records

    def restore(self, mark: _Mark) -> None:
        self.changes, self.last_ms = dict(mark[0]), dict(mark[1])
        self.replayed, self.appended_records = dict(mark[2]), mark[3]

    def commit(self) -> None:
        self.table._commit(self)


def write_snapshot(
    database: Database,
    table: ProducerTable,
    clock: Callable[[], int],
    catch_up_all: Callable[[sqlite3.Connection, Staged], None],
) -> int:
    """Catch up on every partition, then store the table with its offset vector."""
    staged = table.stage()
    with database.write() as conn:
        catch_up_all(conn, staged)
        staged.commit()
        snapshot_id = store.insert_snapshot(
            conn,
            clock(),
            len(table.entries),
            table.evictions,
            table.snapshot_body(),
            table.limits.producer_snapshots_kept,
        )
    table.records_since_snapshot = 0
    return snapshot_id
