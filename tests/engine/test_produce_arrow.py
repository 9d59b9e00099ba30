"""Client.produce_arrow: an Arrow batch's rows appended column by column
(broker.types.RecordColumns), embedded and served.

What a user sees: the records and results produce() gives for the same rows (values,
keys, the partition each lands in, offsets), as one Arrow batch of results; batches
split at the broker's limits; a transaction's rows journaled and invisible until
commit; bad batches refused with a clear error and nothing written; a server before
columns still answered.
"""

from __future__ import annotations

import contextlib
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.server import server as server_module
from broker.types import NewRecord, ProducerFields, RecordColumns
from support.servers import served
from support.values import present

LIMITS = msgspec.structs.replace(DEFAULT_LIMITS, append_records_max=50)


@pytest.fixture(params=["embedded", "served"])
def client(data_dir: Path, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client with two 3-partition topics, "arrow" and "rows", and batches of at most
    50 records: embedded, or through a server."""
    with contextlib.ExitStack() as stack:
        if request.param == "served":
            server = stack.enter_context(served(data_dir, limits=LIMITS))
            opened = stack.enter_context(connect(server.address))
        else:
            opened = stack.enter_context(connect(data_dir, durability="normal", limits=LIMITS))
        opened.create_topic("arrow", 3)
        opened.create_topic("rows", 3)
        yield opened


def stored(client: Client, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [
        (r.partition, r.offset, r.key, r.value)
        for r in client.consume(topic, start=0, max_records=10_000)
    ]


def test_rows_land_as_produce_lands_the_same_records(client: Client) -> None:
    """Keyed rows (some keys null) and rows that name their partition (some null: the
    key chooses): the same records where produce() puts them, and the
    results as one batch of partition, offset and duplicate."""
    count = 130  # three batches of at most 50
    values = [b"value %d" % i for i in range(count)]
    keys = [None if i % 4 == 0 else f"key {i % 7}" for i in range(count)]
    # null: chosen by key (a keyless record's turn depends on the broker's earlier ones)
    partitions = [None if i % 3 == 0 and keys[i] else i % 2 for i in range(count)]
    batch = pa.record_batch(
        [pa.array(values), pa.array(keys, pa.string()), pa.array(partitions, pa.int32())],
        names=["value", "key", "partition"],
    )
    results = client.produce_arrow("arrow", batch)
    expected = client.produce(
        "rows",
        [
            NewRecord(value, None if key is None else key.encode(), (), partition)
            for value, key, partition in zip(values, keys, partitions, strict=True)
        ],
    )
    assert results.schema.names == ["partition", "offset", "duplicate"]
    assert results.to_pylist() == [
        {"partition": r.partition, "offset": r.offset, "duplicate": False} for r in expected
    ]
    assert stored(client, "arrow") == stored(client, "rows")
    assert len(stored(client, "arrow")) == count


def test_values_only_go_round_robin_and_a_table_is_taken_too(client: Client) -> None:
    table = pa.Table.from_batches(
        [pa.record_batch([pa.array([b"a", b"b"])], names=["value"])] * 2
    ).combine_chunks()
    chunked = pa.concat_tables([table, table])  # two chunks
    results = client.produce_arrow("arrow", chunked)
    partitions = results.column("partition").to_pylist()
    assert sorted(partitions.count(p) for p in range(3)) == [2, 3, 3]  # in turn
    assert (
        sorted(present(value) for _, _, _, value in stored(client, "arrow"))
        == [b"a"] * 4 + [b"b"] * 4
    )


def test_string_values_are_their_utf8(client: Client) -> None:
    client.produce_arrow("arrow", pa.table({"value": ["é", "x"], "partition": [1, 1]}))
    assert stored(client, "arrow") == [(1, 0, None, "é".encode()), (1, 1, None, b"x")]


def test_an_empty_batch_appends_nothing(client: Client) -> None:
    results = client.produce_arrow("arrow", pa.table({"value": pa.array([], pa.binary())}))
    assert results.num_rows == 0
    assert results.schema.names == ["partition", "offset", "duplicate"]
    assert stored(client, "arrow") == []


def test_null_typed_dictionary_and_view_columns_are_taken(client: Client) -> None:
    """What pandas and pyarrow make: a key or partition column of nulls only (typed
    null), dictionary-encoded strings (a categorical), string views."""
    client.produce_arrow(
        "arrow",
        pa.table(
            {
                "value": pa.array(["a", "b"]).dictionary_encode(),
                "key": pa.nulls(2),
                "partition": pa.array([2, 2], pa.int64()),
            }
        ),
    )
    client.produce_arrow(
        "arrow", pa.table({"value": pa.array(["c"], pa.string_view()), "partition": [2]})
    )
    client.produce_arrow("arrow", pa.table({"value": [b"d"], "key": [b"k"], "partition": [None]}))
    landed = {value: (partition, key) for partition, _, key, value in stored(client, "arrow")}
    assert landed == {b"a": (2, None), b"b": (2, None), b"c": (2, None), b"d": (1, b"k")}


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (pa.table({"value": [b"a"], "topic": ["t"]}), "it has 'topic'"),
        (
            pa.table([pa.array([b"a"]), pa.array([b"b"])], names=["value", "value"]),
            "each column once: value twice",
        ),
        (pa.table({"key": [b"a"]}), "it has no value"),
        (pa.table({"value": [1, 2]}), "the value column must be binary or string, not int64"),
        (pa.table({"value": [b"a"], "key": [1.5]}), "the key column must be binary or string"),
        (pa.table({"value": [b"a"], "partition": ["0"]}), "the partition column must be integers"),
    ],
)
def test_a_batch_with_wrong_columns_is_refused_and_nothing_written(
    client: Client, table: pa.Table, said: str
) -> None:
    with pytest.raises(BrokerError) as caught:
        client.produce_arrow("arrow", table)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert said in caught.value.message
    assert stored(client, "arrow") == []


def test_a_partition_out_of_range_or_a_value_too_large_writes_nothing(client: Client) -> None:
    with pytest.raises(BrokerError) as caught:
        client.produce_arrow("arrow", pa.table({"value": [b"a", b"b"], "partition": [0, 3]}))
    assert caught.value.code is ErrorCode.UNKNOWN_PARTITION
    huge = b"x" * (LIMITS.record_value_bytes_max + 1)
    with pytest.raises(BrokerError) as caught:
        client.produce_arrow("arrow", pa.table({"value": [b"a", huge]}))
    assert caught.value.code is ErrorCode.RECORD_TOO_LARGE
    with pytest.raises(BrokerError) as caught:
        client.produce_arrow("missing", pa.table({"value": [b"a"]}))
    assert caught.value.code is ErrorCode.UNKNOWN_TOPIC
    assert stored(client, "arrow") == []


def test_a_transactions_rows_are_journaled_and_land_at_commit(client: Client) -> None:
    values = [b"t%d" % i for i in range(120)]
    with client.transaction("g") as txn:
        results = txn.produce_arrow("arrow", pa.table({"value": values, "partition": [2] * 120}))
        assert set(results.column("offset").to_pylist()) == {-1}
        assert stored(client, "arrow") == []
    assert stored(client, "arrow") == [(2, i, None, v) for i, v in enumerate(values)]


def test_a_refused_first_batch_begins_no_transaction(client: Client) -> None:
    """A transaction's first produce_arrow begins it in the same request, as produce()
    does: a batch refused before it is sent begins nothing."""
    txn = client.transaction("g")
    with pytest.raises(BrokerError, match="the value column must be binary or string"):
        txn.produce_arrow("arrow", pa.table({"value": [1, 2]}))
    assert not txn.begun
    with pytest.raises(BrokerError) as caught:
        txn.produce_arrow("arrow", pa.table({"value": [b"x"], "partition": [7]}))
    assert caught.value.code is ErrorCode.UNKNOWN_PARTITION
    assert not txn.begun
    txn.produce_arrow("arrow", pa.table({"value": [b"x"], "partition": [0]}))
    assert txn.begun
    txn.commit()
    assert stored(client, "arrow") == [(0, 0, None, b"x")]


def test_a_joined_member_writes_columns_into_the_owners_transaction(client: Client) -> None:
    txn = client.transaction("g")
    member = client.join_transaction(txn.txn_id, "task-0")
    member.produce_arrow("arrow", pa.table({"value": [b"m1", b"m2"], "partition": [0, 0]}))
    txn.commit()
    assert stored(client, "arrow") == [(0, 0, None, b"m1"), (0, 1, None, b"m2")]


def test_a_server_before_columns_takes_the_rows(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "_features", frozenset)
    with served(data_dir) as server, connect(server.address) as remote:
        remote.create_topic("arrow", 1)
        results = remote.produce_arrow(
            "arrow", pa.table({"value": [b"a", b"b"], "key": ["k", None]})
        )
        assert results.column("offset").to_pylist() == [0, 1]
        assert stored(remote, "arrow") == [(0, 0, b"k", b"a"), (0, 1, None, b"b")]


def test_record_columns_are_a_sequence_of_new_records() -> None:
    columns = RecordColumns([b"a", b"b", b"c"], [None, b"k", None], [None, None, 2])
    records = [
        NewRecord(b"a"),
        NewRecord(b"b", b"k"),
        NewRecord(b"c", None, (), 2),
    ]
    assert len(columns) == 3
    assert columns[1] == records[1]
    assert list(columns) == records
    assert columns == records
    assert columns[::2] == [records[0], records[2]]
    assert isinstance(columns[1:], RecordColumns)
    assert columns.picked([2, 0]) == [records[2], records[0]]
    assert columns.picked(range(1, 3)) == records[1:]
    with pytest.raises(ValueError, match="2 keys for 3 values"):
        RecordColumns([b"a", b"b", b"c"], [None, None])
    with pytest.raises(ValueError, match="1 partitions for 3 values"):
        RecordColumns([b"a", b"b", b"c"], None, [0])
    with pytest.raises(ValueError, match="2 timestamps for 3 values"):
        RecordColumns([b"a", b"b", b"c"], None, None, [1, 2])


def test_record_columns_with_timestamps_keep_them_sliced_picked_and_stored(
    client: Client,
) -> None:
    """A batch of columns with a timestamp each (what the Kafka listener reads a
    producer's batch into): each record keeps its own, through a slice, a pick, and a
    produce embedded as served (served: sent as rows, which carry timestamps)."""
    stamps = array("q", [1_700_000_000_000 + 3 * i for i in range(60)])
    columns = RecordColumns([b"v%d" % i for i in range(60)], None, [1] * 60, stamps)
    assert columns[2] == NewRecord(b"v2", None, (), 1, 1_700_000_000_006)
    assert [r.timestamp_ms for r in columns[58:]] == [1_700_000_000_174, 1_700_000_000_177]
    assert columns.picked([5, 0])[0].timestamp_ms == 1_700_000_000_015
    client.produce("rows", columns)  # 60 records: batches of at most 50
    read = client.consume("rows", start=0, max_records=100)
    assert [(r.partition, r.offset, r.value, r.timestamp_ms) for r in read] == [
        (1, i, b"v%d" % i, 1_700_000_000_000 + 3 * i) for i in range(60)
    ]
    # a column of 32-bit numbers, and one with None (the append's time, as a NewRecord's)
    before_ms = int(time.time() * 1000)
    small = RecordColumns([b"a", b"b", b"c"], None, [2] * 3, array("i", [1, 2, 3]))
    unset = RecordColumns([b"e", b"f", b"g"], None, [2] * 3, [5, None, 7])
    client.produce("rows", small)
    client.produce("rows", unset)
    fetched = client.fetch("rows", {2: 0}, max_records=100)
    assert [(r.value, r.timestamp_ms) for r in fetched if r.value != b"f"] == [
        (b"a", 1),
        (b"b", 2),
        (b"c", 3),
        (b"e", 5),
        (b"g", 7),
    ]
    (appended,) = [r.timestamp_ms for r in fetched if r.value == b"f"]
    assert before_ms <= appended <= int(time.time() * 1000)


def test_the_limits_of_a_client_hold_for_columns_too(data_dir: Path) -> None:
    """Embedded, a batch over append_bytes_max is split, never refused whole."""
    limits = Limits(append_bytes_max=1_000)
    with connect(data_dir, limits=limits) as client:
        client.create_topic("arrow", 1)
        results = client.produce_arrow("arrow", pa.table({"value": [b"x" * 300] * 10}))
        assert results.column("offset").to_pylist() == list(range(10))


def test_an_idempotent_batch_split_into_appends_numbers_each_append_on(client: Client) -> None:
    """produce_arrow() with producer fields sent every append of a split with the same
    first sequence: the appends after the first were duplicates of it, never written."""
    lease = client.lease_pid("arrow", 1)
    fields = ProducerFields(lease.producer_id, lease.generation, lease.sequence + 1)
    batch = pa.table({"value": [b"v%d" % i for i in range(120)], "partition": [1] * 120})
    first = client.produce_arrow("arrow", batch, producer=fields).to_pylist()
    assert [(r["offset"], r["duplicate"]) for r in first] == [(i, False) for i in range(120)]
    records = list(client.consume("arrow", partition=1))
    assert [(r.value, r.sequence) for r in records] == [(b"v%d" % i, i + 1) for i in range(120)]
    retried = client.produce_arrow("arrow", batch, producer=fields).to_pylist()
    assert [(r["offset"], r["duplicate"]) for r in retried] == [(i, True) for i in range(120)]
