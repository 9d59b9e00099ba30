"""broker/core/retention.py: the front cut of a partition and a Kafka epoch's check."""

from __future__ import annotations

import pytest

from broker.core.retention import Cut, check_epoch, front_cut
from broker.errors import BrokerError, ErrorCode


def test_the_cut_takes_the_old_front_and_stops_at_the_first_newer_record() -> None:
    front = [(5, 10, 3), (6, 20, 3), (7, 99, 3), (8, 15, 3)]
    assert front_cut(front, 5, cutoff_ms=50, excess_bytes=0) == Cut(7, 6, 2)
    assert front_cut(front, 5, cutoff_ms=5, excess_bytes=0) is None


def test_the_cut_frees_at_least_the_excess() -> None:
    front = [(0, 10, 4), (1, 10, 4), (2, 10, 4)]
    assert front_cut(front, 0, cutoff_ms=None, excess_bytes=5) == Cut(2, 8, 2)


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
