"""Topics, partitions and their logs in SQLite: the rows, never the rules.

Every function takes the connection of a transaction the engine opened and does exactly
what its name says. Whether a topic may be created or a record appended is decided by the
engine and broker/core before these are called.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Sequence
from itertools import repeat
from typing import Final

from msgspec import Struct

from broker.rows import (
    EMPTY_HEADERS,
    KafkaRow,
    Row,
    encode_headers,
)
from broker.storage import producers as producer_store
from broker.storage.queries import RUN_ROWS, Q
from broker.types import (
    NewRecord,
    PartitionInfo,
    ProducerFields,
    Record,
    RecordColumns,
    TopicConfig,
    keys_of,
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
    conn.execute(Q["records_delete_topic"], (topic.topic_id,))
    conn.execute(Q["log_batches_delete_topic"], (topic.topic_id,))
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
) -> list[tuple[int, int, int]]:
    """(offset, timestamp_ms, key and value bytes) of the first records from start."""
    return conn.execute(Q["records_front"], (topic.topic_id, partition, start, limit)).fetchall()


def delete_front(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, start: int, new_start: int, size: int
) -> None:
    """Delete the records in [start, new_start) and move the log start to new_start."""
    conn.execute(Q["records_delete_below"], (topic.topic_id, partition, start, new_start))
    conn.execute(Q["log_batches_delete_below"], (topic.topic_id, partition, new_start))
    conn.execute(Q["partition_start_set"], (topic.topic_id, partition, new_start, size))


def superseded(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, low: int, high: int, limit: int
) -> list[tuple[int, int]]:
    """(offset, bytes) of up to limit keyed records in [low, high) a later record of the
    same key supersedes."""
    where = (topic.topic_id, partition, low, high, limit)
    return conn.execute(Q["records_superseded"], where).fetchall()


def old_tombstones(
    conn: sqlite3.Connection,
    topic: TopicRow,
    partition: int,
    low: int,
    high: int,
    before_ms: int,
    limit: int,
) -> list[tuple[int, int]]:
    where = (topic.topic_id, partition, low, high, before_ms, limit)
    return conn.execute(Q["records_old_tombstones"], where).fetchall()


def delete_records(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, found: list[tuple[int, int]]
) -> None:
    """Delete records by offset ((offset, bytes) pairs) and take their bytes off."""
    conn.executemany(
        Q["record_delete"], ((topic.topic_id, partition, offset) for offset, _ in found)
    )
    conn.executemany(
        Q["log_batch_delete_holding"],
        ((topic.topic_id, partition, offset) for offset, _ in found),
    )
    conn.execute(Q["partition_shrink"], (topic.topic_id, partition, sum(size for _, size in found)))


def disagreeing_batches(conn: sqlite3.Connection, limit: int) -> list[str]:
    """Up to `limit` log_batches rows that do not describe their records (`fencelog
    check`): a page read from one would give those records' columns wrong."""
    return [
        f"the shape of topic id {topic_id} partition {partition}'s batch at offset "
        f"{first_offset} (log_batches) does not match its records"
        for topic_id, partition, first_offset in conn.execute(
            Q["log_batches_disagreeing"], (limit,)
        )
    ]


def start_offset(conn: sqlite3.Connection, topic: TopicRow, partition: int) -> int:
    """The log start offset: records below it were deleted (retention)."""
    row = conn.execute(Q["partition_start"], (topic.topic_id, partition)).fetchone()
    return int(row[0]) if row is not None else 0


def end_offset(conn: sqlite3.Connection, topic: TopicRow, partition: int) -> int:
    row = conn.execute(Q["partition_end"], (topic.topic_id, partition)).fetchone()
    assert row is not None, "partition rows exist for every partition of a topic"
    return int(row[0])


def offset_for_time(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, timestamp_ms: int
) -> tuple[int, int] | None:
    """The first record at or after timestamp_ms: (offset, its timestamp), or None."""
    row = conn.execute(
        Q["records_offset_for_time"], (topic.topic_id, partition, timestamp_ms)
    ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


# What shape() learns from a batch: its values, timestamps, whether any record has a key
# and whether any has headers
_Described = tuple[Sequence[bytes | bytearray], list[int], bool, bool]

# A batch of at least this many records keeps its shape in log_batches (schema 013):
# its pages are then read without a pass over every record to learn it. A row for a
# smaller batch would cost its insert for little.
SHAPED_RECORDS_MIN: Final = 64


def shape(
    where: tuple[int, int, int],
    values: Sequence[bytes | bytearray],
    stamps: Sequence[int],
    keyed: bool,
    headed: bool,
    producer: tuple[int, int, int, int, int, int | None],
) -> tuple[object, ...]:
    """log_batch_insert's row for a batch at `where` (topic id, partition, first offset)
    of these values, timestamps (one: every record's), whether any record may have a
    key or headers, and producer fields (pid, generation, first sequence, sequence
    step, epoch, transaction)."""
    lengths = list(map(len, values))
    uniform = lengths.count(lengths[0]) == len(lengths)
    timestamp = stamps[0] if stamps.count(stamps[0]) == len(stamps) else None
    topic_id, partition, first_offset = where
    return (
        topic_id,
        partition,
        first_offset,
        first_offset + len(values) - 1,
        timestamp,
        lengths[0] if uniform else None,
        int(keyed),
        int(headed),
        *producer,
    )


def _described(records: Sequence[NewRecord], now_ms: int) -> _Described:
    """A batch's values, timestamps (now_ms where a record has none; one for all when
    none has its own), whether any record has a key, whether any has headers: what
    shape() takes, for a batch whose branch of Appends.add did not learn them."""
    count = len(records)
    stamps = list(map(_TIMESTAMP, records))
    if stamps.count(None) == count:
        stamps = [now_ms]
    elif None in stamps:
        stamps = [now_ms if stamp is None else stamp for stamp in stamps]
    keyed = list(map(_KEY, records)).count(None) != count
    return list(map(_VALUE, records)), stamps, keyed, any(map(_HEADERS, records))


class Appends:
    """The appends of one write transaction, held back and written by flush() in a few
    statements: the record rows (RUN_ROWS at a time where a plain batch allows), one
    update per partition, and the lease row of any pid writing its first batch to a
    partition. Whoever reads the log or the lease rows inside the transaction flushes
    first."""

    __slots__ = ("ends", "leases", "plain", "records", "runs", "shapes", "stamped_runs")

    def __init__(self) -> None:
        self.records: list[tuple[object, ...]] = []
        self.plain: list[tuple[object, ...]] = []  # no key, headers or transaction
        self.runs: list[tuple[object, ...]] = []  # record_insert_run's parameters
        self.stamped_runs: list[tuple[object, ...]] = []  # record_insert_stamped_run's
        self.shapes: list[tuple[object, ...]] = []  # log_batch_insert's (large batches)
        self.leases: list[tuple[int, int, int, int, int]] = []
        self.ends: dict[tuple[int, int], list[int]] = {}  # part: [records, bytes]

    def __len__(self) -> int:
        return (
            len(self.records)
            + len(self.plain)
            + len(self.runs)
            + len(self.stamped_runs)
            + len(self.shapes)
            + len(self.leases)
        )

    def add(
        self,
        topic_id: int,
        partition: int,
        base_offset: int,
        records: Sequence[NewRecord],
        now_ms: int,
        producer: ProducerFields,
    ) -> None:
        """Records appended to one partition at base_offset, its end."""
        pid, generation, epoch, txn_id = (
            producer.producer_id,
            producer.generation,
            producer.epoch,
            producer.txn_id,
        )
        first_sequence = producer.first_sequence
        count = len(records)
        if count == 1 and txn_id is None:  # one record: plain_records' test, unrolled
            value, key, headers, _, timestamp_ms = records[0]
            if key is None and not headers and timestamp_ms is None:
                self.plain.append(
                    (
                        topic_id,
                        partition,
                        base_offset,
                        now_ms,
                        bytearray(value),
                        pid,
                        generation,
                        first_sequence if pid else 0,
                        epoch,
                    )
                )
                end = self.ends.setdefault((topic_id, partition), [0, 0])
                end[0] += 1
                end[1] += len(value)
                return
        if txn_id is None and plain_records(records):
            # The usual batch. Values go as bytearrays: Python's sqlite3 binds those
            # directly, where bytes first go through its adapter lookup (about half the
            # cost of a one-row insert).
            values = list(map(bytearray, map(_VALUE, records)))
            described: _Described | None = (values, [now_ms], False, False)
            step = 1 if pid else 0
            in_runs = count - count % RUN_ROWS
            self.runs.extend(
                (
                    topic_id,
                    partition,
                    base_offset + start,
                    now_ms,
                    pid,
                    generation,
                    (first_sequence + start) * step,
                    step,
                    epoch,
                    None,  # no transaction
                    *values[start : start + RUN_ROWS],
                )
                for start in range(0, in_runs, RUN_ROWS)
            )
            # the rest one row each, column by column in C
            self.plain.extend(
                zip(
                    repeat(topic_id),
                    repeat(partition),
                    range(base_offset + in_runs, base_offset + count),
                    repeat(now_ms),
                    values[in_runs:],
                    repeat(pid),
                    repeat(generation),
                    range(first_sequence + in_runs, first_sequence + count) if pid else repeat(0),
                    repeat(epoch),
                )
            )
        elif txn_id is None and count >= RUN_ROWS and stamped_records(records):
            # A batch with the producer's timestamps and nothing else (a Kafka client's):
            # runs as the plain batch above, the rest one row each.
            values = list(map(bytearray, map(_VALUE, records)))
            stamps = list(map(_TIMESTAMP, records))
            described = (values, stamps, False, False)
            step = 1 if pid else 0
            in_runs = count - count % RUN_ROWS
            self.stamped_runs.extend(
                (
                    topic_id,
                    partition,
                    base_offset + start,
                    pid,
                    generation,
                    (first_sequence + start) * step,
                    step,
                    epoch,
                    None,  # no transaction
                    *values[start : start + RUN_ROWS],
                    *stamps[start : start + RUN_ROWS],
                )
                for start in range(0, in_runs, RUN_ROWS)
            )
            self.records.extend(
                (
                    topic_id,
                    partition,
                    base_offset + index,
                    stamps[index],
                    None,
                    values[index],
                    EMPTY_HEADERS,
                    pid,
                    generation,
                    first_sequence + index if pid else 0,
                    epoch,
                    None,
                )
                for index in range(in_runs, count)
            )
        else:
            described = None
            self.records.extend(
                (
                    topic_id,
                    partition,
                    base_offset + index,
                    now_ms if record.timestamp_ms is None else record.timestamp_ms,
                    record.key,
                    record.value,
                    encode_headers(record.headers) if record.headers else EMPTY_HEADERS,
                    pid,
                    generation,
                    first_sequence + index if pid else 0,
                    epoch,
                    txn_id,
                )
                for index, record in enumerate(records)
            )
        if count >= SHAPED_RECORDS_MIN:
            its_values, its_stamps, keyed, headed = described or _described(records, now_ms)
            self.shapes.append(
                shape(
                    (topic_id, partition, base_offset),
                    its_values,
                    its_stamps,
                    keyed,
                    headed,
                    (pid, generation, first_sequence if pid else 0, 1 if pid else 0, epoch, txn_id),
                )
            )
        end = self.ends.setdefault((topic_id, partition), [0, 0])
        end[0] += len(records)
        end[1] += _stored_bytes(records)

    def add_lease(
        self, topic_id: int, partition: int, producer_id: int, first_offset: int, now_ms: int
    ) -> None:
        """A pid's first batch on the partition starts at first_offset: its lease starts."""
        self.leases.append((topic_id, partition, producer_id, first_offset, now_ms))

    def flush(self, conn: sqlite3.Connection) -> None:
        if self.records:
            conn.executemany(Q["record_insert"], self.records)
            self.records.clear()
        if self.runs:
            conn.executemany(Q["record_insert_run"], self.runs)
            self.runs.clear()
        if self.stamped_runs:
            conn.executemany(Q["record_insert_stamped_run"], self.stamped_runs)
            self.stamped_runs.clear()
        if self.plain:
            conn.executemany(Q["record_insert_plain"], self.plain)
            self.plain.clear()
        if self.shapes:
            conn.executemany(Q["log_batch_insert"], self.shapes)
            self.shapes.clear()
        if self.leases:
            producer_store.insert_leases(conn, self.leases)
            self.leases.clear()
        if self.ends:
            conn.executemany(
                Q["partition_advance"],
                [(count, size, t, p) for (t, p), (count, size) in self.ends.items()],
            )
            self.ends.clear()


def advance(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, records: int, size: int
) -> None:
    """Move a partition's log end past records just inserted (size: their bytes)."""
    conn.execute(Q["partition_advance"], (records, size, topic.topic_id, partition))


def _stored_bytes(records: Sequence[NewRecord]) -> int:
    size = sum(map(len, map(_VALUE, records)))
    if any(map(_KEY, records)):
        size += sum(len(key) for key in map(_KEY, records) if key)
    return size


_VALUE, _KEY, _HEADERS, _PARTITION, _TIMESTAMP = (operator.itemgetter(i) for i in range(5))


VALUE = _VALUE  # a NewRecord's value


def plain_records(records: Sequence[NewRecord]) -> bool:
    """No key, headers or timestamp of the producer's: what the *_plain inserts take."""
    return keys_of(records) is None and values_only(records)


def stamped_records(records: Sequence[NewRecord]) -> bool:
    """Timestamps of the producer's, and no key or headers: the *_stamped_run insert."""
    if isinstance(records, RecordColumns):  # never stamped
        return False
    count = len(records)
    return (
        list(map(_KEY, records)).count(None) == count
        and not any(map(_HEADERS, records))
        and None not in map(_TIMESTAMP, records)
    )


def read_rows(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, offset: int, max_records: int
) -> list[Row]:
    cursor = conn.execute(Q["records_read_rows"], (topic.topic_id, partition, offset, max_records))
    return cursor.fetchall()


def read_kafka_rows(
    conn: sqlite3.Connection, topic: TopicRow, partition: int, offset: int, max_records: int
) -> list[KafkaRow]:
    cursor = conn.execute(Q["records_read_kafka"], (topic.topic_id, partition, offset, max_records))
    return cursor.fetchall()


def read_compacted(conn: sqlite3.Connection, topic: TopicRow, partition: int) -> list[Record]:
    """The newest record of every key in a partition, in offset order (keyless: none)."""
    cursor = conn.execute(Q["records_compacted"], (topic.name, topic.topic_id, partition))
    return list(map(Record._make, cursor))
