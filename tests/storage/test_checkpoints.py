"""Checkpoints off the writers' path (broker/storage/database.py Checkpoints).

A writing connection's commits no longer copy the WAL into the database file
themselves; a thread of the connection's own does so shortly after them. What a user
sees: written records reach the database file while the broker stays open, the WAL
stays bounded under a long run of writes, and closing leaves no thread behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
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


def test_records_reach_the_database_file_while_the_broker_stays_open(
    client: Client, data_dir: Path
) -> None:
    client.create_topic("t")
    client.produce("t", [bytes(1000)] * 8000, partition=0)  # 8 MB: 2,000 pages of WAL
    wait_until(
        lambda: database_bytes(data_dir) > 8 * MB,
        message=lambda: f"the database file holds {database_bytes(data_dir)} bytes",
    )
    assert len(checkpoint_threads()) >= 1


def test_the_wal_stays_bounded_under_a_long_run_of_writes(client: Client, data_dir: Path) -> None:
    client.create_topic("t")
    wal = data_dir / (DB_FILE + "-wal")
    largest = 0
    for _ in range(400):  # about 250 MB of WAL in commits of 5,000 records of 100 bytes
        client.produce("t", [bytes(100)] * 5000, partition=0)
        largest = max(largest, wal.stat().st_size)
    assert client.end_offsets("t") == [2_000_000]
    assert largest < 160 * MB, f"the WAL grew to {largest} bytes"


def test_a_reading_client_starts_no_thread(client: Client, data_dir: Path) -> None:
    client.create_topic("t")
    client.produce("t", [b"x"])
    before = checkpoint_threads()
    with connect(data_dir) as reader:
        assert [r.value for r in reader.fetch("t", {0: 0})] == [b"x"]
        assert checkpoint_threads() == before
