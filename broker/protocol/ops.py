"""The table of operations: one entry per request that is a plain call of the engine.

An entry names the operation's number on the wire, the engine method that answers it
(the embedded transport calls that method directly), whether the server runs it on the
writer or the reader, and the four codecs between a call and its frames:

    client: args(*call) -> payload      server: decode_args(payload) -> engine keywords
    server: reply(result) -> payload    client: decode_reply(payload) -> result

so the server's dispatch and both transports are generic over the table, and a new plain
operation is an engine method, an entry here and a client method. Requests that need more
than a call (HELLO, PRODUCE's group commit, FETCH's long poll, OWN and RELEASE, which
sever other sessions, ATTACH's wait) keep handlers of their own in broker/server.

`retry_safe`: a request the served client may send again on a new connection when the
connection ended under it (its outcome unknown), because repeating it changes nothing
that the first one did not. `wakes` names the topics whose long-polling fetches the
server wakes once the operation has written.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, ParamSpec, TypeVar

from msgspec import Struct

from broker.protocol import codec
from broker.protocol.codec import field, non_negative, txn_id_from_wire
from broker.protocol.messages import Op
from broker.rows import GroupOffsetRow, OffsetRow, SnapshotRow
from broker.types import (
    AppendResult,
    Fence,
    NewRecord,
    ProducerEntry,
    Record,
    SessionInfo,
    TopicConfig,
    TopicInfo,
    TxnInfo,
)

P = ParamSpec("P")
R = TypeVar("R")
Payload = dict[str, Any]


class Side(enum.Enum):
    """Which of the server's two engines answers: every change goes to the writer."""

    READ = "read"
    WRITE = "write"


class Operation(Struct, Generic[P, R], frozen=True):
    op: Op
    method: str  # the Engine method that answers it, called with decode_args' keywords
    side: Side
    args: Callable[P, Payload]
    decode_args: Callable[[Payload], dict[str, Any]]  # the engine method's keywords
    reply: Callable[[R], Payload]
    decode_reply: Callable[[Payload], R]
    retry_safe: bool = False
    wakes: Callable[[Payload, R], Iterable[str]] | None = None
    # An operation that carries records: they may go as columns to a server that takes
    # them (codec.with_columns), and this answers with its results as columns to a
    # client that asks (result_columns: true).
    reply_columns: Callable[[R], Payload] | None = None


def _none() -> Payload:
    return {}


def _nothing(payload: Payload) -> Payload:
    return {}


def _empty(result: object) -> Payload:
    return {}


def _ignore(payload: Payload) -> None:
    return None


def _topic_name(name: str) -> Payload:
    return {"name": name}


def _named(payload: Payload) -> Payload:
    return {"name": field(payload, "name", str)}


def _topic_name_as_topic(topic: str) -> Payload:
    return {"topic": topic}


def _topic(topic: str) -> Payload:
    return {"topic": topic}


def _of_topic(payload: Payload) -> Payload:
    return {"topic": field(payload, "topic", str)}


def _group_topic(group: str, topic: str) -> Payload:
    return {"group": group, "topic": topic}


def _of_group_topic(payload: Payload) -> Payload:
    return {"group": field(payload, "group", str), "topic": field(payload, "topic", str)}


# topics -------------------------------------------------------------------------------


def _create_topic(
    name: str,
    partitions: int = 1,
    *,
    owner_group: str | None = None,
    config: TopicConfig | None = None,
) -> Payload:
    return {
        "name": name,
        "partitions": partitions,
        "owner_group": owner_group,
        "config": codec.config_to_wire(config),
    }


def _of_create_topic(payload: Payload) -> Payload:
    return {
        "name": field(payload, "name", str),
        "partitions": field(payload, "partitions", int),
        "owner_group": field(payload, "owner_group", str, optional=True),
        "config": codec.config_from_wire(payload.get("config")),
    }


def _alter_topic(
    name: str, *, partitions: int | None = None, config: TopicConfig | None = None
) -> Payload:
    return {"name": name, "partitions": partitions, "config": codec.config_to_wire(config)}


def _of_alter_topic(payload: Payload) -> Payload:
    return {
        "name": field(payload, "name", str),
        "partitions": field(payload, "partitions", int, optional=True),
        "config": codec.config_from_wire(payload.get("config")),
    }


def _deleted(count: int) -> Payload:
    return {"deleted": count}


def _deleted_from_wire(payload: Payload) -> int:
    return non_negative(payload, "deleted")


CREATE_TOPIC: Final = Operation(
    Op.CREATE_TOPIC,
    "create_topic",
    Side.WRITE,
    _create_topic,
    _of_create_topic,
    codec.topic_to_wire,
    codec.topic_from_wire,
)
ALTER_TOPIC: Final = Operation(
    Op.ALTER_TOPIC,
    "alter_topic",
    Side.WRITE,
    _alter_topic,
    _of_alter_topic,
    codec.topic_to_wire,
    codec.topic_from_wire,
)
CLEAN_TOPIC: Final = Operation(
    Op.CLEAN_TOPIC,
    "clean_topic",
    Side.WRITE,
    _topic_name_as_topic,
    _of_topic,
    _deleted,
    _deleted_from_wire,
)
DELETE_TOPIC: Final = Operation(
    Op.DELETE_TOPIC,
    "delete_topic",
    Side.WRITE,
    _topic_name,
    _named,
    _empty,
    _ignore,
    wakes=lambda payload, _: (str(payload["name"]),),
)


def _topics_to_wire(topics: list[TopicInfo]) -> Payload:
    return {"topics": [codec.topic_to_wire(topic) for topic in topics]}


def _topics_from_wire(payload: Payload) -> list[TopicInfo]:
    return [codec.topic_from_wire(topic) for topic in payload["topics"]]


LIST_TOPICS: Final = Operation(
    Op.LIST_TOPICS,
    "list_topics",
    Side.READ,
    _none,
    _nothing,
    _topics_to_wire,
    _topics_from_wire,
    retry_safe=True,
)
DESCRIBE_TOPIC: Final = Operation(
    Op.DESCRIBE_TOPIC,
    "describe_topic",
    Side.READ,
    _topic_name,
    _named,
    codec.topic_to_wire,
    codec.topic_from_wire,
    retry_safe=True,
)
STATUS: Final = Operation(
    Op.STATUS,
    "status",
    Side.READ,
    _none,
    _nothing,
    codec.status_to_wire,
    codec.status_from_wire,
    retry_safe=True,
)


def _compacted(topic: str, partition: int) -> Payload:
    return {"topic": topic, "partition": partition}


def _of_compacted(payload: Payload) -> Payload:
    return {"topic": field(payload, "topic", str), "partition": field(payload, "partition", int)}


def _records_to_wire(records: list[Record]) -> Payload:
    return {"records": codec.records_to_wire(records)}


def _records_from_wire(payload: Payload) -> list[Record]:
    return codec.records_from_wire(payload["records"])


READ_COMPACTED: Final = Operation(
    Op.READ_COMPACTED,
    "read_compacted",
    Side.READ,
    _compacted,
    _of_compacted,
    _records_to_wire,
    _records_from_wire,
)

# idempotent producers and consumer offsets --------------------------------------------


def _lease_pid(topic: str, partition: int, producer_id: int | None = None) -> Payload:
    return {"topic": topic, "partition": partition, "pid": producer_id}


def _of_lease_pid(payload: Payload) -> Payload:
    return {
        "topic": field(payload, "topic", str),
        "partition": field(payload, "partition", int),
        "producer_id": field(payload, "pid", int, optional=True),
    }


LEASE_PID: Final = Operation(
    Op.LEASE_PID,
    "lease_pid",
    Side.WRITE,
    _lease_pid,
    _of_lease_pid,
    codec.lease_to_wire,
    codec.lease_from_wire,
)


def _entries_to_wire(entries: list[tuple[int, ProducerEntry]]) -> Payload:
    return {"producers": codec.entries_to_wire(entries)}


def _entries_from_wire(payload: Payload) -> list[tuple[int, ProducerEntry]]:
    return codec.entries_from_wire(payload["producers"])


PRODUCERS: Final = Operation(
    Op.PRODUCERS,
    "producer_states",
    Side.WRITE,  # the table replays the log's tail first, inside a writer transaction
    _topic,
    _of_topic,
    _entries_to_wire,
    _entries_from_wire,
)


def _snapshot_id_to_wire(snapshot_id: int) -> Payload:
    return {"snapshot_id": snapshot_id}


def _snapshot_id_from_wire(payload: Payload) -> int:
    return int(payload["snapshot_id"])


PRODUCER_SNAPSHOT: Final = Operation(
    Op.PRODUCER_SNAPSHOT,
    "snapshot_producers",
    Side.WRITE,
    _none,
    _nothing,
    _snapshot_id_to_wire,
    _snapshot_id_from_wire,
)


def _snapshots_to_wire(rows: list[SnapshotRow]) -> Payload:
    return {"snapshots": codec.snapshots_to_wire(rows)}


def _snapshots_from_wire(payload: Payload) -> list[SnapshotRow]:
    return codec.snapshots_from_wire(payload["snapshots"])


PRODUCER_SNAPSHOTS: Final = Operation(
    Op.PRODUCER_SNAPSHOTS,
    "producer_snapshots",
    Side.READ,
    _none,
    _nothing,
    _snapshots_to_wire,
    _snapshots_from_wire,
)


def _commit_offsets(
    group: str,
    topic: str,
    offsets: Mapping[int, int],
    producer_state: bytes | None = None,
    metadata: str | None = None,
) -> Payload:
    payload: Payload = {
        "group": group,
        "topic": topic,
        "offsets": list(offsets.items()),
        "producer_state": producer_state,
    }
    if metadata is not None:  # every partition's (a server before it never sees the key)
        payload["metadata"] = metadata
    return payload


def _of_commit_offsets(payload: Payload) -> Payload:
    decoded = {
        "group": field(payload, "group", str),
        "topic": field(payload, "topic", str),
        "offsets": codec.offset_map_from_wire(payload.get("offsets")),
        "producer_state": field(payload, "producer_state", bytes, optional=True),
    }
    if "metadata" in payload:
        decoded["metadata"] = field(payload, "metadata", str, optional=True)
    return decoded


COMMIT_OFFSETS: Final = Operation(
    Op.COMMIT_OFFSETS,
    "commit_offsets",
    Side.WRITE,
    _commit_offsets,
    _of_commit_offsets,
    _empty,
    _ignore,
)


def _offsets_to_wire(rows: list[OffsetRow]) -> Payload:
    return {"offsets": codec.offsets_to_wire(rows)}


def _offsets_from_wire(payload: Payload) -> list[OffsetRow]:
    return codec.offsets_from_wire(payload["offsets"])


COMMITTED_OFFSETS: Final = Operation(
    Op.COMMITTED_OFFSETS,
    "committed_offsets",
    Side.READ,
    _group_topic,
    _of_group_topic,
    _offsets_to_wire,
    _offsets_from_wire,
)


def _limit(limit: int = 10_000) -> Payload:
    return {"limit": limit}


def _of_limit(payload: Payload) -> Payload:
    return {"limit": non_negative(payload, "limit")}


def _group_offsets_to_wire(found: list[GroupOffsetRow]) -> Payload:
    return {
        "offsets": [(r.group, r.topic, r.partition, r.next_offset, r.committed_ms) for r in found]
    }


def _group_offsets_from_wire(payload: Payload) -> list[GroupOffsetRow]:
    return [GroupOffsetRow(*row) for row in payload["offsets"]]


CONSUMER_GROUPS: Final = Operation(
    Op.CONSUMER_GROUPS,
    "consumer_groups",
    Side.READ,
    _limit,
    _of_limit,
    _group_offsets_to_wire,
    _group_offsets_from_wire,
    retry_safe=True,
)


def _offset_for_time(topic: str, partition: int, timestamp_ms: int) -> Payload:
    return {"topic": topic, "partition": partition, "timestamp_ms": timestamp_ms}


def _of_offset_for_time(payload: Payload) -> Payload:
    return {
        "topic": field(payload, "topic", str),
        "partition": non_negative(payload, "partition"),
        "timestamp_ms": field(payload, "timestamp_ms", int),
    }


def _found_to_wire(found: tuple[int, int] | None) -> Payload:
    return {"found": None if found is None else list(found)}


def _found_from_wire(payload: Payload) -> tuple[int, int] | None:
    found = payload["found"]
    return None if found is None else (int(found[0]), int(found[1]))


OFFSET_FOR_TIME: Final = Operation(
    Op.OFFSET_FOR_TIME,
    "offset_for_time",
    Side.READ,
    _offset_for_time,
    _of_offset_for_time,
    _found_to_wire,
    _found_from_wire,
    retry_safe=True,
)


# sessions -----------------------------------------------------------------------------


def _sessions_to_wire(found: list[SessionInfo]) -> Payload:
    return {
        "sessions": [
            (s.session_id, s.kind, s.pid, s.started_ms, s.heartbeat_ms, s.severed, s.live)
            for s in found
        ]
    }


def _sessions_from_wire(payload: Payload) -> list[SessionInfo]:
    return [SessionInfo(*row) for row in payload["sessions"]]


SESSIONS: Final = Operation(
    Op.SESSIONS,
    "sessions",
    Side.READ,
    _limit,
    _of_limit,
    _sessions_to_wire,
    _sessions_from_wire,
    retry_safe=True,
)

# exclusive producers ------------------------------------------------------------------

TOPIC_ACCESS: Final = Operation(
    Op.TOPIC_ACCESS,
    "topic_access",
    Side.WRITE,  # looking detaches producers whose sessions ended, and promotes waiters
    _topic,
    _of_topic,
    codec.access_to_wire,
    codec.access_from_wire,
)

# transactions -------------------------------------------------------------------------


def _txn_begin(group: str, key: str | None = None, timeout_ms: int | None = None) -> Payload:
    return {"group": group, "key": key, "timeout_ms": timeout_ms}


def _of_txn_begin(payload: Payload) -> Payload:
    return {
        "group": field(payload, "group", str),
        "key": field(payload, "key", str, optional=True),
        "timeout_ms": field(payload, "timeout_ms", int, optional=True),
    }


TXN_BEGIN: Final = Operation(
    Op.TXN_BEGIN,
    "txn_begin",
    Side.WRITE,
    _txn_begin,
    _of_txn_begin,
    codec.txn_to_wire,
    codec.txn_from_wire,
)


def _txn_join(txn_id: int, member: str) -> Payload:
    return {"txn_id": txn_id, "member": member}


def _of_txn_join(payload: Payload) -> Payload:
    return {"txn_id": txn_id_from_wire(payload), "member": field(payload, "member", str)}


TXN_JOIN: Final = Operation(
    Op.TXN_JOIN,
    "txn_join",
    Side.WRITE,
    _txn_join,
    _of_txn_join,
    codec.member_to_wire,
    codec.member_from_wire,
    retry_safe=True,  # joining twice only bumps the member's generation before it wrote
)


def _txn_commit(
    txn_id: int, group: str | None = None, members: Mapping[str, int] | None = None
) -> Payload:
    return {
        "txn_id": txn_id,
        "group": group,
        "members": None if members is None else list(members.items()),
    }


def _of_txn_commit(payload: Payload) -> Payload:
    return {
        "txn_id": txn_id_from_wire(payload),
        "group": field(payload, "group", str, optional=True),
        "members": codec.members_from_wire(payload.get("members")),
    }


def _committed_topics(payload: Payload, info: TxnInfo) -> Iterable[str]:
    return {part.topic for part in info.partitions if part.topic is not None}


TXN_COMMIT: Final = Operation(
    Op.TXN_COMMIT,
    "txn_commit",
    Side.WRITE,
    _txn_commit,
    _of_txn_commit,
    codec.txn_to_wire,
    codec.txn_from_wire,
    retry_safe=True,  # committing twice is answered as done
    wakes=_committed_topics,
)


def _txn_abort(txn_id: int, group: str | None = None) -> Payload:
    return {"txn_id": txn_id, "group": group}


def _of_txn_abort(payload: Payload) -> Payload:
    return {
        "txn_id": txn_id_from_wire(payload),
        "group": field(payload, "group", str, optional=True),
    }


TXN_ABORT: Final = Operation(
    Op.TXN_ABORT,
    "txn_abort",
    Side.WRITE,
    _txn_abort,
    _of_txn_abort,
    codec.txn_to_wire,
    codec.txn_from_wire,
    retry_safe=True,  # aborting twice is answered as done
)


def _txn_list(include_ended: bool = False, limit: int = 100) -> Payload:
    return {"all": include_ended, "limit": limit}


def _of_txn_list(payload: Payload) -> Payload:
    return {
        "include_ended": field(payload, "all", bool, optional=True) or False,
        "limit": non_negative(payload, "limit"),
    }


def _txns_to_wire(found: list[TxnInfo]) -> Payload:
    return {"txns": [codec.txn_to_wire(info) for info in found]}


def _txns_from_wire(payload: Payload) -> list[TxnInfo]:
    return [codec.txn_from_wire(wire) for wire in payload["txns"]]


TXN_LIST: Final = Operation(
    Op.TXN_LIST,
    "txn_list",
    Side.WRITE,  # listing expires transactions past their timeout first
    _txn_list,
    _of_txn_list,
    _txns_to_wire,
    _txns_from_wire,
    retry_safe=True,
)


def _txn_show(txn_id: int, records_max: int | None = None) -> Payload:
    return {"txn_id": txn_id, "records_max": records_max}


def _of_txn_show(payload: Payload) -> Payload:
    return {
        "txn_id": txn_id_from_wire(payload),
        "records_max": non_negative(payload, "records_max", optional=True),
    }


TXN_SHOW: Final = Operation(
    Op.TXN_SHOW,
    "txn_show",
    Side.WRITE,  # showing expires the transaction first if it is past its timeout
    _txn_show,
    _of_txn_show,
    codec.detail_to_wire,
    codec.detail_from_wire,
    retry_safe=True,
)


def _txn_commit_offsets(
    txn_id: int,
    group: str,
    topic: str,
    offsets: Mapping[int, int],
    producer_state: bytes | None = None,
) -> Payload:
    return {"txn_id": txn_id, **_commit_offsets(group, topic, offsets, producer_state)}


def _of_txn_commit_offsets(payload: Payload) -> Payload:
    return {"txn_id": txn_id_from_wire(payload), **_of_commit_offsets(payload)}


TXN_COMMIT_OFFSETS: Final = Operation(
    Op.TXN_COMMIT_OFFSETS,
    "txn_commit_offsets",
    Side.WRITE,
    _txn_commit_offsets,
    _of_txn_commit_offsets,
    _empty,
    _ignore,
    retry_safe=True,
)


def _txn_keepalive(txn_id: int, group: str | None, timeout_ms: int) -> Payload:
    return {"txn_id": txn_id, "group": group, "timeout_ms": timeout_ms}


def _of_txn_keepalive(payload: Payload) -> Payload:
    return {
        "txn_id": txn_id_from_wire(payload),
        "group": field(payload, "group", str, optional=True),
        "timeout_ms": non_negative(payload, "timeout_ms"),
    }


TXN_KEEPALIVE: Final = Operation(
    Op.TXN_KEEPALIVE,
    "txn_keepalive",
    Side.WRITE,
    _txn_keepalive,
    _of_txn_keepalive,
    codec.txn_to_wire,
    codec.txn_from_wire,
    retry_safe=True,  # moving the deadline again is harmless
)


def _txn_begin_produce(
    group: str,
    topic: str,
    records: Sequence[NewRecord],
    timeout_ms: int | None = None,
    fences: Sequence[Fence] = (),
) -> Payload:
    return {
        "group": group,
        "topic": topic,
        "records": codec.new_records_to_wire(records),
        "timeout_ms": timeout_ms,
        "fences": codec.fences_to_wire(fences),
        "result_columns": True,  # results as columns (codec.results_reply)
    }


def _of_txn_begin_produce(payload: Payload) -> Payload:
    return {
        "group": field(payload, "group", str),
        "topic": field(payload, "topic", str),
        "records": codec.records_from_args(payload),
        "timeout_ms": field(payload, "timeout_ms", int, optional=True),
        "fences": codec.fences_from_wire(payload.get("fences")),
    }


def _begun_to_wire(begun: tuple[TxnInfo, Sequence[AppendResult]], columns: bool = False) -> Payload:
    """TXN_BEGIN_PRODUCE's reply; columns: its results as PRODUCE sends them to a
    client that asks (result_columns)."""
    info, results = begun
    topic = results[0].topic if results else ""
    return {
        "txn": codec.txn_to_wire(info),
        "topic": topic,
        **codec.results_reply(results, columns),
    }


def _begun_with_columns(begun: tuple[TxnInfo, Sequence[AppendResult]]) -> Payload:
    return _begun_to_wire(begun, columns=True)


def _begun_from_wire(payload: Payload) -> tuple[TxnInfo, Sequence[AppendResult]]:
    topic = payload["topic"]
    return codec.txn_from_wire(payload["txn"]), codec.results_from_reply(topic, payload)


# A transaction begun by its first produce: one request (and one write) fewer than
# TXN_BEGIN then PRODUCE. Not retry-safe: a repeat would begin a second transaction.
TXN_BEGIN_PRODUCE: Final = Operation(
    Op.TXN_BEGIN_PRODUCE,
    "txn_begin_produce",
    Side.WRITE,
    _txn_begin_produce,
    _of_txn_begin_produce,
    _begun_to_wire,
    _begun_from_wire,
    reply_columns=_begun_with_columns,
)

OPERATIONS: Final[tuple[Operation[Any, Any], ...]] = (
    CREATE_TOPIC,
    ALTER_TOPIC,
    CLEAN_TOPIC,
    DELETE_TOPIC,
    LIST_TOPICS,
    DESCRIBE_TOPIC,
    STATUS,
    READ_COMPACTED,
    LEASE_PID,
    PRODUCERS,
    PRODUCER_SNAPSHOT,
    PRODUCER_SNAPSHOTS,
    COMMIT_OFFSETS,
    COMMITTED_OFFSETS,
    CONSUMER_GROUPS,
    OFFSET_FOR_TIME,
    SESSIONS,
    TOPIC_ACCESS,
    TXN_BEGIN,
    TXN_JOIN,
    TXN_COMMIT,
    TXN_ABORT,
    TXN_LIST,
    TXN_SHOW,
    TXN_COMMIT_OFFSETS,
    TXN_KEEPALIVE,
    TXN_BEGIN_PRODUCE,
)
BY_OP: Final[dict[Op, Operation[Any, Any]]] = {entry.op: entry for entry in OPERATIONS}
