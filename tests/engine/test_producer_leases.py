"""Producer state kept in memory and in the records (schema 006): what a user sees of it.

An idempotent commit writes only its records (and a pid's lease row with its first batch
on a partition). These tests hold the broker to DESIGN.md section 4 where that could go
wrong: a duplicate, old or new and cut into batches as the originals were or not, gets
its original offsets from the records, in the same process and after a restart with or
without snapshots; a producer's own record timestamps never move its lease; and a data
directory written by schema 005 (batch headers) opens in place with its producer state
and its duplicates intact.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgpack
import pytest
from msgspec.structs import replace

from broker.discovery import DB_FILE
from broker.engine import backup
from broker.engine.engine import Engine, ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.rows import EMPTY_HEADERS
from broker.storage import producers as producer_store
from broker.storage.database import (
    APPLICATION_ID,
    SCHEMA_SCRIPTS,
    SCHEMA_VERSION,
    _statements,
)
from broker.types import Lease, NewRecord, ProducerFields
from support.producing import FakeClock, open_engine, state_rows

LEASE_MS = 60_000
TOPIC = "orders"
LIMITS: Limits = replace(DEFAULT_LIMITS, pid_lease_ms=LEASE_MS)


def send(
    engine: Engine,
    lease: Lease | tuple[int, int],
    sequence: int,
    values: list[str],
    *,
    timestamp_ms: int | None = None,
) -> list[tuple[int, bool]]:
    pid, generation = (lease.producer_id, lease.generation) if isinstance(lease, Lease) else lease
    records = [NewRecord(v.encode(), None, (), 0, timestamp_ms) for v in values]
    results = engine.produce(TOPIC, records, producer=ProducerFields(pid, generation, sequence))
    return [(r.offset, r.duplicate) for r in results]


def plain(engine: Engine, value: str) -> int:
    (result,) = engine.produce(TOPIC, [NewRecord(value.encode(), partition=0)])
    return result.offset


def values(engine: Engine) -> list[bytes | None]:
    return [r.value for r in engine.read(TOPIC, 0, 0)]


def restart(opened: list[Engine], engine: Engine, clock: FakeClock, *, snapshots: bool) -> Engine:
    data_dir = engine.database.data_dir.path
    engine.close()
    opened.remove(engine)
    if not snapshots:
        with sqlite3.connect(data_dir / DB_FILE) as conn:
            producer_store.delete_snapshots(conn)
        conn.close()
    return open_engine(opened, data_dir, clock, LIMITS)


def interleaved_history(engine: Engine) -> tuple[Lease, dict[int, int]]:
    """A pid's six batches (sequences 1..9) between other producers' records; the offset
    of each of its sequences."""
    engine.create_topic(TOPIC)
    lease, other = engine.lease_pid(TOPIC, 0), engine.lease_pid(TOPIC, 0)
    where: dict[int, int] = {}
    other_sequence = 1
    for first, count in ((1, 2), (3, 1), (4, 3), (7, 1), (8, 1), (9, 1)):
        plain(engine, f"plain-{first}")
        send(engine, other, other_sequence, [f"other-{other_sequence}"])
        other_sequence += 1
        appended = send(engine, lease, first, [f"s{s}" for s in range(first, first + count)])
        assert all(not duplicate for _, duplicate in appended)
        where.update(zip(range(first, first + count), (o for o, _ in appended), strict=True))
    return lease, where


@pytest.mark.parametrize("when", ["running", "restarted", "restarted-without-snapshots"])
def test_a_duplicate_of_any_batch_gets_its_original_offsets(
    opened: list[Engine], data_dir: Path, when: str
) -> None:
    clock = FakeClock()
    engine = open_engine(opened, data_dir, clock, LIMITS)
    lease, where = interleaved_history(engine)
    engine.snapshot_producers()
    if when != "running":
        engine = restart(opened, engine, clock, snapshots=when == "restarted")
    before = values(engine)
    # the oldest batch, a batch cut differently from the originals (it spans three), and
    # the newest
    assert send(engine, lease, 1, ["s1", "s2"]) == [(where[1], True), (where[2], True)]
    assert send(engine, lease, 2, ["s2", "s3", "s4"]) == [(where[s], True) for s in (2, 3, 4)]
    assert send(engine, lease, 9, ["s9"]) == [(where[9], True)]
    assert values(engine) == before
    assert send(engine, lease, 10, ["s10"]) == [(len(before), False)]


def test_a_duplicate_within_one_group_commit_gets_the_offset_staged_before_it(
    opened: list[Engine], data_dir: Path
) -> None:
    engine = open_engine(opened, data_dir, FakeClock(), LIMITS)
    engine.create_topic(TOPIC)
    lease = engine.lease_pid(TOPIC, 0)
    record = [NewRecord(b"a", partition=0)]
    fields = ProducerFields(lease.producer_id, lease.generation, 1)
    outcomes = engine.produce_group(
        [ProduceRequest(TOPIC, record, fields), ProduceRequest(TOPIC, record, fields)]
    )
    assert [
        [(r.offset, r.duplicate) for r in o] for o in outcomes if not isinstance(o, BrokerError)
    ] == [
        [(0, False)],
        [(0, True)],
    ]
    assert values(engine) == [b"a"]


@pytest.mark.parametrize("snapshots", [True, False], ids=["snapshots", "no-snapshots"])
def test_a_producers_own_timestamps_never_move_its_lease(
    opened: list[Engine], data_dir: Path, snapshots: bool
) -> None:
    clock = FakeClock()
    engine = open_engine(opened, data_dir, clock, LIMITS)
    engine.create_topic(TOPIC)
    lease = engine.lease_pid(TOPIC, 0)
    appended_ms = clock.now_ms
    send(engine, lease, 1, ["old"], timestamp_ms=appended_ms - 10 * LEASE_MS)
    clock.advance(10)
    send(engine, lease, 2, ["new"], timestamp_ms=appended_ms + 10 * LEASE_MS)
    engine = restart(opened, engine, clock, snapshots=snapshots)
    assert engine.lease_pid(TOPIC, 0, lease.producer_id).expire_ms == appended_ms + LEASE_MS
    clock.now_ms = appended_ms + LEASE_MS - 1
    assert send(engine, lease, 3, ["last"]) == [(2, False)]
    clock.now_ms = appended_ms + LEASE_MS
    with pytest.raises(BrokerError) as raised:
        send(engine, lease, 4, ["late"])
    assert raised.value.code is ErrorCode.PID_EXPIRED


# a data directory written by schema 005 -------------------------------------------------

T0 = 5_000_000
OLD_PID, OTHER_PID, TXN_PID, GENERATION = 101, 102, 103, 7
# offset: (timestamp_ms, value, producer_id, generation, sequence, txn_id)
OLD_RECORDS = {
    0: (T0 - 3 * LEASE_MS, b"a1", OLD_PID, GENERATION, 1, None),  # the producer's own time
    1: (T0, b"a2", OLD_PID, GENERATION, 2, None),
    2: (T0 + 5, b"plain", 0, 0, 0, None),
    3: (T0 + 10, b"a3", OLD_PID, GENERATION, 3, None),
    4: (T0 + 20, b"b1", OTHER_PID, 1, 1, None),
    5: (T0 + 30, b"t1", TXN_PID, 1, 0, 9),  # a committed transaction's record
}
# (base_offset, producer_id, generation, first_sequence, last_sequence, append_ms)
OLD_HEADERS = [
    (0, OLD_PID, GENERATION, 1, 2, T0),
    (3, OLD_PID, GENERATION, 3, 3, T0 + 10),
    (4, OTHER_PID, 1, 1, 1, T0 + 20),
]


def write_schema_005(data_dir: Path, *, with_snapshot: bool) -> None:
    """The directory fencelog wrote before schema 006: records, batch headers, and (if
    asked) a producer snapshot taken at offset 2 that knows only OLD_PID's first batch."""
    data_dir.mkdir(mode=0o700, exist_ok=True)
    conn = sqlite3.connect(data_dir / DB_FILE, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for number, script in SCHEMA_SCRIPTS[:5]:
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("INSERT INTO topics VALUES (1, ?, 1, ?, NULL)", (TOPIC, T0 - LEASE_MS))
        conn.execute("INSERT INTO partitions VALUES (1, 0, ?, 0)", (len(OLD_RECORDS),))
        conn.execute("INSERT INTO counters VALUES ('next_producer_id', 200)")
        conn.execute("INSERT INTO counters VALUES ('next_topic_id', 2)")
        conn.executemany(
            "INSERT INTO records VALUES (1, 0, ?, ?, NULL, ?, ?, ?, ?, ?, 0, ?)",
            [(o, ts, v, EMPTY_HEADERS, *fields) for o, (ts, v, *fields) in OLD_RECORDS.items()],
        )
        conn.executemany(
            "INSERT INTO producer_batches VALUES (1, 0, ?, ?, ?, ?, ?, ?)", OLD_HEADERS
        )
        if with_snapshot:
            body = msgpack.packb(
                {
                    "entries": [(1, 0, (OLD_PID, GENERATION, 2, T0, 1))],
                    "replayed": [(1, 0, 2)],
                    "evictions": 0,
                    "last_ms": [(1, 0, OLD_PID, T0)],
                }
            )
            conn.execute("INSERT INTO producer_snapshots VALUES (1, ?, 1, 0, ?)", (T0 + 6, body))
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.mark.parametrize("with_snapshot", [True, False], ids=["snapshot", "no-snapshot"])
def test_a_schema_005_directory_opens_with_its_producer_state_and_duplicates(
    opened: list[Engine], data_dir: Path, with_snapshot: bool
) -> None:
    write_schema_005(data_dir, with_snapshot=with_snapshot)
    clock = FakeClock(T0 + 100)
    engine = open_engine(opened, data_dir, clock, LIMITS)
    assert engine.status().schema_version == SCHEMA_VERSION
    # the state the headers held; the lease from the first batch's append time
    assert state_rows(engine.producer_states(TOPIC)) == [
        (0, OLD_PID, GENERATION, 3, T0, 3),
        (0, OTHER_PID, 1, 1, T0 + 20, 4),
    ]
    assert engine.lease_pid(TOPIC, 0, OLD_PID).expire_ms == T0 + LEASE_MS
    with pytest.raises(BrokerError) as raised:
        # its transaction's record has no sequence, and the upgrade to schema 8 issues
        # only the pids its lease rows and transaction members name
        engine.lease_pid(TOPIC, 0, TXN_PID)
    assert raised.value.code is ErrorCode.UNKNOWN_PID
    # duplicates get the offsets the old broker appended them at
    old = (OLD_PID, GENERATION)
    assert send(engine, old, 1, ["a1", "a2"]) == [(0, True), (1, True)]
    assert send(engine, old, 2, ["a2", "a3"]) == [(1, True), (3, True)]
    assert send(engine, (OTHER_PID, 1), 1, ["b1"]) == [(4, True)]
    # and the pids go on where they were
    assert send(engine, old, 4, ["a4"]) == [(6, False)]
    assert send(engine, (OTHER_PID, 1), 2, ["b2"]) == [(7, False)]
    assert values(engine) == [b"a1", b"a2", b"plain", b"a3", b"b1", b"t1", b"a4", b"b2"]
    clock.now_ms = T0 + LEASE_MS
    with pytest.raises(BrokerError) as expired:
        send(engine, old, 5, ["a5"])
    assert expired.value.code is ErrorCode.PID_EXPIRED


def test_a_schema_005_directory_keeps_working_after_the_upgrade_and_a_restart(
    opened: list[Engine], data_dir: Path
) -> None:
    write_schema_005(data_dir, with_snapshot=False)
    clock = FakeClock(T0 + 100)
    engine = open_engine(opened, data_dir, clock, LIMITS)
    assert send(engine, (OLD_PID, GENERATION), 4, ["a4"]) == [(6, False)]
    fresh = engine.lease_pid(TOPIC, 0)
    assert send(engine, fresh, 1, ["c1"]) == [(7, False)]
    engine = restart(opened, engine, clock, snapshots=False)
    assert send(engine, fresh, 1, ["c1"]) == [(7, True)]
    assert send(engine, (OLD_PID, GENERATION), 3, ["a3", "a4"]) == [(3, True), (6, True)]
    assert engine.lease_pid(TOPIC, 0, fresh.producer_id).expire_ms == T0 + 100 + LEASE_MS


def test_a_restored_schema_005_snapshot_file_opens_upgraded(
    opened: list[Engine], tmp_path: Path
) -> None:
    old_dir = tmp_path / "old"
    write_schema_005(old_dir, with_snapshot=True)  # closed: the file holds everything
    target = tmp_path / "restored"
    backup.restore(old_dir / DB_FILE, target, force=False, progress=lambda done, total: None)
    engine = open_engine(opened, target, FakeClock(T0 + 100), LIMITS)
    assert engine.status().schema_version == SCHEMA_VERSION
    assert send(engine, (OLD_PID, GENERATION), 3, ["a3"]) == [(3, True)]
    assert send(engine, (OLD_PID, GENERATION), 4, ["a4"]) == [(6, False)]


def one_record(value: bytes | None, fields: ProducerFields, at_ms: int | None) -> ProduceRequest:
    return ProduceRequest(TOPIC, [NewRecord(value, None, (), 0, at_ms)], fields)


@pytest.mark.parametrize("when", ["running", "restarted", "restarted-without-snapshots"])
def test_one_record_produces_of_one_group_commit_keep_every_records_fields(
    opened: list[Engine], data_dir: Path, when: str
) -> None:
    """A server's group commit of one-record requests (a producer's window in flight,
    plain produces from other clients) is stored in as few batches as it can be; every
    record keeps its offset, sequence, timestamp and value (null and empty ones too), a
    duplicate of any of them gets its original offset, and the producer's next sequence
    is the one after its last, also when its state is rebuilt from the log alone."""
    clock = FakeClock()
    engine = open_engine(opened, data_dir, clock, LIMITS)
    engine.create_topic(TOPIC)
    lease, other = engine.lease_pid(TOPIC, 0), engine.lease_pid(TOPIC, 0)
    now = clock.now_ms
    requests: list[ProduceRequest] = []
    for sequence in range(1, 41):
        value = [b"v%d" % sequence, None, b"", b"x" * sequence][sequence % 4]
        at_ms = now - 1000 + sequence * 7 if sequence % 5 else None  # None: the append's
        mine = ProducerFields(lease.producer_id, lease.generation, sequence)
        requests.append(one_record(value, mine, at_ms))
        if sequence in (12, 30):  # another producer's record and a plain one cut the run
            theirs = ProducerFields(other.producer_id, other.generation, sequence // 12)
            requests.append(one_record(b"other", theirs, None))
            requests.append(one_record(b"plain", ProducerFields(), None))
    outcomes = engine.produce_group(requests)
    offsets = [r.offset for o in outcomes if not isinstance(o, BrokerError) for r in o]
    assert offsets == list(range(len(requests)))
    sent = [(r.records[0], r.producer) for r in requests]
    expected = [(s.value, p.producer_id, p.first_sequence, s.timestamp_ms or now) for s, p in sent]
    where = {
        r.producer.first_sequence: offset
        for r, offset in zip(requests, offsets, strict=True)
        if r.producer.producer_id == lease.producer_id
    }
    if when != "running":
        engine = restart(opened, engine, clock, snapshots=when == "restarted")
    stored = engine.read(TOPIC, 0, 0, max_records=1000)
    assert [(r.value, r.producer_id, r.sequence, r.timestamp_ms) for r in stored] == expected
    assert [r.offset for r in stored] == offsets
    for sequence in (1, 7, 12, 13, 20, 31, 40):  # inside runs and at their ends
        assert send(engine, lease, sequence, ["again"]) == [(where[sequence], True)]
    with pytest.raises(BrokerError) as raised:
        send(engine, lease, 42, ["a gap"])
    assert raised.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert send(engine, lease, 41, ["next"]) == [(len(requests), False)]
