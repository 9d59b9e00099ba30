"""Producer state as the records hold it, lease rows, id counters, producer snapshots and
consumer offsets: rows."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from msgspec import Struct

from broker.rows import GroupOffsetRow, OffsetRow, SnapshotRow
from broker.storage.queries import Q
from broker.types import NO_OFFSET_METADATA, OffsetMetadata


class LeaseRow(Struct, frozen=True):
    """Where and when a pid's first record on a partition was appended."""

    first_offset: int
    first_ms: int


class LastRecord(Struct, frozen=True):
    """A pid's newest record in a stretch of a partition's log."""

    producer_id: int
    offset: int
    generation: int
    sequence: int
    timestamp_ms: int


def _last(
    producer_id: int,
    first_offset: int,
    last_offset: int,
    generation: int,
    first_sequence: int,
    timestamp_ms: int,
    timestamps: bytes | None,
) -> LastRecord:
    """A pid's newest record: the last of its newest batch."""
    if timestamps is not None:
        timestamp_ms = int(timestamps.rpartition(b"\n")[2])
    sequence = first_sequence + last_offset - first_offset
    return LastRecord(producer_id, last_offset, generation, sequence, timestamp_ms)


def last_records_after(
    conn: sqlite3.Connection, topic_id: int, partition: int, offset: int
) -> list[LastRecord]:
    """Each idempotent pid's newest record at or after offset, oldest first."""
    rows = conn.execute(Q["log_last_of_producers"], (topic_id, partition, offset))
    return [_last(*row) for row in rows if row[2] >= offset]


def last_record_of(
    conn: sqlite3.Connection, topic_id: int, partition: int, producer_id: int, first_offset: int
) -> LastRecord | None:
    """A pid's newest record, searched from the log end back to first_offset."""
    row = conn.execute(
        Q["log_last_of_producer"], (topic_id, partition, first_offset, producer_id)
    ).fetchone()
    return None if row is None else _last(producer_id, *row)


def offsets_of_sequences(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    producer_id: int,
    sequences: tuple[int, int],
    offsets: tuple[int, int],
) -> dict[int, int]:
    """{sequence: offset} of a pid's records with sequences in the closed range, searched
    between the offsets given (both included), from the higher one down."""
    first, last = sequences
    low, high = offsets
    found: dict[int, int] = {}
    cursor = conn.execute(
        Q["log_of_sequences"], (topic_id, partition, low, high, producer_id, first, last)
    )
    try:
        for first_offset, last_offset, first_sequence, offset_deltas in cursor:
            shift = first_offset - first_sequence
            held: Sequence[int]
            if offset_deltas is None:
                held = range(first_sequence, first_sequence + last_offset - first_offset + 1)
            else:  # compaction took some away
                held = [first_sequence + int(delta) for delta in offset_deltas.split()]
            for sequence in held:
                if first <= sequence <= last and low <= sequence + shift <= high:
                    found.setdefault(sequence, sequence + shift)
            if len(found) > last - first:
                break
    finally:
        cursor.close()
    return found


def insert_leases(conn: sqlite3.Connection, rows: list[tuple[int, int, int, int, int]]) -> None:
    """(topic_id, partition, producer_id, first_offset, first_ms) of pids' first batches."""
    conn.executemany(Q["lease_insert"], rows)


def lease_of(
    conn: sqlite3.Connection, topic_id: int, partition: int, producer_id: int
) -> LeaseRow | None:
    row = conn.execute(Q["lease_of_producer"], (topic_id, partition, producer_id)).fetchone()
    return None if row is None else LeaseRow(*row)


class IssuedPid(Struct, frozen=True):
    """A pid the broker handed out: at which generation (None: issued before schema 8,
    whose first batch on a partition sets it) and when."""

    generation: int | None
    issued_ms: int


def issue_pid(conn: sqlite3.Connection, pid: int, generation: int, now_ms: int) -> bool:
    """Record pid as issued; False if it already was (it must not be handed out again)."""
    return conn.execute(Q["producer_id_issue"], (pid, generation, now_ms)).rowcount == 1


def issued_pid(conn: sqlite3.Connection, pid: int) -> IssuedPid | None:
    row = conn.execute(Q["producer_id_issued"], (pid,)).fetchone()
    return None if row is None else IssuedPid(row[0], row[1])


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
    details: OffsetMetadata = NO_OFFSET_METADATA,
) -> None:
    conn.execute(
        Q["offset_commit"],
        (group, topic_id, partition, next_offset, producer_state, now_ms, *details),
    )


def offsets_of(conn: sqlite3.Connection, group: str, topic_id: int) -> list[OffsetRow]:
    return [OffsetRow(*row) for row in conn.execute(Q["offsets_of_group"], (group, topic_id))]


def all_group_offsets(conn: sqlite3.Connection, limit: int) -> list[GroupOffsetRow]:
    """Every consumer group's next offsets, by group, topic and partition."""
    return [GroupOffsetRow(*row) for row in conn.execute(Q["offsets_all_groups"], (limit,))]


def delete_group_offsets(conn: sqlite3.Connection, group: str) -> int:
    """Forget every committed offset of group; how many there were."""
    return conn.execute(Q["offsets_delete_group"], (group,)).rowcount


def delete_offset(conn: sqlite3.Connection, group: str, topic_id: int, partition: int) -> None:
    conn.execute(Q["offsets_delete_partition"], (group, topic_id, partition))


def set_group_state(
    conn: sqlite3.Connection, group: str, topic_id: int, producer_state: bytes
) -> None:
    """The producer state belongs to the (group, topic): the newest one on every row."""
    conn.execute(Q["offsets_state_put"], (producer_state, group, topic_id))
