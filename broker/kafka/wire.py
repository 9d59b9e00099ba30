"""Kafka's wire format, as a thin layer over kafka-python's protocol classes.

kafka-python (3.x) builds a class per API from Kafka's own JSON message specs, with
every version's fields, flexible versions and tagged fields; this module only adds what
a broker needs and a client does not: reading a request's header before its body is
known to be decodable, the table of the APIs and versions fencelog answers (ApiVersions
advertises exactly this table), holding each request body to its API's spec as a
broker must (schema.py: every API of the table, every version), and framing the
answers.

A request frame is INT32 length, then the request header (v1: api_key, api_version,
correlation_id, client_id; v2, for flexible versions, adds tagged fields), then the
body. An answer is INT32 length, the response header (v0: correlation_id; v1 adds tagged
fields; ApiVersions always answers with v0), then the body.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from kafka.protocol import admin, consumer, metadata, producer, sasl
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32  # a compact length: n + 1
from msgspec import Struct

from broker.kafka import schema, specs


# KIP-848's APIs, which kafka-python 3.0 does not ship: built the same way, from specs
# fencelog keeps (broker/kafka/specs/)
class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=specs):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=specs):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=specs):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=specs):  # type: ignore[misc,call-arg]
    pass


class Api(Struct, frozen=True):
    """One Kafka API fencelog answers: its classes and the versions it implements."""

    key: int
    name: str
    request: Any
    response: Any
    min_version: int
    max_version: int

    def flexible(self, version: int) -> bool:
        return bool(self.request.flexible_version_q(version))


def _api(request: Any, response: Any, low: int, high: int) -> Api:
    return Api(request.API_KEY, request.name.removesuffix("Request"), request, response, low, high)


# The versions: from the oldest each client still sends to the newest whose meaning
# fencelog implements in full (the next one adds what it does not: topic ids in Produce
# v13 and Fetch v13, Metadata v13's top-level error...). KIP-848's consumer protocol:
# ConsumerGroupHeartbeat v0-1 (librdkafka sends v1 only), with topic ids in Metadata
# v10-12 and member epochs in OffsetCommit v9 and OffsetFetch v9 (v8: batched groups).
APIS: Final = {
    api.key: api
    for api in (
        _api(producer.ProduceRequest, producer.ProduceResponse, 3, 9),
        _api(consumer.FetchRequest, consumer.FetchResponse, 4, 12),
        _api(consumer.ListOffsetsRequest, consumer.ListOffsetsResponse, 1, 11),
        _api(metadata.MetadataRequest, metadata.MetadataResponse, 0, 12),
        _api(consumer.OffsetCommitRequest, consumer.OffsetCommitResponse, 2, 9),
        _api(consumer.OffsetFetchRequest, consumer.OffsetFetchResponse, 1, 9),
        _api(metadata.FindCoordinatorRequest, metadata.FindCoordinatorResponse, 0, 4),
        _api(consumer.JoinGroupRequest, consumer.JoinGroupResponse, 0, 7),
        _api(consumer.HeartbeatRequest, consumer.HeartbeatResponse, 0, 4),
        _api(consumer.LeaveGroupRequest, consumer.LeaveGroupResponse, 0, 4),
        _api(consumer.SyncGroupRequest, consumer.SyncGroupResponse, 0, 5),
        _api(sasl.SaslHandshakeRequest, sasl.SaslHandshakeResponse, 1, 1),
        _api(metadata.ApiVersionsRequest, metadata.ApiVersionsResponse, 0, 3),
        _api(admin.CreateTopicsRequest, admin.CreateTopicsResponse, 2, 6),
        _api(producer.InitProducerIdRequest, producer.InitProducerIdResponse, 0, 4),
        _api(producer.AddPartitionsToTxnRequest, producer.AddPartitionsToTxnResponse, 0, 3),
        _api(producer.AddOffsetsToTxnRequest, producer.AddOffsetsToTxnResponse, 0, 3),
        _api(producer.EndTxnRequest, producer.EndTxnResponse, 0, 3),
        _api(producer.TxnOffsetCommitRequest, producer.TxnOffsetCommitResponse, 0, 3),
        _api(sasl.SaslAuthenticateRequest, sasl.SaslAuthenticateResponse, 0, 2),
        # the admin APIs (broker/kafka/topics_admin.py, configs.py, groups_admin.py,
        # txn_admin.py, cluster.py)
        _api(admin.DeleteTopicsRequest, admin.DeleteTopicsResponse, 0, 6),
        _api(admin.CreatePartitionsRequest, admin.CreatePartitionsResponse, 0, 3),
        _api(admin.DeleteRecordsRequest, admin.DeleteRecordsResponse, 0, 2),
        _api(admin.DescribeConfigsRequest, admin.DescribeConfigsResponse, 0, 4),
        _api(admin.AlterConfigsRequest, admin.AlterConfigsResponse, 0, 2),
        _api(admin.IncrementalAlterConfigsRequest, admin.IncrementalAlterConfigsResponse, 0, 1),
        _api(admin.ListGroupsRequest, admin.ListGroupsResponse, 0, 5),
        _api(admin.DescribeGroupsRequest, admin.DescribeGroupsResponse, 0, 6),
        _api(admin.DeleteGroupsRequest, admin.DeleteGroupsResponse, 0, 2),
        _api(consumer.OffsetDeleteRequest, consumer.OffsetDeleteResponse, 0, 0),
        _api(admin.DescribeClusterRequest, admin.DescribeClusterResponse, 0, 2),
        _api(admin.DescribeLogDirsRequest, admin.DescribeLogDirsResponse, 1, 5),
        _api(admin.ListTransactionsRequest, admin.ListTransactionsResponse, 0, 2),
        _api(admin.DescribeTransactionsRequest, admin.DescribeTransactionsResponse, 0, 0),
        _api(admin.DescribeProducersRequest, admin.DescribeProducersResponse, 0, 0),
        _api(admin.DescribeAclsRequest, admin.DescribeAclsResponse, 0, 3),
        _api(admin.CreateAclsRequest, admin.CreateAclsResponse, 0, 3),
        _api(admin.DeleteAclsRequest, admin.DeleteAclsResponse, 0, 3),
        _api(
            admin.DescribeUserScramCredentialsRequest,
            admin.DescribeUserScramCredentialsResponse,
            0,
            0,
        ),
        _api(admin.AlterUserScramCredentialsRequest, admin.AlterUserScramCredentialsResponse, 0, 0),
        # KIP-848 (broker/kafka/groups_consumer.py)
        _api(ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, 0, 1),
        _api(ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, 0, 0),
    )
}
API_VERSIONS_KEY: Final = metadata.ApiVersionsRequest.API_KEY
FETCH_KEY: Final = consumer.FetchRequest.API_KEY
_HEADER: Final = struct.Struct(">hhi")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")


class MalformedRequest(Exception):
    """A request that cannot be read, or breaks its API's spec (schema.py): its
    connection is closed after the answer, if any."""


class Header(Struct, frozen=True):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class Request(Struct, frozen=True):
    header: Header
    api: Api | None  # None: an API fencelog does not answer
    body: Any  # the decoded request; None when the api or its version is not answered


def read_request(frame: bytes | memoryview) -> Request:
    """A request frame (without its length prefix) as its header and, when fencelog
    answers that API at that version, its decoded body, held to the API's spec.
    MalformedRequest when the bytes are not a Kafka request or break that spec."""
    data = memoryview(frame)
    if len(data) < _HEADER.size + 2:
        raise MalformedRequest(f"a request of {len(data)} bytes is shorter than its header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(data)
    (client_len,) = _INT16.unpack_from(data, _HEADER.size)
    pos = _HEADER.size + 2
    client_id: str | None = None
    if client_len >= 0:
        if pos + client_len > len(data):
            raise MalformedRequest("the client id runs past the end of the request")
        client_id = bytes(data[pos : pos + client_len]).decode("utf-8", "replace")
        pos += client_len
    header = Header(api_key, api_version, correlation_id, client_id)
    api = APIS.get(api_key)
    if api is None or not api.min_version <= api_version <= api.max_version:
        return Request(header, api, None)
    if api.flexible(api_version):
        pos = _skip_tagged_fields(data, pos)
    try:
        body = schema.decode(api.request, api_version, data[pos:])
    except schema.SchemaViolation as exc:
        raise MalformedRequest(f"{api.name} v{api_version} request breaks its spec: {exc}") from exc
    except Exception as exc:  # kafka-python raises what struct and its codecs raise
        raise MalformedRequest(
            f"{api.name} v{api_version} request cannot be decoded: {exc}"
        ) from exc
    return Request(header, api, body)


def _skip_tagged_fields(data: memoryview, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)  # tag
        size, pos = _uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise MalformedRequest("a tagged field runs past the end of the request header")
    return pos


def _uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 28:
            raise MalformedRequest("a malformed varint in the request header")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def encode_response(header: Header, api: Api, body: Any) -> bytes:
    """The framed answer to a request, at the request's version."""
    version = header.api_version
    flexible_header = api.flexible(version) and api.key != API_VERSIONS_KEY
    payload = bytes(body.encode(version=version))
    head = _INT32.pack(header.correlation_id) + (b"\x00" if flexible_header else b"")
    return _INT32.pack(len(head) + len(payload)) + head + payload


def encode_fetch_response(header: Header, api: Api, body: Any) -> list[bytes]:
    """encode_response() of a Fetch answer as parts to write one after another, each
    partition's record batch a part of its own: a fetch answer is megabytes of batches,
    and encoding them into the answer copied each three times (the codec's buffer, its
    result, the framing), a tenth of a kcat read's server time.

    Each non-empty records field is encoded as a placeholder (_RECORDS_MARK and its
    index), which the batch and its own length prefix replace. The mark begins with
    0xFE, a byte UTF-8 never uses, so it cannot begin inside a topic name; the rest of
    the answer is numbers, which would have to spell all 16 bytes of the mark."""
    batches: list[bytes] = []
    for topic in body.responses:
        for part in topic.partitions:
            if part.records:
                batches.append(part.records)
                part.records = _records_mark(len(batches) - 1)
    framed = encode_response(header, api, body)
    if not batches:
        return [framed]
    compact = api.flexible(header.api_version)
    parts: list[bytes] = []
    at = 0
    for index, batch in enumerate(batches):
        mark = _records_mark(index)
        found = framed.index(mark, at)
        parts.append(framed[at : found - (1 if compact else _INT32.size)])
        parts.append(
            UnsignedVarInt32.encode(len(batch) + 1) if compact else _INT32.pack(len(batch))
        )
        parts.append(batch)
        at = found + len(mark)
    parts.append(framed[at:])
    parts[0] = _INT32.pack(sum(map(len, parts)) - _INT32.size) + parts[0][_INT32.size :]
    return parts


def _records_mark(index: int) -> bytes:
    return _RECORDS_MARK + _INT32.pack(index)


_RECORDS_MARK: Final = b"\xfe\x00\xfdfencelog\x00\xfc"  # 12 bytes; with the index, 16


def api_versions_body(version: int, error_code: int = 0) -> Any:
    """ApiVersions' answer: every API and version range of APIS."""
    response = metadata.ApiVersionsResponse
    keys = [
        response.ApiVersion(
            api_key=api.key, min_version=api.min_version, max_version=api.max_version
        )
        for api in sorted(APIS.values(), key=lambda api: api.key)
    ]
    return response(version=version, error_code=error_code, api_keys=keys, throttle_time_ms=0)


def unsupported_version_answer(header: Header) -> bytes:
    """Kafka's answer to an ApiVersions request of a version fencelog does not know:
    UNSUPPORTED_VERSION with the supported versions, in v0, which every client reads."""
    body = api_versions_body(0, UNSUPPORTED_VERSION)
    payload = bytes(body.encode(version=0))
    head = _INT32.pack(header.correlation_id)
    return _INT32.pack(len(head) + len(payload)) + head + payload


def error_answer(header: Header, api: Api, error_code: int) -> bytes | None:
    """An answer to a request carrying error_code wherever the response has an error
    field at its top level, or None when the response cannot say it (then the
    connection is closed, which is what Kafka does)."""
    version = header.api_version
    if not 0 <= version <= api.response.max_version:
        return None
    fields = {f["name"] for f in api.response.json["fields"] if _in(f["versions"], version)}
    if "ErrorCode" not in fields:
        return None
    body = api.response(version=version, error_code=error_code)
    return encode_response(header, api, body)


def _in(versions: str, version: int) -> bool:
    """Whether a message spec's versions ("3+", "0-7", "5", "none") include version."""
    if versions.endswith("+"):
        return version >= int(versions[:-1])
    low, _, high = versions.partition("-")
    if not low.isdigit():
        return False
    return int(low) <= version <= int(high or low)


def unknown_api_message(header: Header) -> str:
    api = APIS.get(header.api_key)
    if api is None:
        return f"Kafka API key {header.api_key} is not answered by fencelog"
    return (
        f"{api.name} v{header.api_version} is not answered by fencelog "
        f"(versions {api.min_version} to {api.max_version} are)"
    )


# Kafka's error codes that fencelog answers (org.apache.kafka.common.protocol.Errors).
NONE: Final = 0
OFFSET_OUT_OF_RANGE: Final = 1
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
INVALID_FETCH_SIZE: Final = 4
NOT_LEADER_OR_FOLLOWER: Final = 6
REQUEST_TIMED_OUT: Final = 7
MESSAGE_TOO_LARGE: Final = 10
OFFSET_METADATA_TOO_LARGE: Final = 12
COORDINATOR_NOT_AVAILABLE: Final = 15
NOT_COORDINATOR: Final = 16
INVALID_TOPIC_EXCEPTION: Final = 17
RECORD_LIST_TOO_LARGE: Final = 18
ILLEGAL_GENERATION: Final = 22
INCONSISTENT_GROUP_PROTOCOL: Final = 23
INVALID_GROUP_ID: Final = 24
UNKNOWN_MEMBER_ID: Final = 25
INVALID_SESSION_TIMEOUT: Final = 26
REBALANCE_IN_PROGRESS: Final = 27
TOPIC_AUTHORIZATION_FAILED: Final = 29
CLUSTER_AUTHORIZATION_FAILED: Final = 31
INVALID_TIMESTAMP: Final = 32
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
UNSUPPORTED_VERSION: Final = 35
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_CONFIG: Final = 40
INVALID_REPLICATION_FACTOR: Final = 38
INVALID_REPLICA_ASSIGNMENT: Final = 39
INVALID_REQUEST: Final = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
DUPLICATE_SEQUENCE_NUMBER: Final = 46
INVALID_PRODUCER_EPOCH: Final = 47
INVALID_TXN_STATE: Final = 48
INVALID_PRODUCER_ID_MAPPING: Final = 49
INVALID_TRANSACTION_TIMEOUT: Final = 50
CONCURRENT_TRANSACTIONS: Final = 51
SASL_AUTHENTICATION_FAILED: Final = 58
UNKNOWN_PRODUCER_ID: Final = 59
KAFKA_STORAGE_ERROR: Final = 56
GROUP_ID_NOT_FOUND: Final = 69
UNKNOWN_TOPIC_ID: Final = 100
FENCED_INSTANCE_ID: Final = 82
UNKNOWN_SERVER_ERROR: Final = -1
INVALID_RECORD: Final = 87
UNSTABLE_OFFSET_COMMIT: Final = 88
PRODUCER_FENCED: Final = 90
