"""broker/storage: what a data directory holds on disk, and which directories are refused.

The stored state is inspected with sqlite-utils, straight from the file, not through the
engine that wrote it. Every refusal is also checked to leave what was there untouched.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from msgspec.structs import replace

import broker
from broker.discovery import DB_FILE
from broker.engine.backup import inspect
from broker.engine.engine import ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.storage.database import APPLICATION_ID, SCHEMA_VERSION
from broker.types import NO_PRODUCER, NewRecord, ProducerFields
from support.stored import stored_records


def pragma(path: Path, name: str) -> Any:
    with contextlib.closing(sqlite_utils.Database(path)) as db:
        return next(iter(db.query(f"PRAGMA {name}")))[name]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_error(path: Path) -> BrokerError:
    with pytest.raises(BrokerError) as excinfo:
        broker.open(path).close()
    return excinfo.value


# a fencelog data directory ------------------------------------------------------------


def test_schema_version_is_recorded(engine: broker.Engine, data_dir: Path) -> None:
    assert SCHEMA_VERSION >= 1
    assert pragma(data_dir / DB_FILE, "user_version") == SCHEMA_VERSION


def test_database_is_in_wal_mode(engine: broker.Engine, data_dir: Path) -> None:
    assert pragma(data_dir / DB_FILE, "journal_mode") == "wal"


def test_database_is_marked_as_fencelogs(engine: broker.Engine, data_dir: Path) -> None:
    assert pragma(data_dir / DB_FILE, "application_id") == APPLICATION_ID


def test_data_dir_is_0700_and_files_0600(engine: broker.Engine, data_dir: Path) -> None:
    engine.create_topic("orders")
    engine.produce("orders", [NewRecord(b"x")])
    assert mode(data_dir) == 0o700
    files = [p for p in data_dir.iterdir() if p.name.startswith(DB_FILE)]
    assert data_dir / DB_FILE in files
    for path in files:  # the -wal and -shm files too, while the engine has them open
        assert mode(path) == 0o600, path.name


def test_nested_data_dir_is_created(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b" / "data"
    with broker.open(nested) as engine:
        engine.create_topic("orders")
    assert (nested / DB_FILE).is_file()
    assert mode(nested) == 0o700


_SOME = ("partition", "offset", "key", "value", "producer_id", "txn_id")


def test_stored_rows_after_produce(engine: broker.Engine, data_dir: Path) -> None:
    engine.create_topic("orders", partitions=2)
    engine.produce(
        "orders",
        [NewRecord(b"a", key=b"k", partition=1), NewRecord(b"bc", partition=1)],
    )
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        partitions = list(db.query("SELECT partition, next_offset, bytes FROM partitions"))
        rows = [
            {field: record[field] for field in _SOME}
            for record in stored_records(data_dir / DB_FILE)
        ]
    assert sorted(partitions, key=lambda p: p["partition"]) == [
        {"partition": 0, "next_offset": 0, "bytes": 0},
        {"partition": 1, "next_offset": 2, "bytes": 4},
    ]
    assert sorted(rows, key=lambda r: r["offset"]) == [
        {"partition": 1, "offset": 0, "key": b"k", "value": b"a", "producer_id": 0, "txn_id": None},
        {
            "partition": 1,
            "offset": 1,
            "key": None,
            "value": b"bc",
            "producer_id": 0,
            "txn_id": None,
        },
    ]


@pytest.mark.parametrize("size", [1, 2, 63, 197])
def test_plain_batches_of_any_size_store_every_offset_and_sequence(
    engine: broker.Engine, size: int
) -> None:
    """Each batch is one stored row: a group of a plain, an idempotent and a one-record
    produce reads back gap-free, every record with its own offset, value and
    sequence."""
    engine.create_topic("runs", partitions=2)
    lease = engine.lease_pid("runs", 1)
    values = [b"v%d" % i for i in range(size)]
    outcomes = engine.produce_group(
        [
            ProduceRequest("runs", [NewRecord(v, partition=1) for v in values], NO_PRODUCER),
            ProduceRequest(
                "runs",
                [NewRecord(v.upper(), partition=1) for v in values],
                ProducerFields(lease.producer_id, lease.generation + 1, 1),
            ),
            ProduceRequest("runs", [NewRecord(b"last", partition=1)], NO_PRODUCER),
        ]
    )
    assert [o if isinstance(o, BrokerError) else len(o) for o in outcomes] == [size, size, 1]
    read = engine.read("runs", 1, 0, 3 * size + 10)
    assert [r.offset for r in read] == list(range(2 * size + 1))
    assert [r.value for r in read] == values + [v.upper() for v in values] + [b"last"]
    assert [(r.producer_id, r.sequence) for r in read] == (
        [(0, 0)] * size + [(lease.producer_id, 1 + i) for i in range(size)] + [(0, 0)]
    )
    assert [r.generation for r in read] == [0] * size + [lease.generation + 1] * size + [0]
    assert {(r.key, r.headers, r.txn_id, r.epoch) for r in read} == {(None, (), None, 0)}
    batches = (read[:size], read[size : 2 * size])
    assert [len({r.timestamp_ms for r in batch}) for batch in batches] == [1, 1]  # one each
    assert engine.describe_topic("runs").partition_details[1].end_offset == 2 * size + 1


@pytest.mark.parametrize("size", [1, 2, 63, 197])
def test_batches_with_their_own_timestamps_store_each_records(
    engine: broker.Engine, size: int
) -> None:
    """A batch whose records carry the producer's timestamps and nothing else (a Kafka
    client's) keeps every record's own timestamp, offset and
    sequence, beside a keyed batch of the same group."""
    engine.create_topic("stamped")
    lease = engine.lease_pid("stamped", 0)
    stamps = [1_700_000_000_000 + 7 * i for i in range(size)]
    outcomes = engine.produce_group(
        [
            ProduceRequest(
                "stamped",
                [NewRecord(b"s%d" % i, None, (), 0, t) for i, t in enumerate(stamps)],
                ProducerFields(lease.producer_id, lease.generation, 1),
            ),
            ProduceRequest("stamped", [NewRecord(b"keyed", b"k", (), 0, 5)], NO_PRODUCER),
        ]
    )
    assert [len(o) for o in outcomes if not isinstance(o, BrokerError)] == [size, 1]
    read = engine.read("stamped", 0, 0, size + 10)
    assert [(r.offset, r.timestamp_ms, r.value) for r in read] == [
        (i, t, b"s%d" % i) for i, t in enumerate(stamps)
    ] + [(size, 5, b"keyed")]
    assert [(r.producer_id, r.sequence) for r in read[:size]] == [
        (lease.producer_id, 1 + i) for i in range(size)
    ]
    assert {(r.key, r.headers) for r in read[:size]} == {(None, ())}
    assert read[size].key == b"k"


@pytest.mark.parametrize("size", [1, 63, 128])
def test_a_transactions_plain_batches_of_any_size_commit_in_order(
    engine: broker.Engine, size: int
) -> None:
    """Two batches of one transaction commit gap-free, in the order they were
    produced."""
    engine.create_topic("runs")
    txn_id = engine.txn_begin("g").txn_id
    first = [b"a%d" % i for i in range(size)]
    second = [b"b%d" % i for i in range(size + 2)]
    for values in (first, second):
        engine.produce(
            "runs", [NewRecord(v) for v in values], producer=ProducerFields(txn_id=txn_id)
        )
    engine.txn_commit(txn_id)
    read = engine.read("runs", 0, 0, 3 * size + 10)
    assert [(r.offset, r.value) for r in read] == list(enumerate(first + second))
    assert {(r.key, r.headers, r.txn_id) for r in read} == {(None, (), txn_id)}


def test_records_survive_close_and_reopen(data_dir: Path) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders", partitions=2)
        engine.produce("orders", [NewRecord(b"one", partition=1), NewRecord(b"two", partition=1)])
    with broker.open(data_dir) as engine:
        assert engine.end_offsets("orders") == [0, 2]
        assert [r.value for r in engine.read("orders", 1, 0)] == [b"one", b"two"]
        assert pragma(data_dir / DB_FILE, "user_version") == SCHEMA_VERSION


def test_directory_with_only_fencelog_scratch_files_is_accepted(data_dir: Path) -> None:
    data_dir.mkdir(exist_ok=True)
    (data_dir / "leftover.tmp").write_bytes(b"")
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
    assert (data_dir / DB_FILE).is_file()


# directories and files that are not fencelog's ------------------------------------------


def test_non_empty_foreign_directory_is_refused_untouched(data_dir: Path) -> None:
    data_dir.mkdir(exist_ok=True)
    (data_dir / "notes.txt").write_text("mine\n")
    error = open_error(data_dir)
    assert error.code is ErrorCode.FOREIGN_DATA_DIR
    assert sorted(p.name for p in data_dir.iterdir()) == ["notes.txt"]
    assert (data_dir / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
    "content", [b"hello, this is not a database\n", b"\x00" * 100 + b"SQLite format 3" * 300]
)
def test_garbage_database_file_is_refused_untouched(data_dir: Path, content: bytes) -> None:
    data_dir.mkdir(exist_ok=True)
    (data_dir / DB_FILE).write_bytes(content)
    error = open_error(data_dir)
    assert error.code is ErrorCode.FOREIGN_DATA_DIR
    assert (data_dir / DB_FILE).read_bytes() == content
    assert sorted(p.name for p in data_dir.iterdir()) == [DB_FILE]


def test_an_emptied_database_is_damage_not_a_new_broker(data_dir: Path) -> None:
    """fencelog.db truncated to nothing (a failed copy, a lost write) opened as a fresh
    broker: no topics, and its pids and generations handed out again from the start.
    fencelog builds the file whole before it appears, so an empty one is damage."""
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"kept")])
    assert sorted(p.name for p in data_dir.iterdir()) == [DB_FILE]  # no temporary left
    (data_dir / DB_FILE).write_bytes(b"")
    error = open_error(data_dir)
    assert error.code is ErrorCode.DATA_CORRUPT
    assert "is empty (0 bytes)" in error.message
    assert (data_dir / DB_FILE).stat().st_size == 0  # untouched
    with pytest.raises(BrokerError) as checked:
        inspect(data_dir)
    assert checked.value.code is ErrorCode.DATA_CORRUPT


def test_what_a_creator_killed_mid_way_left_is_cleared_and_the_directory_opens(
    data_dir: Path,
) -> None:
    """A serve killed while it built a new database left its temporary files for good."""
    data_dir.mkdir(exist_ok=True)
    dead = 2**22 + 12345  # above Linux's largest pid_max: no such process
    left = [f"{DB_FILE}.{dead}.0badf00d.tmp", f"{DB_FILE}.{dead}.0badf00d.tmp-journal"]
    for name in left:
        (data_dir / name).write_bytes(b"half")
        os.utime(data_dir / name, (0, 0))  # long ago
    live = f"{DB_FILE}.{os.getpid()}.00000000.tmp"  # a creator still at work: kept
    (data_dir / live).write_bytes(b"")
    young = f"{DB_FILE}.{dead}.00000001.tmp"  # maybe another host's creator at work: kept
    (data_dir / young).write_bytes(b"")
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
    assert sorted(p.name for p in data_dir.iterdir()) == sorted([DB_FILE, live, young])


def test_a_directory_that_refuses_a_new_file_is_unreadable_not_a_storage_failure(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What SQLite answers in a directory this user may not write to (the tests may run
    as root, who writes anywhere): it was STORAGE_FAILED (34), not 30 as README says."""
    real = sqlite3.connect

    def refusing(database: Any, *args: Any, **kwargs: Any) -> Any:
        if str(database).endswith(".tmp"):
            raise sqlite3.OperationalError("unable to open database file")
        return real(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", refusing)
    error = open_error(data_dir)
    assert error.code is ErrorCode.DATA_DIR_UNREADABLE
    assert f"cannot create {data_dir / DB_FILE}: unable to open database file" in error.message
    assert not (data_dir / DB_FILE).exists()


def test_a_fencelog_database_another_process_holds_is_busy_not_foreign(data_dir: Path) -> None:
    """A lock held past the busy timeout at open is STORAGE_BUSY (retry), never
    FOREIGN_DATA_DIR (a verdict on the directory); once the lock goes, it opens."""
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"kept")])
    holder = sqlite3.connect(data_dir / DB_FILE, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(BrokerError) as excinfo:
            broker.open(data_dir, limits=replace(DEFAULT_LIMITS, busy_timeout_ms=100)).close()
    finally:
        holder.close()
    assert excinfo.value.code is ErrorCode.STORAGE_BUSY
    assert excinfo.value.message == (
        "the data directory stayed locked by another writer during the open of the data directory"
    )
    with broker.open(data_dir) as engine:
        assert [r.value for r in engine.read("orders", 0, 0)] == [b"kept"]


def test_someone_elses_sqlite_database_is_refused_untouched(data_dir: Path) -> None:
    data_dir.mkdir(exist_ok=True)
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        db.table("invoices").insert({"id": 1, "amount": 12})
    before = (data_dir / DB_FILE).read_bytes()
    error = open_error(data_dir)
    assert error.code is ErrorCode.FOREIGN_DATA_DIR
    assert "not fencelog's" in error.message
    assert (data_dir / DB_FILE).read_bytes() == before
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        assert db.table_names() == ["invoices"]
        assert list(db.query("SELECT id, amount FROM invoices")) == [{"id": 1, "amount": 12}]
    assert pragma(data_dir / DB_FILE, "journal_mode") == "delete"


def test_newer_schema_is_refused_untouched(data_dir: Path) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
        engine.produce("orders", [NewRecord(b"kept")])
    newer = SCHEMA_VERSION + 1
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        db.execute(f"PRAGMA user_version = {newer}")
    before = (data_dir / DB_FILE).read_bytes()

    error = open_error(data_dir)

    assert error.code is ErrorCode.SCHEMA_TOO_NEW
    assert error.details["found"] == newer
    assert error.details["supported"] == SCHEMA_VERSION
    assert "upgrade" in (error.hint or "")
    assert (data_dir / DB_FILE).read_bytes() == before
    assert pragma(data_dir / DB_FILE, "user_version") == newer


def test_regular_file_as_data_dir_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_bytes(b"contents")
    error = open_error(path)
    assert error.code is ErrorCode.DATA_DIR_UNREADABLE
    assert "not a directory" in error.message
    assert path.read_bytes() == b"contents"


def test_unknown_durability_is_refused_before_creating_anything(tmp_path: Path) -> None:
    new = tmp_path / "new"
    with pytest.raises(BrokerError) as excinfo:
        broker.open(new, durability="fast")  # type: ignore[arg-type]
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert not new.exists()


def test_plain_and_keyed_records_in_one_transaction_store_as_written(
    engine: broker.Engine, data_dir: Path
) -> None:
    """A plain batch is inserted with literal NULL key and X'90' headers (msgpack's empty
    array): it must read back exactly like one written through the general insert."""
    engine.create_topic("mixed")
    engine.produce("mixed", [NewRecord(b"plain-1"), NewRecord(b"plain-2")])
    engine.produce("mixed", [NewRecord(b"keyed", key=b"k", headers=(("h", b"v"),))])
    engine.produce("mixed", [NewRecord(b"empty-key", key=b"")])
    read = engine.read("mixed", 0, 0, 10)
    assert [(r.offset, r.key, r.value, r.headers) for r in read] == [
        (0, None, b"plain-1", ()),
        (1, None, b"plain-2", ()),
        (2, b"k", b"keyed", (("h", b"v"),)),
        (3, b"", b"empty-key", ()),
    ]
    stored = stored_records(data_dir / DB_FILE)
    assert [(type(r["value"]), r["headers"].hex()) for r in stored[:2]] == [(bytes, "90")] * 2
