"""How fencelog behaves as the data grows (issue 23, "Curves"): the same measures on a
partition that already holds 0, 1M, 10M and 50M records of 100 bytes (about 6.5 GB of
database, and as much again for the snapshot file and its restored copy: 20 GB free).

    python -m bench.run --only growth [--quick]

Rules:
- One data directory grows through the sizes, embedded, durability normal while it is
  filled: first 100,000 idempotent producer ids, each with one record written under
  its pid (the producer table a restart loads), then records of 100 random bytes in
  batches of 10,000 up to each size. Every measure runs at each size on the directory
  as it is then; what a measure writes is counted in the next size's fill.
- Produce: 100,000 more records in batches of 1,000 (durability full), records/s, on
  a connection that has produced one batch already.
- Consume from an offset: 100,000 records from the middle of the partition, in pages
  of 10,000, records/s.
- First record from the middle: a fresh connection (the data directory opened) and one
  fetch at the partition's middle offset, ms.
- Restart: opening the directory (the producer table loaded, prepared commits
  checked) and the first idempotent produce of a known pid, ms, in a fresh process.
- Snapshot: `Client.backup` of the directory to one file and `fencelog snapshot
  restore` of it into an empty directory, MB/s of the database file.
- Each size's measures start after `sync`, and so do the snapshot's create and restore,
  so that no measure waits for the writeback of what was written before it.
- Topics and sessions: a `fencelog serve` (durability normal) with 10, 100 and 1,000
  topics of 4 partitions and as many idle sessions as the step says (10, 100, 500:
  connections of AsyncClient in one event loop); one-record produces, one at a time,
  round-robin over the topics from those sessions: p50 and p99; the server's RSS
  (VmRSS) after them.
- A curve's ratio is the largest size's figure against the smallest's (time-like
  figures: large over small; rates: small over large): at most 1.5 is flat.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.cli_produce import cached_environment, fencelog_script
from bench.processes import fencelog_server
from bench.sections import Row, Section, verdict
from broker.client.client import connect
from broker.types import NewRecord, ProducerFields

TITLE: Final = "Growth curves (issue 23)"
TOPIC: Final = "grow"
VALUE_BYTES: Final = 100
FILL_BATCH: Final = 10_000
FLAT_MAX: Final = 1.5


@dataclass(frozen=True, slots=True)
class Sizes:
    records: tuple[int, ...]
    pids: int
    sample: int  # records produced and consumed per measure
    quick: bool


FULL: Final = Sizes((0, 1_000_000, 10_000_000, 50_000_000), 100_000, 100_000, False)
QUICK: Final = Sizes((0, 100_000, 1_000_000), 10_000, 20_000, True)


@dataclass(frozen=True, slots=True)
class Point:
    records: int
    db_mb: float
    produce_rps: float
    consume_rps: float
    first_record_ms: float
    restart_ms: float
    backup_mbps: float
    restore_mbps: float


@dataclass(frozen=True, slots=True)
class Crowd:
    """One step of topics and sessions on a served broker."""

    topics: int
    sessions: int
    p50_ms: float
    p99_ms: float
    rss_mb: float


@dataclass(frozen=True, slots=True)
class Results:
    sizes: Sizes
    points: tuple[Point, ...]
    crowds: tuple[Crowd, ...] = ()


def _fill(data_dir: Path, count: int, rng: random.Random) -> None:
    with connect(data_dir, durability="normal") as client:
        for low in range(0, count, FILL_BATCH):
            n = min(FILL_BATCH, count - low)
            client.produce(TOPIC, [NewRecord(rng.randbytes(VALUE_BYTES)) for _ in range(n)])


def _pids(data_dir: Path, pids: int) -> int:
    """pids idempotent producers, one record each; the last one's pid."""
    last = 0
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 1)
        for _ in range(pids):
            lease = client.lease_pid(TOPIC, 0)
            fields = ProducerFields(lease.producer_id, lease.generation, lease.sequence + 1)
            client.produce(TOPIC, [b"p"], partition=0, producer=fields)
            last = lease.producer_id
    return last


def _end(data_dir: Path) -> int:
    with connect(data_dir) as client:
        return client.end_offsets(TOPIC)[0]


def _produce_rate(data_dir: Path, sample: int) -> float:
    batch = [NewRecord(b"x" * VALUE_BYTES)] * 1_000
    with connect(data_dir) as client:
        client.produce(TOPIC, batch)  # the open's one-time costs are the restart's figure
        start = time.perf_counter()
        for _ in range(sample // 1_000):
            client.produce(TOPIC, batch)
        return sample / (time.perf_counter() - start)


def _consume_rate(data_dir: Path, sample: int) -> float:
    middle = _end(data_dir) // 2
    with connect(data_dir) as client:
        start = time.perf_counter()
        position, read = middle, 0
        while read < sample:
            page = client.fetch(TOPIC, {0: position}, max_records=10_000)
            if not page:
                break
            read += len(page)
            position = page[-1].offset + 1
        return read / (time.perf_counter() - start)


def _first_record_ms(data_dir: Path) -> float:
    middle = _end(data_dir) // 2
    start = time.perf_counter()
    with connect(data_dir) as client:
        page = client.fetch(TOPIC, {0: middle}, max_records=1)
    elapsed = (time.perf_counter() - start) * 1000
    assert page and page[0].offset == middle, page
    return elapsed


RESTART_RUNS: Final = 5
RESTART = """
import sys, time
start = time.perf_counter()
from broker.client.client import connect
from broker.types import ProducerFields
with connect(sys.argv[1]) as client:
    lease = client.lease_pid(sys.argv[2], 0, int(sys.argv[3]))
    fields = ProducerFields(lease.producer_id, lease.generation, lease.sequence + 1)
    client.produce(sys.argv[2], [b"restart"], partition=0, producer=fields)
print((time.perf_counter() - start) * 1000)
"""


def _restart_ms(data_dir: Path, pid: int, env: dict[str, str]) -> float:
    """The median of 5 fresh processes: open the directory, first idempotent produce.
    (Of 3, one burst of the host's other work moved a median by 200 ms.)"""
    args = [sys.executable, "-c", RESTART, str(data_dir), TOPIC, str(pid)]
    runs = sorted(
        float(subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout)
        for _ in range(RESTART_RUNS)
    )
    return runs[RESTART_RUNS // 2]


def _snapshot(data_dir: Path, work: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """(database MB, backup MB/s, restore MB/s)."""
    out = work / "snapshot.db"
    restored = work / "restored"
    os.sync()  # what the measures before it wrote is written back first
    with connect(data_dir) as client:
        start = time.perf_counter()
        client.backup(out)
        backup_s = time.perf_counter() - start
    mb = out.stat().st_size / 1e6
    os.sync()
    start = time.perf_counter()
    subprocess.run(
        [str(fencelog_script()), "--broker", str(restored), "snapshot", "restore", str(out)],
        env=env,
        capture_output=True,
        check=True,
    )
    restore_s = time.perf_counter() - start
    out.unlink()
    shutil.rmtree(restored)
    return mb, mb / backup_s, mb / restore_s


CROWDS: Final = ((10, 10), (100, 100), (1_000, 500))
CROWD_PRODUCES: Final = 2_000


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _crowd_produces(url: str, topics: int, sessions: int) -> list[float]:
    from broker.client.async_client import AsyncClient
    from broker.client.served import Address

    clients = [AsyncClient(Address.parse(url)) for _ in range(sessions)]
    try:
        await asyncio.gather(*(client.connection() for client in clients))
        record = [NewRecord(b"x" * VALUE_BYTES)]
        latencies = []
        for i in range(CROWD_PRODUCES):
            start = time.perf_counter()
            await clients[i % sessions].produce(f"t{i % topics}", record)
            latencies.append((time.perf_counter() - start) * 1000)
        return latencies
    finally:
        await asyncio.gather(*(client.close() for client in clients))


def crowds(work_dir: Path) -> tuple[Crowd, ...]:
    found = []
    with fencelog_server(work_dir, "crowd", "normal") as server:
        made = 0
        for topics, sessions in CROWDS:
            with connect(server.address) as client:
                for n in range(made, topics):
                    client.create_topic(f"t{n}", 4)
            made = topics
            latencies = sorted(asyncio.run(_crowd_produces(server.address, topics, sessions)))
            p50 = latencies[len(latencies) // 2]
            p99 = latencies[int(len(latencies) * 0.99)]
            found.append(Crowd(topics, sessions, p50, p99, _rss_mb(server.pid)))
            print(f"  growth: {found[-1]}", file=sys.stderr, flush=True)
    return tuple(found)


def measure(work_dir: Path, sizes: Sizes) -> Results:
    data_dir = work_dir / "grow"
    env = cached_environment(work_dir / "pycache")
    rng = random.Random(23)
    pid = _pids(data_dir, sizes.pids)
    points = []
    for target in sizes.records:
        missing = target - (_end(data_dir) - sizes.pids)
        if missing > 0:
            _fill(data_dir, missing, rng)
        os.sync()  # the measures start once the fill is on disk, not while it is written back
        produce = _produce_rate(data_dir, sizes.sample)
        consume = _consume_rate(data_dir, sizes.sample)
        first = _first_record_ms(data_dir)
        restart = _restart_ms(data_dir, pid, env)
        mb, backup, restore = _snapshot(data_dir, work_dir, env)
        points.append(Point(target, mb, produce, consume, first, restart, backup, restore))
        print(f"  growth: {points[-1]}", file=sys.stderr, flush=True)
    shutil.rmtree(data_dir)
    return Results(sizes, tuple(points), crowds(work_dir))


FINDINGS: Final = (
    "- Produce and consume rates stay flat as the partition grows; a read from the middle "
    "is a primary-key seek. Two bends this bench found were fixed: only idempotent records "
    "counted toward the producer-table snapshot, so a restart re-scanned every plain record "
    "since the last one (restart at 1M records with 10,000 pids: 231 -> 90 ms); and every "
    "open loaded the producer table, so a reader of a directory with 100,000 pids waited "
    "245 ms for its first record (now about 1 ms: the table loads when first used).",
    "- Restart costs the load of the producer table, bounded by `producer_ids_max` "
    "(broker/limits.py), not by the records: a profile of it on the 10M directory spent "
    "0.30 s of 0.34 s in `ProducerTable.load`, no query growing with the log. The load "
    "was then halved (C loops, the cyclic GC paused: 100,000 pids in about 135 ms). Two "
    "earlier runs of this bench read about 450 ms at 10M or 50M: one process in several "
    "took 100 to 200 ms longer while the host was busy, and a median of 3 took it in; the "
    "restart is now the median of 5, and a rerun of those directories by hand gave 216 to "
    "250 ms.",
    "- Snapshot create was `VACUUM INTO`, which rebuilds every table into the copy: 340, "
    "382, 246 and 225 MB/s at 0, 1M, 10M and 50M. It is now SQLite's backup API, page by "
    "page (VACUUM INTO only when a quarter of the pages are free): faster at every size. "
    "What is left of the bend is mostly the disk. The copy of the 50M directory writes "
    "7.4 GB, more than the page cache takes as dirty pages here (vm.dirty_ratio 20% of "
    "23 GB). So it goes at the disk's pace, while the small copies never wait for the "
    "disk. On this host on 2026-11-25, a 7.4 GB `dd` with fdatasync ran at 395 MB/s and "
    "`cp` plus `sync` of that file at 431 MB/s: even a raw file copy would be 1.5x slower "
    "than the 0M figure (653 MB/s). SQLite's copy, one 4 KiB page per write, reaches about "
    "0.7 of that raw copy at 50M: 259 to 290 MB/s in four runs. The copy also holds the "
    "free pages (7.4 against 6.6 GB at 50M). Until 2026-11-25 the measures at each size "
    "ran while the fill's writeback was still going on. Each size now starts after "
    "`sync`, which moved the 10M copy from 344-439 to 795-813 MB/s and the 50M restart "
    "from 269-346 to 219 ms.",
    "- Restore is a file copy and a check; at 0M it is mostly the `fencelog snapshot "
    "restore` process start.",
    "- The server's memory stays within tens of MB from 40 partitions and 10 sessions to "
    "4,000 partitions and 500 sessions: it keeps per-session and per-partition state only "
    "within broker/limits.py's bounds.",
)


def section(results: Results) -> Section:
    small, large = results.points[0], results.points[-1]
    rows: list[Row] = []

    def curve(name: str, unit: str, value: str, higher_is_better: bool) -> None:
        figures = [float(getattr(p, value)) for p in results.points]
        cells = ", ".join(
            f"{p.records / 1e6:g}M: {f:,.1f}" for p, f in zip(results.points, figures, strict=True)
        )
        ratio = figures[0] / figures[-1] if higher_is_better else figures[-1] / figures[0]
        rows.append(
            Row(
                f"{name} ({unit})",
                cells,
                f"{small.records / 1e6:g}M vs {large.records / 1e6:g}M",
                f"{ratio:.2f}",
                f"<= {FLAT_MAX}",
                verdict(ratio <= FLAT_MAX),
            )
        )

    curve("produce, batches of 1,000", "records/s", "produce_rps", True)
    curve("consume from the middle", "records/s", "consume_rps", True)
    curve("first record from the middle", "ms", "first_record_ms", False)
    curve(f"restart with {results.sizes.pids:,} pids", "ms", "restart_ms", False)
    curve("snapshot create", "MB/s", "backup_mbps", True)
    curve("snapshot restore", "MB/s", "restore_mbps", True)
    for name, field_ in (("p50", "p50_ms"), ("p99", "p99_ms"), ("server RSS", "rss_mb")):
        figures = [float(getattr(c, field_)) for c in results.crowds]
        if not figures:
            continue
        cells = ", ".join(
            f"{c.topics:,}x4/{c.sessions}: {f:,.2f}"
            for c, f in zip(results.crowds, figures, strict=True)
        )
        unit = "MB" if field_ == "rss_mb" else "ms"
        ratio = figures[-1] / figures[0]
        rows.append(
            Row(
                f"topics x partitions / sessions: produce {name} ({unit})"
                if unit == "ms"
                else f"topics x partitions / sessions: {name} ({unit})",
                cells,
                "smallest vs largest",
                f"{ratio:.2f}",
                f"<= {FLAT_MAX}" if unit == "ms" else "(information)",
                verdict(ratio <= FLAT_MAX) if unit == "ms" else "-",
            )
        )
    doc = (__doc__ or "").split("Rules:")[1].strip().splitlines()
    return Section(
        title=TITLE,
        summary=(
            f"a partition holding {', '.join(f'{n:,}' for n in results.sizes.records)} records "
            f"of {VALUE_BYTES} bytes after {results.sizes.pids:,} producer ids; database "
            f"{', '.join(f'{p.db_mb:,.0f} MB' for p in results.points)}"
            + (" (--quick)" if results.sizes.quick else "")
        ),
        rows=tuple(rows),
        method=tuple(line.strip() for line in doc),
        findings=FINDINGS,
        raw=tuple(str(p) for p in (*results.points, *results.crowds)),
    )
