"""Client.fetch_arrow (broker/columnar.py): a page of a partition as one Arrow
record batch, built by SQLite.

What a user sees: exactly the records fetch_rows gives (offsets, timestamps, keys or
none, values, headers, producer fields, transaction ids), as the Spark connector's
columns, cut at the same record and byte limits; committed records only; consistent
pages while another process appends; the same batch through a transport that has no
columnar fetch; a clear error where pyarrow is missing.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import columnar
from broker.client.client import Client, connect
from broker.client.embedded import EmbeddedTransport
from broker.client.remote import fetched_arrow
from broker.client.served import ServedTransport
from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.protocol import codec
from broker.protocol.messages import Op
from broker.server import server as server_module
from broker.types import NewRecord
from support.mixed_logs import OPERATIONS, TOPIC, mixed_log
from support.page_checks import assert_same_pages
from support.servers import served

PAGE = 7  # records per fetch: pages end inside produce batches


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=OPERATIONS, page=st.sampled_from([1, PAGE, 10_000]))
def test_fetch_arrow_equals_fetch_rows(
    tmp_path_factory: pytest.TempPathFactory, operations: list[Any], page: int
) -> None:
    with mixed_log(tmp_path_factory.mktemp("data"), operations) as (client, committed):
        assert assert_same_pages(client, 2, page, built=True) == committed


@pytest.fixture(params=["embedded", "served"])
def client(data_dir: Path, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client of one single-partition topic: embedded, or through a server that
    builds the batches itself (FETCH_ARROW)."""
    with contextlib.ExitStack() as stack:
        target: str | Path = data_dir
        if request.param == "served":
            target = stack.enter_context(served(data_dir)).address
        opened = stack.enter_context(connect(target, durability="normal"))
        opened.create_topic(TOPIC, 1)
        yield opened


def test_a_page_of_uniform_records_has_every_column(client: Client) -> None:
    client.produce(TOPIC, [NewRecord(b"v%d" % i, timestamp_ms=5_000) for i in range(3)])
    batch = client.fetch_arrow(TOPIC, 0, 1)
    assert batch.to_pylist() == [
        {
            "topic": TOPIC,
            "partition": 0,
            "offset": offset,
            "timestamp": pa.scalar(
                5_000_000, columnar.ARROW_SCHEMA.field("timestamp").type
            ).as_py(),
            "key": None,
            "value": b"v%d" % offset,
            "headers": [],
            "producer_id": 0,
            "generation": 0,
            "sequence": 0,
            "epoch": 0,
            "txn_id": None,
        }
        for offset in (1, 2)
    ]


def test_past_the_end_and_bad_requests(client: Client) -> None:
    client.produce(TOPIC, [b"a", b"b"])
    assert client.fetch_arrow(TOPIC, 0, 2).num_rows == 0
    assert client.fetch_arrow(TOPIC, 0, 99).num_rows == 0
    assert client.fetch_arrow(TOPIC, 0, 0, max_records=0).num_rows == 0
    with pytest.raises(BrokerError) as negative:
        client.fetch_arrow(TOPIC, 0, -1)
    assert negative.value.code is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(BrokerError) as partition:
        client.fetch_arrow(TOPIC, 1, 0)
    assert partition.value.code is ErrorCode.UNKNOWN_PARTITION
    with pytest.raises(BrokerError) as topic:
        client.fetch_arrow("missing", 0, 0)
    assert topic.value.code is ErrorCode.UNKNOWN_TOPIC


def test_an_open_transaction_is_invisible_until_it_commits(client: Client) -> None:
    client.produce(TOPIC, [b"before"])
    with client.transaction("g") as txn:
        txn.produce(TOPIC, [b"in-1", b"in-2"])
        assert client.fetch_arrow(TOPIC, 0, 0).column("value").to_pylist() == [b"before"]
    batch = client.fetch_arrow(TOPIC, 0, 0)
    assert batch.column("value").to_pylist() == [b"before", b"in-1", b"in-2"]
    assert batch.column("txn_id").to_pylist() == [None, txn.txn_id, txn.txn_id]


@pytest.mark.parametrize("value_bytes", [60, 300, 5_000])
def test_the_bytes_limit_cuts_where_fetch_rows_does(data_dir: Path, value_bytes: int) -> None:
    """read_bytes_max 1,000: pages cut after the records within it (at least one). SQLite
    builds the cut page (values up to 60 or 300 bytes); a record past twice the limit
    (up to 5,000) is read as rows: the same records either way."""
    limits = Limits(read_bytes_max=1_000)
    with connect(data_dir, durability="normal", limits=limits) as client:
        client.create_topic(TOPIC, 1)
        rng = random.Random(value_bytes)
        client.produce(
            TOPIC,
            [
                NewRecord(rng.randbytes(rng.randint(1, value_bytes)), rng.choice([None, b"kk"]))
                for _ in range(40)
            ],
        )
        assert assert_same_pages(client, 1, 10_000, built=value_bytes <= 300) == 40
        first = client.fetch_arrow(TOPIC, 0, 0).to_pydict()
        sizes = [len(v) + len(k or b"") for v, k in zip(first["value"], first["key"], strict=True)]
        assert 0 < len(sizes) < 40
        assert sum(sizes) <= 1_000 or len(sizes) == 1


def _append_forever(data_dir: Path, batches: int, ready: Any) -> None:
    with connect(data_dir, durability="normal") as client:
        ready.set()
        for index in range(batches):
            start = index * 50
            client.produce(
                TOPIC,
                [NewRecord(b"%08d" % offset, b"k") for offset in range(start, start + 50)],
            )


def test_pages_stay_whole_while_another_process_appends(data_dir: Path) -> None:
    """Each page is one snapshot: contiguous offsets, every value the one written at
    that offset, and fetch_rows' page once the writer is done."""
    batches = 200
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 1)
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        writer = context.Process(target=_append_forever, args=(data_dir, batches, ready))
        writer.start()
        try:
            assert ready.wait(60)
            offset, pages = 0, 0
            while offset < batches * 50:
                batch = client.fetch_arrow(TOPIC, 0, offset, max_records=120)
                values = batch.column("value").to_pylist()
                assert values == [b"%08d" % o for o in range(offset, offset + batch.num_rows)]
                offset += batch.num_rows
                pages += batch.num_rows > 0
        finally:
            writer.join(60)
        assert writer.exitcode == 0
        assert pages > 1
        assert assert_same_pages(client, 1, 120) == batches * 50


class _RowsOnly:
    """A transport without fetch_arrow (as a served broker is for now)."""

    def __init__(self, inner: EmbeddedTransport) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "fetch_arrow":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_transport_without_columnar_fetch_gives_the_same_batch(data_dir: Path) -> None:
    engine = Engine.open(data_dir, durability="normal", limits=DEFAULT_LIMITS)
    embedded = EmbeddedTransport(engine)
    rows_only = Client(_RowsOnly(embedded), str(data_dir))
    columns = Client(embedded, str(data_dir))
    try:
        columns.create_topic(TOPIC, 1)
        columns.produce(TOPIC, [NewRecord(b"x", b"k", (("h", b"v"),)), NewRecord(b"y")])
        assert not hasattr(rows_only._transport, "fetch_arrow")
        assert rows_only.fetch_arrow(TOPIC, 0, 0).equals(columns.fetch_arrow(TOPIC, 0, 0))
        assert rows_only.fetch_arrow(TOPIC, 0, 2).num_rows == 0
    finally:
        columns.close()


def test_without_pyarrow_fetch_arrow_says_what_to_install(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if never installed
    monkeypatch.delitem(sys.modules, "broker.columnar")
    with pytest.raises(BrokerError) as missing:
        client.fetch_arrow(TOPIC, 0, 0)
    assert missing.value.code is ErrorCode.INVALID_ARGUMENT
    assert "pyarrow" in missing.value.message
    assert "fencelog[spark]" in (missing.value.hint or "")


def mixed_records(rng: random.Random) -> list[NewRecord]:
    """Keys, no keys, headers and producer timestamps mixed in one page."""
    return [
        NewRecord(
            rng.randbytes(rng.randrange(0, 40)),
            rng.choice([None, b"", b"k%d" % i]),
            (("h", b"%d" % i),) if i % 3 == 0 else (),
            timestamp_ms=rng.choice([None, 1_000 + i]),
        )
        for i in range(300)
    ]


def test_a_served_batch_equals_the_embedded_one(data_dir: Path) -> None:
    """FETCH_ARROW: the server builds the batch and sends it as Arrow IPC; it is the
    batch the engine builds in process, page for page."""
    with connect(data_dir, durability="normal") as embedded:
        embedded.create_topic(TOPIC, 1)
        for _ in range(3):
            embedded.produce(TOPIC, mixed_records(random.Random(7)), partition=0)
        pages = [
            embedded.fetch_arrow(TOPIC, 0, offset, max_records=250) for offset in (0, 250, 800)
        ]
    with served(data_dir) as server, connect(server.address) as remote:
        got = [remote.fetch_arrow(TOPIC, 0, offset, max_records=250) for offset in (0, 250, 800)]
    assert [page.num_rows for page in got] == [250, 250, 100]
    for want, have in zip(pages, got, strict=True):
        assert have.equals(want)


def test_a_server_without_pyarrow_is_answered_by_rows(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that cannot build batches does not announce fetch_arrow; the client
    fetches rows and converts them itself: the same batch."""
    records = mixed_records(random.Random(11))
    with served(data_dir) as server, connect(server.address) as remote:
        remote.create_topic(TOPIC, 1)
        remote.produce(TOPIC, records, partition=0)
        columns = remote.fetch_arrow(TOPIC, 0, 5)
    monkeypatch.setattr(server_module, "_features", frozenset)
    with served(data_dir) as server, connect(server.address) as remote:
        rows = remote.fetch_arrow(TOPIC, 0, 5)
    assert columns.num_rows == len(records) - 5
    assert rows.equals(columns)


def test_a_served_fetch_arrow_long_polls_for_new_records(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as remote:
        remote.create_topic(TOPIC, 1)
        transport = remote._transport
        assert isinstance(transport, ServedTransport)
        work = transport.client.fetch_arrow(TOPIC, 0, 0, 10, wait_ms=10_000)
        waiting = transport.run_async(work)
        with connect(server.address) as producer:
            producer.produce(TOPIC, [b"late"])
        ipc = waiting.result(timeout=10)
    assert ipc is not None
    assert columnar.batch_from_ipc(ipc).column("value").to_pylist() == [b"late"]


@pytest.mark.parametrize(
    "page",
    [
        [0, 0, 2, b"ab", b"1\n", 0, b"", -1, [], [0, 0, 0, 0, None]],  # 1 length, 2 records
        [0, 0, 2, b"ab", 1, b"7\nx\n", b"", -1, [], [0, 0, 0, 0, None]],  # not a number
        [0, 0, 1, b"a", 1, 0, b"", -1, [], [0, 0]],  # 2 producer columns
        [0, 0, 2, b"ab", [[1, 1, 0]], 0, b"", -1, [], [0, 0, 0, 0, None]],  # runs short
        [0, 0, 2, b"ab", 1, [[0, 5, 0], [2, 5, 0]], b"", -1, [], [0, 0, 0, 0, None]],
        [0, 0, 2, b"ab", 1, 0, b"", -1, [], [0, 0, [[2, b"x", 1]], 0, None]],
    ],
    ids=[
        "lengths short",
        "timestamp not a number",
        "producer columns",
        "runs short",
        "an empty run",
        "a run of text",
    ],
)
def test_a_malformed_fetched_page_is_a_protocol_error(page: list[object]) -> None:
    """A served reader builds its batch from the page a FETCH returns: a page that does
    not add up is the server's fault, said as such, not a crash of the reader."""
    with pytest.raises(BrokerError) as refused:
        fetched_arrow(TOPIC, {"pages": [{"page": page}]})
    assert refused.value.code is ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize("runs", [True, False], ids=["runs", "text"])
def test_a_fetched_page_becomes_the_batch_the_engine_builds(client: Client, runs: bool) -> None:
    """Through the wire (msgpack both ways), with columns as runs (large batches keep
    their shapes: two timestamps, an idempotent producer's sequences) or, for a client
    before runs, as text."""
    client.produce(TOPIC, [b"v%d" % i for i in range(30)], key=b"k", headers=(("h", b"1"),))
    client.produce(TOPIC, [NewRecord(b"w%d" % i, timestamp_ms=1_000 + i // 50) for i in range(100)])
    client.producer(TOPIC).send([b"p%d" % i for i in range(100)])
    engine_batch = client.fetch_arrow(TOPIC, 0, 5, max_records=1_000)
    if isinstance(client._transport, EmbeddedTransport):
        engine = client._transport.engine
        for start in (5, 30, 130):
            chunks = engine.fetch_pages(TOPIC, {0: start}, 1_000)
            wire = msgpack.packb({"pages": codec.chunks_to_wire(chunks, runs)})
            reply = msgpack.unpackb(wire, raw=False, use_list=False)
            assert fetched_arrow(TOPIC, reply).equals(engine_batch.slice(start - 5))
            records = codec.records_from_chunks(TOPIC, reply["pages"])
            assert records == client.fetch(TOPIC, {0: start}, max_records=1_000)
    assert engine_batch.column("offset").to_pylist() == list(range(5, 230))
    assert engine_batch.column("sequence").to_pylist()[-100:] == list(range(1, 101))


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", columnar.batch_to_ipc(pa.record_batch({"x": [1]}))],
    ids=["empty", "garbage", "another schema"],
)
def test_a_malformed_arrow_reply_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="Arrow"):
        columnar.batch_from_ipc(data)


def test_arrow_pages_cover_a_range_page_by_page(client: Client) -> None:
    client.produce(TOPIC, [b"v%d" % i for i in range(25)])
    pages = list(client.arrow_pages(TOPIC, 0, 3, 23, page_records=10))
    assert [page.num_rows for page in pages] == [10, 10]
    values = [v for page in pages for v in page.column("value").to_pylist()]
    assert values == [b"v%d" % i for i in range(3, 23)]
    tail = list(client.arrow_pages(TOPIC, 0, 20, 25, page_records=10))
    assert [page.column("offset").to_pylist() for page in tail] == [[20, 21, 22, 23, 24]]
    assert list(client.arrow_pages(TOPIC, 0, 7, 7)) == []


def test_arrow_pages_past_the_end_of_a_partition_are_refused(client: Client) -> None:
    client.produce(TOPIC, [b"a", b"b", b"c"])
    pages = client.arrow_pages(TOPIC, 0, 1, 10, page_records=1)
    assert next(pages).column("value").to_pylist() == [b"b"]
    assert next(pages).column("value").to_pylist() == [b"c"]
    with pytest.raises(BrokerError) as short:
        next(pages)
    assert short.value.code is ErrorCode.UNKNOWN_PARTITION
    assert "ends before offset 3" in short.value.message


def test_a_reader_that_stops_early_leaves_the_client_usable(client: Client) -> None:
    """Served, the page after the last one taken was already asked for: its answer is
    dropped, and the next request on the connection gets its own answer."""
    client.produce(TOPIC, [b"v%d" % i for i in range(30)])
    pages = client.arrow_pages(TOPIC, 0, 0, 30, page_records=10)
    assert next(pages).num_rows == 10
    pages.close()
    assert client.fetch_arrow(TOPIC, 0, 25).column("value").to_pylist() == [
        b"v%d" % i for i in range(25, 30)
    ]
    assert client.end_offsets(TOPIC) == [30]


def test_fetch_arrow_asked_of_a_server_without_pyarrow_says_what_to_install(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that asks anyway (it did not look at HELLO's features) gets a clear
    error, not a dropped connection."""
    monkeypatch.setattr(server_module, "_features", frozenset)
    with served(data_dir) as server, connect(server.address) as remote:
        remote.create_topic(TOPIC, 1)
        transport = remote._transport
        assert isinstance(transport, ServedTransport)
        args = {"topic": TOPIC, "partition": 0, "offset": 0, "max_records": 10, "wait_ms": 0}
        with pytest.raises(BrokerError) as refused:
            transport._request(Op.FETCH_ARROW, args)
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT
        assert "pyarrow is not installed" in refused.value.message
        assert "spark extra" in (refused.value.hint or "")
        assert remote.end_offsets(TOPIC) == [0]  # the connection still answers
