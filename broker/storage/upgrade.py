"""The moves of the log's rows into a new layout, in bounded steps at open
(storage/database.py): schema 015's, the records of schemas 001-014, a row each in
`records`, become batches of `log`; schema 016's, the batches of 015's WITHOUT ROWID
table (renamed log_015) are copied as they are into `log`, a table with rowids.

Each step is one write transaction: it takes the first records left (in primary key
order), packs each run of them that one batch can hold (one partition, offsets with no
gap, the same producer fields with sequences that follow on, at most BATCH_RECORDS)
into a row of `log`, and deletes them from `records`. A kill -9 at any point leaves
either the step done or not begun, so the next open goes on from where the last step
ended; when nothing is left, `records` and log_batches (schema 013) are dropped. Then
016's steps, the same way: each copies the first batches of log_015 holding up to the
step's records (at least one batch) and deletes them there; log_015 is dropped once
empty. Until both have finished nothing else reads the log: the open finishes the moves
before it returns.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from typing import Any, Final

from broker import failpoints
from broker.rows import EMPTY_HEADERS
from broker.storage import batches
from broker.storage.queries import Q

STEP_RECORDS: Final = 50_000  # records a step moves (FENCELOG_MIGRATE_STEP_RECORDS)
BATCH_RECORDS: Final = 1_000  # records a batch of the move holds at most
FAILPOINT_ENV: Final = "FENCELOG_MIGRATE_FAILPOINT"
# moved: inside a step, its rows written but not committed; step: after it committed
FAILPOINT_STEPS: Final = ("moved", "step")


def pending(conn: sqlite3.Connection) -> bool:
    """Whether records of an old layout are left to move."""
    return _has(conn, "legacy_records_table") or _has(conn, "log_015_table")


def _has(conn: sqlite3.Connection, query: str) -> bool:
    found: tuple[int] | None = conn.execute(Q[query]).fetchone()
    return found is not None


def step_records() -> int:
    configured = os.environ.get("FENCELOG_MIGRATE_STEP_RECORDS", "")
    return int(configured) if configured.isdigit() and int(configured) > 0 else STEP_RECORDS


def move_step(conn: sqlite3.Connection, limit: int, points: failpoints.Failpoints) -> int:
    """Move up to `limit` records into the log (in the caller's write transaction): the
    records moved; 0: none was left, and the old tables are gone."""
    if _has(conn, "legacy_records_table"):
        moved = _move_records(conn, limit, points)
        if moved:
            return moved  # 015's move first: a directory of 014 has an empty log_015
    return _move_batches(conn, limit, points) if _has(conn, "log_015_table") else 0


def _move_batches(conn: sqlite3.Connection, limit: int, points: failpoints.Failpoints) -> int:
    """Schema 016's step: the first batches of log_015 up to `limit` records (at least
    one batch) copied into `log` and deleted there; their records, or 0: none was left,
    and log_015 is dropped."""
    last: tuple[int, int, int] | None = None
    taken = 0
    cursor = conn.execute(Q["log_015_first"], (limit,))  # a batch holds one record at least
    try:
        for topic_id, partition, first_offset, records in cursor:
            last = (topic_id, partition, first_offset)
            taken += records
            if taken >= limit:
                break
    finally:
        cursor.close()
    if last is None:
        conn.execute(Q["log_015_drop"])
        return 0
    conn.execute(Q["log_015_move"], last)
    conn.execute(Q["log_015_delete"], last)
    points.reached("moved")
    return taken


def _move_records(conn: sqlite3.Connection, limit: int, points: failpoints.Failpoints) -> int:
    """Schema 015's step: up to `limit` records of `records` packed into batches of
    `log`; their number, or 0: none was left, and the old tables are dropped."""
    found = conn.execute(Q["legacy_records_first"], (limit,)).fetchall()
    if not found:
        conn.execute(Q["legacy_records_drop"])
        conn.execute(Q["legacy_log_batches_drop"])
        return 0
    for run in _runs(found):
        conn.execute(Q["log_insert"], _packed(run))
        first, last = run[0], run[-1]
        conn.execute(Q["legacy_records_delete"], (first[0], first[1], first[2], last[2]))
    points.reached("moved")
    return len(found)


def _runs(found: list[Any]) -> Iterator[list[Any]]:
    """The records in runs that one batch holds."""
    run: list[Any] = []
    for record in found:
        if run and (len(run) >= BATCH_RECORDS or not _follows(run[-1], record)):
            yield run
            run = []
        run.append(record)
    if run:
        yield run


def _follows(previous: Any, record: Any) -> bool:
    """Whether record can follow previous in one batch: (topic_id, partition, offset,
    timestamp, key, value, headers, pid, generation, sequence, epoch, txn_id)."""
    topic_id, partition, offset = previous[:3]
    pid, generation, sequence, epoch, txn_id = previous[7:]
    return bool(
        record[0] == topic_id
        and record[1] == partition
        and record[2] == offset + 1
        and record[7] == pid
        and record[8] == generation
        and record[10] == epoch
        and record[11] == txn_id
        and (record[9] == sequence + 1 if sequence > 0 else record[9] == 0)
    )


def _packed(run: list[Any]) -> tuple[object, ...]:
    first = run[0]
    topic_id, partition, offset = first[:3]
    pid, generation, sequence, epoch, txn_id = first[7:]
    return batches.pack(
        (topic_id, partition, offset),
        [record[5] for record in run],
        [record[4] for record in run],
        [record[6] or EMPTY_HEADERS for record in run],
        [record[3] for record in run],
        (pid, generation, sequence, epoch, txn_id),
    )
