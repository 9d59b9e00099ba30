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
- a Kafka producer's batch (decide's `restarts`): g > G by any step starts the epoch
  again, so it appends only at s = 1, and the state becomes (g, n).

ProducerEntry and Batch are NamedTuples, as NewRecord is: one of each is built for every
idempotent append, and a frozen dataclass costs about a microsecond more to build.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from broker.errors import BrokerError, ErrorCode
from broker.limits import INT64_MAX, INT64_MIN
from broker.types import ProducerEntry, ProducerFields

_tuple_new = tuple.__new__


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"


APPEND, DUPLICATE = Verdict.APPEND, Verdict.DUPLICATE  # module globals: no enum lookup


class Batch(NamedTuple):
    producer_id: int
    generation: int
    first_sequence: int
    record_count: int

    @property
    def last_sequence(self) -> int:
        return self.first_sequence + self.record_count - 1


def check_stored_range(producer: ProducerFields) -> None:
    """Each producer field a 64-bit integer, as SQLite stores them: a number past that
    would fail the write itself, and with it every request of the group commit it
    joined, not only its own."""
    for name, value in zip(producer._fields, producer, strict=True):
        if value is not None and not INT64_MIN <= value <= INT64_MAX:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"producer field {name} is {value}, past the 64-bit integers fencelog stores",
                field=name,
            )


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


def continues(entry: ProducerEntry, batch: Batch, now_ms: int, pid_lease_ms: int) -> bool:
    """The usual batch, judged in one test: the next sequence of the pid's generation,
    within its lease (next_entry's test). Anything else goes to decide() (which also
    answers this case)."""
    fields = (batch.generation, batch.first_sequence, batch.record_count)
    return next_entry(entry, *fields, now_ms, pid_lease_ms, 0) is not None


def next_entry(
    entry: ProducerEntry,
    generation: int,
    first_sequence: int,
    count: int,
    now_ms: int,
    pid_lease_ms: int,
    last_offset: int,
) -> ProducerEntry | None:
    """The usual batch in one step, from its fields: the entry after it (as after_append
    makes it) when it is the next sequence of the pid's generation within its lease,
    else None (judge the batch with decide()). The engine's path for every batch of a
    pid that goes on writing: no Batch is built."""
    if (
        first_sequence != entry.high_water_sequence + 1
        or generation != entry.generation
        or now_ms >= entry.first_record_ms + pid_lease_ms
    ):
        return None
    return _tuple_new(  # ProducerEntry(...) without its Python-level __new__
        ProducerEntry,
        (
            entry.producer_id,
            generation,
            first_sequence + count - 1,
            entry.first_record_ms,
            last_offset,
        ),
    )


def decide(
    entry: ProducerEntry | None,
    batch: Batch,
    now_ms: int,
    pid_lease_ms: int,
    *,
    restarts: bool = False,
) -> Verdict:
    """Append, or a duplicate; anything else raises the BrokerError to answer with.

    restarts: Kafka's rule for a batch through the Kafka listener, where the generation
    is the producer's epoch. An idempotent Kafka producer bumps its epoch by itself after
    a batch failed for good (KIP-360) and numbers the new epoch's batches from the start
    again: a batch of a newer epoch (by any step) appends if it is its epoch's first
    sequence, and is OUT_OF_ORDER_SEQUENCE otherwise."""
    if entry is None:
        generation, high_water = batch.generation, 0
    elif now_ms >= entry.first_record_ms + pid_lease_ms:
        raise BrokerError(
            ErrorCode.PID_EXPIRED,
            f"producer id {batch.producer_id}'s lease ended at {entry.expires_ms(pid_lease_ms)}",
            producer_id=batch.producer_id,
            expired_ms=entry.expires_ms(pid_lease_ms),
            hint="lease a new pid (fencelog lease-pid) and start again at sequence 1",
        )
    else:
        generation, high_water = entry.generation, entry.high_water_sequence
    if batch.generation < generation:
        raise BrokerError(
            ErrorCode.FENCED,
            f"producer {batch.producer_id} generation {batch.generation} is older than the "
            f"stored {generation}: a newer instance of this producer took over",
            producer_id=batch.producer_id,
            stored_generation=generation,
            received_generation=batch.generation,
        )
    if restarts and batch.generation > generation:
        if batch.first_sequence == 1:
            return APPEND
        raise BrokerError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE,
            f"producer {batch.producer_id} epoch {batch.generation} is new here and must "
            f"start at sequence 0, not {batch.first_sequence - 1}",
            producer_id=batch.producer_id,
            expected_sequence=1,
            received_sequence=batch.first_sequence,
        )
    if batch.generation > generation + 1:
        raise BrokerError(
            ErrorCode.INVALID_GENERATION,
            f"producer {batch.producer_id} generation {batch.generation} skips ahead of the "
            f"stored {generation} (at most {generation + 1})",
            producer_id=batch.producer_id,
            stored_generation=generation,
            received_generation=batch.generation,
        )
    expected = high_water + 1
    if batch.first_sequence == expected:
        return APPEND
    if batch.first_sequence < expected:
        if batch.last_sequence > high_water:
            raise BrokerError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE,
                f"batch {batch.first_sequence}..{batch.last_sequence} straddles the "
                f"high-water mark {high_water}",
                producer_id=batch.producer_id,
                expected_sequence=expected,
                received_sequence=batch.first_sequence,
            )
        return DUPLICATE
    raise BrokerError(
        ErrorCode.OUT_OF_ORDER_SEQUENCE,
        f"producer {batch.producer_id} sent sequence {batch.first_sequence}, expected {expected}",
        producer_id=batch.producer_id,
        expected_sequence=expected,
        received_sequence=batch.first_sequence,
        hint="resend every unacknowledged batch in order",
    )


def latest_offset(entry: ProducerEntry, sequence: int) -> int:
    """The highest offset a logged sequence of the pid can sit at. Its sequences 1..H are
    at increasing offsets, one each, with H at entry.last_offset, so sequence s is no
    later than last_offset - (H - s)."""
    return entry.last_offset - (entry.high_water_sequence - sequence)


def after_append(
    entry: ProducerEntry | None, batch: Batch, now_ms: int, last_offset: int
) -> ProducerEntry:
    """The entry once the batch is in the log, ending at last_offset."""
    first_record_ms = entry.first_record_ms if entry else now_ms
    return ProducerEntry(
        batch.producer_id, batch.generation, batch.last_sequence, first_record_ms, last_offset
    )
