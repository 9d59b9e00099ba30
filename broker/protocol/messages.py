"""The messages that travel between a client and `fencelog serve`.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack: an array
[kind, request_id, op, payload]. `kind` says what the frame is (a request, its reply, an
error reply, or a push the server sends unasked); `op` names the operation (0 on replies
and pushes); `payload` is a map with string keys. Ops and kinds are closed, numbered
sets: a number is never reused.

Replies come back in the order of their requests on one connection, and carry the
request's id so that a client can check it.

FETCH with `pages: true` is answered {"pages": [chunk, ...]}, a chunk per partition
read: {"page": [10 fields of broker/storage/pages.py Page]} or, where SQLite could not
page it, {"rows": [...]}. Without it (a client before pages) it is answered {"rows":
[...]}, a stored row per record. With `runs: true` a page's number columns may also
come as runs ([records, first, step] arrays, broker/rows.py Runs); without it (a client
before runs) they come as a number or text only.

PRODUCE carries its records as {"records": [[value, key, headers, partition,
timestamp], ...]} or, to a server that announces produce_columns and for a batch with
no headers or timestamps, {"columns": [values, keys or nil, partitions or nil]}.
PRODUCE (and TXN_BEGIN_PRODUCE beside its "txn") is answered {"results": [[partition,
offset, duplicate], ...]}, a row per record, or, with `result_columns: true`,
{"result_columns": [count, partitions, offsets, duplicates]}, each column an array or
one value for every record.
"""

from __future__ import annotations

import enum
from typing import Any, Final

from msgspec import Struct, field

PROTOCOL_VERSION: Final = 2  # 2: fetch replies carry rows without the topic


# HELLO's "features": what a server answers beyond its protocol version
ARROW_FEATURE: Final = "fetch_arrow"  # FETCH_ARROW (the server has pyarrow)
COLUMNS_FEATURE: Final = "produce_columns"  # PRODUCE's records as columns
CHECKSUM_FEATURE: Final = "frame_crc"  # frames carry a CRC-32 of their body (frames.py)
KAFKA_GROUPS_FEATURE: Final = "kafka_groups"  # KAFKA_GROUPS
NULL_VALUES_FEATURE: Final = "null_values"  # PRODUCE takes null values (FETCH: its "nulls")


class Kind(enum.IntEnum):
    REQUEST = 0
    REPLY = 1
    ERROR = 2
    PUSH = 3


class Op(enum.IntEnum):
    NONE = 0
    HELLO = 1
    HEARTBEAT = 2
    GOODBYE = 3
    CREATE_TOPIC = 10
    DELETE_TOPIC = 11
    LIST_TOPICS = 12
    DESCRIBE_TOPIC = 13
    STATUS = 14
    ALTER_TOPIC = 15
    CLEAN_TOPIC = 16
    PRODUCE = 20
    FETCH = 21
    FETCH_ARROW = 22  # one partition's page as an Arrow IPC stream (feature fetch_arrow)
    OWN = 30
    RELEASE = 31
    OWNERSHIP = 32
    OWN_HISTORY = 33
    SESSIONS = 34
    LEASE_PID = 40
    PRODUCERS = 41
    PRODUCER_SNAPSHOT = 42
    PRODUCER_SNAPSHOTS = 43
    COMMIT_OFFSETS = 44
    COMMITTED_OFFSETS = 45
    BACKUP = 46
    CONSUMER_GROUPS = 47
    OFFSET_FOR_TIME = 48
    KAFKA_GROUPS = 49  # the Kafka listener's live groups and members (feature kafka_groups)
    ATTACH = 50
    DETACH = 51
    TOPIC_ACCESS = 52
    READ_COMPACTED = 53
    TXN_BEGIN = 60
    TXN_JOIN = 61
    TXN_COMMIT = 62
    TXN_ABORT = 63
    TXN_LIST = 64
    TXN_SHOW = 65
    TXN_COMMIT_OFFSETS = 66
    TXN_KEEPALIVE = 67
    TXN_BEGIN_PRODUCE = 68


class Request(Struct, frozen=True):
    request_id: int
    op: Op
    args: dict[str, Any] = field(default_factory=dict)


class Reply(Struct, frozen=True):
    request_id: int
    result: dict[str, Any] = field(default_factory=dict)


class ErrorReply(Struct, frozen=True):
    """A failed request (request_id > 0) or a connection-level error (request_id 0)."""

    request_id: int
    code: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)


class Push(Struct, frozen=True):
    """Something the server tells a client unasked, e.g. that its session was severed."""

    event: str
    data: dict[str, Any] = field(default_factory=dict)


Message = Request | Reply | ErrorReply | Push
