"""Offset by time: Engine.offset_for_time on one partition of 10M records (a binary
search over the primary key), against the scan it replaced (`records_offset_for_time`'s
SELECT ... WHERE timestamp_ms >= ? ORDER BY offset LIMIT 1, which walks the partition).

Rules:
- One partition of RECORDS records of VALUE_BYTES bytes, stamped 1 ms apart (ascending,
  as the broker's clock stamps them), filled once with durability normal, checkpointed.
- LOOKUPS lookups of random times spread over the whole partition, after one unmeasured
  round: the median and p99 of each, and the number of probes (primary-key seeks).
- The scan is measured for a few times only (SCAN_LOOKUPS): a time in the middle costs
  half a walk of the partition.

Run: python -m bench.offset_by_time [DIR] [RECORDS]
"""

from __future__ import annotations

import math
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from broker.discovery import DB_FILE
from broker.engine.engine import Engine
from broker.types import NewRecord

TOPIC: Final = "bench"
RECORDS: Final = 10_000_000
VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 10_000
LOOKUPS: Final = 2_000
SCAN_LOOKUPS: Final = 3
BASE_MS: Final = 1_700_000_000_000
SCAN: Final = (  # the batch a scan finds the time in (schema 015: a row per batch)
    "SELECT first_offset, timestamp_ms FROM log WHERE topic_id = ? AND partition = ? "
    "AND max_timestamp_ms >= ? ORDER BY first_offset LIMIT 1"
)


def fill(data_dir: Path, records: int) -> None:
    value = b"v" * VALUE_BYTES
    with Engine.open(data_dir, durability="normal") as engine:
        engine.create_topic(TOPIC)
        for first in range(0, records, BATCH_RECORDS):
            count = min(BATCH_RECORDS, records - first)
            engine.produce(
                TOPIC,
                [
                    NewRecord(value, partition=0, timestamp_ms=BASE_MS + first + i)
                    for i in range(count)
                ],
            )
    with sqlite3.connect(data_dir / DB_FILE) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _ms(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


def measure(data_dir: Path, records: int) -> dict[str, float]:
    times = [BASE_MS + random.randrange(records) for _ in range(LOOKUPS)]
    with Engine.open(data_dir) as engine:
        for at in times[:100]:
            assert engine.offset_for_time(TOPIC, 0, at) == (at - BASE_MS, at)
        taken = []
        for at in times:
            began = time.perf_counter()
            engine.offset_for_time(TOPIC, 0, at)
            taken.append(time.perf_counter() - began)
    scans = []
    with sqlite3.connect(data_dir / DB_FILE) as conn:
        for _ in range(SCAN_LOOKUPS):
            began = time.perf_counter()
            conn.execute(SCAN, (1, 0, BASE_MS + records // 2)).fetchone()
            scans.append(time.perf_counter() - began)
    return {
        "records": records,
        "probes": math.ceil(math.log2(records)) + 1,
        "search_median_ms": statistics.median(taken) * 1000,
        "search_p99_ms": _ms(taken, 0.99),
        "scan_middle_median_ms": statistics.median(scans) * 1000,
        "db_bytes": (data_dir / DB_FILE).stat().st_size,
    }


def main() -> None:
    records = int(sys.argv[2]) if len(sys.argv) > 2 else RECORDS
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(scratch) / "data"
        if not (data_dir / DB_FILE).exists():
            began = time.perf_counter()
            fill(data_dir, records)
            print(f"filled {records} records in {time.perf_counter() - began:.1f} s")
        print(measure(data_dir, records))


if __name__ == "__main__":
    main()
