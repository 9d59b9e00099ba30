"""Pages read from the log's batches (schema 015, broker/storage/batches.py, pages.py).

Each append is one row of `log`, its records packed as a page's columns, and a page is
those columns joined. What a user sees must not change: every page, cut anywhere, gives
exactly the records fetch_rows gives, before and after retention (a log start inside a
batch), compaction and a topic's deletion; `fencelog check` names a batch whose columns
do not hold its records, and a read of one is DATA_CORRUPT, never wrong records.
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
from broker.errors import BrokerError, ErrorCode
from broker.rows import records_of
from broker.storage import logs, pages
from broker.types import NewRecord, TopicConfig
from support.helpers import Invoke, expect, json_lines
from support.mixed_logs import OPERATIONS, TOPIC, mixed_log
from support.page_checks import assert_same_pages

BIG = 100  # records of a large batch


@pytest.fixture
def client(data_dir: Path) -> Iterator[Client]:
    with connect(data_dir, durability="normal") as opened:
        yield opened


def stored(client: Client) -> list[tuple[int, int, int, int]]:
    """(topic id, partition, first offset, records) of every stored batch."""
    engine = client._transport.engine  # type: ignore[attr-defined]
    with engine.database.read() as conn:
        found = conn.execute(
            "SELECT topic_id, partition, first_offset, records FROM log"
            " ORDER BY topic_id, partition, first_offset"
        )
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


def test_every_kind_of_batch_is_one_row_and_reads_as_its_rows(client: Client) -> None:
    client.create_topic(TOPIC, 2)
    rng = random.Random(3)
    for batch in every_kind(rng, 0):
        client.produce(TOPIC, batch)
    producer = client.producer(TOPIC)
    producer.send([NewRecord(b"i%d" % i, partition=0) for i in range(BIG)])  # sequences
    producer.send([NewRecord(b"j%d" % i, partition=0) for i in range(BIG)])
    with client.transaction("g") as txn:  # two batches of one transaction, moved at commit
        txn.produce(TOPIC, every_kind(rng, 1)[1])
        txn.produce(TOPIC, every_kind(rng, 1)[3])
    client.produce(TOPIC, [NewRecord(b"small", partition=1)])
    assert [records for *_, records in stored(client)] == [BIG] * 10 + [1]
    for page in (5, 64, BIG, 10_000):
        assert assert_same_pages(client, 2, page, built=True) == 10 * BIG + 1


def test_a_page_cut_by_bytes_ends_where_rows_end(client: Client) -> None:
    client.create_topic(TOPIC, 2)
    client.produce(TOPIC, [NewRecord(b"x" * 1000, partition=0) for _ in range(BIG)])
    client.produce(TOPIC, [NewRecord(b"y" * 10, b"k", partition=0) for _ in range(BIG)])
    engine = client._transport.engine  # type: ignore[attr-defined]
    with engine.database.read() as conn:
        topic = logs.topic_by_name(conn, TOPIC)
        assert topic is not None
        page = pages.read_page(conn, topic, 0, 10, 10_000, 5_500)
        keyed = pages.read_page(conn, topic, 0, BIG, 10_000, 55)
        across = pages.read_page(conn, topic, 0, BIG - 2, 10_000, 2_022)
    assert page is not None and (page.offset, page.record_count) == (10, 5)
    assert page.values == b"x" * 5000
    assert keyed is not None and keyed.record_count == 5  # 11 bytes a record
    assert across is not None and across.record_count == 4
    assert across.values == b"x" * 2000 + b"y" * 20 and across.keys == b"kk"


@pytest.mark.parametrize("start", [0, 1, BIG - 1, BIG, BIG + 5])
def test_a_log_start_inside_a_batch_reads_only_what_is_above_it(client: Client, start: int) -> None:
    """DeleteRecords moves the log start into a batch: the records above it read as
    before, the batches wholly below it go, and the one holding it stays."""
    client.create_topic(TOPIC, 2)
    for _ in range(3):
        client.produce(TOPIC, [NewRecord(b"%04d" % n, partition=0) for n in range(BIG)])
    engine = client._transport.engine  # type: ignore[attr-defined]
    assert engine.delete_records_below(TOPIC, 0, start) == start
    assert client.describe_topic(TOPIC).partition_details[0].start_offset == start
    assert len(stored(client)) == 3 - start // BIG
    got = client.fetch_arrow(TOPIC, 0, start, max_records=10_000)
    rows = records_of(TOPIC, client.fetch_rows(TOPIC, {0: start}, max_records=10_000))
    assert got.column("offset").to_pylist() == list(range(start, 3 * BIG))
    assert got.column("value").to_pylist() == [row.value for row in rows]
    with pytest.raises(BrokerError) as below:
        client.fetch(TOPIC, {0: start - 1}, max_records=10)
    assert start == 0 or below.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_retention_by_bytes_cuts_whole_batches(client: Client) -> None:
    client.create_topic(TOPIC, 1)
    for _ in range(3):
        client.produce(TOPIC, [NewRecord(b"%04d" % n) for n in range(BIG)])
    client.alter_topic(TOPIC, config=TopicConfig(retention_bytes=8 * BIG + 8))  # 392 too many
    client.clean_topic(TOPIC)
    assert client.describe_topic(TOPIC).partition_details[0].start_offset == BIG
    assert [first for _, _, first, _ in stored(client)] == [BIG, 2 * BIG]


def test_compaction_inside_a_batch_reads_what_is_left(client: Client) -> None:
    client.create_topic(TOPIC, 1, config=TopicConfig(cleanup="compact"))
    client.produce(TOPIC, [NewRecord(b"%d" % i, b"k%d" % (i % 40)) for i in range(BIG)])
    client.produce(TOPIC, [NewRecord(b"%d" % i, b"new%d" % i) for i in range(BIG)])
    assert client.clean_topic(TOPIC) == BIG - 40
    assert [records for *_, records in stored(client)] == [40, BIG]  # rewritten in place
    got = client.fetch_arrow(TOPIC, 0, 0, max_records=10_000)
    rows = records_of(TOPIC, client.fetch_rows(TOPIC, {0: 0}, max_records=10_000))
    assert got.column("offset").to_pylist() == [row.offset for row in rows]
    assert got.column("key").to_pylist() == [row.key for row in rows]
    assert [row.offset for row in rows[:40]] == list(range(BIG - 40, BIG))
    assert len(rows) == 40 + BIG
    # a read from inside the gap starts at the next record there
    assert client.fetch(TOPIC, {0: 3}, max_records=1)[0].offset == BIG - 40


def test_a_deleted_topic_takes_its_batches(client: Client) -> None:
    client.create_topic(TOPIC, 1)
    client.produce(TOPIC, [NewRecord(b"old") for _ in range(BIG)])
    client.delete_topic(TOPIC)
    assert stored(client) == []
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
def test_pages_of_mixed_batches_equal_rows(
    tmp_path_factory: pytest.TempPathFactory, operations: list[Any], page: int
) -> None:
    """Pages cut anywhere across the mixed log's batches equal fetch_rows."""
    with mixed_log(tmp_path_factory.mktemp("data"), operations) as (client, committed):
        assert assert_same_pages(client, 2, page, built=True) == committed
        for partition in range(2):
            fetched = client.fetch(TOPIC, {partition: 0}, max_records=10_000)
            rows = client.fetch_rows(TOPIC, {partition: 0}, max_records=10_000)
            assert fetched == records_of(TOPIC, rows)


DAMAGES = [
    "UPDATE log SET value_lengths = 3",
    "UPDATE log SET vals = substr(vals, 2)",
    "UPDATE log SET timestamps = CAST('1' AS BLOB)",
    "UPDATE log SET last_offset = last_offset + 1",
]


@pytest.mark.parametrize("damage", DAMAGES)
def test_check_names_a_damaged_batch(invoke: Invoke, data_dir: Path, damage: str) -> None:
    expect(invoke("topic", "create", "t"), 0)
    lines = "".join(f"value-{i}\n" for i in range(500))
    expect(invoke("produce", "t", input=lines), 0)
    expect(invoke("check"), 0)
    damaged = sqlite3.connect(data_dir / DB_FILE)
    with damaged:
        damaged.execute(damage)
    damaged.close()
    result = expect(invoke("check"), ErrorCode.DATA_CORRUPT)
    assert "topic id 1 partition 0's batch at offset 0 is damaged" in result.stdout
    report = json_lines(expect(invoke("check", "--json"), 37).stdout)[0]
    assert report["ok"] is False and len(report["problems"]) == 1


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_batch_reads_as_data_corrupt(data_dir: Path, damage: str) -> None:
    """A batch whose columns do not hold its records is never read as records: the
    read says what is damaged and how to mend it."""
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 1)
        client.produce(TOPIC, [NewRecord(b"%04d" % i) for i in range(BIG)])
        client.produce(TOPIC, [NewRecord(b"v%d" % i) for i in range(BIG)])
    damaged = sqlite3.connect(data_dir / DB_FILE)
    with damaged:
        damaged.execute(damage + " WHERE first_offset = 0")
    damaged.close()
    with connect(data_dir, durability="normal") as client:
        for read in (
            lambda: client.fetch(TOPIC, {0: 0}, max_records=10_000),
            lambda: client.fetch_rows(TOPIC, {0: 5}, max_records=10_000),
            lambda: client.fetch_arrow(TOPIC, 0, 0, max_records=10_000),
        ):
            with pytest.raises(BrokerError) as caught:
                read()
            assert caught.value.code == ErrorCode.DATA_CORRUPT
            assert "batch at offset 0" in caught.value.message
        assert [r.value for r in client.fetch(TOPIC, {0: BIG}, max_records=2)] == [b"v0", b"v1"]


def test_a_large_plain_append_is_stored_in_batches_of_a_thousand_and_reads_as_one(
    client: Client,
) -> None:
    """A fetch of one record reads its whole stored batch: a plain append of 2,500
    records is three (1000, 1000, 500), each read from anywhere; a batch with a
    producer id stays one, as its sequences were sent."""
    client.create_topic(TOPIC, 1)
    values = [b"p%d" % i for i in range(2_500)]
    results = client.produce(TOPIC, values, partition=0)
    assert [r.offset for r in results] == list(range(2_500))
    producer = client.producer(TOPIC)
    producer.send([NewRecord(b"i%d" % i, partition=0) for i in range(2_500)])
    assert [(first, records) for _, _, first, records in stored(client)] == [
        (0, 1000),
        (1000, 1000),
        (2000, 500),
        (2500, 2500),
    ]
    for offset in (0, 999, 1000, 1500, 2499, 2500, 4999):
        (record,) = client.fetch(TOPIC, {0: offset}, max_records=1)
        expected = values[offset] if offset < 2_500 else b"i%d" % (offset - 2_500)
        assert (record.offset, record.value) == (offset, expected)
    assert [r.value for r in client.consume(TOPIC, partition=0)][:2_500] == values
