"""What an operator's view reads (`fencelog top`): Client.consumer_groups(), every group's
committed offsets, and Client.sessions(), the sessions the broker knows and whether
each is live; embedded and served alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.rows import GroupOffsetRow
from support.servers import served
from support.waiting import wait_until


@pytest.fixture(params=["embedded", "served"])
def client(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[Client]:
    with contextlib.ExitStack() as stack:
        target = str(data_dir)
        if request.param == "served":
            target = stack.enter_context(served(data_dir)).address
        yield stack.enter_context(connect(target))


def test_consumer_groups_lists_every_groups_offsets_by_group_topic_partition(
    client: Client,
) -> None:
    client.create_topic("orders", partitions=3)
    client.create_topic("audit")
    client.commit_offsets("billing", "orders", {2: 7, 0: 4})
    client.commit_offsets("billing", "audit", {0: 1})
    client.commit_offsets("archive", "orders", {1: 2})
    found = client.consumer_groups()
    assert [(r.group, r.topic, r.partition, r.next_offset) for r in found] == [
        ("archive", "orders", 1, 2),
        ("billing", "audit", 0, 1),
        ("billing", "orders", 0, 4),
        ("billing", "orders", 2, 7),
    ]
    assert all(isinstance(r, GroupOffsetRow) and r.committed_ms > 0 for r in found)
    assert len(client.consumer_groups(limit=2)) == 2


def test_consumer_groups_forget_a_deleted_topic(client: Client) -> None:
    client.create_topic("orders")
    client.commit_offsets("billing", "orders", {0: 3})
    client.delete_topic("orders")
    assert client.consumer_groups() == []


def test_a_negative_limit_is_invalid_argument(client: Client) -> None:
    for call in (client.consumer_groups, client.sessions):
        with pytest.raises(BrokerError) as raised:
            call(limit=-1)
        assert raised.value.code is ErrorCode.INVALID_ARGUMENT


def test_sessions_show_a_claiming_client_live_and_forget_it_once_closed(
    client: Client, data_dir: Path
) -> None:
    with connect(data_dir) as other:
        other.own("workers", ["w1"])
        mine = other.session_id
        [seen] = [s for s in client.sessions() if s.session_id == mine]
        assert seen.live and not seen.severed
        if client.served:  # a directory a server owns is reached through the server
            assert (seen.kind, seen.pid) == ("connection", None)
        else:
            assert seen.kind == "process" and seen.pid is not None
            assert seen.started_ms is not None and seen.heartbeat_ms is not None
    # served, the server ends the connection's session as it sees the connection close
    wait_until(lambda: mine not in {s.session_id for s in client.sessions()}, 10.0)


def test_served_sessions_include_every_open_connection(data_dir: Path) -> None:
    with served(data_dir) as server, connect(server.address) as one:
        one.list_topics()
        with connect(server.address) as two:
            two.list_topics()
            ids = server.wait_sessions(2)
            found = {s.session_id: s for s in one.sessions()}
            assert ids <= set(found)
            assert all(found[i].live and found[i].kind == "connection" for i in ids)
