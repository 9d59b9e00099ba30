"""Offset by time (broker/storage/timestamps.py): a binary search over the primary key
that answers as a scan does while timestamps ascend, and a crossing of the time when
they do not."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.storage.timestamps import offset_for_time

TABLE = (
    "CREATE TABLE records (topic_id INTEGER, partition INTEGER, offset INTEGER, "
    "timestamp_ms INTEGER, PRIMARY KEY (topic_id, partition, offset)) WITHOUT ROWID"
)


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.execute(TABLE)
    yield connection
    connection.close()


def _fill(conn: sqlite3.Connection, stamps: dict[int, int]) -> None:
    conn.execute("DELETE FROM records")
    conn.executemany("INSERT INTO records VALUES (1, 0, ?, ?)", sorted(stamps.items()))
    conn.execute("INSERT INTO records VALUES (1, 1, 0, 0)")  # another partition: never seen


def _scan(stamps: dict[int, int], at_ms: int) -> tuple[int, int] | None:
    return next(((o, t) for o, t in sorted(stamps.items()) if t >= at_ms), None)


@given(
    st.lists(st.integers(0, 50), max_size=40),
    st.sets(st.integers(0, 60), max_size=20),
    st.integers(-5, 60),
)
def test_ascending_timestamps_answer_as_a_scan(
    steps: list[int], gaps: set[int], at_ms: int
) -> None:
    stamps, now = {}, 0
    for offset, step in enumerate(steps):
        now += step
        if offset not in gaps:  # deleted or compacted away
            stamps[offset] = now
    with sqlite3.connect(":memory:") as conn:
        conn.execute(TABLE)
        _fill(conn, stamps)
        assert offset_for_time(conn, 1, 0, len(steps), at_ms) == _scan(stamps, at_ms)


@given(st.lists(st.integers(0, 20), max_size=40), st.integers(0, 20))
def test_out_of_order_timestamps_answer_a_crossing_of_the_time(
    times: list[int], at_ms: int
) -> None:
    stamps = dict(enumerate(times))
    with sqlite3.connect(":memory:") as conn:
        conn.execute(TABLE)
        _fill(conn, stamps)
        found = offset_for_time(conn, 1, 0, len(times), at_ms)
    if found is None:
        assert not times or times[-1] < at_ms
        return
    offset, stamp = found
    assert stamp == times[offset] >= at_ms
    assert offset == 0 or times[offset - 1] < at_ms


def test_an_empty_partition_and_a_time_after_every_record(conn: sqlite3.Connection) -> None:
    assert offset_for_time(conn, 1, 0, 0, 0) is None
    _fill(conn, {0: 10, 1: 20, 2: 30})
    assert offset_for_time(conn, 1, 0, 3, 31) is None
    assert offset_for_time(conn, 1, 0, 3, 20) == (1, 20)
    assert offset_for_time(conn, 1, 0, 3, -1) == (0, 10)
