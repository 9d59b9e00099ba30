"""The payloads of each op: fencelog's values to msgpack-ready maps and back.

Decoding checks every field a peer sends (presence, type, range) and raises
ProtocolError naming the field, so a server never trusts a payload's shape and a handler
never sees a wrong type. Rows of records travel as arrays in Record's field order.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Final, TypeVar, cast

import msgpack
import msgspec

from broker.core.txn import parse_txn_id
from broker.errors import BrokerError, ErrorCode
from broker.protocol.frames import ProtocolError
from broker.protocol.messages import COLUMNS_FEATURE, NULL_VALUES_FEATURE
from broker.rows import (
    ROW_FIELDS,
    AuditRow,
    Chunk,
    OffsetRow,
    Page,
    Row,
    SnapshotRow,
    page_as_text,
    records_of,
    records_of_chunks,
)
from broker.types import (
    AccessInfo,
    AppendResult,
    AppendResults,
    Attached,
    Attachment,
    BrokerStatus,
    Claimed,
    Fence,
    Headers,
    JournalEntryInfo,
    KafkaGroup,
    Lease,
    Mode,
    NewRecord,
    OwnershipInfo,
    PartitionInfo,
    ProducerEntry,
    ProducerFields,
    Record,
    RecordColumns,
    ResultColumns,
    TopicConfig,
    TopicInfo,
    TxnDetail,
    TxnInfo,
    TxnMember,
    TxnPartition,
    collector_paused,
    columns_of,
    is_columns,
    values_of,
)

T = TypeVar("T")


def field(args: dict[str, Any], name: str, kind: type[T], *, optional: bool = False) -> T:
    value = args.get(name)
    if value is None and optional:
        return value  # type: ignore[return-value]
    if kind is int and isinstance(value, bool):
        raise ProtocolError(f"field {name!r} must be an integer")
    if not isinstance(value, kind):
        raise ProtocolError(f"field {name!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def non_negative(args: dict[str, Any], name: str, *, optional: bool = False) -> int:
    value = field(args, name, int, optional=optional)
    if value is not None and value < 0:
        raise ProtocolError(f"field {name!r} must be >= 0, not {value}")
    return value


# topics ------------------------------------------------------------------------------


def topic_to_wire(info: TopicInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "partitions": info.partitions,
        "created_ms": info.created_ms,
        "owner_group": info.owner_group,
        "details": [
            (p.partition, p.start_offset, p.end_offset, p.records, p.bytes)
            for p in info.partition_details
        ],
        "config": config_to_wire(info.config),
    }


def topic_from_wire(wire: dict[str, Any]) -> TopicInfo:
    return TopicInfo(
        name=wire["name"],
        partitions=wire["partitions"],
        created_ms=wire["created_ms"],
        owner_group=wire["owner_group"],
        partition_details=tuple(PartitionInfo(*row) for row in wire["details"]),
        config=config_from_wire(wire.get("config")) or TopicConfig(),
    )


def config_to_wire(config: TopicConfig | None) -> list[Any] | None:
    if config is None:
        return None
    return [config.retention_ms, config.retention_bytes, config.cleanup]


def config_from_wire(wire: Any) -> TopicConfig | None:
    if wire is None:
        return None
    if not isinstance(wire, list | tuple) or len(wire) != 3:
        raise ProtocolError("a topic config is [retention_ms, retention_bytes, cleanup]")
    retention_ms, retention_bytes, cleanup = wire
    for value in (retention_ms, retention_bytes):
        if value is not None and type(value) is not int:
            raise ProtocolError("a topic's retention is an integer or null")
    if type(cleanup) is not str:
        raise ProtocolError("a topic's cleanup is a string")
    return TopicConfig(retention_ms, retention_bytes, cleanup)


def status_to_wire(status: BrokerStatus) -> dict[str, Any]:
    return {
        "data_dir": status.data_dir,
        "schema_version": status.schema_version,
        "durability": status.durability,
        "database_bytes": status.database_bytes,
        "wal_bytes": status.wal_bytes,
        "topics": [topic_to_wire(t) for t in status.topics],
        "producer_ids": status.producer_ids,
        "producer_evictions": status.producer_evictions,
    }


def status_from_wire(wire: dict[str, Any]) -> BrokerStatus:
    return BrokerStatus(
        data_dir=wire["data_dir"],
        schema_version=wire["schema_version"],
        durability=wire["durability"],
        database_bytes=wire["database_bytes"],
        wal_bytes=wire["wal_bytes"],
        topics=tuple(topic_from_wire(t) for t in wire["topics"]),
        producer_ids=wire["producer_ids"],
        producer_evictions=wire["producer_evictions"],
    )


# produce -----------------------------------------------------------------------------


def new_records_to_wire(records: Sequence[NewRecord]) -> Sequence[NewRecord]:
    # A NewRecord is a tuple: msgpack writes it as [value, key, headers, partition, ts].
    return records  # a RecordColumns: sent as columns, or as rows (with_columns)


def new_records_to_columns(records: Sequence[NewRecord]) -> list[Any] | None:
    """A batch with no headers or timestamps as PRODUCE's columns: [values, keys or
    nil, partitions or nil] (cheaper to send and to check than a row per record);
    None for any other batch."""
    if is_columns(records):
        return [records.values, records.keys, records.partitions]
    count = len(records)
    if (
        count < _COLUMNS_MIN
        or list(map(_FIELDS[2], records)).count(()) != count
        or list(map(_FIELDS[4], records)).count(None) != count
    ):
        return None
    # column by column (zip(*records) would make an iterator per record)
    values, keys, partitions = (list(map(_FIELDS[i], records)) for i in (0, 1, 3))
    return [
        values,
        None if keys.count(None) == count else keys,
        None if partitions.count(None) == count else partitions,
    ]


_COLUMNS_MIN: Final = 16  # records: below, a row per record costs as little
_FIELDS: Final = tuple(operator.itemgetter(i) for i in range(5))  # a NewRecord's


def with_columns(args: dict[str, Any], features: frozenset[str]) -> dict[str, Any]:
    """A request's arguments with its "records" as "columns" where the server takes
    them (COLUMNS_FEATURE in what its HELLO announced) and the batch allows; else as
    they were."""
    records = args.get("records")
    if NULL_VALUES_FEATURE not in features and isinstance(records, list | tuple | RecordColumns):
        _refuse_nulls(records)
    if is_columns(records) and (
        COLUMNS_FEATURE not in features or records.timestamps is not None
    ):  # a server before columns, or timestamps (PRODUCE's columns carry none): rows
        return {**args, "records": records.records()}
    if COLUMNS_FEATURE not in features or not isinstance(records, list | tuple | RecordColumns):
        return args
    columns = new_records_to_columns(records)
    if columns is None:
        return args
    changed = dict(args)
    del changed["records"]
    changed["columns"] = columns
    return changed


def _refuse_nulls(records: Sequence[NewRecord]) -> None:
    """A server before null values (no NULL_VALUES_FEATURE) would refuse the request as
    malformed: say which record, before anything is sent."""
    values = values_of(records)
    if any(value is None for value in values):
        index = next(i for i, value in enumerate(values) if value is None)
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"record {index} has a null value, which this server cannot store",
            index=index,
            hint="upgrade the server to one that keeps null values, or send b''",
        )


def records_from_args(args: dict[str, Any]) -> Sequence[NewRecord]:
    """A request's records, sent as rows or as columns."""
    columns = args.get("columns")
    if columns is None:
        return new_records_from_wire(args.get("records"))
    return new_records_from_columns(columns)


def new_records_from_columns(columns: object) -> RecordColumns:
    """PRODUCE's columns as a batch, checked column by column in C; no NewRecord is
    made unless something asks for one (RecordColumns)."""
    if not (isinstance(columns, tuple | list) and len(columns) == 3):
        raise ProtocolError("field 'columns' must be [values, keys or nil, partitions or nil]")
    values, keys, partitions = columns
    if not isinstance(values, tuple | list) or not {*map(type, values)} <= _KEY_TYPES:
        raise ProtocolError("the values column must be an array of binary values or nil")
    count = len(values)
    return RecordColumns(
        values,
        _optional_column(keys, count, _KEY_TYPES, "keys", "binary or nil"),
        _optional_column(partitions, count, _INT_TYPES, "partitions", "integers or nil"),
    )


def _optional_column(
    column: object, count: int, kinds: frozenset[object], name: str, said: str
) -> Sequence[Any] | None:
    if column is None:
        return None
    if not (
        isinstance(column, tuple | list) and len(column) == count and {*map(type, column)} <= kinds
    ):
        raise ProtocolError(f"the {name} column must be nil or {count} {said}")
    return column


def new_records_from_wire(rows: object) -> list[NewRecord]:
    if type(rows) is tuple and len(rows) == 1:  # one record: checked without a pass
        row = rows[0]
        if (
            type(row) is tuple
            and len(row) == 5
            and (type(row[0]) is bytes or row[0] is None)
            and (row[1] is None or type(row[1]) is bytes)
            and row[2] == ()
            and (row[3] is None or type(row[3]) is int)
            and (row[4] is None or type(row[4]) is int)
        ):
            return [tuple.__new__(NewRecord, row)]
    if not isinstance(rows, tuple | list):
        raise ProtocolError("field 'records' must be an array")
    if _plain(rows):  # the usual batch, checked column by column in C
        with collector_paused():
            return list(map(tuple.__new__, repeat(NewRecord), rows))
    return [_new_record(index, row) for index, row in enumerate(rows)]


def _plain(rows: tuple[Any, ...] | list[Any]) -> bool:
    """Records of five fields: binary values, binary or nil keys, no headers, nil or
    integer partition and timestamp: nothing _new_record would refuse or rebuild."""
    if not rows or {*map(type, rows)} != {tuple} or {*map(len, rows)} != {5}:
        return False
    values, keys, headers, partitions, stamps = _FIELDS
    return (
        {*map(type, map(values, rows))} <= _KEY_TYPES
        and {*map(type, map(keys, rows))} <= _KEY_TYPES
        and list(map(headers, rows)).count(()) == len(rows)
        and {*map(type, map(partitions, rows))} <= _INT_TYPES
        and {*map(type, map(stamps, rows))} <= _INT_TYPES
    )


_KEY_TYPES: Final = frozenset({bytes, type(None)})
_INT_TYPES: Final = frozenset({int, type(None)})


def _new_record(index: int, row: object) -> NewRecord:
    if not (isinstance(row, tuple | list) and len(row) == 5):
        raise ProtocolError(f"record {index} is not [value, key, headers, partition, timestamp]")
    value, key, headers, partition, timestamp_ms = row
    if not (value is None or isinstance(value, bytes)) or not (
        key is None or isinstance(key, bytes)
    ):
        raise ProtocolError(f"record {index}: value and key must be binary or nil")
    for optional_int in (partition, timestamp_ms):
        if optional_int is not None and (
            not isinstance(optional_int, int) or isinstance(optional_int, bool)
        ):
            raise ProtocolError(f"record {index}: partition and timestamp must be integers")
    return NewRecord(value, key, _headers(index, headers), partition, timestamp_ms)


def _headers(index: int, headers: object) -> Headers:
    if not isinstance(headers, tuple | list):
        raise ProtocolError(f"record {index}: headers must be an array")
    for pair in headers:
        if not (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and (pair[1] is None or isinstance(pair[1], bytes))
        ):
            raise ProtocolError(f"record {index}: each header is [name, binary value or nil]")
    return tuple((name, value) for name, value in headers)


def producer_to_wire(producer: ProducerFields) -> tuple[Any, ...]:
    # A ProducerFields is a tuple: msgpack writes [pid, generation, sequence, epoch, txn].
    return producer


def producer_from_wire(wire: object) -> ProducerFields:
    if type(wire) is tuple and len(wire) == 5:  # the usual case, checked without a loop
        pid, generation, sequence, epoch, txn = wire
        if (
            type(pid) is int
            and type(generation) is int
            and type(sequence) is int
            and type(epoch) is int
            and (txn is None or type(txn) is int)
        ):
            return tuple.__new__(ProducerFields, wire)
    if not (isinstance(wire, tuple | list) and len(wire) == 5):
        raise ProtocolError("field 'producer' is not [pid, generation, sequence, epoch, txn]")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in wire[:4]):
        raise ProtocolError("producer fields must be integers")
    if wire[4] is not None and not isinstance(wire[4], int):
        raise ProtocolError("producer txn must be an integer or nil")
    return ProducerFields(*wire)


def results_to_wire(results: Sequence[AppendResult]) -> list[tuple[int, int, bool]]:
    # (partition, offset, duplicate): an AppendResult without its topic, sliced in C
    with collector_paused():
        return list(map(_WIRE_RESULT, results))


_WIRE_RESULT: Final = operator.itemgetter(slice(1, None))


def results_from_wire(topic: str, rows: Sequence[Sequence[Any]]) -> list[AppendResult]:
    """A reply's [partition, offset, duplicate] rows as results, made in C."""
    if not isinstance(rows, tuple | list) or (
        rows and ({*map(type, rows)} != {tuple} or {*map(len, rows)} != {3})
    ):
        raise ProtocolError("field 'results' must be [partition, offset, duplicate] rows")
    with collector_paused():
        return list(map(tuple.__new__, repeat(AppendResult), map((topic,).__add__, rows)))


def results_reply(results: Sequence[AppendResult], columns: bool) -> dict[str, Any]:
    """A PRODUCE reply: a [partition, offset, duplicate] row per record, or (columns:
    the client asked for them) {"result_columns": [count, partitions, offsets,
    duplicates]} (result_columns; a run of offsets sent as its numbers)."""
    if not columns:
        return {"results": results_to_wire(results)}
    count, *rest = columns_of(results)
    return {"result_columns": [count, *(list(c) if isinstance(c, range) else c for c in rest)]}


def result_columns(results: Sequence[AppendResult]) -> ResultColumns:
    """Results as columns, each given once when every result has the same (a
    transaction's: offset -1, not a duplicate)."""
    return columns_of(results)


def results_from_reply(topic: str, reply: dict[str, Any]) -> Sequence[AppendResult]:
    """A PRODUCE reply's results, as rows or columns; anything malformed is a
    ProtocolError."""
    if "result_columns" not in reply:
        return results_from_wire(topic, reply.get("results", ()))
    return AppendResults(topic, [result_columns_of_reply(reply)])


def result_columns_of_reply(reply: dict[str, Any]) -> ResultColumns:
    """A PRODUCE reply's results as columns (a reply in rows: made into columns), each
    checked; anything malformed is a ProtocolError."""
    if "result_columns" not in reply:
        return result_columns(results_from_wire("", reply.get("results", ())))
    wire = reply["result_columns"]
    if not (isinstance(wire, tuple | list) and len(wire) == 4 and type(wire[0]) is int):
        raise ProtocolError("field 'result_columns' is [count, partitions, offsets, duplicates]")
    count = wire[0]
    partitions, offsets, duplicates = (
        _result_column(column, count, kind)
        for column, kind in zip(wire[1:], (int, int, bool), strict=True)
    )
    return count, partitions, offsets, duplicates


def _result_column(column: object, count: int, kind: type) -> Any:
    """A result column as sent: one value for all (kind), or one per record."""
    if type(column) is kind:
        return column
    if isinstance(column, tuple | list) and len(column) == count and {*map(type, column)} <= {kind}:
        return column
    raise ProtocolError(f"a result column holds {count} values of {kind.__name__}")


# fetch -------------------------------------------------------------------------------


def positions_to_wire(positions: dict[int, int]) -> list[tuple[int, int]]:
    return list(positions.items())


def positions_from_wire(wire: object) -> dict[int, int]:
    """Types only: the engine judges the numbers, as it does embedded."""
    if not isinstance(wire, tuple | list):
        raise ProtocolError("field 'positions' must be an array of [partition, offset]")
    positions = {}
    for pair in wire:
        if not (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        ):
            raise ProtocolError("each position is [partition, offset], both integers")
        positions[pair[0]] = pair[1]
    return positions


def records_to_wire(records: Sequence[Record]) -> Sequence[Record]:
    # A Record is a tuple: msgpack writes it as an array in field order as it is.
    return records


def records_from_wire(rows: Sequence[Sequence[Any]]) -> list[Record]:
    return list(map(Record._make, rows))


def rows_of_reply(reply: dict[str, Any]) -> list[Row]:
    """A fetch reply's rows (broker/storage/logs.py Row: no topic, headers as stored)."""
    rows = reply.get("rows")
    if not isinstance(rows, tuple | list) or not all(
        isinstance(row, tuple | list) and len(row) == ROW_FIELDS for row in rows
    ):
        raise ProtocolError(f"field 'rows' must be an array of {ROW_FIELDS}-field rows")
    return list(rows)


def rows_from_wire(topic: str, rows: object) -> list[Record]:
    """A fetch's rows as Records of the topic; anything malformed is a ProtocolError."""
    try:
        return records_of(topic, cast(Sequence[Row], rows))
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"a fetched row is malformed: {exc}") from exc


def chunks_to_wire(chunks: Sequence[Chunk], runs: bool) -> list[dict[str, Any]]:
    """A fetch's pages (a Page is a tuple: msgpack writes it as an array in field order)
    and, for a partition SQLite could not page, its rows. runs: the client reads
    columns given as runs (else they go as text)."""
    return [
        {"page": chunk if runs else page_as_text(chunk)}
        if isinstance(chunk, Page)
        else {"rows": chunk}
        for chunk in chunks
    ]


def records_from_chunks(topic: str, wire: object) -> list[Record]:
    """A FETCH reply's pages and rows as Records of the topic; anything malformed (a
    page whose columns disagree with its count, a field of the wrong type) is a
    ProtocolError."""
    chunks = chunks_from_wire(wire)
    try:
        return records_of_chunks(topic, chunks)
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"a fetched page is malformed: {exc}") from exc


def chunks_from_wire(wire: object) -> list[Chunk]:
    """A FETCH reply's pages and rows, each checked for its shape."""
    if not isinstance(wire, tuple | list):
        raise ProtocolError("field 'pages' must be an array of pages and rows")
    return [_chunk_from_wire(chunk) for chunk in wire]


_PAGE_FIELDS: Final = (
    (int,),  # partition
    (int,),  # offset
    (int,),  # record_count
    (bytes,),  # values
    (int, bytes, tuple, list),  # value_lengths
    (int, bytes, tuple, list),  # timestamps
    (bytes,),  # keys
    (int, bytes),  # key_lengths
    (tuple, list),  # headers
    (tuple, list),  # producer
)


def _chunk_from_wire(chunk: object) -> Chunk:
    if isinstance(chunk, dict) and "rows" in chunk:
        return rows_of_reply(chunk)
    fields = chunk.get("page") if isinstance(chunk, dict) else None
    if not (
        isinstance(fields, tuple | list)
        and len(fields) == len(_PAGE_FIELDS)
        and all(
            isinstance(value, kinds) and not isinstance(value, bool)
            for value, kinds in zip(fields, _PAGE_FIELDS, strict=True)
        )
    ):
        raise ProtocolError("each fetched chunk is {'page': [10 fields]} or {'rows': [...]}")
    page = Page(*fields)
    if not (
        page.record_count >= 0
        and len(page.producer) == 5
        and all(column is None or _column_shaped(column) for column in page.producer)
        and _column_shaped(page.value_lengths)
        and _column_shaped(page.timestamps)
    ):
        raise ProtocolError(
            "a page has a count >= 0 and 5 producer columns (numbers, text or runs)"
        )
    page = page._replace(
        value_lengths=_column_from_wire(page.value_lengths),
        timestamps=_column_from_wire(page.timestamps),
        producer=tuple(map(_column_from_wire, page.producer)),
    )
    if not all(
        isinstance(item, tuple | list)
        and len(item) == 2
        and isinstance(item[0], int)
        and isinstance(item[1], bytes)
        for item in page.headers
    ):
        raise ProtocolError("a page's headers are [offset, stored headers] pairs")
    return page


def _column_from_wire(column: Any) -> Any:
    """Runs arrive as arrays (tuples here): the list of triples rows.Runs is."""
    return [tuple(run) for run in column] if isinstance(column, tuple | list) else column


def _column_shaped(column: object) -> bool:
    """A page column: a number, text, or runs ([records, first, step] triples)."""
    if isinstance(column, list | tuple):
        return all(
            isinstance(run, list | tuple)
            and len(run) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) for n in run)
            for run in column
        )
    return isinstance(column, int | bytes) and not isinstance(column, bool)


# ownership ---------------------------------------------------------------------------


def fences_to_wire(fences: Sequence[Fence]) -> Sequence[tuple[str, str, int]]:
    if not fences:
        return ()  # an empty array on the wire, as [] is
    return [(f.group, f.resource, f.generation) for f in fences]


def fences_from_wire(wire: object) -> tuple[Fence, ...]:
    if wire is None:
        return ()
    if not isinstance(wire, tuple | list):
        raise ProtocolError("field 'fences' must be an array of [group, resource, generation]")
    fences = []
    for item in wire:
        if not (
            isinstance(item, tuple | list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], int)
            and not isinstance(item[2], bool)
        ):
            raise ProtocolError("each fence is [group, resource, generation]")
        fences.append(Fence(*item))
    return tuple(fences)


def claims_from_wire(wire: object) -> list[tuple[str, int]]:
    if not isinstance(wire, tuple | list):
        raise ProtocolError("field 'claims' must be an array of [resource, generation]")
    claims = []
    for item in wire:
        if not (
            isinstance(item, tuple | list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        ):
            raise ProtocolError("each claim is [resource, generation]")
        claims.append((item[0], item[1]))
    return claims


def strings_from_wire(name: str, wire: object) -> list[str] | None:
    if wire is None:
        return None
    if not (isinstance(wire, tuple | list) and all(isinstance(v, str) for v in wire)):
        raise ProtocolError(f"field {name!r} must be an array of strings")
    return list(wire)


def claimed_to_wire(claimed: Sequence[Claimed]) -> list[tuple[str, str, int]]:
    return [(c.group, c.resource, c.generation) for c in claimed]


def claimed_from_wire(wire: Sequence[Sequence[Any]]) -> list[Claimed]:
    return [Claimed(*row) for row in wire]


def kafka_groups_to_wire(groups: Sequence[KafkaGroup]) -> list[Any]:
    return msgspec.to_builtins(list(groups))  # type: ignore[no-any-return]


def kafka_groups_from_wire(wire: Any) -> list[KafkaGroup]:
    try:
        return msgspec.convert(wire, list[KafkaGroup])
    except msgspec.ValidationError as error:
        raise ProtocolError(f"a malformed list of Kafka groups: {error}") from error


def ownership_to_wire(rows: Sequence[OwnershipInfo]) -> list[tuple[Any, ...]]:
    return [
        (r.group, r.resource, r.generation, r.holder, r.holder_live, r.claimed_ms) for r in rows
    ]


def ownership_from_wire(wire: Sequence[Sequence[Any]]) -> list[OwnershipInfo]:
    return [OwnershipInfo(*row) for row in wire]


def audit_to_wire(rows: Sequence[AuditRow]) -> list[tuple[Any, ...]]:
    return [
        (
            r.audit_id,
            r.at_ms,
            r.group,
            r.resource,
            r.event,
            r.session_id,
            r.generation,
            r.requested,
            r.other,
        )
        for r in rows
    ]


def audit_from_wire(wire: Sequence[Sequence[Any]]) -> list[AuditRow]:
    return [AuditRow(*row) for row in wire]


# producers ---------------------------------------------------------------------------


def lease_to_wire(lease: Lease) -> dict[str, int]:
    return {
        "pid": lease.producer_id,
        "generation": lease.generation,
        "sequence": lease.sequence,
        "expire_ms": lease.expire_ms,
        "now_ms": lease.now_ms,
    }


def lease_from_wire(wire: dict[str, Any]) -> Lease:
    return Lease(
        wire["pid"], wire["generation"], wire["sequence"], wire["expire_ms"], wire["now_ms"]
    )


def entries_to_wire(entries: Sequence[tuple[int, ProducerEntry]]) -> list[tuple[int, ...]]:
    return [
        (p, e.producer_id, e.generation, e.high_water_sequence, e.first_record_ms, e.last_offset)
        for p, e in entries
    ]


def entries_from_wire(wire: Sequence[Sequence[int]]) -> list[tuple[int, ProducerEntry]]:
    return [(p, ProducerEntry(pid, g, s, ms, o)) for p, pid, g, s, ms, o in wire]


def snapshots_to_wire(rows: Sequence[SnapshotRow]) -> list[tuple[int, ...]]:
    return [(r.snapshot_id, r.created_ms, r.producers, r.evictions, r.bytes) for r in rows]


def snapshots_from_wire(wire: Sequence[Sequence[int]]) -> list[SnapshotRow]:
    return [SnapshotRow(*row) for row in wire]


def offsets_to_wire(rows: Sequence[OffsetRow]) -> list[tuple[Any, ...]]:
    return [
        (r.partition, r.next_offset, r.producer_state, r.committed_ms, r.metadata, r.leader_epoch)
        for r in rows
    ]


def offsets_from_wire(wire: Sequence[Sequence[Any]]) -> list[OffsetRow]:
    return [OffsetRow(*row) for row in wire]


def offset_map_from_wire(wire: object) -> dict[int, int]:
    if not isinstance(wire, tuple | list):
        raise ProtocolError("field 'offsets' must be an array of [partition, offset]")
    return positions_from_wire(wire)


# exclusive producers -----------------------------------------------------------------


def attachment_to_wire(a: Attachment) -> dict[str, Any]:
    return {
        "id": a.attachment_id,
        "topic": a.topic,
        "name": a.name,
        "mode": a.mode,
        "epoch": a.epoch,
    }


def attachment_from_wire(wire: dict[str, Any]) -> Attachment:
    return Attachment(wire["id"], wire["topic"], wire["name"], Mode(wire["mode"]), wire["epoch"])


def _attached_to_wire(a: Attached) -> tuple[Any, ...]:
    return (a.attachment_id, a.session_id, a.name, a.mode, a.epoch, a.live)


def _attached_from_wire(row: Sequence[Any]) -> Attached:
    return Attached(row[0], row[1], row[2], Mode(row[3]), row[4], row[5])


def access_to_wire(info: AccessInfo) -> dict[str, Any]:
    return {
        "epoch": info.epoch,
        "exclusive": None if info.exclusive is None else _attached_to_wire(info.exclusive),
        "shared": [_attached_to_wire(a) for a in info.shared],
        "waiting": [_attached_to_wire(a) for a in info.waiting],
    }


def access_from_wire(wire: dict[str, Any]) -> AccessInfo:
    exclusive = wire["exclusive"]
    return AccessInfo(
        wire["epoch"],
        None if exclusive is None else _attached_from_wire(exclusive),
        tuple(_attached_from_wire(a) for a in wire["shared"]),
        tuple(_attached_from_wire(a) for a in wire["waiting"]),
    )


# transactions --------------------------------------------------------------------------

_TXN_FIELDS = (
    "txn_id",
    "group",
    "key",
    "state",
    "journal",
    "began_ms",
    "deadline_ms",
    "ended_ms",
    "reason",
    "age_ms",
    "existing",
)


def txn_id_from_wire(args: dict[str, Any]) -> int:
    # a well-formed integer that is no txn id is the caller's error, as it is embedded
    return parse_txn_id(field(args, "txn_id", int))


def members_from_wire(wire: object) -> dict[str, int] | None:
    """[[member, generation], ...] or nil."""
    if wire is None:
        return None
    if not isinstance(wire, list | tuple):
        raise ProtocolError("field 'members' must be an array of [member, generation]")
    members = {}
    for item in wire:
        if not (
            isinstance(item, list | tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        ):
            raise ProtocolError("field 'members' must be an array of [member, generation]")
        members[item[0]] = item[1]
    return members


def txn_to_wire(info: TxnInfo) -> dict[str, Any]:
    wire = {name: getattr(info, name) for name in _TXN_FIELDS}
    wire["partitions"] = [
        (p.topic, p.partition, p.records, p.bytes, p.base_offset) for p in info.partitions
    ]
    return wire


def txn_from_wire(wire: dict[str, Any]) -> TxnInfo:
    parts = tuple(TxnPartition(*row) for row in wire["partitions"])
    return TxnInfo(**{name: wire[name] for name in _TXN_FIELDS}, partitions=parts)


def member_to_wire(member: TxnMember) -> dict[str, Any]:
    return {
        "txn_id": member.txn_id,
        "member": member.member,
        "pid": member.producer_id,
        "generation": member.generation,
        "discarded": member.discarded,
    }


def member_from_wire(wire: dict[str, Any]) -> TxnMember:
    return TxnMember(
        wire["txn_id"], wire["member"], wire["pid"], wire["generation"], wire["discarded"]
    )


def detail_to_wire(detail: TxnDetail) -> dict[str, Any]:
    return {
        "txn": txn_to_wire(detail.info),
        "journal": [(e.journal, e.position, e.kind, e.at_ms, e.body) for e in detail.journal],
        "records": records_to_wire(detail.records),
    }


def detail_from_wire(wire: dict[str, Any]) -> TxnDetail:
    return TxnDetail(
        txn_from_wire(wire["txn"]),
        tuple(
            JournalEntryInfo(journal, position, kind, at_ms, arrays_as_lists(body))
            for journal, position, kind, at_ms, body in wire["journal"]
        ),
        tuple(records_from_wire(wire["records"])),
    )


def arrays_as_lists(value: object) -> object:
    """A free-form value (a journal entry's body, an error's details) as the engine
    made it, arrays as lists: a frame's arrays arrive as tuples, and the same call
    answered otherwise served than embedded."""
    if isinstance(value, tuple | list):
        return [arrays_as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: arrays_as_lists(item) for key, item in value.items()}
    return value
