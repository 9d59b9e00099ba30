"""broker/core/retention.py: the front cut of a partition (by time and size, or below an
offset) and a Kafka epoch's check."""

from __future__ import annotations

import pytest

from broker.core.retention import Cut, check_epoch, compaction_keeps, front_cut, offset_cut
from broker.errors import BrokerError, ErrorCode


def test_the_cut_takes_the_old_front_and_stops_at_the_first_newer_batch() -> None:
    # (last offset, newest timestamp, bytes, records) of each batch
    front = [(5, 10, 3, 1), (9, 20, 12, 4), (10, 99, 3, 1), (11, 15, 3, 1)]
    assert front_cut(front, 5, cutoff_ms=50, excess_bytes=0) == Cut(10, 15, 5)
    assert front_cut(front, 5, cutoff_ms=5, excess_bytes=0) is None


def test_the_cut_frees_at_least_the_excess() -> None:
    front = [(0, 10, 4, 1), (1, 10, 4, 1), (2, 10, 4, 1)]
    assert front_cut(front, 0, cutoff_ms=None, excess_bytes=5) == Cut(2, 8, 2)


def test_the_cut_below_an_offset_moves_the_start_to_it() -> None:
    front = [(3, 0, 4, 1), (4, 0, 4, 1), (9, 0, 4, 1)]  # a compacted log: 5 to 8 are gone
    assert offset_cut(front, 3, before=5, more=False) == Cut(5, 8, 2)
    assert offset_cut(front, 3, before=10, more=False) == Cut(10, 12, 3)
    # the start is the offset asked even where no record is
    assert offset_cut(front, 3, before=7, more=True) == Cut(7, 8, 2)
    assert offset_cut([], 3, before=6, more=False) == Cut(6, 0, 0)


def test_the_cut_below_an_offset_inside_a_batch_keeps_the_batch() -> None:
    front = [(9, 0, 40, 10), (19, 0, 40, 10)]  # two batches of ten: 0-9 and 10-19
    assert offset_cut(front, 0, before=15, more=False) == Cut(15, 40, 10)
    assert offset_cut(front, 0, before=5, more=False) == Cut(5, 0, 0)


def test_the_cut_below_an_offset_goes_step_by_step_and_never_back() -> None:
    front = [(0, 0, 1, 1), (1, 0, 1, 1)]  # as many as a step reads: more may follow
    assert offset_cut(front, 0, before=100, more=True) == Cut(2, 2, 2)
    assert offset_cut(front, 0, before=0, more=True) is None
    assert offset_cut([(5, 0, 1, 1)], 5, before=3, more=False) is None


@pytest.mark.parametrize(
    ("stored", "pid", "epoch", "code"),
    [
        (None, 7, 0, ErrorCode.UNKNOWN_PID),
        ((8, 0), 7, 0, ErrorCode.UNKNOWN_PID),
        ((7, 3), 7, 2, ErrorCode.FENCED),
        ((7, 3), 7, 4, ErrorCode.INVALID_GENERATION),
    ],
)
def test_an_epoch_not_the_current_one_is_refused(
    stored: tuple[int, int] | None, pid: int, epoch: int, code: ErrorCode
) -> None:
    with pytest.raises(BrokerError) as refused:
        check_epoch("copier", stored, pid, epoch)
    assert refused.value.code is code
    check_epoch("copier", (7, 3), 7, 3)  # the current one passes


def test_compaction_keeps_the_newest_of_each_key_and_young_tombstones() -> None:
    # offsets 10-14: a superseded record, the newest of k, an old and a young tombstone,
    # a keyless record; the log start is 10
    keeps = compaction_keeps(
        [10, 11, 12, 13, 14],
        [b"k", b"k", b"old", b"young", None],
        [1, 1, -1, 0, 5],
        [0, 0, 50, 500, 0],
        {b"k": 11, b"old": 12, b"young": 13},
        10,
        100,
    )
    assert keeps == [1, 3, 4]
    assert compaction_keeps([5], [b"k"], [1], [0], {b"k": 9}, 10, 100) == [0]  # below start
