"""Idempotent producers: seeds/idempotent-producer.txt with the rules of DESIGN.md
section 4. Pure: the stored state of (pid, partition) and a batch's producer fields come
in, a decision comes out; time is an argument.

For state (G, H) of (pid, topic, partition) and a batch with generation g, first
sequence s and n records:
- pid 0 opts out: no checks, no state.
- g < G: FENCED (a zombie of this pid).  g > G + 1: INVALID_GENERATION.
- s = H + 1: append; the state becomes (g, H + n). g = G + 1 fences the older one from
  this record on.
- s <= H: a duplicate: nothing is appended; the answer is the original offsets.
- s > H + 1: OUT_OF_ORDER_SEQUENCE; nothing is appended.
- a pid with no state on the partition starts at H = 0, so its first batch has s = 1.
- a pid's lease lasts pid_lease_ms from its first record on the partition; a batch after
  that gets PID_EXPIRED, never a silent accept.
- an entry remembers where its last few batches went (`recent`), so the usual duplicate,
  a retry of a batch still in flight, is answered without reading the log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS

# Where a batch went: (first sequence, last sequence, base offset).
Placed = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """The state of one pid on one partition, as rebuilt from the log."""

    producer_id: int
    generation: int
    high_water_sequence: int
    first_record_ms: int
    last_offset: int
    # The newest batches this process saw appended, oldest first: facts about the log,
    # never its state (not compared, not snapshotted), at most recent_batches_max.
    recent: tuple[Placed, ...] = field(default=(), compare=False)

    def expires_ms(self, pid_lease_ms: int) -> int:
        return self.first_record_ms + pid_lease_ms


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Batch:
    producer_id: int
    generation: int
    first_sequence: int
    count: int

    @property
    def last_sequence(self) -> int:
        return self.first_sequence + self.count - 1


def check_batch_fields(batch: Batch) -> None:
    if batch.producer_id < 0 or batch.generation < 0 or batch.first_sequence < 0:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "producer id, generation and sequence must be >= 0",
            producer_id=batch.producer_id,
        )
    if batch.producer_id and batch.first_sequence == 0:
        raise BrokerError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE,
            "sequences start at 1 (lease-pid answers the high-water mark; send it + 1)",
            producer_id=batch.producer_id,
            expected_sequence=1,
            received_sequence=0,
        )


def decide(entry: ProducerEntry | None, batch: Batch, now_ms: int, pid_lease_ms: int) -> Verdict:
    """Append, or a duplicate; anything else raises the BrokerError to answer with."""
    generation = entry.generation if entry else batch.generation
    high_water = entry.high_water_sequence if entry else 0
    details = {"producer_id": batch.producer_id}
    if entry is not None and now_ms >= entry.expires_ms(pid_lease_ms):
        raise BrokerError(
            ErrorCode.PID_EXPIRED,
            f"producer id {batch.producer_id}'s lease ended at {entry.expires_ms(pid_lease_ms)}",
            **details,
            expired_ms=entry.expires_ms(pid_lease_ms),
            hint="lease a new pid (fencelog lease-pid) and start again at sequence 1",
        )
    if batch.generation < generation:
        raise BrokerError(
            ErrorCode.FENCED,
            f"producer {batch.producer_id} generation {batch.generation} is older than the "
            f"stored {generation}: a newer instance of this producer took over",
            **details,
            stored_generation=generation,
            received_generation=batch.generation,
        )
    if batch.generation > generation + 1:
        raise BrokerError(
            ErrorCode.INVALID_GENERATION,
            f"producer {batch.producer_id} generation {batch.generation} skips ahead of the "
            f"stored {generation} (at most {generation + 1})",
            **details,
            stored_generation=generation,
            received_generation=batch.generation,
        )
    expected = high_water + 1
    if batch.first_sequence == expected:
        return Verdict.APPEND
    if batch.first_sequence < expected:
        if batch.last_sequence > high_water:
            raise BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE,
                f"batch {batch.first_sequence}..{batch.last_sequence} straddles the "
                f"high-water mark {high_water}",
                **details,
                expected_sequence=expected,
                received_sequence=batch.first_sequence,
            )
        return Verdict.DUPLICATE
    raise BrokerError(
        ErrorCode.OUT_OF_ORDER_SEQUENCE,
        f"producer {batch.producer_id} sent sequence {batch.first_sequence}, expected {expected}",
        **details,
        expected_sequence=expected,
        received_sequence=batch.first_sequence,
        hint="resend every unacknowledged batch in order",
    )


def after_append(
    entry: ProducerEntry | None,
    batch: Batch,
    now_ms: int,
    last_offset: int,
    recent_batches_max: int = DEFAULT_LIMITS.producer_recent_batches_max,
) -> ProducerEntry:
    """The entry once the batch is in the log, ending at last_offset."""
    placed = (batch.first_sequence, batch.last_sequence, last_offset - batch.count + 1)
    if entry is None:
        return ProducerEntry(
            batch.producer_id, batch.generation, batch.last_sequence, now_ms, last_offset, (placed,)
        )
    kept = entry.recent[1:] if len(entry.recent) >= recent_batches_max else entry.recent
    return ProducerEntry(
        batch.producer_id,
        batch.generation,
        batch.last_sequence,
        entry.first_record_ms,
        last_offset,
        (*kept, placed),
    )


def duplicate_offsets(entry: ProducerEntry, batch: Batch) -> list[int] | None:
    """A duplicate batch's original offsets, record by record, from the entry's recent
    batches; None when one of its sequences is older than they reach (ask the log)."""
    offsets = []
    for sequence in range(batch.first_sequence, batch.last_sequence + 1):
        for first, last, base_offset in reversed(entry.recent):
            if first <= sequence <= last:
                offsets.append(base_offset + sequence - first)
                break
        else:
            return None
    return offsets
