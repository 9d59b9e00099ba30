"""A Fetch's byte budget, as Kafka keeps it (KIP-74).

A Fetch names the response's max_bytes and each partition's partition_max_bytes. The
records answered stay within both, with one exception that lets a consumer make progress
past a record larger than its budget: the first batch of the first partition that
answers any records is returned whole, however large. Every later partition gets only
what fits in what is left (possibly nothing: its records come in a later fetch).

fencelog builds each partition's answer as one batch of the stored records, so "the
first batch" is the first record alone. A record's size here is an upper bound of its
encoded size in a v2 batch (broker/kafka/records.py), so an answer within the budget by
this count is within it on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from broker.rows import KafkaRow

# A v2 batch's header (BaseOffset to RecordCount).
BATCH_HEADER_BYTES: Final = 61
# A record's bytes beyond its key, value and headers, at most: its length (5), attributes
# (1), timestamp delta (10), offset delta (5), key and value lengths (5 each) and header
# count (5), all varints at their longest. Stored headers (msgpack) take at least as many
# bytes as Kafka's encoding of them.
RECORD_OVERHEAD_BYTES_MAX: Final = 36
_EMPTY_HEADERS_BYTES: Final = 1  # a record without headers: stored as msgpack's empty array


def record_bytes_max(row: KafkaRow) -> int:
    """An upper bound of the bytes row takes in a Kafka record batch."""
    key = row[2]
    return (
        len(row[3] or b"")
        + (len(key) if key is not None else 0)
        + len(row[4])
        + (RECORD_OVERHEAD_BYTES_MAX)
    )


class FetchBudget:
    """What is left of one Fetch's max_bytes, and whether a partition has answered yet."""

    def __init__(self, max_bytes: int) -> None:
        self.left_bytes = max(0, max_bytes)
        self.answered = False  # a partition has records in the answer

    def exhausted(self) -> bool:
        return self.answered and self.left_bytes < BATCH_HEADER_BYTES + RECORD_OVERHEAD_BYTES_MAX

    def take_uniform(
        self, batches: Sequence[int], value_bytes: int, partition_max_bytes: int
    ) -> int:
        """take() of records alike (no key, no headers, values of value_bytes each: a
        uniform page, broker/kafka/records.py encode_uniform), encoded as batches of
        these many records each: how many records."""
        limit = min(self.left_bytes, max(0, partition_max_bytes))
        each = value_bytes + _EMPTY_HEADERS_BYTES + RECORD_OVERHEAD_BYTES_MAX
        size = taken = 0
        for records in batches:
            fit = min(records, max(0, limit - size - BATCH_HEADER_BYTES) // each)
            if fit:
                size += BATCH_HEADER_BYTES + fit * each
                taken += fit
            if fit < records:
                break
        if taken == 0 and batches and not self.answered:
            taken, size = 1, BATCH_HEADER_BYTES + each
        if taken:
            self.answered = True
            self.left_bytes = max(0, self.left_bytes - size)
        return taken

    def take(self, stored: Sequence[KafkaRow], partition_max_bytes: int) -> Sequence[KafkaRow]:
        """The first of stored (one partition's records, in order) that fit the budget
        and partition_max_bytes; the first record always when no partition has answered
        yet. What is taken is spent. (A fetch's loop per record: record_bytes_max inline.)"""
        limit = min(self.left_bytes, max(0, partition_max_bytes))
        size = BATCH_HEADER_BYTES
        count = 0
        for _, _, key, value, headers in stored:
            next_size = size + len(value or b"") + len(headers) + RECORD_OVERHEAD_BYTES_MAX
            if key is not None:
                next_size += len(key)
            if next_size > limit and (count > 0 or self.answered):
                break
            size, count = next_size, count + 1
        if count:
            self.answered = True
            self.left_bytes = max(0, self.left_bytes - size)
        return stored if count == len(stored) else stored[:count]
