"""The Kafka codec (broker/kafka/wire.py, records.py) against bytes real clients sent.

golden/requests.json holds the first frame of each (API key, version) that librdkafka,
kafka-python and aiokafka sent while producing one record (golden/capture.py makes it).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kafka.errors import CorruptRecordError
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker import rows
from broker.kafka import records, wire
from broker.kafka.records import BadRecords

GOLDEN: dict[str, dict[str, str]] = json.loads(
    (Path(__file__).parent / "golden" / "requests.json").read_text()
)
CLIENTS = sorted(GOLDEN)


def golden(client: str, api_key: int) -> list[tuple[int, bytes]]:
    return [
        (int(name.split("/v")[1]), bytes.fromhex(frame))
        for name, frame in GOLDEN[client].items()
        if int(name.split("/")[0]) == api_key
    ]


@pytest.mark.parametrize("client", CLIENTS)
def test_every_captured_request_decodes(client: str) -> None:
    for name, frame in GOLDEN[client].items():
        request = wire.read_request(bytes.fromhex(frame))
        key, version = (int(part) for part in name.split("/v"))
        assert (request.header.api_key, request.header.api_version) == (key, version)
        assert request.header.client_id, "every client names itself"
        api = wire.APIS[key]
        if api.min_version <= version <= api.max_version:
            assert request.body is not None, name
        else:
            assert request.body is None, name  # answered with UNSUPPORTED_VERSION


@pytest.mark.parametrize("client", CLIENTS)
def test_a_captured_produce_holds_the_record_the_client_sent(client: str) -> None:
    ((_, frame),) = golden(client, 0)
    body = wire.read_request(frame).body
    ((topic,),) = [[t.name for t in body.topic_data]]
    assert topic == "golden"
    (part,) = body.topic_data[0].partition_data
    (batch,) = records.read_batches(part.records, part.index)
    (record,) = batch.records
    assert (record.key, record.value, record.headers) == (b"k", client.encode(), (("h", b"1"),))
    assert record.partition == part.index
    if client == "librdkafka":  # idempotence on: a producer id and the first sequence
        assert (batch.producer_id > 0, batch.producer_epoch, batch.base_sequence) == (True, 0, 0)


def test_an_apiversions_of_an_unknown_version_gets_unsupported_version_in_v0() -> None:
    (frame,) = [f for v, f in golden("kafka-python", wire.API_VERSIONS_KEY) if v == 4]
    request = wire.read_request(frame)
    assert request.body is None
    answer = wire.unsupported_version_answer(request.header)
    (size, correlation) = struct.unpack_from(">ii", answer)
    assert size == len(answer) - 4
    assert correlation == request.header.correlation_id
    body = ApiVersionsResponse.decode(answer[8:], version=0)
    assert body.error_code == wire.UNSUPPORTED_VERSION
    advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert advertised[wire.API_VERSIONS_KEY] == (0, 3)
    assert advertised == {a.key: (a.min_version, a.max_version) for a in wire.APIS.values()}


def test_answers_carry_the_correlation_id_and_the_header_of_their_version() -> None:
    (version, frame) = golden("librdkafka", 3)[0]
    request = wire.read_request(frame)
    assert request.api is not None and request.api.flexible(version)
    body = request.api.response(version=version, brokers=[], topics=[], cluster_id=None)
    answer = wire.encode_response(request.header, request.api, body)
    size, correlation, tagged = struct.unpack_from(">iib", answer)
    assert (size, correlation, tagged) == (len(answer) - 4, request.header.correlation_id, 0)
    # ApiVersions answers with the v0 header even in its flexible versions
    ((v3, api_versions),) = golden("librdkafka", 18)
    asked = wire.read_request(api_versions)
    assert asked.api is not None
    answer = wire.encode_response(asked.header, asked.api, wire.api_versions_body(v3))
    decoded = ApiVersionsResponse.decode(answer[8:], version=v3)
    assert decoded.error_code == 0


@pytest.mark.parametrize(
    "frame",
    [b"", b"\x00\x03", b"\x00\x03\x00\x09\x00\x00\x00\x01\x7f\xff", b"\x00\x12\x00\x03\x00"],
)
def test_a_truncated_header_is_malformed(frame: bytes) -> None:
    with pytest.raises(wire.MalformedRequest):
        wire.read_request(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_malformed(frame: bytes) -> None:
    try:
        request = wire.read_request(frame)
    except wire.MalformedRequest:
        return
    assert request.header.api_key == struct.unpack_from(">h", frame)[0]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_record_bytes_are_read_or_refused_with_a_kafka_error(data: bytes) -> None:
    try:
        records.read_batches(data, 0)
    except BadRecords as bad:
        assert bad.code in {
            wire.CORRUPT_MESSAGE,
            wire.UNSUPPORTED_FOR_MESSAGE_FORMAT,
            wire.INVALID_REQUEST,
        }


def built(compression: int = 0, count: int = 3) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(count):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_batches_of_every_codec_clients_use_are_read(codec: int) -> None:
    (batch,) = records.read_batches(built(codec), 2)
    assert [(r.key, r.value, r.timestamp_ms, r.partition) for r in batch.records] == [
        (b"k%d" % i, b"v%d" % i, 1000 + i, 2) for i in range(3)
    ]


def test_a_batch_of_ten_thousand_records_reads_back_whatever_its_varints_take() -> None:
    """Offset deltas of one, two and three bytes (past 63 and 8191), timestamp deltas
    of as many, null and empty keys and values, a header: each read as it was built."""
    builder = DefaultRecordBatchBuilder(2, 0, False, 7, 0, 0, batch_size=1 << 24)
    sent = []
    for i in range(10_000):
        key = None if i % 3 else b"k%d" % i
        value = None if i % 1000 == 1 else b"" if i % 1000 == 2 else b"v" * (i % 300)
        headers = [("h", None)] if i == 9_999 else []
        builder.append(i, timestamp=1_000 + i * i, key=key, value=value, headers=headers)
        sent.append((value, key, tuple(headers), 4, 1_000 + i * i))
    (batch,) = records.read_batches(bytes(builder.build()), 4)
    assert (batch.producer_id, batch.base_sequence) == (7, 0)
    assert [tuple(record) for record in batch.records] == sent


def python_read(batch: bytes, partition: int) -> list[Any]:
    """The Python reader's records of an uncompressed batch (the C reader's fallback)."""
    header = struct.unpack_from(">qiibIhiqqqhii", batch)
    return records._read_records(batch[61:], header[12], header[7], partition)


def either_read(read: Any, batch: bytes) -> list[Any] | str:
    try:
        return [tuple(record) for record in read(batch, 1)]
    except (CorruptRecordError, ValueError, IndexError):
        return "refused"


def with_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=20),
            st.none() | st.binary(max_size=200),
            st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
            st.integers(0, 10**7),
        ),
        min_size=1,
        max_size=30,
    ),
    st.data(),
)
def test_the_c_reader_reads_what_the_python_reader_reads_and_refuses_what_it_refuses(
    sent: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    data: st.DataObject,
) -> None:
    """aiokafka's reader in C and the Python loop, on batches as clients build them and
    on the same with one byte of their records changed (CRC made right again, so the
    reader is what meets it): the same records, or both refuse. But one byte: the C
    reader takes a record's attributes (an int8) for a varint, so it is not given a
    batch with one past 0x7F (the Python loop skips it) and refuses it; read_batches
    then asks the Python loop."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, batch_size=1 << 20)
    for i, (key, value, headers, stamp) in enumerate(sent):
        builder.append(i, timestamp=1_000 + stamp, key=key, value=value, headers=headers)
    batch = bytes(builder.build())
    in_c = either_read(lambda b, p: records._read_records_in_c(memoryview(b), p), batch)
    assert in_c == either_read(python_read, batch) != "refused"
    damaged = bytearray(batch)
    at = data.draw(st.integers(61, len(batch) - 1))
    damaged[at] = data.draw(st.integers(0, 255))
    mutated = with_crc(damaged)
    in_c = either_read(lambda b, p: records._read_records_in_c(memoryview(b), p), mutated)
    in_python = either_read(python_read, mutated)
    # the C reader is not given a batch whose attributes bytes, as the Python loop finds
    # them (the change may move them), hold one past 0x7F; read_batches asks the loop
    assert in_c == in_python or (
        in_c == "refused"
        and not records._attributes_are_bytes(mutated + bytes(16), 61, len(mutated))
    )
    try:
        (read,) = records.read_batches(mutated, 1)
        assert [tuple(record) for record in read.records] == in_python
    except BadRecords:
        assert in_python == "refused"


def columns_read(batch: bytes, partition: int) -> list[Any] | None:
    """The columns reader's records of an uncompressed batch, or None: not a batch it reads."""
    header = struct.unpack_from(">qiibIhiqqqhii", batch)
    read = records._read_columns(memoryview(batch), header[12], header[7], partition)
    return None if read is None else list(read)


def plain_batch(sizes: list[int], deltas: list[int]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, 5, 0, 0, batch_size=1 << 24)
    for i, (size, delta) in enumerate(zip(sizes, deltas, strict=True)):
        value = bytes([i % 251]) * size
        builder.append(i, timestamp=1_700_000_000_000 + delta, key=None, value=value, headers=[])
    return bytes(builder.build())


@settings(max_examples=300, deadline=None)
@given(
    st.integers(32, 400),
    st.sampled_from([0, 1, 63, 64, 100, 300, 8000, 20000]),
    st.lists(st.integers(-(2**21), 2**21), max_size=3),
    st.data(),
)
def test_the_columns_reader_reads_a_producers_values_as_the_python_reader_and_no_other(
    count: int, size: int, jumps: list[int], data: st.DataObject
) -> None:
    """Batches of values as a producer sends them (one size, timestamps a millisecond
    apart, with a few jumps, some past what three varint bytes hold): the columns
    reader reads them as the Python loop does, or leaves them to it (None), and reads
    every batch whose numbers fit three bytes. With a key, a header, a null value, a
    value of another size or any one byte changed (CRC made right again), it reads the
    same records as the Python loop or none, never records the loop refuses."""
    deltas = [i // 3 for i in range(count)]
    for jump in jumps:
        at = data.draw(st.integers(0, count - 1))
        deltas[at:] = [delta + jump for delta in deltas[at:]]
    batch = plain_batch([size] * count, deltas)
    read = columns_read(batch, 1)
    assert read is None or read == python_read(batch, 1)
    fits = all(-(2**20) <= delta - deltas[0] < 2**20 for delta in deltas)
    assert (read is not None) == fits
    builder = DefaultRecordBatchBuilder(2, 0, False, 5, 0, 0, batch_size=1 << 24)
    odd = data.draw(st.integers(0, count - 1))
    kind = data.draw(st.sampled_from(["key", "header", "null", "size"]))
    for i in range(count):
        builder.append(
            i,
            timestamp=1_000 + i,
            key=b"k" if kind == "key" and i == odd else None,
            value=None
            if kind == "null" and i == odd
            else b"v" * (size + (kind == "size" and i == odd)),
            headers=[("h", b"")] if kind == "header" and i == odd else [],
        )
    other = bytes(builder.build())
    read = columns_read(other, 1)
    if kind == "size":
        assert read == python_read(other, 1)
    else:
        assert read is None
    damaged = bytearray(batch)
    damaged[data.draw(st.integers(61, len(batch) - 1))] = data.draw(st.integers(0, 255))
    mutated = with_crc(damaged)
    read = columns_read(mutated, 1)
    assert read is None or read == either_read(python_read, mutated) != "refused"


def raw_batch(values: list[bytes], base_timestamp: int = 0, key: bytes | None = None) -> bytes:
    """A v2 batch of these values, written byte by byte (record i's timestamp delta i,
    no headers; the first record keyed if a key is given)."""
    written = []
    for i, value in enumerate(values):
        keyed = key if i == 0 else None
        fields = (
            b"\x00"
            + records_zigzag(i)  # timestamp delta
            + records_zigzag(i)  # offset delta
            + (records_zigzag(-1) if keyed is None else records_zigzag(len(keyed)) + keyed)
            + records_zigzag(len(value))
            + value
            + b"\x00"
        )
        written.append(records_zigzag(len(fields)) + fields)
    count = len(values)
    inner = struct.pack(
        ">hiqqqhii", 0, count - 1, base_timestamp, base_timestamp, -1, -1, -1, count
    ) + b"".join(written)
    return struct.pack(">qiibI", 0, len(inner) + 9, 0, 2, crc32c(inner)) + inner


def records_zigzag(number: int) -> bytes:
    return records._zigzag(number)


def test_a_batch_of_many_short_runs_is_left_to_the_c_reader_and_read_the_same() -> None:
    """Values whose size changes every 16 records: too many runs for the columns reader
    (whose work is bounded by its runs times the records), read the same by the next."""
    values = [b"x" * (1 + (i // 16) % 2) for i in range(20_000)]
    batch = raw_batch(values)
    assert columns_read(batch, 0) is None
    (read,) = records.read_batches(batch, 0)
    assert [record.value for record in read.records] == values


def test_a_timestamp_past_64_bits_reads_as_the_python_loop_reads_it() -> None:
    """A batch at the largest timestamp with records after it: aiokafka's C reader adds
    in 64 bits and wrapped to the smallest; read_batches gives what the Python loop gives
    (past 64 bits, which the produce's checks refuse)."""
    top = (1 << 63) - 1
    batch = raw_batch([b"v%d" % i for i in range(40)], top - 1, key=b"k")
    assert columns_read(batch, 0) is None  # a key: the C reader's
    (read,) = records.read_batches(batch, 0)
    assert [record.timestamp_ms for record in read.records] == [top - 1 + i for i in range(40)]


def test_a_damaged_batch_is_refused_as_corrupt() -> None:
    data = bytearray(built())
    data[-1] ^= 0xFF
    with pytest.raises(BadRecords, match="CRC") as refused:
        records.read_batches(bytes(data), 0)
    assert refused.value.code == wire.CORRUPT_MESSAGE
    with pytest.raises(BadRecords) as short:
        records.read_batches(built()[:-5], 0)
    assert short.value.code == wire.CORRUPT_MESSAGE


def test_old_message_formats_are_refused_as_unsupported() -> None:
    data = bytearray(built())
    data[16] = 1  # magic v1
    with pytest.raises(BadRecords) as refused:
        records.read_batches(bytes(data), 0)
    assert refused.value.code == wire.UNSUPPORTED_FOR_MESSAGE_FORMAT


def test_a_fetched_batch_reads_back_as_kafka_records() -> None:
    headers = rows.encode_headers((("h", b"\x00"), ("g", b"")))
    stored: list[Any] = [
        (7, 5_000, b"key", b"value", headers),
        (8, 4_000, None, b"", rows.EMPTY_HEADERS),
        (9, 6_000, b"", b"x" * 300, rows.EMPTY_HEADERS),
        (10, 6_000 + 20_000, b"k" * 20_000, b"", rows.EMPTY_HEADERS),  # two-byte varints
    ]
    batch = DefaultRecordBatch(records.encode_batch(stored))
    batch.validate_crc()
    assert (batch.base_offset, batch.next_offset, batch.max_timestamp) == (7, 11, 26_000)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch] == [
        (7, 5_000, b"key", b"value", [("h", b"\x00"), ("g", b"")]),
        (8, 4_000, None, b"", []),
        (9, 6_000, b"", b"x" * 300, []),
        (10, 26_000, b"k" * 20_000, b"", []),
    ]


def _fetch_answer(version: int, batches: list[list[bytes]]) -> Any:
    """A FetchResponse of a topic per list, a partition per batch (b"": none)."""
    response = wire.APIS[wire.FETCH_KEY].response
    topic_cls = response.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    return response(
        version=version,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            topic_cls(
                topic=f"topic-{index}",
                partitions=[
                    part_cls(
                        partition_index=partition,
                        error_code=0,
                        high_watermark=len(batch),
                        last_stable_offset=len(batch),
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=batch,
                    )
                    for partition, batch in enumerate(topic)
                ],
            )
            for index, topic in enumerate(batches)
        ],
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(4, 12),
    st.lists(st.lists(st.binary(max_size=400), min_size=1, max_size=4), min_size=1, max_size=3),
)
@example(12, [[b"\n", bytes(9)]])  # a one-byte batch, the same object as a length's byte
def test_a_fetch_answer_written_in_parts_is_the_answer_encoded_whole(
    version: int, batches: list[list[bytes]]
) -> None:
    """The fetch answer's parts (each batch written as it is) join to the bytes the
    codec encodes for the same answer, every version, empty records and compact
    lengths of one and two bytes among them."""
    api = wire.APIS[wire.FETCH_KEY]
    header = wire.Header(wire.FETCH_KEY, version, 7, "client")
    whole = wire.encode_response(header, api, _fetch_answer(version, batches))
    parts = wire.encode_fetch_response(header, api, _fetch_answer(version, batches))
    assert b"".join(parts) == whole
    # each batch is one of the parts, the object itself; told by identity, so only those
    # of two bytes or more (CPython keeps a single object for each one-byte value, which
    # the encoding's own one-byte parts may be)
    written_whole = [batch for topic in batches for batch in topic if len(batch) > 1]
    assert [
        part for part in parts if any(part is batch for batch in written_whole)
    ] == written_whole
