"""Retention and Kafka producer epochs: pure decisions the engine asks, time passed in.

- front_cut: which batches at the front of a partition go. A batch goes while its
  newest record is older than the cutoff, or while the partition is still past its
  size; the first batch that is neither stops the cut, so the front is cut and never a
  batch behind a newer one (timestamps out of order keep what follows the newer batch).
- check_epoch: a Kafka transactional id's request carries its producer id and epoch; an
  older epoch is a fenced incarnation (FENCED), a newer one was never issued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from broker.errors import BrokerError, ErrorCode


class Cut(NamedTuple):
    new_start: int  # the log start offset after the cut
    freed: int  # key and value bytes deleted
    records: int  # records below the new start in the batches deleted


# A batch at the front of a partition: (last offset, newest timestamp, key and value
# bytes, records), as storage/logs.py front() gives them
Front = tuple[int, int, int, int]


def front_cut(
    front: Iterable[Front],
    start: int,
    cutoff_ms: int | None,
    excess_bytes: int,
) -> Cut | None:
    """The cut of front (its batches from the log start `start`, in offset order):
    batches older than cutoff_ms, or while excess_bytes remain to free. None: nothing
    goes."""
    new_start, freed, count = start, 0, 0
    for last_offset, timestamp_ms, size, records in front:
        if (cutoff_ms is not None and timestamp_ms < cutoff_ms) or freed < excess_bytes:
            new_start, freed, count = last_offset + 1, freed + size, count + records
        else:
            break
    return Cut(new_start, freed, count) if count else None


def offset_cut(front: list[Front], start: int, before: int, more: bool) -> Cut | None:
    """The cut of front (as front_cut takes it) below offset `before`: the batches
    wholly below it go, and the log start moves to `before` (inside a batch, perhaps,
    which stays until all of it is below the start). more: batches may follow front
    (it was as long as asked), so the cut may end at its last batch rather than at
    `before`. None: nothing goes and the log start stays."""
    below = [(last, size, records) for last, _, size, records in front if last < before]
    # every batch of front goes and more may follow: the next step goes on from there
    whole = more and len(below) == len(front)
    new_start = below[-1][0] + 1 if whole else before
    if new_start <= start:
        return None
    freed = sum(size for _, size, _ in below)
    return Cut(new_start, freed, sum(records for _, _, records in below))


def compaction_keeps(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    value_lengths: Sequence[int],
    timestamps: Sequence[int],
    newest: Mapping[bytes, int],
    start: int,
    tombstone_before_ms: int,
) -> list[int]:
    """The indexes of one batch's records compaction keeps, the records given column by
    column: all but a keyed record a later record of its key supersedes (newest: each
    key's newest offset) and a tombstone (a null or empty value: length -1 or 0) older
    than tombstone_before_ms. Records below the log start are retention's."""
    keep = []
    for index, (offset, key) in enumerate(zip(offsets, keys, strict=True)):
        if key is None or offset < start:  # keyless, or retention's
            keep.append(index)
            continue
        superseded = newest.get(key, offset) > offset
        old_tombstone = value_lengths[index] <= 0 and timestamps[index] < tombstone_before_ms
        if not (superseded or old_tombstone):
            keep.append(index)
    return keep


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
