"""Read: page through one partition from offset 0 with `Engine.read`, against one raw
`SELECT * ... ORDER BY offset` fetchall over the same values, a row per record
(bench/raw.py's table, in a database file of its own).

Rules:
- One data directory, filled once (durability normal: filling is not what is measured),
  and the raw table filled with its values and checkpointed.
- fencelog pages with the largest max_records the engine allows (read_records_max);
  the raw side fetches the whole partition in one statement.
- Each side scans once unmeasured first, so neither meets a colder cache than the other;
  then rounds alternate which side goes first.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from typing import Final

from bench import raw
from bench.measures import RateComparison, interleaved
from broker.engine.engine import Engine
from broker.types import NewRecord

TOPIC: Final = "bench"
PARTITION: Final = 0
VALUE_BYTES: Final = 100
RATIO_MIN: Final = 0.5


def fill(engine: Engine, records: int, seed: int = 3) -> None:
    """`records` 100-byte values in one partition, in the largest batches the engine takes."""
    engine.create_topic(TOPIC, partitions=1)
    rng = random.Random(seed)
    step = engine.limits.append_records_max
    for start in range(0, records, step):
        count = min(step, records - start)
        batch = [NewRecord(rng.randbytes(VALUE_BYTES)) for _ in range(count)]
        engine.produce(TOPIC, batch)


def fencelog_rate(engine: Engine, records: int) -> float:
    """Rows per second paging `Engine.read` from offset 0 to the end of the partition."""
    page_records = engine.limits.read_records_max
    offset = 0
    start = time.perf_counter()
    while offset < records:
        page = engine.read(TOPIC, PARTITION, offset, page_records)
        assert page, f"Engine.read returned nothing at offset {offset} of {records}"
        offset = page[-1].offset + 1
    elapsed_s = time.perf_counter() - start
    assert offset == records
    return records / elapsed_s


def raw_rate(conn: sqlite3.Connection, topic_id: int, records: int) -> float:
    """Rows per second of one `SELECT * ... ORDER BY offset` fetchall."""
    start = time.perf_counter()
    rows = raw.scan_partition(conn, topic_id, PARTITION)
    elapsed_s = time.perf_counter() - start
    assert len(rows) == records
    return records / elapsed_s


def raw_copy(engine: Engine, conn: sqlite3.Connection, records: int) -> int:
    """The partition's values written to the raw baseline's table, a row per record, in
    batches of 1000; its topic id there."""
    raw.create_schema(conn)
    offset = 0
    while offset < records:
        page = engine.read(TOPIC, PARTITION, offset, 1000)
        raw.insert_batch(conn, raw.record_rows(1, offset, [r.value or b"" for r in page]))
        offset = page[-1].offset + 1
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return 1


def compare(work_dir: Path, records: int, rounds: int) -> RateComparison:
    data_dir = work_dir / "read"
    with Engine.open(data_dir, durability="normal") as engine:
        fill(engine, records)
        conn = raw.connect(work_dir / "raw-read.db", "normal")
        try:
            topic_id = raw_copy(engine, conn, records)
            fencelog_rate(engine, records)  # unmeasured: warm both caches
            raw_rate(conn, topic_id, records)
            fencelog_rates, raw_rates = interleaved(
                rounds,
                lambda: fencelog_rate(engine, records),
                lambda: raw_rate(conn, topic_id, records),
            )
        finally:
            conn.close()
    return RateComparison(
        name="read a partition from offset 0",
        fencelog_rows_per_s=fencelog_rates,
        raw_rows_per_s=raw_rates,
        ratio_min=RATIO_MIN,
    )
