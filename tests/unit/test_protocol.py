"""broker/protocol: frames and payloads, sans-I/O. Bytes go in one at a time, in chunks of
any size, cut off, oversized or random; what comes out is the messages that went in,
NEED_DATA, CLOSED, or ProtocolError, and never any other exception."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import BrokerError, ErrorCode
from broker.protocol import codec
from broker.protocol.frames import (
    CLOSED,
    HEADER_BYTES,
    NEED_DATA,
    DamagedFrame,
    FrameConnection,
    ProtocolError,
    Sentinel,
    decode_body,
    encode,
)
from broker.protocol.messages import ErrorReply, Kind, Message, Op, Push, Reply, Request
from broker.rows import encode_headers
from broker.types import (
    AppendResult,
    JournalEntryInfo,
    NewRecord,
    ProducerFields,
    Record,
    TxnDetail,
    TxnInfo,
)

FRAME_BYTES_MAX = 64 * 1024

EXAMPLES: list[Message] = [
    Request(1, Op.HELLO, {"client": "test", "token": None}),
    Request(2, Op.PRODUCE, {"topic": "orders", "records": ((b"v", b"k", (), None, None),)}),
    Request(3, Op.FETCH, {"topic": "t", "positions": ((0, 5),), "max_records": 1, "wait_ms": 0}),
    Reply(2, {"results": ((0, 7, False),)}),
    Reply(4, {}),
    ErrorReply(5, int(ErrorCode.UNKNOWN_TOPIC), "topic t does not exist", {"topic": "t"}),
    ErrorReply(0, int(ErrorCode.PROTOCOL_ERROR), "bad frame", {}),
    Push("session_closed", {"reason": "missed heartbeats"}),
    Request(2**64 - 1, Op.STATUS, {"binary": b"\x00\xff" * 100, "nested": {"a": (1, -1.5)}}),
]


def drain(frames: FrameConnection) -> tuple[list[Message], Sentinel]:
    """Every message available now, and the sentinel that ended the run."""
    messages: list[Message] = []
    while not isinstance(message := frames.next_message(), Sentinel):
        messages.append(message)
    return messages, message


def body_frame(body: object) -> bytes:
    """A frame whose body is `body` packed as msgpack, whatever its shape."""
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(packed)) + packed


def raises_protocol_error(work: Callable[[], object]) -> ProtocolError:
    with pytest.raises(ProtocolError) as excinfo:
        work()
    assert excinfo.value.code is ErrorCode.PROTOCOL_ERROR
    return excinfo.value


# well-formed streams ----------------------------------------------------------------------


def test_messages_fed_one_byte_at_a_time_come_out_whole_and_in_order() -> None:
    stream = b"".join(encode(message) for message in EXAMPLES)
    frames = FrameConnection(FRAME_BYTES_MAX)
    received: list[Message] = []
    for index in range(len(stream)):
        frames.receive_data(stream[index : index + 1])
        messages, sentinel = drain(frames)
        assert sentinel is NEED_DATA
        received += messages
    assert received == EXAMPLES
    assert frames.buffered_bytes == 0
    frames.receive_data(b"")
    assert drain(frames) == ([], CLOSED)


def test_a_message_appears_only_when_its_last_byte_is_in() -> None:
    frame = encode(EXAMPLES[1])
    frames = FrameConnection(FRAME_BYTES_MAX)
    for byte in frame[:-1]:
        frames.receive_data(bytes([byte]))
        assert frames.next_message() is NEED_DATA
    frames.receive_data(frame[-1:])
    assert frames.next_message() == EXAMPLES[1]
    assert frames.next_message() is NEED_DATA


def test_many_messages_in_one_chunk_all_come_out() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(b"".join(encode(message) for message in EXAMPLES * 50))
    assert drain(frames) == (EXAMPLES * 50, NEED_DATA)


def test_decoded_request_op_is_the_op_enum() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(encode(Request(9, Op.DESCRIBE_TOPIC, {"name": "x"})))
    message = frames.next_message()
    assert isinstance(message, Request)
    assert message.op is Op.DESCRIBE_TOPIC


def test_a_client_and_a_server_side_wired_back_to_back_hold_a_conversation() -> None:
    client, server = FrameConnection(FRAME_BYTES_MAX), FrameConnection(FRAME_BYTES_MAX)
    requests = [
        Request(1, Op.HELLO, {"client": "test"}),
        Request(2, Op.CREATE_TOPIC, {"name": "t", "partitions": 1}),
        Request(3, Op.DESCRIBE_TOPIC, {"name": "missing"}),
    ]
    wire = b"".join(client.send(request) for request in requests)
    for start in range(0, len(wire), 3):  # the network delivers 3 bytes at a time
        server.receive_data(wire[start : start + 3])
    received, _ = drain(server)
    assert received == requests
    answers: list[Message] = [
        Reply(1, {"session_id": "s1"}),
        Reply(2, {"name": "t"}),
        ErrorReply(3, int(ErrorCode.UNKNOWN_TOPIC), "topic missing does not exist", {}),
        Push("session_closed", {"reason": "bye"}),
    ]
    back = b"".join(server.send(answer) for answer in answers)
    for start in range(0, len(back), 5):
        client.receive_data(back[start : start + 5])
    server.receive_data(b"")
    client.receive_data(b"")
    assert drain(client) == (answers, CLOSED)
    assert drain(server) == ([], CLOSED)


def test_send_is_encode() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    assert [frames.send(m) for m in EXAMPLES] == [encode(m) for m in EXAMPLES]


def test_a_frame_exactly_at_the_limit_is_accepted_and_one_byte_more_is_not() -> None:
    frame = encode(Reply(1, {"blob": b"x" * 1000}))
    body_bytes = len(frame) - HEADER_BYTES
    at_limit = FrameConnection(body_bytes)
    at_limit.receive_data(frame)
    assert at_limit.next_message() == Reply(1, {"blob": b"x" * 1000})
    under = FrameConnection(body_bytes - 1)
    under.receive_data(frame)
    error = raises_protocol_error(under.next_message)
    assert error.details["frame_bytes"] == body_bytes
    assert error.details["frame_bytes_max"] == body_bytes - 1


# truncated, oversized, malformed ----------------------------------------------------------


def test_every_truncation_followed_by_eof_is_a_protocol_error() -> None:
    frame = encode(EXAMPLES[2])
    for cut in range(1, len(frame)):
        frames = FrameConnection(FRAME_BYTES_MAX)
        frames.receive_data(frame[:cut])
        assert frames.next_message() is NEED_DATA
        frames.receive_data(b"")
        error = raises_protocol_error(frames.next_message)
        assert "closed mid-frame" in error.message


def test_eof_between_frames_is_a_clean_close() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(encode(EXAMPLES[0]) + encode(EXAMPLES[3]))
    frames.receive_data(b"")
    assert drain(frames) == ([EXAMPLES[0], EXAMPLES[3]], CLOSED)
    assert frames.next_message() is CLOSED


def test_data_after_eof_is_a_protocol_error() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(b"")
    raises_protocol_error(lambda: frames.receive_data(encode(EXAMPLES[0])))


def test_oversized_length_is_refused_from_the_header_alone() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(struct.pack(">I", 1 << 30))
    error = raises_protocol_error(frames.next_message)
    assert error.details == {"frame_bytes": 1 << 30, "frame_bytes_max": FRAME_BYTES_MAX}
    assert frames.buffered_bytes == HEADER_BYTES  # nothing grew for the claimed body


def test_oversized_length_is_refused_before_the_body_arrives_byte_by_byte() -> None:
    frames = FrameConnection(16)
    header = struct.pack(">I", 17)
    for byte in header[:-1]:
        frames.receive_data(bytes([byte]))
        assert frames.next_message() is NEED_DATA
    frames.receive_data(header[-1:])
    raises_protocol_error(frames.next_message)


def test_an_empty_frame_is_a_protocol_error() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(struct.pack(">I", 0))
    raises_protocol_error(frames.next_message)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("not msgpack", b"\xc1"),
        ("truncated msgpack", b"\x94\x00\x01"),
        ("extra data after the body", msgpack.packb((0, 1, 1, {})) + b"\x00"),
        ("a map, not an array", msgpack.packb({"kind": 0})),
        ("three fields", msgpack.packb((0, 1, 1))),
        ("five fields", msgpack.packb((0, 1, 1, {}, None))),
        ("negative request id", msgpack.packb((0, -1, 1, {}))),
        ("boolean request id", msgpack.packb((0, True, 1, {}))),
        ("text request id", msgpack.packb((0, "1", 1, {}))),
        ("payload not a map", msgpack.packb((0, 1, 1, (1, 2)))),
        ("integer map key", msgpack.packb((0, 1, 1, {1: 2}))),
        ("unknown kind", msgpack.packb((7, 1, 1, {}))),
        ("unknown op", msgpack.packb((0, 1, 99, {}))),
        ("text op", msgpack.packb((0, 1, "HELLO", {}))),
        ("request without an op", msgpack.packb((0, 1, 0, {}))),
        ("error frame without a code", msgpack.packb((2, 1, 0, {"message": "m", "details": {}}))),
        ("error frame, details not a map", msgpack.packb((2, 1, 0, {"code": 1, "message": "m"}))),
        ("push without an event", msgpack.packb((3, 0, 0, {"data": {}}))),
        ("push with data not a map", msgpack.packb((3, 0, 0, {"event": "e", "data": 1}))),
        ("deeply nested", b"\x91" * 100_000 + b"\xc0"),
    ],
)
def test_malformed_body_is_a_protocol_error(name: str, body: bytes) -> None:
    frames = FrameConnection(1 << 20)
    frames.receive_data(struct.pack(">I", len(body)) + body)
    raises_protocol_error(frames.next_message)
    raises_protocol_error(lambda: decode_body(body))


def test_a_malformed_frame_does_not_hide_the_frames_before_it() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(encode(EXAMPLES[0]) + body_frame((9, 1, 1, {})))
    assert frames.next_message() == EXAMPLES[0]
    raises_protocol_error(frames.next_message)


# frames with a CRC-32 -------------------------------------------------------------------


def test_checksummed_frames_round_trip_and_turn_the_receiver_to_them() -> None:
    sender, receiver = FrameConnection(FRAME_BYTES_MAX), FrameConnection(FRAME_BYTES_MAX)
    sender.checksummed = True
    receiver.receive_data(encode(EXAMPLES[0]) + b"".join(sender.send(m) for m in EXAMPLES))
    assert receiver.next_message() == EXAMPLES[0]  # a plain frame first: still read
    assert not receiver.checksummed
    assert [receiver.next_message() for _ in EXAMPLES] == EXAMPLES
    assert receiver.checksummed  # the peer sends them, so it reads them: answer in kind
    assert receiver.send(EXAMPLES[1])[:1] == b"\x80"


@pytest.mark.parametrize("flipped", [8, 9, -1], ids=["first body byte", "second", "last"])
def test_a_checksummed_frame_damaged_in_transit_is_refused_undecoded(flipped: int) -> None:
    """A bit flipped on the way used to be decoded and stored as if sent (no check of
    its own on the native protocol); it is DamagedFrame, which ends the connection."""
    sender = FrameConnection(FRAME_BYTES_MAX)
    sender.checksummed = True
    frame = bytearray(sender.send(Request(3, Op.PRODUCE, {"topic": "t", "records": [[b"MARKER"]]})))
    frame[flipped] ^= 0x01
    receiver = FrameConnection(FRAME_BYTES_MAX)
    receiver.receive_data(bytes(frame))
    with pytest.raises(DamagedFrame) as damaged:
        receiver.next_message()
    assert damaged.value.code is ErrorCode.PROTOCOL_ERROR
    assert "damaged in transit" in damaged.value.message


def test_a_checksummed_length_word_is_still_bounded_by_the_frame_limit() -> None:
    frames = FrameConnection(16)
    frames.receive_data(struct.pack(">II", 17 | 0x8000_0000, 0))
    error = raises_protocol_error(frames.next_message)
    assert "over the limit of 16" in error.message


def test_protocol_error_is_a_broker_error_with_details() -> None:
    error = ProtocolError("bad", frame_bytes=3)
    assert isinstance(error, BrokerError)
    assert error.to_dict() == {
        "error": "PROTOCOL_ERROR",
        "code": 81,
        "message": "bad",
        "frame_bytes": 3,
    }


# payload fields (broker/protocol/codec.py) ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "name", "kind"),
    [
        ({}, "topic", str),
        ({"topic": 1}, "topic", str),
        ({"topic": b"orders"}, "topic", str),
        ({"count": True}, "count", int),
        ({"count": "1"}, "count", int),
    ],
)
def test_field_refuses_a_missing_or_wrong_type(
    args: dict[str, Any], name: str, kind: type[Any]
) -> None:
    error = raises_protocol_error(lambda: codec.field(args, name, kind))
    assert repr(name) in error.message


def test_field_takes_an_optional_none_and_a_right_type() -> None:
    assert codec.field({}, "owner_group", str, optional=True) is None
    assert codec.field({"count": 3}, "count", int) == 3
    assert codec.non_negative({"wait_ms": 0}, "wait_ms") == 0
    raises_protocol_error(lambda: codec.non_negative({"wait_ms": -1}, "wait_ms"))


BAD_ROWS: list[object] = [
    None,
    b"rows",
    {"value": b"x"},
    [(b"v", None, ())],
    [("text value", None, (), None, None)],
    [(b"v", "text key", (), None, None)],
    [(b"v", None, ((b"name", b"v"),), None, None)],
    [(b"v", None, (("name", "text"),), None, None)],
    [(b"v", None, None, None, None)],
    [(b"v", None, (), "0", None)],
    [(b"v", None, (), True, None)],
    [(b"v", None, (), None, 1.5)],
]


@pytest.mark.parametrize("rows", BAD_ROWS)
def test_new_records_from_wire_refuses_a_bad_row(rows: object) -> None:
    raises_protocol_error(lambda: codec.new_records_from_wire(rows))


@pytest.mark.parametrize("rows", [rows for rows in BAD_ROWS if isinstance(rows, list)])
def test_a_one_record_batch_as_msgpack_decodes_it_is_judged_as_any_batch(rows: object) -> None:
    # msgpack gives tuples (use_list=False): a one-record batch has a fast path of its own
    wire = msgpack.unpackb(msgpack.packb(rows), use_list=False)
    raises_protocol_error(lambda: codec.new_records_from_wire(wire))


def wire_round_trip(value: object) -> object:
    """As a frame carries it: msgpack both ways, arrays as tuples."""
    return msgpack.unpackb(msgpack.packb(value), use_list=False)


@pytest.mark.parametrize(
    "records",
    [
        [NewRecord(b"v%d" % i) for i in range(40)],
        [NewRecord(b"v%d" % i, key=b"k" if i % 2 else None) for i in range(40)],
        [NewRecord(b"", partition=i % 3) for i in range(40)],
    ],
    ids=["values", "some keys", "partitions"],
)
def test_a_plain_batch_travels_as_columns_and_comes_back_the_same(
    records: list[NewRecord],
) -> None:
    columns = codec.new_records_to_columns(records)
    assert columns is not None
    decoded = codec.new_records_from_columns(wire_round_trip(columns))
    assert decoded == records and {type(r) for r in decoded} == {NewRecord}


@pytest.mark.parametrize(
    "records",
    [
        [NewRecord(b"v")] * 3,  # too few to be worth it
        [NewRecord(b"v", headers=(("h", b"1"),))] + [NewRecord(b"v")] * 40,
        [NewRecord(b"v", timestamp_ms=5)] + [NewRecord(b"v")] * 40,
    ],
    ids=["small", "headers", "timestamps"],
)
def test_a_batch_with_headers_or_timestamps_travels_as_rows(records: list[NewRecord]) -> None:
    assert codec.new_records_to_columns(records) is None


@pytest.mark.parametrize(
    "columns",
    [
        None,
        [(b"v",), None],
        [("text",), None, None],
        [(b"v", 5), None, None],
        [(b"v", b"w"), (b"k",), None],  # a keys column shorter than the values
        [(b"v",), ("text key",), None],
        [(b"v",), None, (True,)],
        [(b"v",), None, ("0",)],
        [b"values", None, None],
    ],
)
def test_bad_columns_are_refused(columns: object) -> None:
    raises_protocol_error(lambda: codec.new_records_from_columns(columns))


@pytest.mark.parametrize(
    "results",
    [
        [AppendResult("t", 0, -1)] * 5,  # a transaction's: one value per column
        [AppendResult("t", i % 2, 10 + i // 2) for i in range(6)],
        [AppendResult("t", 1, 7, duplicate=True), AppendResult("t", 1, 8)],
        [],
    ],
)
def test_results_as_columns_come_back_the_same(results: list[AppendResult]) -> None:
    for columns in (True, False):
        reply = wire_round_trip(codec.results_reply(results, columns))
        assert isinstance(reply, dict)
        assert codec.results_from_reply("t", reply) == results


@pytest.mark.parametrize(
    "wire",
    [
        [2, 0, 1],
        [2, (0,), 1, False],  # a partitions column of one for two results
        [2, 0, (1, "2"), False],
        [2, 0, 1, 0],  # duplicates are booleans
        ["2", 0, 1, False],
    ],
)
def test_bad_result_columns_are_refused(wire: object) -> None:
    raises_protocol_error(lambda: codec.results_from_reply("t", {"result_columns": wire}))


@pytest.mark.parametrize(
    "record",
    [
        NewRecord(b"a"),
        NewRecord(b"a", partition=0),
        NewRecord(b"", key=b"", partition=3, timestamp_ms=-1),
        NewRecord(b"\x00\xff", key=b"k", headers=(("h", b"v"),), partition=2, timestamp_ms=5),
    ],
)
def test_a_one_record_batch_round_trips_through_a_frame(record: NewRecord) -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(frames.send_request(1, Op.PRODUCE, {"records": [record]}))
    decoded = frames.next_message()
    assert isinstance(decoded, Request)
    assert codec.new_records_from_wire(decoded.args["records"]) == [record]
    assert type(codec.new_records_from_wire(decoded.args["records"])[0]) is NewRecord


def test_new_records_round_trip_through_a_frame() -> None:
    records = [
        NewRecord(b"a"),
        NewRecord(b"\x00\xff", key=b"k", headers=(("h", b"v"),), partition=2, timestamp_ms=5),
    ]
    request = Request(1, Op.PRODUCE, {"records": codec.new_records_to_wire(records)})
    frames = FrameConnection(FRAME_BYTES_MAX)
    frames.receive_data(encode(request))
    decoded = frames.next_message()
    assert isinstance(decoded, Request)
    assert codec.new_records_from_wire(decoded.args["records"]) == records


@pytest.mark.parametrize(
    "wire", [None, "0:1", {0: 1}, [(0,)], [(0, 1, 2)], [(0, True)], [("0", 1)], [(0, 1.0)]]
)
def test_positions_from_wire_refuses_positions_of_the_wrong_shape(wire: object) -> None:
    # Whether the numbers make sense (a negative offset, a missing partition) is the
    # engine's call, served or embedded alike: see test_remote_client's parity cases.
    raises_protocol_error(lambda: codec.positions_from_wire(wire))


@pytest.mark.parametrize(
    "wire", [None, (1, 2, 3, 4), (1, 2, 3, 4, 5, 6), (1, 2, "3", 4, None), (1, 2, 3, 4, "t")]
)
def test_producer_from_wire_refuses_bad_fields(wire: object) -> None:
    raises_protocol_error(lambda: codec.producer_from_wire(wire))


def test_producer_fields_round_trip() -> None:
    producer = ProducerFields(7, 2, 40, 3, 99)
    assert codec.producer_from_wire(codec.producer_to_wire(producer)) == producer
    # on the wire as it always was: the array [pid, generation, sequence, epoch, txn]
    assert msgpack.packb(codec.producer_to_wire(producer)) == msgpack.packb([7, 2, 40, 3, 99])
    assert type(codec.producer_from_wire((7, 2, 40, 3, None))) is ProducerFields
    assert producer._replace(txn_id=None) == ProducerFields(7, 2, 40, 3)


def test_replies_and_requests_framed_without_a_message_equal_the_messages_frames() -> None:
    frames = FrameConnection(FRAME_BYTES_MAX)
    args = {"topic": "t", "records": [NewRecord(b"v", partition=0)]}
    assert frames.send_request(5, Op.PRODUCE, args) == encode(Request(5, Op.PRODUCE, args))
    result = {"results": codec.results_to_wire([AppendResult("t", 0, 9, True)])}
    assert frames.send_reply(5, result) == encode(Reply(5, result))
    assert frames.send(Reply(5, result)) == encode(Reply(5, result))


# hypothesis: round trips and fuzzing ------------------------------------------------------

ids = st.integers(min_value=0, max_value=2**64 - 1)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(max_size=10), values, max_size=5)
ops = st.sampled_from([op for op in Op if op is not Op.NONE])
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Request, ids, ops, payloads),
    st.builds(Reply, ids, payloads),
    st.builds(ErrorReply, ids, st.integers(-(2**63), 2**64 - 1), st.text(max_size=30), payloads),
    st.builds(Push, st.text(max_size=20), payloads),
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=6), st.lists(st.integers(min_value=0), max_size=20))
def test_valid_messages_round_trip_in_any_chunking(batch: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode(message) for message in batch)
    frames = FrameConnection(1 << 24)
    received: list[Message] = []
    for chunk in chunked(stream, cuts):
        frames.receive_data(chunk)
        got, sentinel = drain(frames)
        assert sentinel is NEED_DATA
        received += got
    frames.receive_data(b"")
    got, sentinel = drain(frames)
    assert (received + got, sentinel) == (batch, CLOSED)


record_rows = st.builds(
    Record,
    topic=st.text(min_size=1, max_size=10),
    partition=st.integers(0, 1023),
    offset=st.integers(0, 2**62),
    timestamp_ms=st.integers(0, 2**62),
    key=st.none() | st.binary(max_size=20),
    value=st.binary(max_size=50),
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3).map(tuple),
    producer_id=st.integers(0, 2**62),
    generation=st.integers(0, 2**31),
    sequence=st.integers(0, 2**31),
    epoch=st.integers(0, 2**31),
    txn_id=st.none() | st.integers(0, 2**62),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(record_rows, max_size=10))
def test_fetched_records_round_trip_through_a_reply(records: list[Record]) -> None:
    frames = FrameConnection(1 << 24)
    frames.receive_data(encode(Reply(1, {"records": codec.records_to_wire(records)})))
    reply = frames.next_message()
    assert isinstance(reply, Reply)
    assert codec.records_from_wire(reply.result["records"]) == records


def feed_fuzz(frames: FrameConnection, chunks: list[bytes]) -> None:
    """Feed chunks, then EOF; only messages, NEED_DATA, CLOSED or ProtocolError may result."""
    try:
        for chunk in [*chunks, b""]:
            frames.receive_data(chunk)
            got, sentinel = drain(frames)
            assert all(isinstance(m, Request | Reply | ErrorReply | Push) for m in got)
            assert sentinel is (CLOSED if chunk == b"" else NEED_DATA)
    except ProtocolError as error:
        assert error.code is ErrorCode.PROTOCOL_ERROR


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0), max_size=10))
def test_fuzz_random_bytes_yield_messages_or_protocol_error(data: bytes, cuts: list[int]) -> None:
    feed_fuzz(FrameConnection(256), chunked(data, cuts))


anything = st.recursive(
    scalars | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)),
    lambda children: (
        st.lists(children, max_size=5).map(tuple)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), children, max_size=4)
    ),
    max_leaves=10,
)
kinds_ids_ops = st.integers(-3, 5) | st.integers(-(2**63), 2**64 - 1) | scalars


@settings(max_examples=250, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(kinds_ids_ops, kinds_ids_ops, kinds_ids_ops, anything),
            st.tuples(st.integers(0, 3), ids, st.integers(0, 25), anything),
            st.tuples(st.integers(0, 3), ids, st.integers(0, 25), payloads),
            anything,
        ),
        max_size=4,
    ),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_fuzz_msgpack_bodies_of_any_shape_yield_messages_or_protocol_error(
    bodies: list[object], cuts: list[int]
) -> None:
    stream = b"".join(body_frame(body) for body in bodies)
    feed_fuzz(FrameConnection(1 << 20), chunked(stream, cuts))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(messages, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_fuzz_corrupted_valid_frames_yield_messages_or_protocol_error(
    batch: list[Message], flips: list[tuple[int, int]], cuts: list[int]
) -> None:
    stream = bytearray(b"".join(encode(message) for message in batch))
    for position, byte in flips:
        stream[position % len(stream)] = byte
    feed_fuzz(FrameConnection(1 << 16), chunked(bytes(stream), cuts))


def test_kind_numbers_are_stable() -> None:
    assert [int(kind) for kind in Kind] == [0, 1, 2, 3]
    assert int(Op.HELLO) == 1
    assert int(Op.PRODUCE) == 20
    assert int(Op.FETCH) == 21


@settings(max_examples=100, deadline=None)
@given(st.lists(record_rows, max_size=10))
def test_fetched_rows_round_trip_into_records_of_the_topic(records: list[Record]) -> None:
    rows = [(*r[1:6], encode_headers(r.headers), *r[7:]) for r in records]
    frames = FrameConnection(1 << 24)
    frames.receive_data(encode(Reply(1, {"rows": rows})))
    reply = frames.next_message()
    assert isinstance(reply, Reply)
    fetched = codec.rows_from_wire("orders", reply.result["rows"])
    assert fetched == [r._replace(topic="orders") for r in records]


@pytest.mark.parametrize(
    "rows", [None, 7, [(1, 2)], [[0, 0, 0, None, b"v", b"\xc1", 0, 0, 0, 0, None]]]
)
def test_malformed_fetched_rows_are_a_protocol_error(rows: object) -> None:
    with pytest.raises(BrokerError) as caught:
        codec.rows_from_wire("orders", rows)
    assert caught.value.code is ErrorCode.PROTOCOL_ERROR


def test_records_go_as_columns_only_to_a_server_that_announced_them() -> None:
    from broker.client.remote import produce_args
    from broker.protocol.messages import COLUMNS_FEATURE

    records = [NewRecord(b"v%d" % i) for i in range(40)]
    before = produce_args("t", records, ProducerFields(), (), None)
    assert "columns" not in before and len(before["records"]) == 40
    after = produce_args("t", records, ProducerFields(), (), None, frozenset({COLUMNS_FEATURE}))
    assert "records" not in after
    assert codec.new_records_from_columns(after["columns"]) == records


def test_a_transactions_journal_bodies_come_back_as_the_engine_keeps_them() -> None:
    """A frame carries arrays as tuples; a journal entry's body came back with them
    (PREPARE_COMMIT's partitions ((2, 0, 3),)) where the engine, and so an embedded
    client, gives lists ([[2, 0, 3]]): txn_show() answered otherwise served."""
    info = TxnInfo(7, "billing", None, "committed", 10, 1, 2, 3, None, 4)
    bodies: list[object] = [{"key": "k"}, {"partitions": [[2, 0, 3], [2, 1, 4]], "offsets": 1}]
    journal = tuple(
        JournalEntryInfo(10, position, kind, 5, body)
        for position, (kind, body) in enumerate(
            zip(("BEGIN", "PREPARE_COMMIT", "COMPLETE"), [*bodies, None], strict=True)
        )
    )
    detail = TxnDetail(info, journal, ())
    wire = wire_round_trip(codec.detail_to_wire(detail))
    assert isinstance(wire, dict)
    decoded = codec.detail_from_wire(wire)
    assert [e.body for e in decoded.journal] == [*bodies, None]
    assert decoded == detail
