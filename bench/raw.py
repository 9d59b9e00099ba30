"""The raw SQLite baseline: the same table, pragmas and rows as fencelog's, with nothing
of fencelog's Python in between.

Rules: the table comes from fencelog's own schema scripts (so it cannot drift from what
the engine writes into), the connection takes the pragmas the engine's takes for the
durability under test, every row has the shape the engine stores, and rows go in through
the engine's own insert statements (a multi-row insert for each RUN_ROWS records).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker.limits import DEFAULT_LIMITS
from broker.storage.database import SCHEMA_SCRIPTS, Durability, _statements
from broker.storage.queries import RUN_ROWS, Q

# The scan the issue names as the read baseline.
COUNT_RECORDS: Final = "SELECT count(*) FROM records"
SCAN_PARTITION: Final = "SELECT * FROM records WHERE topic_id = ? AND partition = ? ORDER BY offset"
INSERT_PLAIN: Final = Q["record_insert_plain"]
INSERT_RUN: Final = Q["record_insert_run"]
TIMESTAMP_MS: Final = 1_700_000_000_000


def connect(db_path: Path, durability: Durability) -> sqlite3.Connection:
    """A plain connection with the engine's pragmas: WAL, and synchronous by durability."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {DEFAULT_LIMITS.busy_timeout_ms}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {durability.upper()}")
    return conn


def create_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for _number, script in SCHEMA_SCRIPTS:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("COMMIT")


@dataclass(frozen=True, slots=True)
class RawBatch:
    """One batch as the parameters of the engine's own insert statements: record_insert_run
    for each RUN_ROWS records, record_insert_plain for each one left over."""

    runs: list[tuple[object, ...]]
    rest: list[tuple[object, ...]]


def raw_batch(topic_id: int, first_offset: int, values: Sequence[bytes]) -> RawBatch:
    """The rows of a keyless, headerless, producerless append, bound as the engine binds
    them (values as bytearrays, see broker/storage/logs.Appends)."""
    stored = list(map(bytearray, values))
    in_runs = len(stored) - len(stored) % RUN_ROWS
    runs: list[tuple[object, ...]] = [
        (
            topic_id,
            0,
            first_offset + start,
            TIMESTAMP_MS,
            0,
            0,
            0,
            0,
            0,
            *stored[start : start + RUN_ROWS],
        )
        for start in range(0, in_runs, RUN_ROWS)
    ]
    rest: list[tuple[object, ...]] = [
        (topic_id, 0, first_offset + index, TIMESTAMP_MS, stored[index], 0, 0, 0, 0)
        for index in range(in_runs, len(stored))
    ]
    return RawBatch(runs, rest)


def insert_batch(conn: sqlite3.Connection, batch: RawBatch) -> None:
    """One batch, one writer transaction, in the engine's statements."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(INSERT_RUN, batch.runs)
    conn.executemany(INSERT_PLAIN, batch.rest)
    conn.execute("COMMIT")


def count_records(conn: sqlite3.Connection) -> int:
    return int(conn.execute(COUNT_RECORDS).fetchone()[0])


def scan_partition(conn: sqlite3.Connection, topic_id: int, partition: int) -> list[object]:
    rows: list[object] = conn.execute(SCAN_PARTITION, (topic_id, partition)).fetchall()
    return rows
