"""Topics, partitions and their logs in SQLite: the rows, never the rules.

Every function takes the connection of a transaction the engine opened and does exactly
what its name says. Whether a topic may be created or a record appended is decided by the
engine and broker/core before these are called.
"""

from __future__ import annotations

import itertools
import operator
import sqlite3
from array import array
from collections.abc import Sequence
from typing import Any, Final, cast

from msgspec import Struct

from broker.errors import BrokerError, ErrorCode
from broker.limits import INT64_MAX
from broker.rows import (
    EMPTY_HEADERS,
    KafkaRow,
    Row,
    decode_headers,
    encode_headers,
)
from broker.storage import batches
from broker.storage import producers as producer_store
from broker.storage.queries import Q
from broker.types import (
    NewRecord,
    PartitionInfo,
    ProducerFields,
    Record,
    RecordColumns,
    TopicConfig,
    is_columns,
    keys_of,
    values_of,
    values_only,
)


class TopicRow(Struct, frozen=True):
    topic_id: int
    name: str
    partitions: int
    created_ms: int
    owner_group: str | None
    cleanup: str = "delete"  # topic_configs' policy: a compacted topic's records need keys


def insert_topic(
    conn: sqlite3.Connection, name: str, partitions: int, created_ms: int, owner_group: str | None
) -> TopicRow:
    # Topic ids are never reused (a deleted topic's id stays retired): state keyed by
    # topic id in any process can never be mistaken for a new topic's.
    newest = conn.execute(Q["topic_id_max"]).fetchone()[0]
    retired = conn.execute(Q["counter_get"], ("next_topic_id",)).fetchone()
    topic_id = max(int(newest) + 1, int(retired[0]) if retired else 1)
    conn.execute(Q["topic_insert_with_id"], (topic_id, name, partitions, created_ms, owner_group))
    conn.execute(Q["counter_put"], ("next_topic_id", topic_id + 1))
    conn.executemany(Q["partition_insert"], ((topic_id, p) for p in range(partitions)))
    return TopicRow(topic_id, name, partitions, created_ms, owner_group)


def topic_by_name(conn: sqlite3.Connection, name: str) -> TopicRow | None:
    row = conn.execute(Q["topic_by_name"], (name,)).fetchone()
    return TopicRow(*row) if row else None


def topic_by_id(conn: sqlite3.Connection, topic_id: int) -> TopicRow | None:
    row = conn.execute(Q["topic_by_id"], (topic_id,)).fetchone()
    return TopicRow(*row) if row else None


def all_topics(conn: sqlite3.Connection) -> list[TopicRow]:
    return [TopicRow(*row) for row in conn.execute(Q["topics_all"])]


def delete_topic(conn: sqlite3.Connection, topic: TopicRow) -> None:
    conn.execute(Q["log_delete_topic"], (topic.topic_id,))
    conn.execute(Q["log_times_delete_topic"], (topic.topic_id,))
    conn.execute(Q["txn_batches_delete_topic"], (topic.topic_id,))
    conn.execute(Q["txn_partitions_zero_topic"], (topic.topic_id,))
    conn.execute(Q["leases_delete_topic"], (topic.topic_id,))
    conn.execute(Q["offsets_delete_topic"], (topic.topic_id,))
    conn.execute(Q["access_delete_topic"], (topic.topic_id,))
    conn.execute(Q["attachments_delete_topic"], (topic.topic_id,))
    conn.execute(Q["partitions_delete_topic"], (topic.topic_id,))
    conn.execute(Q["topic_config_delete"], (topic.topic_id,))
    conn.execute(Q["topic_delete"], (topic.topic_id,))


def partition_infos(conn: sqlite3.Connection, topic: TopicRow) -> tuple[PartitionInfo, ...]:
    return tuple(
        PartitionInfo(partition, start, next_offset, next_offset - start, size)
        for partition, next_offset, size, start in conn.execute(
            Q["partitions_of_topic"], (topic.topic_id,)
        )
    )


# retention and compaction (schema 010) --------------------------------------------------


def topic_config(conn: sqlite3.Connection, topic_id: int) -> TopicConfig:
    row = conn.execute(Q["topic_config"], (topic_id,)).fetchone()
    return TopicConfig() if row is None else TopicConfig(row[0], row[1], row[2])


def put_topic_config(conn: sqlite3.Connection, topic_id: int, config: TopicConfig) -> None:
    if config == TopicConfig():
        conn.execute(Q["topic_config_delete"], (topic_id,))
    else:
        conn.execute(
            Q["topic_config_put"],
            (topic_id, config.retention_ms, config.retention_bytes, config.cleanup),
        )


def add_partitions(conn: sqlite3.Connection, topic: TopicRow, partitions: int) -> None:
    conn.executemany(
        Q["partition_insert_at"],
        ((topic.topic_id, p) for p in range(topic.partitions, partitions)),
    )
    conn.execute(Q["topic_set_partitions"], (topic.topic_id, partitions))


def front(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, start: int, limit: int
) -> list[tuple[int, int, int, int]]:
    """(last offset, newest timestamp, key and value bytes, records) of the batches from
    the one holding the log start, until they hold at least `limit` records."""
    found: list[tuple[int, int, int, int]] = []
    held = 0
    cursor = conn.execute(Q["log_front"], (topic.topic_id, partition, start))
    try:
        for last_offset, max_ms, size, records in cursor:
            if last_offset < start:
                continue
            found.append((last_offset, max_ms, size, records))
            held += records
            if held >= limit:
                break
    finally:
        cursor.close()
    return found


def delete_front(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, start: int, new_start: int, size: int
) -> None:
    """Move the log start to new_start and delete the batches wholly below it (size:
    their bytes). A batch holding new_start stays; nothing below the start is read."""
    conn.execute(Q["log_delete_below"], (topic.topic_id, partition, new_start))
    conn.execute(Q["log_times_below"], (topic.topic_id, partition, new_start))
    conn.execute(Q["partition_start_set"], (topic.topic_id, partition, new_start, size))


def keyed_batches(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, low: int, high: int
) -> list[batches.Stored]:
    """The batches holding keyed records, from the one holding offset low to those
    starting before high (compaction's window)."""
    where = (topic.topic_id, partition, low, high)
    return [batch_of(row) for row in conn.execute(Q["log_keyed_between"], where)]


def rewrite(conn: sqlite3.Connection, batch: batches.Stored, keep: Sequence[int]) -> None:
    """Compaction: a batch keeps only the records at these indexes, offsets unchanged
    (none: the batch goes), and the partition gives back the bytes of the others."""
    where = (batch.topic_id, batch.partition, batch.first_offset)
    if keep:
        row = batches.repack(batch, keep)
        conn.execute(Q["log_replace"], row)
        freed = batch.size - row[5]
    else:
        conn.execute(Q["log_delete_batch"], where)
        freed = batch.size
    conn.execute(Q["partition_shrink"], (batch.topic_id, batch.partition, freed))


def damaged_batches(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Up to `limit` log batches whose packed columns do not hold their records
    (`fencelog check`): a read of one would fail or give wrong records."""
    problems: list[str] = []
    tables = ["log_all"]
    if conn.execute(Q["log_015_table"]).fetchone() is not None:  # a move left midway
        tables.append("log_015_all")
    for row in itertools.chain.from_iterable(conn.execute(Q[query]) for query in tables):
        batch = batches.Stored._make(row)
        if batch.topic_id <= 0:  # a transaction's journaled batch: checked with its journal
            continue
        problem = batches.damage(batch)
        if problem is not None:
            problems.append(
                f"topic id {batch.topic_id} partition {batch.partition}'s batch at offset "
                f"{batch.first_offset} is damaged: {problem}"
            )
            if len(problems) >= limit:
                break
    return problems


def start_offset(conn: sqlite3.Connection, topic: TopicRow, partition: int) -> int:
    """The log start offset: records below it were deleted (retention)."""
    row = conn.execute(Q["partition_start"], (topic.topic_id, partition)).fetchone()
    return int(row[0]) if row is not None else 0


def end_offset(conn: sqlite3.Connection, topic: TopicRow, partition: int) -> int:
    row = conn.execute(Q["partition_end"], (topic.topic_id, partition)).fetchone()
    assert row is not None, "partition rows exist for every partition of a topic"
    return int(row[0])


# A plain append stores its records in batches of at most this many, and a group
# commit's run of one-record appends (batches.coalesced) is one batch of at most this
# many: a read that needs one record reads its whole stored batch (a row's values are
# one blob, in a chain of overflow pages), which for 10,000 records of 100 bytes took
# 4.5 ms against 1.2 for 1000 (a fetch of one record from the middle of a partition).
# A batch with a producer id stays whole (its sequences are judged as sent), and so
# does a transaction's (moved at commit as it was journaled).
PLAIN_BATCH_RECORDS_MAX: Final = 1000


class Appends:
    """The appends of one write transaction, held back and written by flush() in one
    statement: a `log` row per batch (schema 015, storage/batches.py), one update per
    partition, and the lease row of any pid writing its first batch to a partition.
    Whoever reads the log or the lease rows inside the transaction flushes first."""

    __slots__ = ("batches", "ends", "leases")

    def __init__(self) -> None:
        self.batches: list[tuple[object, ...]] = []  # log_insert's rows
        self.leases: list[tuple[int, int, int, int, int]] = []
        self.ends: dict[tuple[int, int], list[int]] = {}  # part: [records, bytes]

    def __len__(self) -> int:
        return len(self.batches) + len(self.leases)

    def add(
        self,
        topic_id: int,
        partition: int,
        base_offset: int,
        records: Sequence[NewRecord],
        now_ms: int,
        producer: ProducerFields,
    ) -> None:
        """Records appended to one partition at base_offset, its end: one batch, or
        for a plain append (no producer id, no transaction) of more than
        PLAIN_BATCH_RECORDS_MAX records, a batch of each PLAIN_BATCH_RECORDS_MAX."""
        pid = producer.producer_id
        fields = (
            pid,
            producer.generation,
            producer.first_sequence if pid and producer.txn_id is None else 0,
            producer.epoch,
            producer.txn_id,
        )
        count = len(records)
        if count > PLAIN_BATCH_RECORDS_MAX and not pid and producer.txn_id is None:
            for start in range(0, count, PLAIN_BATCH_RECORDS_MAX):
                part = records[start : start + PLAIN_BATCH_RECORDS_MAX]
                where = (topic_id, partition, base_offset + start)
                self._added(pack_records(where, part, now_ms, fields))
            return
        where = (topic_id, partition, base_offset)
        if count == 1:  # the one-record produce: plain_records' test, unrolled
            value, key, headers, _, timestamp_ms = records[0]
            if key is None and not headers:
                row = batches.pack_one(
                    where, value, now_ms if timestamp_ms is None else timestamp_ms, fields
                )
                self._added(row)
                return
        self._added(pack_records(where, records, now_ms, fields))

    def _added(self, row: tuple[Any, ...]) -> None:
        self.batches.append(row)
        end = self.ends.setdefault((row[0], row[1]), [0, 0])
        end[0] += row[4]
        end[1] += row[5]

    def add_lease(
        self, topic_id: int, partition: int, producer_id: int, first_offset: int, now_ms: int
    ) -> None:
        """A pid's first batch on the partition starts at first_offset: its lease starts."""
        self.leases.append((topic_id, partition, producer_id, first_offset, now_ms))

    def flush(self, conn: sqlite3.Connection) -> None:
        if self.batches:
            conn.executemany(
                Q["log_insert"], batches.coalesced(self.batches, PLAIN_BATCH_RECORDS_MAX)
            )
            self.batches.clear()
        if self.leases:
            producer_store.insert_leases(conn, self.leases)
            self.leases.clear()
        if self.ends:
            conn.executemany(
                Q["partition_advance"],
                [(count, size, t, p) for (t, p), (count, size) in self.ends.items()],
            )
            self.ends.clear()


def pack_records(
    where: tuple[int, int, int],
    records: Sequence[NewRecord],
    now_ms: int,
    producer: batches.Producer,
) -> tuple[object, ...]:
    """The `log` row of records appended at `where` (now_ms: the timestamp of those
    without their own)."""
    if plain_records(records):
        return batches.pack(where, values_of(records), None, None, now_ms, producer)
    if is_columns(records):  # timestamps (a Kafka producer's), no headers
        return batches.pack(
            where, records.values, keys_of(records), None, _stamps(records, now_ms), producer
        )
    given: list[int | None] = list(map(_TIMESTAMP, records))
    stamps: int | list[int] = now_ms
    if given.count(None) != len(records):
        stamps = [now_ms if stamp is None else stamp for stamp in given]
    return batches.pack(
        where,
        values_of(records),
        keys_of(records),
        [encode_headers(h) if h else EMPTY_HEADERS for h in map(_HEADERS, records)],
        stamps,
        producer,
    )


def _stamps(columns: RecordColumns, now_ms: int) -> int | Sequence[int]:
    """A batch of columns' timestamps as pack() takes them: now_ms for a batch without
    them, and for each None of the column (as a NewRecord's None)."""
    column = columns.timestamps
    if column is None:
        return now_ms
    if isinstance(column, array) or None not in column:
        return cast(Sequence[int], column)
    return [now_ms if stamp is None else stamp for stamp in column]


def advance(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, records: int, size: int
) -> None:
    """Move a partition's log end past records just inserted (size: their bytes)."""
    conn.execute(Q["partition_advance"], (records, size, topic.topic_id, partition))


_VALUE, _KEY, _HEADERS, _PARTITION, _TIMESTAMP = (operator.itemgetter(i) for i in range(5))


VALUE = _VALUE  # a NewRecord's value


def plain_records(records: Sequence[NewRecord]) -> bool:
    """No key, headers or timestamp of the producer's."""
    return keys_of(records) is None and values_only(records)


# reading --------------------------------------------------------------------------


def batch_of(row: tuple[Any, ...], vals_bytes: int | None = None) -> batches.Stored:
    """A stored batch a read may use: DATA_CORRUPT if its columns do not hold its
    records (a damaged file: nothing of the batch is read). vals_bytes: the length of
    its values, for a row read without them."""
    batch = batches.Stored._make(row)
    problem = batches.unreadable_shape(batch, len(batch.vals) if vals_bytes is None else vals_bytes)
    if problem is not None:
        raise BrokerError(
            ErrorCode.DATA_CORRUPT,
            f"topic id {batch.topic_id} partition {batch.partition}'s batch at offset "
            f"{batch.first_offset} is damaged: {problem}",
            hint="`fencelog check` tells what is damaged; restore a snapshot "
            "(`fencelog snapshot restore FILE --force`)",
        )
    return batch


def parts(
    conn: sqlite3.Connection,
    topic_id: int,
    partition: int,
    offset: int,
    max_records: int,
    bytes_max: int | None = None,
) -> list[batches.Part]:
    """The stored batches' records from offset: at most max_records, then the first
    within bytes_max of keys and values (at least one record)."""
    found: list[batches.Part] = []
    if max_records <= 0:
        return found
    taken = size = 0
    cursor = conn.execute(Q["log_from"], (topic_id, partition, offset))
    try:
        for row in cursor:
            batch = batch_of(row)
            if batch.last_offset < offset:
                continue
            low = batches.index_at(batch, offset)
            part = batches.Part(batch, low, min(batch.records, low + max_records - taken))
            if bytes_max is not None:
                its_bytes = batches.part_bytes(part)
                if size + its_bytes > bytes_max:
                    fit = batches.within(batches.sizes(part), bytes_max - size, not found)
                    if fit:
                        found.append(part._replace(high=low + fit))
                    break
                size += its_bytes
            found.append(part)
            taken += part.high - part.low
            if taken >= max_records:
                break
    finally:
        cursor.close()
    return found


def read_rows(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, offset: int, max_records: int
) -> list[Row]:
    found: list[Row] = []
    for part in parts(conn, topic.topic_id, partition, offset, max_records):
        found += batches.rows(part)
    return found


def read_kafka_rows(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, offset: int, max_records: int
) -> list[KafkaRow]:
    """(offset, timestamp_ms, key, value, stored headers) of the records from offset."""
    return [
        (row[1], row[2], row[3], row[4], row[5])
        for row in read_rows(conn, topic, partition, offset, max_records)
    ]


def read_compacted(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, start: int
) -> list[Record]:
    """The newest record of every key in a partition from its log start, in offset
    order (keyless: none)."""
    newest: dict[bytes, Row] = {}
    for batch in keyed_batches(conn, topic, partition, start, INT64_MAX):
        part = batches.Part(batch, batches.index_at(batch, start), batch.records)
        for found in batches.rows(part):
            if found[3] is not None:
                newest[found[3]] = found
    kept = sorted(newest.values(), key=_ROW_OFFSET)
    return [
        Record(
            topic.name,
            p,
            o,
            t,
            k,
            v,
            () if h == EMPTY_HEADERS else decode_headers(h),
            pid,
            g,
            s,
            e,
            x,
        )
        for p, o, t, k, v, h, pid, g, s, e, x in kept
    ]


_ROW_OFFSET = operator.itemgetter(1)


def batch_at_or_after(
    conn: sqlite3.Connection, topic_id: int, partition: int, offset: int
) -> batches.Stored | None:
    """The batch holding the first record at or after offset, or None."""
    cursor = conn.execute(Q["log_from"], (topic_id, partition, offset))
    try:
        for row in cursor:
            batch = batch_of(row)
            if batch.last_offset >= offset:
                return batch
    finally:
        cursor.close()
    return None
