"""Client.consume with its fetches kept ahead (broker/client/client.py `_FetchesAhead`).

Served, the next page's fetch leaves before the caller iterates the current one, and a
consumer of one partition whose last page was full also sends a guessed fetch for the
page after; a guess whose positions turn out wrong is dropped. Embedded, a fetch ahead
runs when it is taken. Whatever travels ahead, a user sees the same thing: every record
from its start exactly once, in offset order per partition, up to max_records or the end
offsets as they were at the start, and a consumer that stops leaves nothing long-polling
in front of the client's next call.

Small limits (PAGE records a fetch, READ_BYTES a partition's share of one) make a few
hundred records several pages, so each test runs embedded and served in well under a
second (the follow tests wait out their short idle timeouts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker.client.client import Client, connect
from broker.limits import DEFAULT_LIMITS
from broker.types import Record
from support.servers import served
from support.values import present
from support.waiting import within

PAGE = 50  # read_records_max: records in one fetch
READ_BYTES = 4_000  # read_bytes_max: about this many bytes from each partition per fetch
LIMITS = replace(DEFAULT_LIMITS, read_records_max=PAGE, read_bytes_max=READ_BYTES)
QUICK_S = 5.0  # a call that must not wait behind a long poll (which would take POLL_MS)
POLL_MS = 20_000

pytestmark = pytest.mark.timeout(60)


# brokers, clients and records ----------------------------------------------------------


@pytest.fixture(params=["embedded", "served"])
def target(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[str]:
    """Where clients connect: the data directory itself, or a server on 127.0.0.1."""
    if request.param == "embedded":
        yield str(data_dir)
    else:
        with served(data_dir, limits=LIMITS) as server:
            yield server.address


@pytest.fixture
def served_target(data_dir: Path) -> Iterator[str]:
    with served(data_dir, limits=LIMITS) as server:
        yield server.address


@pytest.fixture
def client(target: str) -> Iterator[Client]:
    with connect(target, limits=LIMITS) as opened:
        assert opened.limits.read_records_max == PAGE
        assert opened.limits.read_bytes_max == READ_BYTES
        yield opened


def value_of(partition: int, offset: int, padding: int = 0) -> bytes:
    return f"p{partition}-o{offset}|".encode() + b"x" * padding


def fill(
    client: Client,
    topic: str,
    count: int,
    *,
    partition: int = 0,
    first: int = 0,
    padding: Callable[[int], int] = lambda offset: 0,
) -> list[tuple[int, int, bytes]]:
    """Append `count` records to one partition, whose next offset is `first`; what a
    consumer should see of them: (partition, offset, value)."""
    offsets = range(first, first + count)
    values = [value_of(partition, n, padding(n)) for n in offsets]
    results = client.produce(topic, values, partition=partition)
    assert [(r.partition, r.offset) for r in results] == [(partition, n) for n in offsets]
    return [(partition, n, value) for n, value in zip(offsets, values, strict=True)]


def seen(records: Iterable[Record]) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, present(r.value)) for r in records]


def per_partition(records: list[tuple[int, int, bytes]]) -> dict[int, list[int]]:
    """Each partition's offsets in the order they were consumed."""
    offsets: dict[int, list[int]] = {}
    for partition, offset, _ in records:
        offsets.setdefault(partition, []).append(offset)
    return offsets


# one partition, several pages ----------------------------------------------------------


@pytest.mark.parametrize("count", [1, PAGE, PAGE + 1, 3 * PAGE + 17])
def test_one_partition_is_read_once_in_order_across_pages(client: Client, count: int) -> None:
    client.create_topic("t")
    expected = fill(client, "t", count)
    assert seen(client.consume("t")) == expected
    assert seen(client.consume("t", partition=0, start="beginning")) == expected
    # the same client reads it again, and so does a second client
    assert seen(client.consume("t")) == expected
    with connect(client.target, limits=LIMITS) as other:
        assert seen(other.consume("t")) == expected


def test_an_empty_topic_and_a_start_at_the_end_yield_nothing(client: Client) -> None:
    client.create_topic("t")
    assert list(client.consume("t")) == []
    fill(client, "t", 2 * PAGE)
    assert list(client.consume("t", start="end")) == []
    assert list(client.consume("t", start=2 * PAGE)) == []
    assert list(client.consume("t", start=10 * PAGE)) == []


@pytest.mark.parametrize(
    "max_records",
    [
        0,
        1,
        PAGE,  # a page boundary
        PAGE + 23,  # mid-page
        2 * PAGE,  # a page boundary
        2 * PAGE + 1,
        3 * PAGE,  # the last full page
        3 * PAGE + 10,  # the whole log: it ends mid-page
        10 * PAGE,  # more than there is
    ],
)
def test_max_records_ends_mid_page_or_at_a_boundary(client: Client, max_records: int) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 3 * PAGE + 10)
    got = seen(client.consume("t", max_records=max_records))
    assert got == expected[:max_records]
    assert len(got) == min(max_records, len(expected))


@pytest.mark.parametrize("max_records", [PAGE, PAGE + 13, 2 * PAGE])
def test_max_records_from_an_offset_in_the_middle(client: Client, max_records: int) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 4 * PAGE)
    got = seen(client.consume("t", start=PAGE + 7, max_records=max_records))
    assert got == expected[PAGE + 7 : PAGE + 7 + max_records]


# pages cut short by read_bytes_max --------------------------------------------------------


def blocks(offset: int) -> int:
    """Runs of 70 small records and 70 large ones: a full page of small records is
    followed by one cut short by bytes, so the guessed page after it is wrong."""
    return 1_000 if (offset // 70) % 2 else 0


def mixed(offset: int) -> int:
    """Sizes that change from record to record: some pages are full, some cut short
    (so some guesses are wrong), and now and then one record is larger than a whole
    page's bytes (a page always holds at least one record)."""
    if offset % 97 == 96:
        return 2 * READ_BYTES
    if offset % 31 == 30:
        return 1_800
    return (offset % 5) * 10


@pytest.mark.parametrize("padding", [blocks, mixed], ids=["blocks", "mixed"])
def test_pages_cut_by_bytes_still_yield_every_record_once_in_order(
    client: Client, padding: Callable[[int], int]
) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 400, padding=padding)
    # the broker really does cut pages short here: a plain fetch from a large run
    first_large = next(n for n in range(400) if padding(n) >= 1_000)
    assert len(client.fetch("t", {0: first_large})) < PAGE
    assert seen(client.consume("t")) == expected
    for start in (1, 49, 50, 69, 71, 140, 333):
        assert seen(client.consume("t", start=start)) == expected[start:]
    for max_records in (PAGE, 2 * PAGE, 123, 399, 400):
        assert seen(client.consume("t", max_records=max_records)) == expected[:max_records]
    assert seen(client.consume("t", start=60, max_records=PAGE)) == expected[60 : 60 + PAGE]


# several partitions ----------------------------------------------------------------------


COUNTS = {0: 2 * PAGE + 5, 1: 0, 2: PAGE, 3: 7, 4: 3 * PAGE}


@pytest.fixture
def spread(client: Client) -> dict[int, list[tuple[int, int, bytes]]]:
    """A topic `s` of 5 partitions with the records of COUNTS; each partition's records."""
    client.create_topic("s", partitions=len(COUNTS))
    expected = {}
    for partition, count in COUNTS.items():
        # a large record now and then: pages cut by bytes, per partition
        expected[partition] = fill(
            client,
            "s",
            count,
            partition=partition,
            padding=lambda n: 1_200 if n % 23 == 22 else 0,
        )
    return expected


def test_several_partitions_are_read_once_each_in_offset_order(
    client: Client, spread: dict[int, list[tuple[int, int, bytes]]]
) -> None:
    got = seen(client.consume("s"))
    assert len(got) == sum(COUNTS.values())
    assert sorted(got) == sorted(r for records in spread.values() for r in records)
    for partition, records in spread.items():
        assert [r for r in got if r[0] == partition] == records
    assert per_partition(got) == {p: list(range(c)) for p, c in COUNTS.items() if c}


@pytest.mark.parametrize("max_records", [1, PAGE, PAGE + 3, 2 * PAGE + 5, 200])
def test_several_partitions_with_max_records(
    client: Client, spread: dict[int, list[tuple[int, int, bytes]]], max_records: int
) -> None:
    got = seen(client.consume("s", max_records=max_records))
    assert len(got) == min(max_records, sum(COUNTS.values()))
    assert len(set(got)) == len(got)
    for partition, offsets in per_partition(got).items():
        assert offsets == list(range(len(offsets))), partition  # a prefix, in order
        assert [r for r in got if r[0] == partition] == spread[partition][: len(offsets)]


def test_a_subset_of_partitions_from_an_offset_in_the_middle(
    client: Client, spread: dict[int, list[tuple[int, int, bytes]]]
) -> None:
    start = 37
    for chosen in ([4, 0], [0, 4], [2, 3, 4], [1, 3], [4]):
        got = seen(client.consume("s", partition=chosen, start=start))
        expected = [r for p in chosen for r in spread[p][start:]]
        assert sorted(got) == sorted(expected), chosen
        for partition in chosen:
            assert [r for r in got if r[0] == partition] == spread[partition][start:]
    assert seen(client.consume("s", partition=4, start=start)) == spread[4][start:]
    got = seen(client.consume("s", partition=[4], start=start, max_records=PAGE))
    assert got == spread[4][start : start + PAGE]
    assert seen(client.consume("s", partition=[0, 4], start=PAGE)) == (
        spread[0][PAGE:] + spread[4][PAGE:]
    )


def test_two_consumers_on_one_client_taken_in_turns(
    client: Client, spread: dict[int, list[tuple[int, int, bytes]]]
) -> None:
    """Served, both keep fetches in flight on one connection; each gets its own."""
    first = client.consume("s", partition=4)
    second = client.consume("s", partition=[0, 2], start=3)
    got_first: list[Record] = []
    got_second: list[Record] = []
    going = True
    while going:  # one record of each in turn, until both have ended
        one, two = next(first, None), next(second, None)
        got_first += [one] if one is not None else []
        got_second += [two] if two is not None else []
        going = one is not None or two is not None
    assert seen(got_first) == spread[4]
    assert seen(got_second) == spread[0][3:] + spread[2][3:]


# a consumer that stops early --------------------------------------------------------------


@pytest.mark.parametrize("count", [PAGE - 20, PAGE, 2 * PAGE, 3 * PAGE + 1])
@pytest.mark.parametrize("stop_after", ["one record", "one page"])
def test_a_follower_that_breaks_off_leaves_no_long_poll_in_flight(
    served_target: str, count: int, stop_after: str
) -> None:
    """follow=True with a long poll_ms: a fetch ahead that waited for new records would
    hold every later reply on this connection for about POLL_MS."""
    with connect(served_target) as client:
        client.create_topic("t")
        expected = fill(client, "t", count)
        wanted = 1 if stop_after == "one record" else min(count, PAGE)
        taken: list[Record] = []
        for record in client.consume("t", follow=True, poll_ms=POLL_MS):
            taken.append(record)
            if len(taken) == wanted:
                break
        assert seen(taken) == expected[:wanted]
        assert within(QUICK_S, lambda: client.describe_topic("t")).records == count
        assert within(QUICK_S, lambda: seen(client.consume("t"))) == expected
        later = fill(client, "t", 3, first=count)
        assert within(QUICK_S, lambda: seen(client.consume("t", start=count))) == later
        within(QUICK_S, client.close)


def test_an_abandoned_bounded_consume_does_not_disturb_the_next(client: Client) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 3 * PAGE)
    abandoned: list[Iterator[Record]] = []  # left suspended, their fetches ahead sent
    for stop in (1, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE + 7):
        records = client.consume("t")
        abandoned.append(records)
        assert seen(next(records) for _ in range(stop)) == expected[:stop]
        assert seen(client.consume("t", start=stop)) == expected[stop:]
        assert client.describe_topic("t").records == len(expected)
    abandoned.clear()
    assert seen(client.consume("t")) == expected


# follow, and records appended while reading -----------------------------------------------


def test_follow_gets_records_produced_meanwhile_then_ends_after_the_idle_timeout(
    client: Client,
) -> None:
    client.create_topic("t")
    expected = fill(client, "t", PAGE + 10)
    idle_s = 0.5
    started = threading.Event()
    produced: list[tuple[int, int, bytes]] = []
    failures: list[BaseException] = []

    def produce_later() -> None:
        try:
            with connect(client.target, limits=LIMITS) as other:
                assert started.wait(10)
                # pacing, well within idle_s: the follower most likely waits by now, and
                # the records come in two bursts
                time.sleep(0.1)
                produced.extend(fill(other, "t", 2 * PAGE + 3, first=PAGE + 10))
                time.sleep(0.1)
                produced.extend(fill(other, "t", 5, first=3 * PAGE + 13))
        except BaseException as exc:
            failures.append(exc)

    producer = threading.Thread(target=produce_later, name="test-producer", daemon=True)
    producer.start()
    got: list[tuple[int, int, bytes]] = []

    def follow() -> None:
        for record in client.consume("t", follow=True, timeout_s=idle_s, poll_ms=200):
            got.extend(seen([record]))
            if len(got) == len(expected):
                started.set()

    try:
        within(20, follow)  # it ends by itself, idle_s after the last records
    finally:
        started.set()
        producer.join(20)
    assert not producer.is_alive() and not failures, failures
    assert got == expected + produced  # nothing missed: it did not end before idle_s
    assert len(got) == 3 * PAGE + 18


def test_follow_with_a_poll_longer_than_the_timeout_ends_on_time(client: Client) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 2 * PAGE)
    got = within(
        QUICK_S, lambda: seen(client.consume("t", follow=True, timeout_s=0.2, poll_ms=POLL_MS))
    )
    assert got == expected


def test_follow_stops_at_max_records_without_waiting(client: Client) -> None:
    client.create_topic("t")
    expected = fill(client, "t", 2 * PAGE)

    def follow_up_to(max_records: int) -> list[tuple[int, int, bytes]]:
        return seen(client.consume("t", follow=True, max_records=max_records, poll_ms=POLL_MS))

    for max_records in (PAGE, PAGE + 1, 2 * PAGE):
        got = within(QUICK_S, partial(follow_up_to, max_records))
        assert got == expected[:max_records]


def test_follow_yields_records_that_arrived_within_the_timeout_of_the_last_ones(
    client: Client,
) -> None:
    """The caller takes longer than timeout_s over a page; records another client
    produced soon after that page (well within timeout_s of it) are there when the
    caller asks for more, so they are yielded before the iterator ends."""
    client.create_topic("t")
    first = fill(client, "t", 10)
    got: list[tuple[int, int, bytes]] = []
    later: list[tuple[int, int, bytes]] = []
    with connect(client.target, limits=LIMITS) as other:
        for record in client.consume("t", follow=True, timeout_s=0.3, poll_ms=100):
            got += seen([record])
            if got == first:
                # Served, replies come in order: once this one is back, so is that of any
                # fetch sent ahead before the page was handed out.
                client.describe_topic("t")
                later = fill(other, "t", 5, first=10)  # well within timeout_s
                time.sleep(0.5)  # on purpose: the caller is busy past timeout_s
    assert got == first + later


@pytest.mark.parametrize("count", [PAGE, 2 * PAGE, 2 * PAGE + 20, 3 * PAGE - 1])
def test_a_bounded_read_stops_at_the_end_offsets_it_started_with(
    client: Client, count: int
) -> None:
    """Records appended while a consume (follow=False) pages through are not read, even
    though its later pages are fetched after they were written."""
    client.create_topic("t")
    expected = fill(client, "t", count)
    got: list[tuple[int, int, bytes]] = []
    with connect(client.target, limits=LIMITS) as other:
        for record in client.consume("t"):
            got += seen([record])
            if record.offset % PAGE == 0:  # the first record of each page
                end = client.end_offsets("t")[0]
                fill(other, "t", PAGE + 5, first=end)
    assert got == expected
    assert client.end_offsets("t")[0] > count
    assert seen(client.consume("t", max_records=count)) == expected


def test_a_bounded_read_of_several_partitions_stops_at_their_start_ends(
    client: Client, spread: dict[int, list[tuple[int, int, bytes]]]
) -> None:
    got: list[tuple[int, int, bytes]] = []
    with connect(client.target, limits=LIMITS) as other:
        for record in client.consume("s"):
            got += seen([record])
            if len(got) % 20 == 1:
                ends = other.end_offsets("s")
                for partition in (0, 1, 4):
                    fill(other, "s", 30, partition=partition, first=ends[partition])
    assert sorted(got) == sorted(r for records in spread.values() for r in records)
    for partition, records in spread.items():
        assert [r for r in got if r[0] == partition] == records
