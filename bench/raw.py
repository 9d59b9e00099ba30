"""The raw SQLite baseline: the same values, one row per record, in the table fencelog
kept its records in up to schema 014 (`records`), with the engine's pragmas and nothing
of fencelog's Python in between.

Rules: the table is fixed here (fencelog's own log is a log of batches since schema 015;
the baseline stays what the issues measured against: SQLite writing and reading a row
per record), the connection takes the pragmas the engine's takes for the durability
under test, and every row has the shape that table stored.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from broker.limits import DEFAULT_LIMITS
from broker.rows import EMPTY_HEADERS
from broker.types import Durability

TABLE: Final = """
CREATE TABLE records (
    topic_id     INTEGER NOT NULL,
    partition    INTEGER NOT NULL,
    offset       INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    key          BLOB,
    value        BLOB    NOT NULL,
    headers      BLOB    NOT NULL,
    producer_id  INTEGER NOT NULL DEFAULT 0,
    generation   INTEGER NOT NULL DEFAULT 0,
    sequence     INTEGER NOT NULL DEFAULT 0,
    epoch        INTEGER NOT NULL DEFAULT 0,
    txn_id       INTEGER,
    PRIMARY KEY (topic_id, partition, offset)
) STRICT, WITHOUT ROWID
"""
# The scan the issue names as the read baseline.
COUNT_RECORDS: Final = "SELECT count(*) FROM records"
SCAN_PARTITION: Final = "SELECT * FROM records WHERE topic_id = ? AND partition = ? ORDER BY offset"
INSERT_RECORD: Final = "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
TIMESTAMP_MS: Final = 1_700_000_000_000

RecordRow = tuple[int, int, int, int, bytes | None, bytes, bytes, int, int, int, int, int | None]


def connect(db_path: Path, durability: Durability) -> sqlite3.Connection:
    """A plain connection with the engine's pragmas: WAL, and synchronous by durability."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {DEFAULT_LIMITS.busy_timeout_ms}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {durability.upper()}")
    return conn


def create_schema(conn: sqlite3.Connection) -> None:
    conn.execute(TABLE)


def record_rows(topic_id: int, first_offset: int, values: Sequence[bytes]) -> list[RecordRow]:
    """Rows as the engine stores a keyless, headerless, producerless append."""
    return [
        (
            topic_id,
            0,
            first_offset + index,
            TIMESTAMP_MS,
            None,
            value,
            EMPTY_HEADERS,
            0,
            0,
            0,
            0,
            None,
        )
        for index, value in enumerate(values)
    ]


def insert_batch(conn: sqlite3.Connection, rows: Sequence[RecordRow]) -> None:
    """One batch, one writer transaction, as the engine does it."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(INSERT_RECORD, rows)
    conn.execute("COMMIT")


def count_records(conn: sqlite3.Connection) -> int:
    return int(conn.execute(COUNT_RECORDS).fetchone()[0])


def scan_partition(conn: sqlite3.Connection, topic_id: int, partition: int) -> list[object]:
    rows: list[object] = conn.execute(SCAN_PARTITION, (topic_id, partition)).fetchall()
    return rows
