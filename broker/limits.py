"""Every bound fencelog keeps, named with its unit last.

A limit is a plain number in one frozen dataclass so that a test, a benchmark or an
operator can build a `Limits` with other values and hand it to the engine. Nothing in
fencelog is unbounded: names, values, batches, frames and waits all stop somewhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    topic_name_chars_max: int = 249
    topic_partitions_max: int = 1024
    record_key_bytes_max: int = 64 * 1024
    record_value_bytes_max: int = 1024 * 1024
    record_headers_max: int = 64
    header_key_chars_max: int = 256
    header_value_bytes_max: int = 64 * 1024
    append_records_max: int = 10_000
    append_bytes_max: int = 32 * 1024 * 1024
    read_records_max: int = 10_000
    read_bytes_max: int = 8 * 1024 * 1024
    busy_timeout_ms: int = 30_000


DEFAULT_LIMITS = Limits()
