"""Offset by time (broker/storage/timestamps.py): a binary search over the log's primary
key that answers as a scan does while timestamps ascend, and a crossing of the time when
they do not, whatever batches hold the records; and the record of the greatest timestamp
(ListOffsets' MAX_TIMESTAMP), as a scan from the log start finds it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import broker.storage
from broker.storage import batches
from broker.storage.queries import Q
from broker.storage.timestamps import offset_for_time, offset_of_greatest_time

TABLE = (Path(broker.storage.__file__).parent / "schema" / "015_log.sql").read_text()


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.executescript(TABLE)
    yield connection
    connection.close()


def _fill(conn: sqlite3.Connection, stamps: dict[int, int]) -> None:
    """The records as batches of up to 3 (a gap in offsets ends one)."""
    conn.execute("DELETE FROM log")
    runs: list[list[tuple[int, int]]] = []
    for offset, stamp in sorted(stamps.items()):
        if runs and len(runs[-1]) < 3 and runs[-1][-1][0] == offset - 1:
            runs[-1].append((offset, stamp))
        else:
            runs.append([(offset, stamp)])
    for run in runs:
        where, times = (1, 0, run[0][0]), [stamp for _, stamp in run]
        conn.execute(
            Q["log_insert"], batches.pack(where, [b"v"] * len(run), None, None, times, _NONE)
        )
    # another partition: never seen
    conn.execute(Q["log_insert"], batches.pack((1, 1, 0), [b"v"], None, None, 0, _NONE))


_NONE = (0, 0, 0, 0, None)


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
        conn.executescript(TABLE)
        _fill(conn, stamps)
        assert offset_for_time(conn, 1, 0, (0, len(steps)), at_ms) == _scan(stamps, at_ms)


@given(st.lists(st.integers(0, 20), max_size=40), st.integers(0, 20))
def test_out_of_order_timestamps_answer_a_crossing_of_the_time(
    times: list[int], at_ms: int
) -> None:
    stamps = dict(enumerate(times))
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(TABLE)
        _fill(conn, stamps)
        found = offset_for_time(conn, 1, 0, (0, len(times)), at_ms)
    if found is None:
        assert not times or times[-1] < at_ms
        return
    offset, stamp = found
    assert stamp == times[offset] >= at_ms
    assert offset == 0 or times[offset - 1] < at_ms


def test_an_empty_partition_and_a_time_after_every_record(conn: sqlite3.Connection) -> None:
    assert offset_for_time(conn, 1, 0, (0, 0), 0) is None
    _fill(conn, {0: 10, 1: 20, 2: 30})
    assert offset_for_time(conn, 1, 0, (0, 3), 31) is None
    assert offset_for_time(conn, 1, 0, (0, 3), 20) == (1, 20)
    assert offset_for_time(conn, 1, 0, (0, 3), -1) == (0, 10)


def test_the_search_starts_at_the_log_start(conn: sqlite3.Connection) -> None:
    """Records below the log start are gone even where their batch is still stored."""
    _fill(conn, {0: 10, 1: 20, 2: 30})
    assert offset_for_time(conn, 1, 0, (2, 3), 5) == (2, 30)


@given(
    st.lists(st.integers(0, 20), max_size=40),
    st.sets(st.integers(0, 40), max_size=15),
    st.integers(0, 45),
)
@example([5, 0, 1], set(), 1)  # the log start inside a batch, past its greatest
@example([1, 2, 2, 1, 2], set(), 0)  # a tie across batches: the first
def test_the_greatest_timestamp_answers_as_a_scan_from_the_log_start(
    times: list[int], gaps: set[int], start: int
) -> None:
    stamps = {offset: stamp for offset, stamp in enumerate(times) if offset not in gaps}
    visible = [(o, t) for o, t in sorted(stamps.items()) if o >= start]
    # the first record of the greatest timestamp (max keeps the first on a tie)
    expected = max(visible, key=lambda record: record[1]) if visible else None
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(TABLE)
        _fill(conn, stamps)
        assert offset_of_greatest_time(conn, 1, 0, start) == expected
