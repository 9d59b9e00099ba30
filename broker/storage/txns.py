"""Transactions, their journal entries and their data journals in SQLite: rows, never rules.

The copy of a partition's journaled records into its log is one INSERT ... SELECT: the
records never pass through Python on their way from the data journal to the log.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from itertools import repeat

import msgpack
from msgspec import Struct

from broker.rows import EMPTY_HEADERS, encode_headers
from broker.storage.logs import VALUE, plain_records
from broker.storage.queries import RUN_ROWS, Q
from broker.types import NewRecord, Record

TXN_COUNTER = "next_txn_id"


class TxnRow(Struct, frozen=True):
    txn_id: int
    group: str
    key: str | None
    journal: int
    state: str
    began_ms: int
    deadline_ms: int
    ended_ms: int | None
    reason: str | None
    prepare_position: int | None


class TxnPartitionRow(Struct, frozen=True):
    topic_id: int
    topic: str | None  # None: the topic was deleted since
    partition: int
    records: int
    bytes: int
    base_offset: int | None  # None until APPLY_COMMIT copied it into the log


class JournalEntry(Struct, frozen=True):
    journal: int
    position: int
    kind: str
    at_ms: int
    body: object


def insert(
    conn: sqlite3.Connection,
    txn_id: int,
    group: str,
    key: str | None,
    journal: int,
    began_ms: int,
    deadline_ms: int,
) -> None:
    conn.execute(Q["txn_insert"], (txn_id, group, key, journal, began_ms, deadline_ms))


def by_id(conn: sqlite3.Connection, txn_id: int) -> TxnRow | None:
    row = conn.execute(Q["txn_by_id"], (txn_id,)).fetchone()
    return TxnRow(*row) if row else None


def by_key(conn: sqlite3.Connection, group: str, key: str) -> TxnRow | None:
    row = conn.execute(Q["txn_by_key"], (group, key)).fetchone()
    return TxnRow(*row) if row else None


def live(conn: sqlite3.Connection) -> list[TxnRow]:
    return [TxnRow(*row) for row in conn.execute(Q["txns_live"])]


def recent(conn: sqlite3.Connection, limit: int) -> list[TxnRow]:
    return [TxnRow(*row) for row in conn.execute(Q["txns_recent"], (limit,))]


def expired(conn: sqlite3.Connection, now_ms: int) -> list[int]:
    return [row[0] for row in conn.execute(Q["txns_expired"], (now_ms,))]


def prepared(conn: sqlite3.Connection, journal: int | None = None, upto: int = 0) -> list[int]:
    """Prepared transactions in journal order (of one journal up to a position, or all)."""
    if journal is None:
        return [row[0] for row in conn.execute(Q["txns_prepared"])]
    return [row[0] for row in conn.execute(Q["txns_prepared_in_journal"], (journal, upto))]


def set_state(
    conn: sqlite3.Connection, txn_id: int, state: str, ended_ms: int | None, reason: str | None
) -> None:
    conn.execute(Q["txn_set_state"], (state, ended_ms, reason, txn_id))


def set_deadline(conn: sqlite3.Connection, txn_id: int, deadline_ms: int) -> None:
    conn.execute(Q["txn_set_deadline"], (deadline_ms, txn_id))


def set_prepared(conn: sqlite3.Connection, txn_id: int, position: int) -> None:
    conn.execute(Q["txn_set_prepared"], (position, txn_id))


def journal_append(
    conn: sqlite3.Connection, journal: int, txn_id: int, kind: str, at_ms: int, body: object
) -> int:
    """Append an entry to journal partition `journal`; its position."""
    position = int(conn.execute(Q["txn_journal_end"], (journal,)).fetchone()[0])
    packed = None if body is None else msgpack.packb(body, use_bin_type=True)
    conn.execute(Q["txn_journal_append"], (journal, position, txn_id, kind, at_ms, packed))
    return position


def journal_of(conn: sqlite3.Connection, txn_id: int) -> list[JournalEntry]:
    return [
        JournalEntry(
            journal,
            position,
            kind,
            at_ms,
            None if body is None else msgpack.unpackb(body, raw=False),
        )
        for journal, position, kind, at_ms, body in conn.execute(Q["txn_journal_of"], (txn_id,))
    ]


def partitions_of(conn: sqlite3.Connection, txn_id: int) -> list[TxnPartitionRow]:
    return [TxnPartitionRow(*row) for row in conn.execute(Q["txn_partitions_of"], (txn_id,))]


def journal_sequence(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int
) -> tuple[int | None, int]:
    """A partition's first sequence in the transaction (None: not sequenced yet) and the
    number of records journaled there."""
    conn.execute(Q["txn_partition_touch"], (txn_id, topic_id, partition))
    row = conn.execute(Q["txn_first_sequence"], (txn_id, topic_id, partition)).fetchone()
    end = conn.execute(Q["txn_data_end"], (txn_id, topic_id, partition)).fetchone()
    return (None if row is None else row[0]), int(end[0])


def set_first_sequence(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int, sequence: int
) -> None:
    conn.execute(Q["txn_first_sequence_set"], (txn_id, topic_id, partition, sequence))


def journal_records(
    conn: sqlite3.Connection,
    txn_id: int,
    topic_id: int,
    partition: int,
    records: Sequence[NewRecord],
    now_ms: int,
    producer_id: int,
    generation: int,
    epoch: int,
) -> None:
    """Append records to one partition's data journal, tagged with the transaction, and
    add them to the partition's counts."""
    start = int(conn.execute(Q["txn_data_end"], (txn_id, topic_id, partition)).fetchone()[0])
    count = len(records)
    if plain_records(records):
        values = list(map(bytearray, map(VALUE, records)))  # bound as is, see logs.Appends
        size = sum(map(len, values))
        conn.execute(Q["txn_partition_add"], (txn_id, topic_id, partition, count, size))
        in_runs = count - count % RUN_ROWS
        conn.executemany(
            Q["txn_data_insert_run"],
            (
                (
                    txn_id,
                    topic_id,
                    partition,
                    start + first,
                    now_ms,
                    producer_id,
                    generation,
                    epoch,
                    *values[first : first + RUN_ROWS],
                )
                for first in range(0, in_runs, RUN_ROWS)
            ),
        )
        conn.executemany(
            Q["txn_data_insert_plain"],
            zip(
                repeat(txn_id),
                repeat(topic_id),
                repeat(partition),
                range(start + in_runs, start + count),
                repeat(now_ms),
                values[in_runs:],
                repeat(producer_id),
                repeat(generation),
                repeat(epoch),
            ),
        )
        return
    size = sum(len(record.value) + len(record.key or b"") for record in records)
    conn.execute(Q["txn_partition_add"], (txn_id, topic_id, partition, count, size))
    conn.executemany(
        Q["txn_data_insert"],
        (
            (
                txn_id,
                topic_id,
                partition,
                start + index,
                now_ms if record.timestamp_ms is None else record.timestamp_ms,
                record.key,
                record.value,
                encode_headers(record.headers) if record.headers else EMPTY_HEADERS,
                producer_id,
                generation,
                epoch,
            )
            for index, record in enumerate(records)
        ),
    )


def recount(conn: sqlite3.Connection, txn_id: int) -> None:
    """Count each partition's records and bytes again, from its data journal: after
    journaled records were discarded (journaling keeps the counts otherwise)."""
    conn.execute(Q["txn_partition_count"], (txn_id,))


def drop_empty(conn: sqlite3.Connection, txn_id: int) -> None:
    """Forget the partitions left with no record (at PREPARE_COMMIT)."""
    conn.execute(Q["txn_partitions_drop_empty"], (txn_id,))


def copy_partition(
    conn: sqlite3.Connection,
    txn_id: int,
    topic_id: int,
    partition: int,
    base_offset: int,
    epoch: int,
    records: int,
) -> int:
    """APPLY_COMMIT of one partition: copy its journaled records (`records` of them)
    into the log from base_offset, stamped with the topic's epoch now, inside SQLite;
    how many were copied. Positions without gaps (nothing fenced or dropped) map
    straight to offsets; otherwise the records are numbered in position order."""
    args = (txn_id, topic_id, partition, base_offset, epoch)
    end = conn.execute(Q["txn_data_end"], args[:3]).fetchone()[0]
    contiguous = end == records
    cursor = conn.execute(Q["txn_data_copy" if contiguous else "txn_data_copy_numbered"], args)
    return cursor.rowcount


def mark_applied(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int, base_offset: int
) -> None:
    """Record that a partition was copied (base_offset -1: its topic was deleted) and
    drop its data journal."""
    conn.execute(Q["txn_partition_applied"], (base_offset, txn_id, topic_id, partition))
    conn.execute(Q["txn_data_delete_partition"], (txn_id, topic_id, partition))


def data_records(conn: sqlite3.Connection, txn_id: int, limit: int) -> list[Record]:
    """The data journal's records of a transaction (offset: position in its journal)."""
    return list(map(Record._make, conn.execute(Q["txn_data_read"], (txn_id, limit))))


def discard(conn: sqlite3.Connection, txn_id: int) -> None:
    """Drop everything a transaction journaled: its data, members and pending offsets."""
    conn.execute(Q["txn_data_delete"], (txn_id,))
    conn.execute(Q["txn_members_delete"], (txn_id,))
    conn.execute(Q["txn_offsets_delete"], (txn_id,))
    conn.execute(Q["txn_fences_delete"], (txn_id,))


def drop_partitions(conn: sqlite3.Connection, txn_id: int) -> None:
    conn.execute(Q["txn_partitions_delete"], (txn_id,))


def fence_older(conn: sqlite3.Connection, txn_id: int, producer_id: int, generation: int) -> int:
    """Discard a member's records of older generations; how many."""
    discarded = int(conn.execute(Q["txn_data_fence"], (txn_id, producer_id, generation)).rowcount)
    if discarded:
        recount(conn, txn_id)
    return discarded


def member(conn: sqlite3.Connection, txn_id: int, name: str) -> tuple[int, int] | None:
    row = conn.execute(Q["txn_member_get"], (txn_id, name)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def member_by_pid(
    conn: sqlite3.Connection, txn_id: int, producer_id: int
) -> tuple[str, int] | None:
    row = conn.execute(Q["txn_member_by_pid"], (txn_id, producer_id)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def put_member(
    conn: sqlite3.Connection, txn_id: int, name: str, producer_id: int, generation: int
) -> None:
    conn.execute(Q["txn_member_put"], (txn_id, name, producer_id, generation))


def put_offset(
    conn: sqlite3.Connection,
    txn_id: int,
    group: str,
    topic_id: int,
    partition: int,
    offset: int,
    producer_state: bytes | None,
) -> None:
    conn.execute(Q["txn_offset_put"], (txn_id, group, topic_id, partition, offset, producer_state))


def apply_offsets(conn: sqlite3.Connection, txn_id: int, now_ms: int) -> int:
    """Make a transaction's consumer offsets the committed ones; how many. A producer
    state given with them becomes the (group, topic)'s, as commit_offsets does."""
    count = int(conn.execute(Q["txn_offsets_count"], (txn_id,)).fetchone()[0])
    states = conn.execute(Q["txn_offset_states"], (txn_id,)).fetchall()
    conn.execute(Q["txn_offsets_apply"], (txn_id, now_ms))
    for group, topic_id, producer_state in states:
        conn.execute(Q["offsets_state_put"], (producer_state, group, topic_id))
    conn.execute(Q["txn_offsets_delete"], (txn_id,))
    return count


def put_fences(
    conn: sqlite3.Connection, txn_id: int, fences: Iterable[tuple[str, str, int]]
) -> None:
    conn.executemany(Q["txn_fence_put"], ((txn_id, *fence) for fence in fences))


def fences_of(conn: sqlite3.Connection, txn_id: int) -> list[tuple[str, str, int]]:
    return [(g, r, int(n)) for g, r, n in conn.execute(Q["txn_fences_of"], (txn_id,))]


def topics_of(conn: sqlite3.Connection, txn_id: int) -> list[int]:
    return [int(row[0]) for row in conn.execute(Q["txn_topics"], (txn_id,))]


def delete_topic(conn: sqlite3.Connection, topic_id: int) -> None:
    conn.execute(Q["txn_data_delete_topic"], (topic_id,))


def prune(conn: sqlite3.Connection, keep: int) -> None:
    """Forget ended transactions beyond the newest `keep` (by id)."""
    for (txn_id,) in conn.execute(Q["txns_prune"], (keep,)).fetchall():
        conn.execute(Q["txn_delete"], (txn_id,))
        conn.execute(Q["txn_journal_delete"], (txn_id,))
        conn.execute(Q["txn_partitions_delete"], (txn_id,))


def journaled(conn: sqlite3.Connection, txn_id: int) -> list[TxnPartitionRow]:
    """An open transaction's partitions that hold journaled records."""
    return [p for p in partitions_of(conn, txn_id) if p.records]


def keep_writers(conn: sqlite3.Connection, txn_id: int, keep: set[tuple[int, int]]) -> int:
    """Discard the journaled records of every (pid, generation) not in keep; how many."""
    dropped = 0
    for producer_id, generation in conn.execute(Q["txn_data_writers"], (txn_id,)).fetchall():
        if (producer_id, generation) not in keep:
            cursor = conn.execute(Q["txn_data_delete_writer"], (txn_id, producer_id, generation))
            dropped += cursor.rowcount
    if dropped:
        recount(conn, txn_id)
    return dropped


def members_of(conn: sqlite3.Connection, txn_id: int) -> dict[str, tuple[int, int]]:
    """member -> (pid, generation)."""
    return {m: (p, g) for m, p, g in conn.execute(Q["txn_members_all"], (txn_id,))}
