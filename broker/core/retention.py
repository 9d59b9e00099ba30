"""Retention and Kafka producer epochs: pure decisions the engine asks, time passed in.

- front_cut: which records at the front of a partition go. A record goes while it is
  older than the cutoff, or while the partition is still past its size; the first record
  that is neither stops the cut, so the front is cut and never a record behind a newer
  one (timestamps out of order keep what follows the newer record).
- check_epoch: a Kafka transactional id's request carries its producer id and epoch; an
  older epoch is a fenced incarnation (FENCED), a newer one was never issued.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from broker.errors import BrokerError, ErrorCode


class Cut(NamedTuple):
    new_start: int  # the log start offset after the cut
    freed: int  # key and value bytes deleted
    records: int


def front_cut(
    front: Iterable[tuple[int, int, int]],
    start: int,
    cutoff_ms: int | None,
    excess_bytes: int,
) -> Cut | None:
    """The cut of front ((offset, timestamp_ms, bytes) from the log start `start`, in
    offset order): records older than cutoff_ms, or while excess_bytes remain to free.
    None: nothing goes."""
    new_start, freed, count = start, 0, 0
    for offset, timestamp_ms, size in front:
        if (cutoff_ms is not None and timestamp_ms < cutoff_ms) or freed < excess_bytes:
            new_start, freed, count = offset + 1, freed + size, count + 1
        else:
            break
    return Cut(new_start, freed, count) if count else None


def offset_cut(
    front: list[tuple[int, int, int]], start: int, before: int, more: bool
) -> Cut | None:
    """The cut of front (as front_cut takes it) below offset `before`. more: records
    may follow front (it was as long as asked), so the cut may end at its last record
    rather than at `before`. None: nothing goes and the log start stays."""
    below = [(offset, size) for offset, _, size in front if offset < before]
    # every record of front goes and more may follow: the next step goes on from there
    whole = more and len(below) == len(front)
    new_start = below[-1][0] + 1 if whole else before
    if new_start <= start:
        return None
    return Cut(new_start, sum(size for _, size in below), len(below))


def check_epoch(
    transactional_id: str,
    stored: tuple[int, int] | None,
    producer_id: int,
    epoch: int,
) -> None:
    """stored: the id's (producer id, epoch), None if it has none."""
    if stored is None or stored[0] != producer_id:
        raise BrokerError(
            ErrorCode.UNKNOWN_PID,
            f"producer id {producer_id} is not transactional id {transactional_id}'s",
            producer_id=producer_id,
            hint="call InitProducerId (init_transactions) first",
        )
    current = stored[1]
    if epoch < current:
        raise BrokerError(
            ErrorCode.FENCED,
            f"transactional id {transactional_id}: epoch {epoch} was fenced by epoch "
            f"{current} (a newer producer with this transactional.id started)",
            producer_id=producer_id,
            stored_generation=current,
            received_generation=epoch,
        )
    if epoch > current:
        raise BrokerError(
            ErrorCode.INVALID_GENERATION,
            f"transactional id {transactional_id}: epoch {epoch} is ahead of {current}",
            producer_id=producer_id,
        )
