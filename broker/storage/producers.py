"""Producer batch headers, id counters, producer snapshots and consumer offsets: rows."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from broker.storage.queries import Q


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    producer_id: int
    generation: int
    first_sequence: int
    last_sequence: int
    append_ms: int


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    snapshot_id: int
    created_ms: int
    producers: int
    evictions: int
    bytes: int


@dataclass(frozen=True, slots=True)
class OffsetRow:
    partition: int
    next_offset: int
    producer_state: bytes | None
    committed_ms: int


def batches_after(
    conn: sqlite3.Connection, topic_id: int, partition: int, offset: int
) -> list[BatchHeader]:
    rows = conn.execute(Q["batches_after"], (topic_id, partition, offset))
    return [BatchHeader(*row) for row in rows]


def offset_of_sequence(
    conn: sqlite3.Connection, topic_id: int, partition: int, producer_id: int, sequence: int
) -> int | None:
    """The offset the record with this (pid, sequence) was appended at, if known."""
    row = conn.execute(
        Q["batch_with_sequence"], (topic_id, partition, producer_id, sequence)
    ).fetchone()
    return None if row is None else int(row[0]) + sequence - int(row[1])


def counter(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(Q["counter_get"], (name,)).fetchone()
    return 0 if row is None else int(row[0])


def set_counter(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute(Q["counter_put"], (name, value))


def insert_snapshot(
    conn: sqlite3.Connection, now_ms: int, producers: int, evictions: int, body: bytes, keep: int
) -> int:
    cursor = conn.execute(Q["snapshot_insert"], (now_ms, producers, evictions, body))
    conn.execute(Q["snapshots_trim"], (keep,))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def newest_snapshot(conn: sqlite3.Connection) -> tuple[int, int, bytes] | None:
    row = conn.execute(Q["snapshot_newest"]).fetchone()
    return None if row is None else (int(row[0]), int(row[1]), bytes(row[2]))


def snapshots(conn: sqlite3.Connection) -> list[SnapshotRow]:
    return [SnapshotRow(*row) for row in conn.execute(Q["snapshots_all"])]


def delete_snapshots(conn: sqlite3.Connection) -> int:
    return conn.execute(Q["snapshots_delete_all"]).rowcount


def commit_offset(
    conn: sqlite3.Connection,
    group: str,
    topic_id: int,
    partition: int,
    next_offset: int,
    producer_state: bytes | None,
    now_ms: int,
) -> None:
    conn.execute(
        Q["offset_commit"], (group, topic_id, partition, next_offset, producer_state, now_ms)
    )


def offsets_of(conn: sqlite3.Connection, group: str, topic_id: int) -> list[OffsetRow]:
    return [OffsetRow(*row) for row in conn.execute(Q["offsets_of_group"], (group, topic_id))]


def entry_from_headers(
    conn: sqlite3.Connection, topic_id: int, partition: int, producer_id: int
) -> tuple[int, int, int, int] | None:
    """(generation, last sequence, first append_ms, last offset) of a pid on a partition,
    from its batch headers alone, or None if it never wrote there."""
    first_ms = first_append_ms(conn, topic_id, partition, producer_id)
    if first_ms is None:
        return None
    last = conn.execute(Q["batch_last_of_producer"], (topic_id, partition, producer_id)).fetchone()
    return int(last[0]), int(last[1]), first_ms, int(last[2])


def first_append_ms(
    conn: sqlite3.Connection, topic_id: int, partition: int, producer_id: int
) -> int | None:
    """When a pid's first record on a partition was appended: its lease starts there."""
    row = conn.execute(Q["batch_first_append_ms"], (topic_id, partition, producer_id)).fetchone()
    return None if row is None else int(row[0])


def set_group_state(
    conn: sqlite3.Connection, group: str, topic_id: int, producer_state: bytes
) -> None:
    """The producer state belongs to the (group, topic): the newest one on every row."""
    conn.execute(Q["offsets_state_put"], (producer_state, group, topic_id))
