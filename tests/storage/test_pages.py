"""Fetches as pages (broker/storage/pages.py): a partition's records read with SQLite's
aggregates and sent as a few values instead of a row per record.

What a user sees: fetch and consume give exactly the records of the stored rows (offsets,
timestamps, keys or none, values, headers, producer fields, transaction ids), cut at the
same record and byte limits, embedded and served; a client from before pages is still
answered with rows; and a partition SQLite cannot page comes as rows in the same reply.
How a page is decoded, alone, is tests/unit/test_page_decoding.py.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import rows
from broker.client.client import Client, connect
from broker.limits import Limits
from broker.protocol import codec
from broker.protocol.messages import Op, Reply
from broker.types import NewRecord, Record, TopicConfig
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


def test_a_partition_a_page_cannot_hold_comes_as_rows_in_the_same_reply(data_dir: Path) -> None:
    """Partition 0 was compacted: its offsets have gaps, which a page (offsets from its
    first, one after another) cannot say, so it is sent as rows; partition 1 is a page.
    The first record is larger than read_bytes_max, and comes whole."""
    limits = Limits(read_bytes_max=1_000)
    big = NewRecord(random.Random(1).randbytes(5_000), b"key", (("h", b"v"),), partition=0)
    with served(data_dir, limits=limits) as server, connect(server.address) as client:
        client.create_topic(TOPIC, 2, config=TopicConfig(cleanup="compact"))
        client.produce(TOPIC, [NewRecord(b"old", b"key", partition=0), big])
        client.produce(TOPIC, [NewRecord(b"small", b"k2", partition=0)])
        client.produce(
            TOPIC, [NewRecord(b"one", b"a", partition=1), NewRecord(b"two", b"b", partition=1)]
        )
        assert client.clean_topic(TOPIC) == 1
        asked = {"topic": TOPIC, "positions": [[0, 0], [1, 0]], "pages": True}
        chunks = raw_fetch(server.port, {**asked, "max_records": 10, "wait_ms": 0})["pages"]
        fetched = client.fetch(TOPIC, {0: 0, 1: 0}, max_records=10)
    assert [sorted(chunk) for chunk in chunks] == [["rows"], ["page"]]
    assert [(r.partition, r.offset, r.value) for r in fetched] == [
        (0, 1, big.value),
        (1, 0, b"one"),
        (1, 1, b"two"),
    ]
    assert fetched[0].key == b"key" and fetched[0].headers == (("h", b"v"),)
