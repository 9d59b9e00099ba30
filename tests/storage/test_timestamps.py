"""Offset by time (broker/storage/timestamps.py): the first record at or after the time, as
a scan from the log start finds it, whatever the order of the timestamps, the batches
holding the records, compaction's rewrites and retention's cuts; and the record of the
greatest timestamp (ListOffsets' MAX_TIMESTAMP), likewise."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import broker.storage
from broker.discovery import DB_FILE
from broker.engine.engine import Engine
from broker.storage import batches
from broker.storage.database import SCHEMA_VERSION
from broker.storage.queries import Q
from broker.storage.timestamps import offset_for_time, offset_of_greatest_time
from broker.types import NewRecord

SCHEMA = Path(broker.storage.__file__).parent / "schema"
# the log of batches (015) and its time index (018), as an upgraded directory has them
TABLE = (SCHEMA / "015_log.sql").read_text() + (SCHEMA / "018_log_times.sql").read_text()


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.executescript(TABLE)
    yield connection
    connection.close()


def _fill(conn: sqlite3.Connection, stamps: dict[int, int]) -> None:
    """The records as batches of up to 3 (a gap in offsets ends one)."""
    conn.execute("DELETE FROM log")
    conn.execute("DELETE FROM log_times")
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


@given(st.lists(st.integers(0, 20), max_size=40), st.integers(0, 21))
@example([100, 400, 250], 300)  # librdkafka's 0081: the first at or after, not a crossing
def test_out_of_order_timestamps_answer_the_first_record_at_or_after_the_time(
    times: list[int], at_ms: int
) -> None:
    stamps = dict(enumerate(times))
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(TABLE)
        _fill(conn, stamps)
        assert offset_for_time(conn, 1, 0, (0, len(times)), at_ms) == _scan(stamps, at_ms)


@given(
    st.lists(st.integers(0, 20), max_size=40),
    st.sets(st.integers(0, 40), max_size=20),
    st.integers(0, 45),
    st.integers(0, 21),
)
@example([1, 9, 1, 2, 7, 4], {1}, 0, 6)  # the record that raised the greatest compacted away
@example([9, 1, 1, 2, 1, 5], set(), 1, 2)  # the greatest before the log start
# a batch compacted short of the next offset asked: passed, not asked for again forever
@example([3, 15, 13, 8, 3, 1, 11], {5, 8, 9}, 4, 6)
def test_compacted_and_cut_partitions_answer_as_a_scan(
    times: list[int], compacted: set[int], start: int, at_ms: int
) -> None:
    """Compaction's rewrites lower a batch's greatest timestamp under its index row, and
    retention deletes the index rows below the start but the last: neither misleads."""
    stamps = dict(enumerate(times))
    with sqlite3.connect(":memory:") as conn:
        conn.executescript(TABLE)
        _fill(conn, stamps)
        for row in conn.execute("SELECT * FROM log WHERE partition = 0").fetchall():
            batch = batches.Stored(*row)
            at = batches.offsets(batches.Part(batch, 0, batch.records))
            keep = [i for i, offset in enumerate(at) if offset not in compacted]
            if not keep:
                conn.execute(Q["log_delete_batch"], (1, 0, batch.first_offset))
            elif len(keep) < batch.records:
                conn.execute(Q["log_replace"], batches.repack(batch, keep))
        conn.execute(Q["log_delete_below"], (1, 0, start))
        conn.execute(Q["log_times_below"], (1, 0, start))
        end = len(times)
        left = {o: t for o, t in stamps.items() if o not in compacted and o >= start}
        assert offset_for_time(conn, 1, 0, (min(start, end), end), at_ms) == _scan(left, at_ms)


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


BATCHES = [[100, 400, 250], [50, 300], [500, 100]]  # a batch each, timestamps unordered


def _answers(engine: Engine, stamps: list[int]) -> None:
    ordered = dict(enumerate(stamps))
    for at_ms in range(0, 650, 25):
        assert engine.offset_for_time("t", 0, at_ms) == _scan(ordered, at_ms), at_ms


def test_a_directory_of_schema_17_gets_its_time_index_at_the_upgrade(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with Engine.open(data_dir) as engine:
        engine.create_topic("t")
        for stamps in BATCHES:
            engine.produce("t", [NewRecord(b"v", partition=0, timestamp_ms=t) for t in stamps])
    with contextlib.closing(sqlite3.connect(data_dir / DB_FILE)) as conn, conn:
        # as schema 017 left it: no time index
        conn.execute("DROP TRIGGER log_times_appended")
        conn.execute("DROP TRIGGER log_times_committed")
        conn.execute("DROP TABLE log_times")
        conn.execute("PRAGMA user_version = 17")
    with Engine.open(data_dir) as engine:
        assert engine.status().schema_version == SCHEMA_VERSION
        stamps = [t for batch in BATCHES for t in batch]
        _answers(engine, stamps)
        engine.produce("t", [NewRecord(b"v", partition=0, timestamp_ms=t) for t in (450, 600)])
        _answers(engine, [*stamps, 450, 600])
