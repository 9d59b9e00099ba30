"""Fetches as pages (broker/storage/pages.py): a partition's records read with SQLite's
aggregates and sent as a few values instead of a row per record.

What a user sees: fetch and consume give exactly the records of the stored rows (offsets,
timestamps, keys or none, values, headers, producer fields, transaction ids), cut at the
same record and byte limits, embedded and served; a client from before pages is still
answered with rows; a partition SQLite cannot page comes as rows in the same reply; a
malformed page from a server is a protocol error, never wrong records; and reading does
not leave Python's cycle collector switched the other way.
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import rows
from broker.client.client import Client, connect
from broker.limits import Limits
from broker.protocol import codec
from broker.protocol.frames import ProtocolError
from broker.protocol.messages import Op, Reply
from broker.types import NewRecord, Record
from support.mixed_logs import OPERATIONS, TOPIC, apply, mixed_log
from support.servers import RawClient, served


def stored(client: Client, positions: dict[int, int], max_records: int) -> list[Record]:
    """What a fetch must give: the stored rows of the same fetch, made Records one by one."""
    return rows.records_of(TOPIC, client.fetch_rows(TOPIC, positions, max_records=max_records))


def assert_every_fetch_is_stored(client: Client, max_records: int) -> int:
    """Reading both partitions from 0, fetch by fetch: every fetch equals the stored rows'
    records; records read."""
    positions = {0: 0, 1: 0}
    total = 0
    while True:
        found = client.fetch(TOPIC, positions, max_records=max_records)
        assert found == stored(client, positions, max_records), positions
        if not found:
            return total
        for record in found:
            assert record.offset == positions[record.partition]
            positions[record.partition] += 1
        total += len(found)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=OPERATIONS, page=st.sampled_from([1, 7, 10_000]))
def test_fetch_equals_the_stored_rows(
    tmp_path_factory: pytest.TempPathFactory, operations: list[Any], page: int
) -> None:
    with mixed_log(tmp_path_factory.mktemp("data"), operations) as (client, committed):
        assert assert_every_fetch_is_stored(client, page) == committed


MIXED = [
    ("plain", 0, 12, 1),
    ("keyed", 1, 9, 2),
    ("idempotent", 0, 5, 3),
    ("txn", 1, 4, 4),
    ("aborted", 0, 3, 5),
    ("mixed", 0, 11, 6),
    ("txn", 0, 2, 7),
]


@pytest.fixture(params=["embedded", "served"])
def client(data_dir: Path, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client of a two-partition topic holding every kind of record."""
    with contextlib.ExitStack() as stack:
        target: str | Path = data_dir
        if request.param == "served":
            target = stack.enter_context(served(data_dir)).address
        opened = stack.enter_context(connect(target, durability="normal"))
        opened.create_topic(TOPIC, 2)
        apply(opened, MIXED)
        yield opened


@pytest.mark.parametrize("page", [1, 7, 10_000])
def test_fetch_and_consume_give_the_stored_records(client: Client, page: int) -> None:
    assert assert_every_fetch_is_stored(client, page) == 43
    consumed = list(client.consume(TOPIC))
    assert consumed == stored(client, {0: 0}, 10_000) + stored(client, {1: 0}, 10_000)
    assert {r.txn_id for r in consumed if r.txn_id is not None}  # transactions are in it
    assert any(r.key is None for r in consumed) and any(r.key == b"" for r in consumed)
    assert any(r.headers for r in consumed) and any(r.producer_id for r in consumed)


def raw_fetch(port: int, args: dict[str, Any]) -> dict[str, Any]:
    with RawClient(port) as raw:
        raw.hello()
        request_id = raw.request(Op.FETCH, args)
        reply = raw.receive()
    assert isinstance(reply, Reply) and reply.request_id == request_id, reply
    return reply.result


def test_the_server_answers_pages_to_who_asks_and_rows_to_older_clients(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic(TOPIC, 2)
        apply(client, MIXED)
        positions = [[0, 0], [1, 0]]
        asked = {"topic": TOPIC, "positions": positions, "max_records": 100, "wait_ms": 0}
        paged = raw_fetch(server.port, {**asked, "pages": True})
        older = raw_fetch(server.port, asked)  # a client from before pages: no "pages"
    assert [tuple(chunk["page"][:3]) for chunk in paged["pages"]] == [(0, 0, 30), (1, 0, 13)]
    assert "rows" not in paged and "pages" not in older
    records = codec.records_from_chunks(TOPIC, paged["pages"])
    assert records == codec.rows_from_wire(TOPIC, older["rows"])
    assert len(records) == 43  # every committed record; the aborted 3 are not


def test_a_partition_sqlite_cannot_page_comes_as_rows_in_the_same_reply(data_dir: Path) -> None:
    """read_bytes_max 1,000: partition 0's first record is past twice that, so SQLite
    does not concatenate it and it is sent as a row; partition 1 is a page."""
    limits = Limits(read_bytes_max=1_000)
    big = NewRecord(random.Random(1).randbytes(5_000), b"key", (("h", b"v"),), partition=0)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        client.create_topic(TOPIC, 2)
        client.produce(TOPIC, [big, NewRecord(b"small", partition=0)])
        client.produce(TOPIC, [NewRecord(b"one", partition=1), NewRecord(b"two", partition=1)])
        asked = {"topic": TOPIC, "positions": [[0, 0], [1, 0]], "pages": True}
        chunks = raw_fetch(server.port, {**asked, "max_records": 10, "wait_ms": 0})["pages"]
        fetched = client.fetch(TOPIC, {0: 0, 1: 0}, max_records=10)
    assert [sorted(chunk) for chunk in chunks] == [["rows"], ["page"]]
    assert [(r.partition, r.value) for r in fetched] == [
        (0, big.value),
        (1, b"one"),
        (1, b"two"),
    ]
    assert fetched[0].key == b"key" and fetched[0].headers == (("h", b"v"),)


# malformed pages ------------------------------------------------------------------------

GOOD = {
    "page": [
        3,  # partition
        10,  # offset
        3,  # records
        b"aabbbc",  # values
        b"2\n3\n1",  # value lengths
        1_000,  # every timestamp
        b"kk",  # keys
        b"-1\n2\n0",  # key lengths: none, "kk", empty
        [[11, msgpack.packb([["h", b"v"]])]],  # headers of offset 11
        [7, 1, b"4\n5\n6", 0, None],  # producer: pid 7, generation 1, sequences 4..6
    ]
}


def test_a_well_formed_page_is_read_column_by_column() -> None:
    records = codec.records_from_chunks(TOPIC, [GOOD])
    assert records == [
        Record(TOPIC, 3, 10, 1_000, None, b"aa", (), 7, 1, 4, 0, None),
        Record(TOPIC, 3, 11, 1_000, b"kk", b"bbb", (("h", b"v"),), 7, 1, 5, 0, None),
        Record(TOPIC, 3, 12, 1_000, b"", b"c", (), 7, 1, 6, 0, None),
    ]


def with_field(index: int, value: object) -> dict[str, Any]:
    fields = list(GOOD["page"])
    fields[index] = value
    return {"page": fields}


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        ("a string", "each fetched chunk is"),
        ({"page": GOOD["page"][:9]}, "each fetched chunk is"),
        (with_field(3, "aabbbc"), "each fetched chunk is"),
        (with_field(2, True), "each fetched chunk is"),
        (with_field(2, -1), "a count >= 0"),
        (with_field(2, 4), "value lengths for a page of 4 records"),
        (with_field(4, b"2\n3\n2"), "do not add up to 6 bytes"),
        (with_field(4, 3), "3 values of 3 bytes in 6 bytes"),
        (with_field(5, b"1\n2"), "2 timestamps for a page of 3"),
        (with_field(5, b"1\nx\n3"), "invalid literal"),
        (with_field(7, b"-1\n2\n5"), "do not add up to 2 bytes"),
        (with_field(8, [[99, b"\x90"]]), "outside the page"),
        (with_field(8, [[11, b"\xc1"]]), "a fetched page is malformed"),
        (with_field(8, [11]), "headers are [offset, stored headers] pairs"),
        (with_field(9, [7, 1, 4, 0]), "5 producer columns"),
        (with_field(9, [7, 1, "4", 0, None]), "5 producer columns"),
        ({"rows": [[1, 2]]}, "11-field rows"),
    ],
)
def test_a_malformed_page_is_a_protocol_error(chunk: object, message: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        codec.records_from_chunks(TOPIC, [GOOD, chunk])
    assert message in str(raised.value)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-3, 12) | st.binary(max_size=8),
        lambda inner: st.lists(inner, max_size=11) | st.dictionaries(st.just("page"), inner),
        max_leaves=30,
    )
)
def test_anything_a_server_might_send_is_records_or_a_protocol_error(chunk: object) -> None:
    with contextlib.suppress(ProtocolError):
        records = codec.records_from_chunks(TOPIC, [chunk])
        assert all(isinstance(r, Record) and isinstance(r.value, bytes) for r in records)


# the cycle collector ----------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_page_leaves_the_collector_as_it_was(enabled: bool) -> None:
    page = rows.Page(0, 0, 2, b"ab", 1, 5, b"", -1, [], (0, 0, 0, 0, None))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert [r.value for r in rows.records_of_page(TOPIC, page)] == [b"a", b"b"]
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()
