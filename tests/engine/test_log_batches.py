"""Pages read from the shapes of large batches (schema 013, broker/storage/pages.py).

A batch of at least SHAPED_RECORDS_MIN records keeps its shape (timestamp, value size,
keys or headers, producer fields) in log_batches, and a page of such batches is read
from those rows instead of a pass over every record. What a user sees must not change:
every page, cut anywhere, gives exactly the records fetch_rows gives, before and after
retention, compaction and a topic's deletion; `fencelog check` names a shape that
does not match its records.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client.client import Client, connect
from broker.discovery import DB_FILE
from broker.errors import ErrorCode
from broker.rows import records_of
from broker.storage import logs, pages, txns
from broker.types import NewRecord, TopicConfig
from support.helpers import Invoke, expect, json_lines
from support.mixed_logs import OPERATIONS, TOPIC, mixed_log
from support.page_checks import assert_same_pages

BIG = logs.SHAPED_RECORDS_MIN + 36  # a batch that keeps its shape


class ShapedReads:
    """Counts the pages read from shapes (the path under test), not by the scan."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pages = 0
        read = pages._read_shaped

        def counted(*args: Any) -> Any:
            page = read(*args)
            self.pages += page is not None
            return page

        monkeypatch.setattr(pages, "_read_shaped", counted)


@pytest.fixture
def shaped(monkeypatch: pytest.MonkeyPatch) -> ShapedReads:
    return ShapedReads(monkeypatch)


@pytest.fixture
def client(data_dir: Path) -> Iterator[Client]:
    with connect(data_dir, durability="normal") as opened:
        yield opened


def shapes(client: Client) -> list[tuple[int, int, int]]:
    engine = client._transport.engine  # type: ignore[attr-defined]
    with engine.database.read() as conn:
        found = conn.execute("SELECT topic_id, partition, first_offset FROM log_batches")
        return [tuple(row) for row in found]


def every_kind(rng: random.Random, partition: int) -> list[list[NewRecord]]:
    """One large batch of each kind a producer sends."""
    size = BIG
    return [
        [NewRecord(b"%08d" % i, partition=partition) for i in range(size)],  # one value size
        [NewRecord(rng.randbytes(rng.randrange(60)), partition=partition) for _ in range(size)],
        [
            NewRecord(b"v", rng.choice([None, b"", b"k%d" % i]), partition=partition)
            for i in range(size)
        ],
        [
            NewRecord(b"v%d" % i, headers=(("h", b"%d" % i),) if i % 5 else (), partition=partition)
            for i in range(size)
        ],
        [NewRecord(b"s", partition=partition, timestamp_ms=1_000 + i % 3) for i in range(size)],
        [NewRecord(b"same", partition=partition, timestamp_ms=7_000) for _ in range(size)],
    ]


def test_every_kind_of_large_batch_reads_as_its_rows(client: Client, shaped: ShapedReads) -> None:
    client.create_topic(TOPIC, 2)
    rng = random.Random(3)
    for batch in every_kind(rng, 0):
        client.produce(TOPIC, batch)
    producer = client.producer(TOPIC)
    producer.send([NewRecord(b"i%d" % i, partition=0) for i in range(BIG)])  # sequences
    producer.send([NewRecord(b"j%d" % i, partition=0) for i in range(BIG)])
    with client.transaction("g") as txn:  # two batches of one transaction, copied at commit
        txn.produce(TOPIC, every_kind(rng, 1)[1])
        txn.produce(TOPIC, every_kind(rng, 1)[3])
    client.produce(TOPIC, [NewRecord(b"small", partition=1)])  # no shape: the scan's pages
    assert len(shapes(client)) == 10
    for page in (5, 64, BIG, 10_000):
        shaped.pages = 0
        assert assert_same_pages(client, 2, page, built=True) == 10 * BIG + 1
        assert shaped.pages > 0


def test_a_page_cut_by_bytes_ends_where_rows_end(data_dir: Path, shaped: ShapedReads) -> None:
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 2)
        client.produce(TOPIC, [NewRecord(b"x" * 1000, partition=0) for _ in range(BIG)])
        client.produce(TOPIC, [NewRecord(b"y" * 10, b"k", partition=0) for _ in range(BIG)])
        engine = client._transport.engine  # type: ignore[attr-defined]
        with engine.database.read() as conn:
            topic = logs.topic_by_name(conn, TOPIC)
            assert topic is not None
            page = pages.read_page(conn, topic, 0, 10, 10_000, 5_500, 1 << 30)
            keyed = pages.read_page(conn, topic, 0, BIG, 10_000, 55, 1 << 30)
        assert page is not None and (page.offset, page.record_count) == (10, 5)
        assert page.values == b"x" * 5000
        assert keyed is not None and keyed.record_count == 5  # 11 bytes a record
        assert shaped.pages == 2


@pytest.mark.parametrize("start", [0, 1, BIG - 1, BIG, BIG + 5])
def test_retention_into_a_batch_leaves_its_pages_right(data_dir: Path, start: int) -> None:
    """Retention by bytes moves the log start into a batch: the records above it read
    as before, and the shapes wholly below it go."""
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 2)
        for _ in range(3):
            client.produce(TOPIC, [NewRecord(b"%04d" % n, partition=0) for n in range(BIG)])
        kept = 3 * BIG - start
        client.alter_topic(TOPIC, config=TopicConfig(retention_bytes=4 * kept))
        client.clean_topic(TOPIC)
        assert client.describe_topic(TOPIC).partition_details[0].start_offset == start
        assert len(shapes(client)) == 3 - start // BIG
        got = client.fetch_arrow(TOPIC, 0, start, max_records=10_000)
        rows = records_of(TOPIC, client.fetch_rows(TOPIC, {0: start}, max_records=10_000))
        assert got.column("offset").to_pylist() == [row.offset for row in rows]
        assert got.column("value").to_pylist() == [row.value for row in rows]


def test_compaction_inside_a_batch_reads_what_is_left(data_dir: Path) -> None:
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 1, config=TopicConfig(cleanup="compact"))
        client.produce(TOPIC, [NewRecord(b"%d" % i, b"k%d" % (i % 40)) for i in range(BIG)])
        client.produce(TOPIC, [NewRecord(b"%d" % i, b"new%d" % i) for i in range(BIG)])
        assert client.clean_topic(TOPIC) == BIG - 40
        assert len(shapes(client)) == 1  # the compacted batch's shape went with its records
        got = client.fetch_arrow(TOPIC, 0, 0, max_records=10_000)
        rows = records_of(TOPIC, client.fetch_rows(TOPIC, {0: 0}, max_records=10_000))
        assert got.column("offset").to_pylist() == [row.offset for row in rows]
        assert got.column("key").to_pylist() == [row.key for row in rows]
        assert len(rows) == 40 + BIG


def test_a_deleted_topic_takes_its_shapes(client: Client) -> None:
    client.create_topic(TOPIC, 1)
    client.produce(TOPIC, [NewRecord(b"old") for _ in range(BIG)])
    client.delete_topic(TOPIC)
    assert shapes(client) == []
    client.create_topic(TOPIC, 1)
    client.produce(TOPIC, [NewRecord(b"new%d" % i) for i in range(3)])
    batch = client.fetch_arrow(TOPIC, 0, 0, max_records=100)
    assert batch.column("value").to_pylist() == [b"new0", b"new1", b"new2"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=OPERATIONS, page=st.sampled_from([1, 3, 7, 10_000]))
def test_pages_of_shaped_batches_equal_rows(
    tmp_path_factory: pytest.TempPathFactory, operations: list[Any], page: int
) -> None:
    """Every batch of the mixed log keeps its shape (the threshold lowered to 2):
    pages cut anywhere across them still equal fetch_rows."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logs, "SHAPED_RECORDS_MIN", 2)
        patch.setattr(txns, "SHAPED_RECORDS_MIN", 2)
        with mixed_log(tmp_path_factory.mktemp("data"), operations) as (client, committed):
            assert assert_same_pages(client, 2, page, built=True) == committed
            for partition in range(2):
                fetched = client.fetch(TOPIC, {partition: 0}, max_records=10_000)
                rows = client.fetch_rows(TOPIC, {partition: 0}, max_records=10_000)
                assert fetched == records_of(TOPIC, rows)


def test_check_names_a_shape_that_does_not_match(invoke: Invoke, data_dir: Path) -> None:
    expect(invoke("topic", "create", "t"), 0)
    lines = "".join(f"value-{i}\n" for i in range(500))
    expect(invoke("produce", "t", input=lines), 0)
    expect(invoke("check"), 0)  # every shape the produce kept matches its records
    damaged = sqlite3.connect(data_dir / DB_FILE)
    with damaged:
        (first,) = damaged.execute("SELECT min(first_offset) FROM log_batches").fetchone()
        damaged.execute("UPDATE log_batches SET timestamp_ms = 1 WHERE first_offset = ?", (first,))
    damaged.close()
    result = expect(invoke("check"), ErrorCode.DATA_CORRUPT)
    said = f"the shape of topic id 1 partition 0's batch at offset {first} (log_batches)"
    assert said in result.stdout
    report = json_lines(expect(invoke("check", "--json"), 37).stdout)[0]
    assert report["ok"] is False and len(report["problems"]) == 1


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM records WHERE offset = 20",
        "UPDATE records SET value = X'00' WHERE offset = 20",
        "UPDATE records SET value = CAST(X'0000000000000000' || value AS BLOB) WHERE offset = 20",
    ],
)
def test_a_batch_unlike_its_shape_is_read_as_its_rows(
    data_dir: Path, shaped: ShapedReads, damage: str
) -> None:
    """The shapes say every record's value length, and the page trusts the values'
    total length to stand for their count: a record gone from under its shape, or
    made shorter or longer, must send the page to the scan, which reads what is
    there, never columns that disagree with the values."""
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 1)
        client.produce(TOPIC, [NewRecord(b"%08d" % i) for i in range(BIG)])
    damaged = sqlite3.connect(data_dir / DB_FILE)
    with damaged:
        damaged.execute(damage)
    damaged.close()
    with connect(data_dir, durability="normal") as client:
        shaped.pages = 0
        got = client.fetch_arrow(TOPIC, 0, 0, max_records=10_000)
        rows = records_of(TOPIC, client.fetch_rows(TOPIC, {0: 0}, max_records=10_000))
        assert shaped.pages == 0
        assert got.column("offset").to_pylist() == [row.offset for row in rows]
        assert got.column("value").to_pylist() == [row.value for row in rows]
