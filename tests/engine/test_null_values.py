"""A null record value (Kafka's tombstone) kept distinct from an empty one, end to end:
produced and read back as None embedded and served, from any offset inside a batch, in
a transaction, as Arrow columns, and removed by compaction as the tombstone it is; a
served client that did not say it reads nulls gets them as empty values, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

from broker import columnar, rows
from broker.client.async_client import AsyncClient
from broker.client.client import Client, connect
from broker.client.remote import fetch_args
from broker.client.served import Address
from broker.errors import BrokerError, ErrorCode
from broker.protocol import codec
from broker.protocol.messages import Op
from broker.server import server as server_module
from broker.storage import batches
from broker.types import NewRecord
from support.servers import HOST, served

VALUES: list[bytes | None] = [b"a", None, b"", None, b"bb", None]


@pytest.fixture(params=["embedded", "served"])
def client(data_dir: Path, request: pytest.FixtureRequest) -> Iterator[Client]:
    with contextlib.ExitStack() as stack:
        if request.param == "served":
            server = stack.enter_context(served(data_dir))
            opened = stack.enter_context(connect(server.address))
        else:
            opened = stack.enter_context(connect(data_dir))
        opened.create_topic("t", 1)
        yield opened


def values(client: Client, start: int = 0) -> list[bytes | None]:
    return [r.value for r in client.consume("t", start=start, max_records=1000)]


def test_null_values_read_back_as_none_and_empty_values_as_empty(client: Client) -> None:
    client.produce("t", VALUES)  # one batch: its value lengths hold -1s
    client.produce("t", [None])  # the one-record produce
    client.produce("t", [NewRecord(None, b"k"), NewRecord(b"v", b"k")])
    client.produce("t", [None] * 20)  # every value null: never a uniform length
    assert values(client) == [*VALUES, None, None, b"v", *[None] * 20]
    assert values(client, start=3) == [*VALUES[3:], None, None, b"v", *[None] * 20]
    keyed = client.fetch("t", {0: 7}, max_records=2)
    assert [(r.key, r.value) for r in keyed] == [(b"k", None), (b"k", b"v")]


def test_a_transactions_null_values_land_null_at_commit(client: Client) -> None:
    with client.transaction("g") as txn:
        txn.produce("t", [None, b"x", b""])
    assert values(client) == [None, b"x", b""]


def test_arrow_columns_keep_null_values(client: Client) -> None:
    client.produce_arrow("t", pa.table({"value": [b"a", None, b""]}))
    client.produce_arrow("t", pa.table({"value": pa.nulls(2)}))  # a column of nulls only
    assert values(client) == [b"a", None, b"", None, None]
    fetched = client.fetch_arrow("t", 0, 1)
    assert fetched.column("value").to_pylist() == [None, b"", None, None]
    assert fetched.schema.field("value").nullable


def test_a_served_client_before_nulls_reads_them_as_empty(data_dir: Path) -> None:
    """An older client sends FETCH without "nulls": it gets the page it can read, each
    null value given as an empty one (what it got before nulls were kept)."""
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic("t", 1)
        client.produce("t", VALUES)
        transport = client._transport
        old = fetch_args("t", {0: 0}, 100, 0, (), pages=True)
        del old["nulls"]
        reply = transport._request(Op.FETCH, old)  # type: ignore[attr-defined]
        assert [r.value for r in codec.records_from_chunks("t", reply["pages"])] == [
            b"a",
            b"",
            b"",
            b"",
            b"bb",
            b"",
        ]
        rows_only = {**old, "pages": False}
        reply = transport._request(Op.FETCH, rows_only)  # type: ignore[attr-defined]
        assert [row[4] for row in reply["rows"]] == [b"a", b"", b"", b"", b"bb", b""]


NOBODY: batches.Producer = (0, 0, 0, 0, None)


def stored_of(row: tuple[object, ...]) -> batches.Stored:
    return batches.Stored(*cast(Any, row))


def test_a_packed_batch_keeps_nulls_as_minus_one_and_checks_clean() -> None:
    """storage/batches.py, pure: the stored columns of a batch with null values, read
    back whole and from inside it, sized without bytes for a null, and found sound; a
    uniform length of -1 (which pack never writes) is damage."""
    given = [b"ab", None, b"", None, b"c"]
    stored = stored_of(batches.pack((1, 0, 10), given, None, None, 5, NOBODY))
    assert (stored.value_lengths, stored.vals, stored.size) == (b"2\n-1\n0\n-1\n1", b"abc", 3)
    whole = batches.Part(stored, 0, 5)
    assert batches.values(whole) == [b"ab", None, b"", None, b"c"]
    assert batches.values(batches.Part(stored, 1, 4)) == [None, b"", None]
    assert batches.sizes(whole) == [2, 0, 0, 0, 1]
    assert batches.damage(stored) is None and batches.unreadable(stored) is None
    page = batches.page(0, 11, [batches.Part(stored, 1, 5)])
    assert [r.value for r in rows.records_of_page("t", page)] == [None, b"", None, b"c"]
    one = stored_of(batches.pack_one((1, 0, 0), None, 5, NOBODY))
    assert batches.values(batches.Part(one, 0, 1)) == [None]
    every_null = stored_of(batches.pack((1, 0, 0), [None] * 3, None, None, 5, NOBODY))
    assert every_null.value_lengths == b"-1\n-1\n-1"
    assert batches.damage(every_null._replace(value_lengths=-1)) is not None


def test_fetch_arrow_gives_nulls_to_a_client_that_reads_them_and_empty_to_one_before(
    data_dir: Path,
) -> None:
    """FETCH_ARROW (the server builds the Arrow batch): null where the request says it
    reads nulls, as AsyncClient's does; empty in a request without "nulls"."""
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic("t", 1)
        client.produce("t", VALUES)

        async def both() -> tuple[bytes | None, Any]:
            reader = AsyncClient(Address("tcp", HOST, server.port))
            try:
                ipc = await reader.fetch_arrow("t", 0, 0, 100)
                old = {"topic": "t", "partition": 0, "offset": 0, "max_records": 100}
                reply = await reader.request(Op.FETCH_ARROW, {**old, "wait_ms": 0, "fences": []})
                return ipc, reply["arrow"]
            finally:
                await reader.close()

        ipc, before = asyncio.run(both())
    assert ipc is not None
    assert columnar.batch_from_ipc(ipc).column("value").to_pylist() == VALUES
    empty = [b"" if value is None else value for value in VALUES]
    assert columnar.batch_from_ipc(before).column("value").to_pylist() == empty


def test_a_server_before_null_values_is_not_sent_one(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose HELLO does not announce null values would refuse the request as
    malformed: the client names the record instead, and sends nothing."""
    monkeypatch.setattr(server_module, "_features", frozenset)
    with served(data_dir) as server, connect(server.address) as client:
        client.create_topic("t", 1)
        with pytest.raises(BrokerError) as refused:
            client.produce("t", [b"a", None])
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT
        assert "record 1 has a null value, which this server cannot store" in str(refused.value)
        with pytest.raises(BrokerError, match="record 0 has a null value"):
            client.produce_arrow("t", pa.table({"value": pa.nulls(20, pa.binary())}))
        client.produce("t", [b"a", b""])
        assert values(client) == [b"a", b""]
