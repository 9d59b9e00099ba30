"""Checkpoints off a large commit's path (broker/storage/database.py Checkpoints).

A transaction's commit that copies its records into the log (those journaled before
schema 017; the others move in place) no longer copies the WAL into the database file
before it returns; a thread of the connection's own does so just after. What a user
sees: the committed records reach the database file while the broker stays open, the
WAL stays bounded under a long run of writes, several processes writing at once lose
nothing, and closing leaves no thread behind.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
from support.helpers import Processes
from support.waiting import wait_until

MB = 1 << 20


def checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fencelog-checkpoints"]


@pytest.fixture
def client(data_dir: Path) -> Iterator[Client]:
    before = checkpoint_threads()
    with connect(data_dir) as opened:
        yield opened
    assert checkpoint_threads() == before  # closing stopped the thread


def database_bytes(data_dir: Path) -> int:
    return (data_dir / DB_FILE).stat().st_size


def as_journaled_before_schema_17(data_dir: Path) -> None:
    """Turn every journaled batch into what schema 016's code left: its records packed
    in txn_batches' body (values, keys, headers, timestamps), no row of the log."""
    conn = sqlite3.connect(data_dir / DB_FILE)
    with conn:
        batches = conn.execute("SELECT rowid, records FROM txn_batches").fetchall()
        for rowid, records in batches:
            body = msgspec.msgpack.encode(([bytes(100)] * records, None, None, None))
            conn.execute(
                "UPDATE txn_batches SET body = ?, log_rowid = NULL WHERE rowid = ?", (body, rowid)
            )
        conn.execute("DELETE FROM log WHERE topic_id <= 0")
    conn.execute("VACUUM")  # no free pages left for the copy to fill
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all of it in the database file
    conn.close()


def test_a_large_copy_reaches_the_database_file_while_the_broker_stays_open(
    client: Client, data_dir: Path
) -> None:
    """A transaction journaled before the upgrade to schema 017 is copied at its commit:
    6 MB written in one SQLite transaction, checkpointed by the thread just after."""
    client.create_topic("t", 2)
    txn_id = client.txn_begin("g").txn_id
    for partition in (0, 1):
        client.produce("t", [bytes(100)] * 30_000, partition=partition, txn=txn_id)  # 6 MB
    as_journaled_before_schema_17(data_dir)
    before = database_bytes(data_dir)
    client.txn_commit(txn_id)
    assert client.end_offsets("t") == [30_000, 30_000]
    assert [r.value for r in client.fetch("t", {0: 29_999})] == [bytes(100)]
    wait_until(
        # the copy's first partition, 3 MB (the second's reuses the pages its journal freed)
        lambda: database_bytes(data_dir) > before + 2 * MB,
        message=lambda: f"the database file holds {database_bytes(data_dir)} bytes",
    )
    assert len(checkpoint_threads()) >= 1  # started by the commit's copy


def test_the_wal_stays_bounded_under_a_long_run_of_writes(client: Client, data_dir: Path) -> None:
    client.create_topic("t")
    wal = data_dir / (DB_FILE + "-wal")
    largest = 0
    for _ in range(400):  # about 250 MB of WAL in commits of 5,000 records of 100 bytes
        client.produce("t", [bytes(100)] * 5000, partition=0)
        largest = max(largest, wal.stat().st_size)
    assert client.end_offsets("t") == [2_000_000]
    assert largest < 160 * MB, f"the WAL grew to {largest} bytes"


def test_plain_writes_and_reads_start_no_thread(client: Client, data_dir: Path) -> None:
    before = checkpoint_threads()
    client.create_topic("t")
    client.produce("t", [b"x"] * 20_000)  # SQLite's own checkpoint takes care of these
    with connect(data_dir) as reader:
        assert len(reader.fetch("t", {0: 0})) > 0
    assert checkpoint_threads() == before


WRITER = r"""
import sys
from broker.client.client import connect
from broker.types import NewRecord

data_dir, partition = sys.argv[1], int(sys.argv[2])
with connect(data_dir) as client:
    for batch in range(60):
        client.produce("t", [NewRecord(b"%06d" % batch * 20, partition=partition)] * 5000)
print("done", flush=True)
"""


def test_writers_in_several_processes_lose_nothing_while_each_checkpoints(
    client: Client, data_dir: Path, processes: Processes
) -> None:
    """Three processes write at once, each with its checkpoint thread (a connection of
    its own in each process): every record is there and the file passes SQLite's
    integrity check. (A checkpoint thread that opened and closed the -shm file itself
    dropped its process's locks on it and corrupted the database here.)"""
    client.create_topic("t", 3)
    writers = [processes.python(WRITER, data_dir, str(p)) for p in (1, 2)]
    for batch in range(60):
        client.produce("t", [b"%06d" % batch * 20] * 5000, partition=0)
    for writer in writers:
        assert writer.wait(120) == 0, writer.stderr_text()
    assert client.end_offsets("t") == [300_000, 300_000, 300_000]
    with sqlite3.connect(data_dir / DB_FILE) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
