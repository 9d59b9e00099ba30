"""A Kafka request that breaks its API's message spec is refused before any handler
runs (broker/kafka/schema.py, issue 39): a null where the spec allows none, at any depth,
or a length that runs past the end of the request.

- the codec: every API and version the listener advertises (wire.APIS: an API added
  there is covered here too), every field that may not be null, top level or inside
  an array of structs, set to null: refused, naming the field;
- the listener: each request of issue 39 that reached its handler and ended in an
  internal error (a Python traceback at ERROR) is refused as other bad input is: the
  connection closed unanswered, one WARNING naming the field, no ERROR, and the broker
  answers the next request.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    ListOffsetsRequest,
    OffsetFetchRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest, TxnOffsetCommitRequest

from broker.kafka import wire
from support.kafka_raw import RawKafka
from support.servers import ServeProcess
from support.waiting import wait_until

STEP_S: Final = 20.0
GOLDEN_DIR: Final = Path(__file__).parent / "golden"


# the codec: every advertised API and version ---------------------------------------------


def sample(struct: Any, version: int) -> Any:
    """A request body of struct's class at version: every field its default, every
    array of structs holding one such element (so nested fields are there to null)."""
    values = {}
    for field in struct.untagged_fields(version):
        if field.is_struct_array():
            values[field.name] = [sample(field.array_of, version)]
        elif field.is_struct():
            values[field.name] = sample(field, version)
        elif field.is_array():
            values[field.name] = [field.array_of.default]
        else:
            values[field.name] = field.default
    return struct.data_class(version=version, **values)


Path_ = tuple[str | int, ...]  # attribute names and list indexes, from the body down


def non_nullable(struct: Any, version: int, prefix: Path_ = ()) -> Iterator[Path_]:
    """The paths of the string, bytes and array fields the spec does not let be null."""
    for field in struct.untagged_fields(version):
        path = (*prefix, field.name)
        nullable = field.nullable_for_version_q(version)
        if not nullable and (field.is_array() or field.type_str in ("string", "bytes", "records")):
            yield path
        if field.is_struct_array():
            yield from non_nullable(field.array_of, version, (*path, 0))
        elif field.is_struct():
            yield from non_nullable(field, version, path)


def at(body: Any, path: Path_) -> Any:
    for step in path:
        body = body[step] if isinstance(step, int) else getattr(body, step)
    return body


def nulled(body: Any, path: Path_) -> Any:
    parent = at(body, path[:-1])
    setattr(parent, str(path[-1]), None)
    return body


def frame_of(api: wire.Api, version: int, body: bytes) -> bytes:
    """A request frame without its length word (as wire.read_request takes it)."""
    head = struct.pack(">hhih", api.key, version, 7, 4) + b"test"
    if api.flexible(version):
        head += b"\x00"  # the request header's tagged fields
    return head + body


def body_with_null(api: wire.Api, version: int, path: Path_) -> bytes:
    """A sample request body with the field at path null."""
    if (api.key, version, path) == (MetadataRequest.API_KEY, 0, ("topics",)):
        return struct.pack(">i", -1)  # kafka-python writes v0's null topics as empty
    return bytes(nulled(sample(api.request._struct, version), path).encode(version=version))


def shown(path: Path_) -> str:
    """A path as the refusal names it: topics[0].partitions."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text.lstrip(".")


NULL_CASES: Final = [
    (api.key, version, path)
    for api in wire.APIS.values()
    for version in range(api.min_version, api.max_version + 1)
    for path in non_nullable(api.request._struct, version)
]


def test_the_cases_reach_every_version_of_the_apis_of_issue_39() -> None:
    versions = {(key, version) for key, version, _ in NULL_CASES}
    for request in (ProduceRequest, FetchRequest, ListOffsetsRequest, OffsetFetchRequest):
        api = wire.APIS[request.API_KEY]
        assert {(api.key, v) for v in range(api.min_version, api.max_version + 1)} <= versions
    assert (FindCoordinatorRequest.API_KEY, 4) in versions
    assert (TxnOffsetCommitRequest.API_KEY, 3) in versions


@pytest.mark.parametrize(
    ("api_key", "version", "path"),
    NULL_CASES,
    ids=[f"{wire.APIS[k].name}-v{v}-{shown(p)}" for k, v, p in NULL_CASES],
)
def test_a_null_where_the_spec_allows_none_is_refused(
    api_key: int, version: int, path: Path_
) -> None:
    api = wire.APIS[api_key]
    sound = bytes(sample(api.request._struct, version).encode(version=version))
    assert wire.read_request(frame_of(api, version, sound)).body is not None
    body = body_with_null(api, version, path)
    assert at(api.request.decode(body, version=version), path) is None  # a client decoder's view
    with pytest.raises(wire.MalformedRequest) as refused:
        wire.read_request(frame_of(api, version, body))
    assert f"{api.name} v{version} request breaks its spec: {shown(path)} is null" in str(
        refused.value
    )


def test_a_string_that_runs_past_the_end_of_the_request_is_refused() -> None:
    api = wire.APIS[MetadataRequest.API_KEY]
    body = struct.pack(">ih", 1, 10) + b"abc"  # one topic, named in 10 bytes; 3 are there
    assert api.request.decode(body, version=1).topics[0].name == "abc"  # a client's decoder
    with pytest.raises(wire.MalformedRequest) as refused:
        wire.read_request(frame_of(api, 1, body))
    assert "Metadata v1 request breaks its spec: a length in the request runs 7 bytes" in str(
        refused.value
    )


def test_bytes_after_the_last_field_are_not_refused() -> None:
    api = wire.APIS[MetadataRequest.API_KEY]
    body = struct.pack(">ih", 1, 3) + b"abc" + b"\x00\x00"
    assert [t.name for t in wire.read_request(frame_of(api, 1, body)).body.topics] == ["abc"]


SESSIONS: dict[str, dict[str, str]] = json.loads((GOLDEN_DIR / "sessions.json").read_text())


@pytest.mark.parametrize("client", sorted(SESSIONS))
def test_every_request_real_clients_sent_meets_its_spec(client: str) -> None:
    for name, frame in SESSIONS[client].items():
        request = wire.read_request(bytes.fromhex(frame))
        api, version = wire.APIS[request.header.api_key], request.header.api_version
        if api.min_version <= version <= api.max_version:  # else: UNSUPPORTED_VERSION
            assert request.body is not None, name


# the listener: the requests of issue 39 ------------------------------------------------------


def txn_offset_commit(partitions: list[Any] | None) -> Any:
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
        version=3, name="t", partitions=partitions
    )
    return TxnOffsetCommitRequest(
        version=3,
        transactional_id="txn",
        group_id="g",
        producer_id=1,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        topics=[topic],
    )


# (request, version, the field named null): each reached its handler and failed there
ISSUE_39: Final = {
    "find-coordinator-v4": (
        FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=None),
        4,
        "coordinator_keys",
    ),
    "list-offsets-v6": (ListOffsetsRequest(version=6, replica_id=-1, topics=None), 6, "topics"),
    "fetch-v12": (FetchRequest(version=12, max_wait_ms=0, topics=None), 12, "topics"),
    "txn-offset-commit-v3-topics": (
        TxnOffsetCommitRequest(
            version=3, transactional_id="txn", group_id="g", producer_id=1, topics=None
        ),
        3,
        "topics",
    ),
    "txn-offset-commit-v3-partitions": (txn_offset_commit(None), 3, "topics[0].partitions"),
    "produce-acks-0": (
        ProduceRequest(version=9, acks=0, timeout_ms=1000, topic_data=None),
        9,
        "topic_data",
    ),
    "offset-fetch-v7": (
        OffsetFetchRequest(version=7, group_id=None, topics=None, require_stable=False),
        7,
        "group_id",
    ),
}


@pytest.mark.parametrize("case", list(ISSUE_39))
def test_a_request_with_a_null_the_spec_allows_not_is_refused_before_its_handler(
    kafka_server: ServeProcess, case: str
) -> None:
    request, version, field = ISSUE_39[case]
    name = type(request).__name__.removesuffix("Request")
    refused = RawKafka(kafka_server.kafka, client_id="issue-39")
    try:
        refused.send(request, version)
        assert refused.closed_unanswered()
    finally:
        refused.close()
    said = f"{name} v{version} request breaks its spec: {field} is null"
    wait_until(
        lambda: said in kafka_server.stderr_text(),
        STEP_S,
        message=lambda: f"a warning saying {said!r}; stderr: {kafka_server.stderr_text()}",
    )
    log = kafka_server.stderr_text()
    warnings = [line for line in log.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and said in warnings[0], log
    assert " ERROR " not in log and "Traceback" not in log, log
    answering = RawKafka(kafka_server.kafka)
    try:
        versions = answering.call(ApiVersionsRequest(version=3), 3)
        assert versions.error_code == 0
    finally:
        answering.close()
