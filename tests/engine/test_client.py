"""broker.client: the Python client on an embedded data directory."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

import broker
from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.types import NewRecord, ProducerFields
from support.servers import served
from support.values import present
from support.waiting import wait_until, within


@pytest.fixture
def client(data_dir: Path) -> Iterator[Client]:
    with connect(data_dir) as opened:
        yield opened


@pytest.fixture
def orders(client: Client) -> Client:
    """orders: 3 partitions; p0: a0 a1 a2, p1: empty, p2: c0 c1."""
    client.create_topic("orders", partitions=3)
    client.produce("orders", [b"a0", b"a1", b"a2"], partition=0)
    client.produce("orders", ["c0", "c1"], partition=2)
    return client


def seen(records: Iterator[broker.Record]) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, present(r.value)) for r in records]


def test_round_trip(data_dir: Path) -> None:
    with connect(data_dir) as client:
        client.create_topic("orders", partitions=2)
        results = client.produce("orders", [b"bytes", "text"], partition=1)
        assert [(r.topic, r.partition, r.offset) for r in results] == [
            ("orders", 1, 0),
            ("orders", 1, 1),
        ]
    with connect(str(data_dir)) as client:
        assert [t.name for t in client.list_topics()] == ["orders"]
        assert [r.value for r in client.consume("orders")] == [b"bytes", b"text"]
        assert client.end_offsets("orders") == [0, 2]


def test_produce_with_key_partition_and_headers(client: Client) -> None:
    client.create_topic("orders", partitions=4)
    keyed = client.produce("orders", [b"a", b"b", b"c"], key="k1")
    assert len({r.partition for r in keyed}) == 1
    assert [r.offset for r in keyed] == [0, 1, 2]
    [placed] = client.produce(
        "orders", [b"hello"], partition=3, key=b"\x00", headers=(("trace", b"abc"),)
    )
    assert placed.partition == 3
    [record] = client.consume("orders", partition=3)
    assert (record.key, record.value, record.headers) == (b"\x00", b"hello", (("trace", b"abc"),))
    assert [r.key for r in client.consume("orders", partition=keyed[0].partition)] == [b"k1"] * 3


def test_produce_new_records_choose_their_own_partitions(client: Client) -> None:
    client.create_topic("orders", partitions=3)
    results = client.produce(
        "orders", [NewRecord(b"x", partition=2), NewRecord(b"y", partition=0), b"z"], partition=1
    )
    assert [r.partition for r in results] == [2, 0, 1]


def test_produce_splits_batches_at_append_records_max(data_dir: Path) -> None:
    with connect(data_dir, limits=Limits(append_records_max=3)) as client:
        client.create_topic("orders")
        results = client.produce("orders", [str(i) for i in range(7)])
        assert [r.offset for r in results] == list(range(7))
        assert [r.value for r in client.consume("orders")] == [str(i).encode() for i in range(7)]


@pytest.mark.parametrize("kind", ["embedded", "served"])
def test_an_idempotent_produce_split_into_appends_numbers_each_append_on(
    data_dir: Path, kind: str
) -> None:
    """Given producer fields, produce() sent every append of a split with the same first
    sequence: the appends after the first were answered as duplicates of it (offsets
    0, 1, 2 again) and their records never written."""
    small = Limits(append_records_max=3)
    with contextlib.ExitStack() as stack:
        target = str(data_dir)
        if kind == "served":
            target = stack.enter_context(served(data_dir, limits=small)).address
        client = stack.enter_context(connect(target, limits=small))
        client.create_topic("orders")
        lease = client.lease_pid("orders", 0)
        fields = ProducerFields(lease.producer_id, lease.generation, lease.sequence + 1)
        values = [str(i) for i in range(7)]
        first = client.produce("orders", values, partition=0, producer=fields)
        assert [(r.offset, r.duplicate) for r in first] == [(i, False) for i in range(7)]
        records = list(client.consume("orders"))
        assert [(r.value, r.sequence) for r in records] == [
            (str(i).encode(), i + 1) for i in range(7)
        ]
        retried = client.produce("orders", values, partition=0, producer=fields)
        assert [(r.offset, r.duplicate) for r in retried] == [(i, True) for i in range(7)]
        assert client.lease_pid("orders", 0, lease.producer_id).sequence == 7


def test_consume_from_beginning_reads_every_partition(orders: Client) -> None:
    assert seen(orders.consume("orders")) == [
        (0, 0, b"a0"),
        (0, 1, b"a1"),
        (0, 2, b"a2"),
        (2, 0, b"c0"),
        (2, 1, b"c1"),
    ]
    assert seen(orders.consume("orders", start="beginning")) == seen(orders.consume("orders"))


def test_consume_from_end_reads_nothing(orders: Client) -> None:
    assert list(orders.consume("orders", start="end")) == []


def test_consume_from_an_offset(orders: Client) -> None:
    assert seen(orders.consume("orders", start=2)) == [(0, 2, b"a2")]
    assert seen(orders.consume("orders", partition=2, start=1)) == [(2, 1, b"c1")]
    assert list(orders.consume("orders", start=50)) == []


def test_consume_max_records(orders: Client) -> None:
    assert seen(orders.consume("orders", max_records=4)) == [
        (0, 0, b"a0"),
        (0, 1, b"a1"),
        (0, 2, b"a2"),
        (2, 0, b"c0"),
    ]
    assert list(orders.consume("orders", max_records=0)) == []


def test_consume_chosen_partitions(orders: Client) -> None:
    assert seen(orders.consume("orders", partition=[2, 1])) == [(2, 0, b"c0"), (2, 1, b"c1")]
    assert [r.partition for r in orders.consume("orders", partition=[0, 2])] == [0, 0, 0, 2, 2]


def test_bounded_consume_stops_at_the_end_it_started_with(orders: Client) -> None:
    records = orders.consume("orders", partition=0)
    first = next(records)
    orders.produce("orders", [b"later"], partition=0)
    assert [first.value, *(r.value for r in records)] == [b"a0", b"a1", b"a2"]


def test_follow_returns_after_the_timeout(orders: Client) -> None:
    # it ends by itself once 0.5 s pass without a record (that it waits for records
    # meanwhile is the next test's)
    records = within(10, lambda: seen(orders.consume("orders", follow=True, timeout_s=0.5)))
    assert len(records) == 5


def follow_while(
    client: Client,
    data_dir: Path,
    change: Callable[[Client], object],
    max_records: int | None,
    got: list[tuple[int, int, bytes]] | None = None,
) -> list[tuple[int, int, bytes]]:
    """What a follower of the whole topic "orders", from its end, reads (into `got` as
    it goes) while another connection makes `change` once the follower waits (on the
    WAL, having read to the end); its error, if it ends with one. Bounded: 15 s, though
    it follows for 30."""
    got = [] if got is None else got

    def follow() -> list[tuple[int, int, bytes]]:
        records = client.consume(
            "orders", start="end", follow=True, timeout_s=30, max_records=max_records
        )
        got.extend((r.partition, r.offset, present(r.value)) for r in records)
        return got

    def change_once_it_waits() -> None:
        wait_until(
            lambda: getattr(client._transport, "_watcher", None) is not None,
            message="the follower waits for new records",
        )
        with connect(data_dir) as other:
            change(other)

    writer = threading.Thread(target=change_once_it_waits)
    writer.start()
    try:
        return within(15, follow)
    finally:
        writer.join(timeout=20)


def test_follow_wakes_for_a_record_from_another_connection(orders: Client, data_dir: Path) -> None:
    # it wakes for the record, long before its own 30 s timeout would end it
    records = follow_while(
        orders, data_dir, lambda other: other.produce("orders", [b"late"], partition=1), 1
    )
    assert records == [(1, 0, b"late")]


def test_a_topic_recreated_under_a_follower_is_said_not_skipped(
    orders: Client, data_dir: Path
) -> None:
    """A topic deleted and created again while a follower waits starts its offsets
    again: the follower, at offset 3 of the old one, read the new one's offset 3 on and
    skipped what came before. It says so instead (UNKNOWN_TOPIC, as a served follower
    whose long poll sees the topic go): that it was deleted and created again, or, when
    it looked between the two, that it was deleted."""

    def recreate(other: Client) -> None:
        other.delete_topic("orders")
        other.create_topic("orders", partitions=3)
        other.produce("orders", [b"n0", b"n1", b"n2", b"n3"], partition=0)

    got: list[tuple[int, int, bytes]] = []
    with pytest.raises(BrokerError) as raised:
        follow_while(orders, data_dir, recreate, None, got)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC
    assert raised.value.message in (
        "topic orders was deleted and created again while it was followed: its offsets "
        "started again",
        "topic orders was deleted while it was followed",
    )
    assert got == []


def test_a_topic_deleted_under_a_follower_is_said_deleted(orders: Client, data_dir: Path) -> None:
    with pytest.raises(BrokerError) as raised:
        follow_while(orders, data_dir, lambda other: other.delete_topic("orders"), None)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC
    assert raised.value.message == "topic orders was deleted while it was followed"


def test_a_follower_of_every_partition_reads_partitions_added_under_it(
    orders: Client, data_dir: Path
) -> None:
    """A partition added by `topic alter` while a follower of the whole topic waits is
    read from its beginning, as a Kafka consumer of the topic reads it; a follower of
    named partitions keeps to them."""

    def add_partition(other: Client) -> None:
        other.alter_topic("orders", partitions=4)
        other.produce("orders", [b"n0", b"n1"], partition=3)
        other.produce("orders", [b"old"], partition=1)

    records = follow_while(orders, data_dir, add_partition, 3)
    assert sorted(records) == [(1, 0, b"old"), (3, 0, b"n0"), (3, 1, b"n1")]
    named = within(
        15,
        lambda: seen(orders.consume("orders", partition=[0, 1], follow=True, timeout_s=0.5)),
    )
    assert [(p, v) for p, _, v in named] == [(0, b"a0"), (0, b"a1"), (0, b"a2"), (1, b"old")]


def test_an_embedded_client_shared_by_threads_keeps_every_acknowledged_record(
    client: Client,
) -> None:
    """Threads sharing one embedded client interleaved their SQLite transactions on its
    one connection: acknowledged offsets held other records or none, and errors came back
    as STORAGE_FAILED. Each engine call now has the connection to itself."""
    client.create_topic("shared")
    acked: list[tuple[bytes, int]] = []
    failures: list[BaseException] = []

    def produce(thread: int) -> None:
        try:
            for i in range(150):
                value = b"%d-%d" % (thread, i)
                acked.append((value, client.produce("shared", [value], partition=0)[0].offset))
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    stored = {record.offset: record.value for record in client.consume("shared")}
    assert len(acked) == 600
    assert all(stored.get(offset) == value for value, offset in acked)
    assert sorted(stored) == list(range(600))


def test_closing_a_client_ends_another_threads_follow_and_later_calls(
    orders: Client,
) -> None:
    """close() from another thread raised ValueError (the WAL watch was in use) and left
    the database open; now the follower ends with CONNECTION_FAILED, as served."""
    outcome: list[BaseException | None] = []

    def follow() -> None:
        try:
            list(orders.consume("orders", start="end", follow=True, timeout_s=30))
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        wait_until(
            lambda: getattr(orders._transport, "_watcher", None) is not None,
            message="the follower waits for new records",
        )
        orders.close()
    finally:
        follower.join(timeout=20)
    assert not follower.is_alive()
    [error] = outcome
    assert isinstance(error, BrokerError) and error.code is ErrorCode.CONNECTION_FAILED
    with pytest.raises(BrokerError) as later:
        orders.list_topics()
    assert later.value.code is ErrorCode.CONNECTION_FAILED
    assert later.value.message == "this client is closed"
    orders.close()  # again: nothing to do


def inotify_instances() -> int:
    """This process's inotify instances (each WAL watch holds one)."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


def test_threads_that_followed_and_ended_leave_no_watch_behind(orders: Client) -> None:
    """Each thread that waited kept its WAL watch (an inotify instance) until the client
    closed: a client used from many short-lived threads ran out of instances (128 a
    user by default)."""
    before = inotify_instances()
    release = threading.Event()
    sleepers = []
    try:
        for _ in range(6):
            follower = threading.Thread(
                target=lambda: list(
                    orders.consume("orders", start="end", follow=True, timeout_s=0.05)
                )
            )
            follower.start()
            follower.join(timeout=20)
            # a thread that lives on takes the ended one's ident: the next one gets another
            sleepers.append(threading.Thread(target=release.wait, args=(20,)))
            sleepers[-1].start()
        assert inotify_instances() - before <= 1
    finally:
        release.set()
        for sleeper in sleepers:
            sleeper.join(timeout=20)


def test_a_fetch_waits_no_longer_than_the_broker_allows(data_dir: Path) -> None:
    """A server answers a long poll after fetch_wait_ms_max at most; embedded, a fetch
    waited as long as it was asked (here, about eleven days)."""
    limits = replace(DEFAULT_LIMITS, fetch_wait_ms_max=200)
    with connect(data_dir, limits=limits) as client:
        client.create_topic("quiet")
        assert within(10, lambda: client.fetch("quiet", {0: 0}, wait_ms=10**9)) == []


@pytest.mark.parametrize("start", [-1, "middle", True, 1.5, None])
def test_invalid_start_is_invalid_argument(orders: Client, start: Any) -> None:
    with pytest.raises(BrokerError) as excinfo:
        list(orders.consume("orders", start=start))
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT


def test_negative_max_records_is_invalid_argument(orders: Client) -> None:
    with pytest.raises(BrokerError) as excinfo:
        list(orders.consume("orders", max_records=-1))
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT


def test_unknown_partition_and_topic(orders: Client) -> None:
    with pytest.raises(BrokerError) as excinfo:
        list(orders.consume("orders", partition=[0, 3]))
    assert excinfo.value.code is ErrorCode.UNKNOWN_PARTITION
    with pytest.raises(BrokerError) as excinfo:
        list(orders.consume("nope"))
    assert excinfo.value.code is ErrorCode.UNKNOWN_TOPIC
    with pytest.raises(BrokerError) as excinfo:
        orders.produce("orders", [b"x"], partition=3)
    assert excinfo.value.code is ErrorCode.UNKNOWN_PARTITION


def test_negative_wait_is_invalid_argument(orders: Client) -> None:
    with pytest.raises(BrokerError) as excinfo:
        orders.fetch("orders", {0: 0}, wait_ms=-1)
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "target", ["tcp://", "tcp://localhost", "tcp://localhost:notaport", "http://example.com:80"]
)
def test_malformed_broker_address_is_invalid_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    # connect() parses the address before any connection attempt: no network here.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BrokerError) as excinfo:
        connect(target)
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert target in excinfo.value.message
    assert list(tmp_path.iterdir()) == []  # nothing created as a data directory


@pytest.mark.parametrize("target", ["data", "tcp://127.0.0.1:9"])
def test_unknown_durability_is_invalid_argument_embedded_or_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BrokerError) as excinfo:
        connect(target, durability="sometimes")  # type: ignore[arg-type]
    assert excinfo.value.code is ErrorCode.INVALID_ARGUMENT
    assert excinfo.value.message == "unknown durability 'sometimes'"
    assert list(tmp_path.iterdir()) == []  # nothing created as a data directory


def test_broker_from_environment(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FENCELOG_BROKER", str(data_dir))
    with connect(None) as client:
        assert client.target == str(data_dir)
        client.create_topic("from-env")
    with broker.open(data_dir) as engine:
        assert [t.name for t in engine.list_topics()] == ["from-env"]
    assert not (tmp_path / ".fencelog").exists()


def test_default_broker_is_dot_fencelog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCELOG_BROKER", raising=False)
    with connect() as client:
        client.create_topic("here")
    with broker.open(tmp_path / ".fencelog") as engine:
        assert [t.name for t in engine.list_topics()] == ["here"]
