"""Transactions, their journal entries and their data journals in SQLite: rows, never rules.

A data journal keeps each produce into a transaction as one row of txn_batches, its
records packed (schema/012_txn_batches.sql). APPLY_COMMIT makes each of a partition's
journaled batches, in journal order, one batch of the log (schema 015): a row moved,
not a row per record; the journal is then dropped one row per batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import msgpack
import msgspec
from msgspec import Struct

from broker.errors import BrokerError, ErrorCode
from broker.rows import EMPTY_HEADERS, decode_headers
from broker.storage import batches, logs
from broker.storage.queries import Q
from broker.types import (
    NO_OFFSET_METADATA,
    NewRecord,
    OffsetMetadata,
    Record,
)

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
    return (None if row is None else row[0]), _journal_end(conn, txn_id, topic_id, partition)


def _journal_end(conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int) -> int:
    """The position after a partition's last journaled record (0: none yet)."""
    row = conn.execute(Q["txn_batch_end"], (txn_id, topic_id, partition)).fetchone()
    return 0 if row is None else int(row[0])


def set_first_sequence(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int, sequence: int
) -> None:
    conn.execute(Q["txn_first_sequence_set"], (txn_id, topic_id, partition, sequence))


# A batch's body: values, then keys, encoded headers and timestamps, each None when no
# record of the batch has one of its own.
Body = tuple[list[bytes | None], list[bytes | None] | None, list[bytes] | None, list[int] | None]
_encode_body = msgspec.msgpack.Encoder().encode
_BODY = msgspec.msgpack.Decoder(Body)


def _unpacked(
    decoder: msgspec.msgpack.Decoder[Any], body: bytes, count: int, txn_id: int, where: str
) -> Any:
    """A batch's body, checked: its columns as the batch's row says, else DATA_CORRUPT
    (the file was damaged under SQLite's checks; nothing of the batch is used)."""
    try:
        columns = decoder.decode(body)
    except msgspec.MsgspecError as error:
        problem = str(error)
    else:
        if all(column is None or len(column) == count for column in columns):
            return columns
        problem = f"its columns do not hold {count} records"
    raise _damaged(txn_id, where, problem)


def _damaged(txn_id: int, where: str, problem: str) -> BrokerError:
    return BrokerError(
        ErrorCode.DATA_CORRUPT,
        f"transaction {txn_id}'s journaled batch at {where} is damaged: {problem}",
        txn_id=txn_id,
        hint="`fencelog check` tells what is damaged; restore a snapshot "
        "(`fencelog snapshot restore FILE --force`)",
    )


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
    """Append records to one partition's data journal as one batch, tagged with the
    transaction, and add them to the partition's counts. The records are packed into a
    row of `log` under the journal's key (schema 017), that the commit moves."""
    start = _journal_end(conn, txn_id, topic_id, partition)
    hidden = journal_topic_id(topic_id)
    (first_offset,) = conn.execute(Q["log_journal_end"], (hidden, partition, topic_id)).fetchone()
    row = logs.pack_records(
        (hidden, partition, first_offset),
        records,
        now_ms,
        (producer_id, generation, 0, epoch, txn_id),  # sequence: none in the log
    )
    count, size = row[4], row[5]
    log_rowid = conn.execute(Q["log_insert"], row).lastrowid
    conn.execute(Q["txn_partition_add"], (txn_id, topic_id, partition, count, size))
    conn.execute(
        Q["txn_batch_insert"],
        (
            txn_id,
            topic_id,
            partition,
            start,
            count,
            size,
            now_ms,
            producer_id,
            generation,
            epoch,
            log_rowid,
        ),
    )


def journal_topic_id(topic_id: int) -> int:
    """The topic id of a journaled row of `log`: 0 or negative (topic ids start at 1), so
    no read of a topic meets it, and as many bytes in a SQLite record as topic_id, so
    that the commit's UPDATE keeps the record's size and SQLite writes it in place.
    (SQLite stores 0 and 1 in no bytes, -128 to 127 in one, -32768 to 32767 in two...:
    1 maps to 0, any other id n to ~n, -n - 1.)"""
    return 0 if topic_id == 1 else ~topic_id


def recount(conn: sqlite3.Connection, txn_id: int) -> None:
    """Count each partition's records and bytes again, from its data journal: after
    journaled records were discarded (journaling keeps the counts otherwise)."""
    conn.execute(Q["txn_partition_count"], (txn_id,))


def drop_empty(conn: sqlite3.Connection, txn_id: int) -> None:
    """Forget the partitions left with no record (at PREPARE_COMMIT)."""
    conn.execute(Q["txn_partitions_drop_empty"], (txn_id,))


def apply_partition(
    conn: sqlite3.Connection,
    txn_id: int,
    topic_id: int,
    partition: int,
    base_offset: int,
    epoch: int,
) -> int:
    """APPLY_COMMIT of one partition: each journaled batch becomes a batch of the log
    from base_offset, in journal order (the offsets contiguous, whatever was fenced or
    dropped), stamped with the topic's epoch now; how many records were moved. A batch
    journaled as a row of `log` (schema 017) is moved there in place; an older one,
    its records in its body, is copied."""
    offset = base_offset
    for position, count, timestamp_ms, producer_id, generation, body, log_rowid in _journaled(
        conn, txn_id, topic_id, partition
    ):
        where = f"topic id {topic_id} partition {partition} position {position}"
        if log_rowid is not None:  # schema 017: the row is there, under the journal's key
            _check_journaled(conn, log_rowid, topic_id, count, txn_id, where)
            conn.execute(
                Q["log_journaled_move"],
                (topic_id, offset, offset + count - 1, epoch, log_rowid),
            )
            offset += count
            continue
        values, keys, headers, stamps = _unpacked(_BODY, body, count, txn_id, where)
        conn.execute(
            Q["log_insert"],
            batches.pack(
                (topic_id, partition, offset),
                values,
                keys,
                headers,
                timestamp_ms if stamps is None else stamps,
                # sequence: none in the log for a transaction's records
                (producer_id, generation, 0, epoch, txn_id),
            ),
        )
        offset += count
    return offset - base_offset


def bytes_to_copy(conn: sqlite3.Connection, txn_id: int) -> int:
    """The bytes of a transaction's batches that its commit copies (those journaled
    before schema 017, their records in their body); the others move in place."""
    return int(conn.execute(Q["txn_batches_to_copy"], (txn_id,)).fetchone()[0])


def _journaled(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int
) -> Iterator[tuple[int, int, int, int, int, bytes, int | None]]:
    """A partition's batches in journal order: position, records, timestamp, pid,
    generation, body, the rowid of its row of `log` (None: the records are in body)."""
    position = 0
    while True:
        page = conn.execute(
            Q["txn_batches_of_partition"], (txn_id, topic_id, partition, position, _COPY_PAGE)
        ).fetchall()
        yield from page
        if len(page) < _COPY_PAGE:
            return
        position = page[-1][0] + 1


_COPY_PAGE: Final = 16  # batches read at a time by the copy


def mark_applied(
    conn: sqlite3.Connection, txn_id: int, topic_id: int, partition: int, base_offset: int
) -> None:
    """Record that a partition was copied (base_offset -1: its topic was deleted) and
    drop its data journal."""
    conn.execute(Q["txn_partition_applied"], (base_offset, txn_id, topic_id, partition))
    conn.execute(Q["txn_batches_delete_partition"], (txn_id, topic_id, partition))


def data_records(conn: sqlite3.Connection, txn_id: int, limit: int) -> list[Record]:
    """The data journal's first `limit` records of a transaction (offset: position in
    its partition's journal)."""
    found: list[Record] = []
    cursor = conn.execute(Q["txn_batches_read"], (txn_id,))
    for row in cursor:
        topic, partition, position, count, at_ms, producer_id, generation, epoch, body = row[:9]
        if len(found) >= limit:
            break
        where = f"{topic or 'a deleted topic'} partition {partition} position {position}"
        log_rowid = row[9]
        if log_rowid is None:
            values, keys, headers, stamps = _unpacked(_BODY, body, count, txn_id, where)
        else:
            values, keys, headers, stamps = _journaled_row(conn, log_rowid, count, txn_id, where)
        for index in range(min(count, limit - len(found))):
            found.append(
                Record(
                    topic,
                    partition,
                    position + index,
                    at_ms if stamps is None else stamps[index],
                    None if keys is None else keys[index],
                    values[index],
                    () if headers is None else decode_headers(headers[index]),
                    producer_id,
                    generation,
                    0,
                    epoch,
                    txn_id,
                )
            )
    return found


def _check_journaled(
    conn: sqlite3.Connection, log_rowid: int, topic_id: int, count: int, txn_id: int, where: str
) -> None:
    """DATA_CORRUPT unless a journaled batch's row of `log` is there, under the journal's
    key, and holds its records as a read would check them (its values unread)."""
    found = conn.execute(Q["log_journaled_shape"], (log_rowid,)).fetchone()
    if found is None or found[0] != journal_topic_id(topic_id):
        raise _damaged(txn_id, where, _MISSING)
    shape = batches.Shape._make(found[1:-1])
    problem = batches.unreadable_shape(shape, found[-1]) or _miscounted(shape.records, count)
    if problem is not None:
        raise _damaged(txn_id, where, problem)


_MISSING: Final = "its row of the log is missing"


def _miscounted(stored: int, count: int) -> str | None:
    return None if stored == count else f"its row of the log holds {stored} records, not {count}"


def _journaled_row(
    conn: sqlite3.Connection, log_rowid: int, count: int, txn_id: int, where: str
) -> Body:
    """A journaled batch's records from its row of `log`, as a body's columns."""
    found = conn.execute(Q["log_by_rowid"], (log_rowid,)).fetchone()
    if found is None:
        raise _damaged(txn_id, where, _MISSING)
    batch = batches.Stored._make(found)
    problem = batches.damage(batch) or _miscounted(batch.records, count)
    if problem is not None:
        raise _damaged(txn_id, where, problem)
    part = batches.Part(batch, 0, count)
    keys = batches.keys(part) if batch.key_lengths is not None else None
    stored_headers: list[bytes] | None = None
    if batch.headers is not None:
        stored_headers = [EMPTY_HEADERS] * count
        for index, stored in batches.headers(part):
            stored_headers[index] = stored
    stamps = None if batch.timestamps is None else list(batches.timestamps(part))
    return list(batches.values(part)), None if keys is None else list(keys), stored_headers, stamps


def discard(conn: sqlite3.Connection, txn_id: int) -> None:
    """Drop everything a transaction journaled: its data, members and pending offsets."""
    conn.execute(Q["txn_batches_delete"], (txn_id,))
    conn.execute(Q["txn_members_delete"], (txn_id,))
    conn.execute(Q["txn_offsets_delete"], (txn_id,))
    conn.execute(Q["txn_fences_delete"], (txn_id,))


def drop_partitions(conn: sqlite3.Connection, txn_id: int) -> None:
    conn.execute(Q["txn_partitions_delete"], (txn_id,))


def fence_older(conn: sqlite3.Connection, txn_id: int, producer_id: int, generation: int) -> int:
    """Discard a member's records of older generations; how many."""
    args = (txn_id, producer_id, generation)
    discarded = int(conn.execute(Q["txn_batches_older"], args).fetchone()[0])
    if discarded:
        conn.execute(Q["txn_batches_fence"], args)
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
    details: OffsetMetadata = NO_OFFSET_METADATA,
) -> None:
    conn.execute(
        Q["txn_offset_put"],
        (txn_id, group, topic_id, partition, offset, producer_state, *details),
    )


def apply_offsets(conn: sqlite3.Connection, txn_id: int, now_ms: int) -> int:
    """Make a transaction's consumer offsets the committed ones; how many. A producer
    state given with them becomes the (group, topic)'s, as commit_offsets does."""
    count = int(conn.execute(Q["txn_offsets_count"], (txn_id,)).fetchone()[0])
    if count == 0:  # the usual transaction
        return 0
    states = conn.execute(Q["txn_offset_states"], (txn_id,)).fetchall()
    conn.execute(Q["txn_offsets_apply"], (txn_id, now_ms))
    for group, topic_id, producer_state in states:
        conn.execute(Q["offsets_state_put"], (producer_state, group, topic_id))
    conn.execute(Q["txn_offsets_delete"], (txn_id,))
    return count


def pending_offsets(
    conn: sqlite3.Connection, group: str, topic_id: int
) -> list[tuple[int, str, int]]:
    """(partition, state, deadline_ms) of each transaction holding offsets of topic_id
    for group."""
    return [tuple(row) for row in conn.execute(Q["txn_offsets_pending"], (group, topic_id))]


def put_fences(
    conn: sqlite3.Connection, txn_id: int, fences: Iterable[tuple[str, str, int]]
) -> None:
    conn.executemany(Q["txn_fence_put"], ((txn_id, *fence) for fence in fences))


def fences_of(conn: sqlite3.Connection, txn_id: int) -> list[tuple[str, str, int]]:
    return [(g, r, int(n)) for g, r, n in conn.execute(Q["txn_fences_of"], (txn_id,))]


def topics_of(conn: sqlite3.Connection, txn_id: int) -> list[int]:
    return [int(row[0]) for row in conn.execute(Q["txn_topics"], (txn_id,))]


def delete_topic(conn: sqlite3.Connection, topic_id: int) -> None:
    conn.execute(Q["txn_batches_delete_topic"], (topic_id,))


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
    writers = conn.execute(Q["txn_batch_writers"], (txn_id,)).fetchall()
    for producer_id, generation, records in writers:
        if (producer_id, generation) not in keep:
            conn.execute(Q["txn_batches_delete_writer"], (txn_id, producer_id, generation))
            dropped += records
    if dropped:
        recount(conn, txn_id)
    return dropped


def members_of(conn: sqlite3.Connection, txn_id: int) -> dict[str, tuple[int, int]]:
    """member -> (pid, generation)."""
    return {m: (p, g) for m, p, g in conn.execute(Q["txn_members_all"], (txn_id,))}


def move_record_journal(conn: sqlite3.Connection) -> None:
    """Schema 012's move, inside its migration: every record of the old one-row-per-record
    data journal (txn_data) becomes a batch of one at the same position, then txn_data
    goes. Only transactions open or prepared at the upgrade have records there."""
    rows = conn.execute(Q["txn_data_legacy"])
    conn.executemany(
        Q["txn_batch_insert_packed"],
        (
            (
                txn_id,
                topic_id,
                partition,
                position,
                1,
                len(value) + len(key or b""),
                at_ms,
                producer_id,
                generation,
                epoch,
                _encode_body(
                    (
                        [value],
                        None if key is None else [key],
                        None if headers == EMPTY_HEADERS else [headers],
                        None,
                    )
                ),
            )
            for (
                txn_id,
                topic_id,
                partition,
                position,
                at_ms,
                key,
                value,
                headers,
                producer_id,
                generation,
                epoch,
            ) in rows.fetchall()
        ),
    )
    conn.execute(Q["txn_data_legacy_drop"])


def damaged_batches(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Up to `limit` journaled batches whose packed records do not match their row,
    each said as the commit would say it (`fencelog check`)."""
    problems: list[str] = []
    upgraded = conn.execute(Q["txn_batches_log_rowid"]).fetchone() is not None
    rows = conn.execute(Q["txn_batches_all" if upgraded else "txn_batches_all_012"])
    for txn_id, topic_id, partition, position, count, body, log_rowid in rows:
        where = f"topic id {topic_id} partition {partition} position {position}"
        try:
            if log_rowid is None:
                _unpacked(_BODY, body, count, txn_id, where)
            else:
                _journaled_row(conn, log_rowid, count, txn_id, where)
        except BrokerError as error:
            problems.append(error.message)
            if len(problems) >= limit:
                break
    return problems
