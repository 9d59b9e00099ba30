"""Append: 100-byte values in batches of 1000 through the Python client, against a plain
sqlite3 `executemany` of the same rows into the same table.

Rules:
- Both sides write the same values, one BEGIN IMMEDIATE/COMMIT per batch, into a fresh
  database under the same pragmas (WAL; synchronous FULL or NORMAL by durability).
- Within a round the two sides take turns batch by batch (fencelog, raw, raw, fencelog,
  ...), so a burst of machine noise lands on both; a side's rate is its rows over the
  sum of its batches' times. Each round starts from two fresh databases.
- The clock covers the appends only: not opening, not creating the topic or the table.
  fencelog's time includes turning values into records, as a caller's would; the raw
  rows are built before the clock starts, so the baseline is SQLite alone.
- Each round checks afterwards that every record landed on both sides.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

from bench import raw
from bench.measures import RateComparison, interleaved
from broker.client.client import connect
from broker.types import Durability

TOPIC: Final = "bench"
VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 1000
RATIO_MIN: Final = 0.5
Batch = TypeVar("Batch")


def value_batches(records: int, seed: int = 2) -> list[list[bytes]]:
    """`records` distinct 100-byte values in batches of 1000 (the last may be shorter)."""
    rng = random.Random(seed)
    values = [rng.randbytes(VALUE_BYTES) for _ in range(records)]
    return [values[start : start + BATCH_RECORDS] for start in range(0, records, BATCH_RECORDS)]


def raw_row_batches(batches: Sequence[list[bytes]]) -> list[list[raw.RecordRow]]:
    """The rows the engine would store for `batches` appended to a fresh topic (id 1)."""
    firsts = list(itertools.accumulate(map(len, batches), initial=0))[:-1]
    return [raw.record_rows(1, first, batch) for first, batch in zip(firsts, batches, strict=True)]


def timed_steps(
    batches: Sequence[Batch], append_one: Callable[[Batch], object]
) -> Callable[[], float]:
    """A measure that appends the next batch on each call and returns its seconds."""
    pending = iter(batches)

    def step() -> float:
        batch = next(pending)
        start = time.perf_counter()
        append_one(batch)
        return time.perf_counter() - start

    return step


def one_round(
    run_dir: Path, durability: Durability, batches: Sequence[list[bytes]]
) -> tuple[float, float]:
    """(fencelog rows/s, raw rows/s) of one round, batches taking turns."""
    records = sum(map(len, batches))
    row_batches = raw_row_batches(batches)
    with (
        connect(run_dir / "data", durability=durability) as client,
        contextlib.closing(raw.connect(run_dir / "raw.db", durability)) as conn,
    ):
        client.create_topic(TOPIC, partitions=1)
        raw.create_schema(conn)
        fencelog_s, raw_s = interleaved(
            len(batches),
            timed_steps(batches, lambda values: client.produce(TOPIC, values)),
            timed_steps(row_batches, lambda rows: raw.insert_batch(conn, rows)),
        )
        assert client.end_offsets(TOPIC) == [records], "fencelog lost or added records"
        assert raw.count_records(conn) == records, "the raw baseline lost or added rows"
    return records / sum(fencelog_s), records / sum(raw_s)


def compare(work_dir: Path, durability: Durability, records: int, rounds: int) -> RateComparison:
    """`rounds` rounds, each into two fresh databases it deletes afterwards."""
    batches = value_batches(records)
    fencelog_rates: list[float] = []
    raw_rates: list[float] = []
    for round_index in range(rounds):
        run_dir = work_dir / f"append-{durability}-{round_index}"
        run_dir.mkdir()
        try:
            fencelog_rate, raw_rate = one_round(run_dir, durability, batches)
        finally:
            shutil.rmtree(run_dir)
        fencelog_rates.append(fencelog_rate)
        raw_rates.append(raw_rate)
    return RateComparison(
        name=f"append, durability {durability}",
        fencelog_rows_per_s=tuple(fencelog_rates),
        raw_rows_per_s=tuple(raw_rates),
        ratio_min=RATIO_MIN,
    )
