"""Transactions (issue 7): transactional produce against plain produce, commit latency,
and where a 1000-record transaction's time goes.

    python -m bench.run --only txn [--quick]

Rules:
- Three deployments, one after another: the embedded engine with durability full (the
  default) and normal, and a `fencelog serve` process (durability full) on 127.0.0.1,
  reached by the synchronous client over TCP (bench/processes.py starts and stops it).
- Throughput: transactions of 100, 1000 and 10000 records of 100 bytes, produced in
  batches of up to 1000 records into one partition, or spread round-robin over 4. A
  round makes two fresh topics, then a third holding one record, so that neither side
  appends at the end of the records table (where SQLite appends without a page split:
  until 2026-11-25 the plain side's topic was made last and had that to itself); the
  transactional side runs `client.transaction(GROUP)`,
  produces the batches into it and commits; the plain side produces the same batches
  without a transaction. The sides take turns transaction by transaction (A B, B A,
  ...); a rate is records over the sum of that side's times; the ratio is median over
  median. Records are built before any clock; every round checks its logs' end offsets.
- Latency: 10-record transactions into one partition, one at a time, perf_counter
  around begin, produce and commit; a plain produce of the same 10 records in turn with
  each (their topics followed by a third, as above). A round's p50 and p99 (nearest
  rank), median over rounds.
- Profile: cProfile around 1000-record transactions into one partition (embedded,
  durability full), and apart from them the same batches produced plainly; fsyncs
  counted with `strace -f -c` of a child process doing the same, when strace runs here.
"""

from __future__ import annotations

import contextlib
import cProfile
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.measures import interleaved, median, percentile
from bench.processes import fencelog_server
from bench.sections import INFORMATION, Row, Section, rate, series, verdict
from broker.client.client import Client, connect
from broker.types import Durability, NewRecord

TITLE: Final = "Transactions (issue 7)"
GROUP: Final = "bench"
VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 1000
TXN_RECORDS: Final = (100, 1000, 10_000)
SPREAD: Final = (1, 4)  # partitions a transaction's records go to
TARGET_RECORDS: Final = 1000
RATIO_MIN: Final = 0.60
LATENCY_RECORDS: Final = 10
WARM_UP_TXNS: Final = 3
_REPOSITORY: Final = Path(__file__).resolve().parent.parent

# One transaction's records, as the produce calls that send them.
Unit = Sequence[Sequence[NewRecord]]


@dataclass(frozen=True, slots=True)
class TxnSizes:
    rounds: int
    records: int  # per side per round, for each transaction size and spread
    latency_rounds: int
    latency_txns: int  # 10-record transactions per round (and as many plain produces)
    profile_txns: int
    fsync_txns: int
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} rounds per comparison of {self.records:,} records per side "
            f"(transactions of {', '.join(f'{n:,}' for n in TXN_RECORDS)} records of "
            f"{VALUE_BYTES} bytes, in batches of up to {BATCH_RECORDS}, into 1 or 4 "
            f"partitions) and {self.latency_rounds} rounds of {self.latency_txns:,} "
            f"{LATENCY_RECORDS}-record transactions, embedded (durability full and normal) and "
            f"served (full); a cProfile of {self.profile_txns} {TARGET_RECORDS}-record "
            "transactions" + (" (--quick)" if self.quick else "")
        )


@dataclass(frozen=True, slots=True)
class Deployment:
    served: bool
    durability: Durability

    @property
    def name(self) -> str:
        return f"{'served' if self.served else 'embedded'}, {self.durability}"


DEPLOYMENTS: Final = (
    Deployment(False, "full"),
    Deployment(False, "normal"),
    Deployment(True, "full"),
)


@dataclass(frozen=True, slots=True)
class Throughput:
    """Records/s per round, transactional and plain, same run, same batches."""

    deployment: str
    txn_records: int
    partitions: int
    txn: tuple[float, ...]
    plain: tuple[float, ...]

    @property
    def name(self) -> str:
        where = "1 partition" if self.partitions == 1 else f"{self.partitions} partitions"
        return f"{self.deployment}: txns of {self.txn_records:,}, {where}"

    @property
    def ratio(self) -> float:
        return median(self.txn) / median(self.plain)

    @property
    def round_ratios(self) -> tuple[float, ...]:
        return tuple(t / p for t, p in zip(self.txn, self.plain, strict=True))

    @property
    def judged(self) -> bool:
        return self.txn_records == TARGET_RECORDS

    @property
    def passed(self) -> bool:
        return self.ratio >= RATIO_MIN


@dataclass(frozen=True, slots=True)
class Percentiles:
    """One step's p50 and p99 per round, in milliseconds."""

    p50_ms: tuple[float, ...]
    p99_ms: tuple[float, ...]

    @property
    def text(self) -> str:
        return f"p50 {median(self.p50_ms):.2f} ms, p99 {median(self.p99_ms):.2f} ms"


@dataclass(frozen=True, slots=True)
class Latency:
    deployment: str
    steps: dict[str, Percentiles]  # total, begin, produce, commit, plain


@dataclass(frozen=True, slots=True)
class Profiled:
    """Per transaction (or per plain batch), under cProfile: milliseconds by step."""

    transactions: int
    txn_ms: float  # wall time per transaction, profiled
    plain_ms: float  # wall time per plain batch of the same records, profiled
    txn_parts: dict[str, float]
    plain_parts: dict[str, float]
    writes_per_txn: float  # SQLite write transactions (BEGIN IMMEDIATE ... COMMIT)
    writes_per_batch: float
    fsyncs: dict[str, float]  # fdatasync + fsync per transaction or batch (strace)
    fsync_us: float  # strace's microseconds per fdatasync
    fsync_skipped: str


@dataclass(frozen=True, slots=True)
class TxnResults:
    sizes: TxnSizes
    throughputs: tuple[Throughput, ...]
    latencies: tuple[Latency, ...]
    profile: Profiled


# throughput ----------------------------------------------------------------------------


def _values(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(VALUE_BYTES) for _ in range(count)]


def _units(values: Sequence[bytes], txn_records: int, partitions: int) -> list[Unit]:
    """The values as transactions of txn_records, each as batches of up to 1000 records,
    the records going round-robin to `partitions` partitions."""
    records = [NewRecord(v, None, (), i % partitions) for i, v in enumerate(values)]
    return [
        [
            records[start : min(start + BATCH_RECORDS, first + txn_records)]
            for start in range(first, first + txn_records, BATCH_RECORDS)
        ]
        for first in range(0, len(records), txn_records)
    ]


def _tail(client: Client, name: str) -> None:
    """A topic made after a comparison's two and given one record, so that neither
    side's records go at the end of the records table: SQLite appends there without
    splitting a page, and the side whose topic was made last got that for free."""
    client.create_topic(f"{name}-tail", 1)
    client.produce(f"{name}-tail", [b"tail"])


def _txn_step(client: Client, topic: str, units: Sequence[Unit]) -> Callable[[], float]:
    pending = iter(units)

    def step() -> float:
        unit = next(pending)
        start = time.perf_counter()
        with client.transaction(GROUP) as txn:  # begin; commit on leaving the block
            for batch in unit:
                txn.produce(topic, batch)
        return time.perf_counter() - start

    return step


def _plain_step(client: Client, topic: str, units: Sequence[Unit]) -> Callable[[], float]:
    pending = iter(units)

    def step() -> float:
        unit = next(pending)
        start = time.perf_counter()
        for batch in unit:
            client.produce(topic, batch)
        return time.perf_counter() - start

    return step


def _throughput(
    client: Client,
    deployment: Deployment,
    txn_records: int,
    partitions: int,
    values: Sequence[bytes],
    rounds: int,
) -> Throughput:
    units = _units(values, txn_records, partitions)
    per_partition = [len(values[p::partitions]) for p in range(partitions)]
    txn_rates, plain_rates = [], []
    for round_index in range(rounds):
        names = [f"{side}-{txn_records}-{partitions}-{round_index}" for side in ("txn", "plain")]
        for name in names:
            client.create_topic(name, partitions)
        _tail(client, names[0])
        txn_s, plain_s = interleaved(
            len(units),
            _txn_step(client, names[0], units),
            _plain_step(client, names[1], units),
        )
        for name in names:
            assert client.end_offsets(name) == per_partition, f"{name}: lost or added records"
        txn_rates.append(len(values) / sum(txn_s))
        plain_rates.append(len(values) / sum(plain_s))
    return Throughput(
        deployment.name, txn_records, partitions, tuple(txn_rates), tuple(plain_rates)
    )


# latency -------------------------------------------------------------------------------


def _latency(client: Client, deployment: Deployment, rounds: int, count: int) -> Latency:
    client.create_topic("latency-txn", 1)
    client.create_topic("latency-plain", 1)
    _tail(client, "latency")
    batch = [NewRecord(v, None, (), 0) for v in _values(LATENCY_RECORDS, seed=73)]
    laps: dict[str, list[float]] = {}

    def transaction() -> None:
        start = time.perf_counter()
        txn = client.transaction(GROUP)
        begun = time.perf_counter()
        txn.produce("latency-txn", batch)
        produced = time.perf_counter()
        txn.commit()
        end = time.perf_counter()
        laps["total"].append(end - start)
        laps["begin"].append(begun - start)
        laps["produce"].append(produced - begun)
        laps["commit"].append(end - produced)

    def plain() -> None:
        start = time.perf_counter()
        client.produce("latency-plain", batch)
        laps["plain"].append(time.perf_counter() - start)

    p50s: dict[str, list[float]] = {}
    p99s: dict[str, list[float]] = {}
    for round_index in range(rounds + 1):  # the first round warms up, unmeasured
        laps = {step: [] for step in ("total", "begin", "produce", "commit", "plain")}
        for index in range(count if round_index else count // 10):
            for which in (transaction, plain) if index % 2 == 0 else (plain, transaction):
                which()
        if round_index:
            for step, seconds in laps.items():
                p50s.setdefault(step, []).append(percentile(seconds, 0.50) * 1000)
                p99s.setdefault(step, []).append(percentile(seconds, 0.99) * 1000)
    written = LATENCY_RECORDS * (count // 10 + count * rounds)
    for topic in ("latency-txn", "latency-plain"):
        assert client.end_offsets(topic) == [written], f"{topic}: lost or added records"
    steps = {step: Percentiles(tuple(p50s[step]), tuple(p99s[step])) for step in p50s}
    return Latency(deployment.name, steps)


@contextlib.contextmanager
def _client(work_dir: Path, deployment: Deployment) -> Iterator[Client]:
    name = f"txn-{'serve' if deployment.served else 'embedded'}-{deployment.durability}"
    if not deployment.served:
        with connect(work_dir / name, durability=deployment.durability) as client:
            yield client
        return
    with (
        fencelog_server(work_dir, name, deployment.durability) as server,
        connect(server.address) as client,
    ):
        yield client


def _warm_up(client: Client, values: Sequence[bytes]) -> None:
    client.create_topic("warm-up", 1)
    units = _units(values[: WARM_UP_TXNS * TARGET_RECORDS], TARGET_RECORDS, 1)
    for step in (_txn_step(client, "warm-up", units), _plain_step(client, "warm-up", units)):
        for _ in units:
            step()


# profile -------------------------------------------------------------------------------

# (file under the repository, qualified name) -> what the profile calls it
_TXN_PARTS: Final = {
    # client.transaction() begins with its first produce, in one write
    ("broker/engine/engine.py", "Engine.txn_begin_produce"): "begin and produce",
    ("broker/engine/engine.py", "Engine.produce"): "produce",
    ("broker/storage/txns.py", "journal_records"): "journal batch insert",
    ("broker/core/records.py", "check_records"): "check_records",
    ("broker/engine/engine.py", "Engine._route"): "route",
    ("broker/engine/transactions.py", "Transactions.commit"): "commit",
    ("broker/storage/txns.py", "copy_partition"): "copy into the log",
    ("broker/storage/txns.py", "mark_applied"): "mark_applied (drop journal batches)",
    ("broker/storage/database.py", "Database.write"): "BEGIN IMMEDIATE/COMMIT",
}
_PLAIN_PARTS: Final = {
    ("broker/engine/engine.py", "Engine.produce"): "produce",
    ("broker/storage/logs.py", "Appends.flush"): "inserts into records",
    ("broker/core/records.py", "check_records"): "check_records",
    ("broker/engine/engine.py", "Engine._route"): "route",
    ("broker/storage/database.py", "Database.write"): "BEGIN IMMEDIATE/COMMIT",
}
_WRITE: Final = ("broker/storage/database.py", "Database.write")

FSYNC_CHILD: Final = """
import random, sys
from broker.client.client import connect
from broker.types import NewRecord
mode, partitions, count, data_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(79)
batch = [NewRecord(rng.randbytes(100), None, (), i % partitions) for i in range(1000)]
with connect(data_dir) as client:
    client.create_topic("t", partitions)
    for _ in range(count):
        if mode == "txn":
            with client.transaction("bench") as txn:
                txn.produce("t", batch)
        else:
            client.produce("t", batch)
"""


def _entries(profile: cProfile.Profile) -> dict[tuple[str, str], tuple[int, float]]:
    """(file under the repository, qualified name) -> (calls, cumulative seconds)."""
    found: dict[tuple[str, str], tuple[int, float]] = {}
    for entry in profile.getstats():
        if isinstance(entry.code, str):
            continue
        path = Path(entry.code.co_filename)
        if not path.is_relative_to(_REPOSITORY):
            continue
        key = (path.relative_to(_REPOSITORY).as_posix(), entry.code.co_qualname)
        calls, seconds = found.get(key, (0, 0.0))
        found[key] = (calls + entry.callcount, seconds + entry.totaltime)
    return found


def _profiled(
    run: Callable[[], None], count: int, parts: dict[tuple[str, str], str]
) -> tuple[float, dict[str, float], float]:
    """(wall ms per run, cumulative ms per run of each part, write transactions per run)
    of `count` runs under cProfile."""
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(count):
        run()
    profile.disable()
    wall_ms = (time.perf_counter() - start) * 1000 / count
    entries = _entries(profile)
    per_run = {name: entries.get(key, (0, 0.0))[1] * 1000 / count for key, name in parts.items()}
    # Database.write is a generator: the profiler sees it once as it enters the with
    # block and once as it leaves, and not while the block's body runs, so its time is
    # its BEGIN IMMEDIATE and COMMIT (the WAL write, fsync and any checkpoint).
    writes = entries.get(_WRITE, (0, 0.0))[0] / 2 / count
    return wall_ms, per_run, writes


def _strace_fsyncs(work_dir: Path, runs: int) -> tuple[dict[str, float], float, str]:
    """fdatasync + fsync per transaction or plain batch, strace's us per fdatasync, and
    why they were not counted (empty when they were)."""
    strace = shutil.which("strace")
    if strace is None:
        return {}, 0.0, "strace is not installed"

    def count(mode: str, partitions: int, times: int) -> tuple[int, float]:
        out = work_dir / f"strace-{mode}-{partitions}-{times}.txt"
        argv = [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out)]
        argv += [sys.executable, "-c", FSYNC_CHILD, mode, str(partitions), str(times)]
        argv.append(str(work_dir / f"fsync-{mode}-{partitions}-{times}"))
        subprocess.run(argv, check=True, capture_output=True, timeout=300)
        calls, seconds = 0, 0.0
        for line in out.read_text().splitlines():
            fields = line.split()
            if fields and fields[-1] in ("fsync", "fdatasync"):
                calls += int(fields[3])
                seconds += float(fields[1])
        return calls, seconds

    try:
        base, _ = count("plain", 1, 0)
        per: dict[str, float] = {}
        total_calls, total_s = 0, 0.0
        for label, mode, partitions in (
            ("txn, 1 partition", "txn", 1),
            ("txn, 4 partitions", "txn", 4),
            ("plain batch", "plain", 1),
        ):
            calls, seconds = count(mode, partitions, runs)
            per[label] = (calls - base) / runs
            total_calls, total_s = total_calls + calls, total_s + seconds
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return {}, 0.0, f"strace failed: {error}"
    return per, total_s * 1e6 / max(1, total_calls), ""


def _profile(work_dir: Path, sizes: TxnSizes) -> Profiled:
    values = _values(TARGET_RECORDS, seed=71)
    batch = [NewRecord(v, None, (), 0) for v in values]
    with connect(work_dir / "txn-profile", durability="full") as client:
        client.create_topic("txn", 1)
        client.create_topic("plain", 1)
        _tail(client, "profile")

        def transaction() -> None:
            with client.transaction(GROUP) as txn:
                txn.produce("txn", batch)

        def plain() -> None:
            client.produce("plain", batch)

        for _ in range(WARM_UP_TXNS):
            transaction()
            plain()
        txn_ms, txn_parts, txn_writes = _profiled(transaction, sizes.profile_txns, _TXN_PARTS)
        plain_ms, plain_parts, plain_writes = _profiled(plain, sizes.profile_txns, _PLAIN_PARTS)
    fsyncs, fsync_us, skipped = _strace_fsyncs(work_dir, sizes.fsync_txns)
    return Profiled(
        sizes.profile_txns,
        txn_ms,
        plain_ms,
        txn_parts,
        plain_parts,
        txn_writes,
        plain_writes,
        fsyncs,
        fsync_us,
        skipped,
    )


def measure(work_dir: Path, sizes: TxnSizes) -> TxnResults:
    assert sizes.records % max(TXN_RECORDS) == 0, "a round holds whole transactions"
    values = _values(sizes.records, seed=67)
    throughputs: list[Throughput] = []
    latencies: list[Latency] = []
    for deployment in DEPLOYMENTS:
        sys.stderr.write(f"bench: transactions, {deployment.name}\n")
        with _client(work_dir, deployment) as client:
            _warm_up(client, values)
            for txn_records in TXN_RECORDS:
                for partitions in SPREAD:
                    throughputs.append(
                        _throughput(
                            client, deployment, txn_records, partitions, values, sizes.rounds
                        )
                    )
            latencies.append(_latency(client, deployment, sizes.latency_rounds, sizes.latency_txns))
    sys.stderr.write("bench: transactions, profile\n")
    return TxnResults(sizes, tuple(throughputs), tuple(latencies), _profile(work_dir, sizes))


# the section ---------------------------------------------------------------------------


def _rows(results: TxnResults) -> list[Row]:
    rows = [
        Row(
            t.name,
            rate(median(t.txn)),
            f"plain {rate(median(t.plain))}",
            f"{t.ratio:.2f}",
            f"ratio >= {RATIO_MIN:.2f}" if t.judged else "(information)",
            verdict(t.passed) if t.judged else INFORMATION,
        )
        for t in results.throughputs
    ]
    for latency in results.latencies:
        steps = latency.steps
        rows += [
            Row(
                f"{latency.deployment}: {LATENCY_RECORDS}-record txn, begin+produce+commit",
                steps["total"].text,
                f"plain produce of the {LATENCY_RECORDS}: {steps['plain'].text}",
                f"{median(steps['total'].p50_ms) / median(steps['plain'].p50_ms):.2f}",
            ),
            Row(
                f"{latency.deployment}: {LATENCY_RECORDS}-record txn, commit alone",
                steps["commit"].text,
                f"begin p50 {median(steps['begin'].p50_ms):.2f} ms, "
                f"produce p50 {median(steps['produce'].p50_ms):.2f} ms",
            ),
        ]
    return rows


def _method(results: TxnResults) -> list[str]:
    sizes = results.sizes
    return [
        "How it is measured (bench/txn.py, bench/processes.py):",
        "",
        "- Deployments: `broker.client.connect(dir, durability=full|normal)` in this process;",
        "  and `fencelog --broker DIR --durability full serve --listen 127.0.0.1:0` as a real",
        "  process, reached through `connect('tcp://...')` (the synchronous client, one",
        "  request at a time). Each deployment first runs 3 unmeasured 1000-record",
        "  transactions and plain batches.",
        f"- Throughput: {sizes.records:,} distinct 100-byte values per side per round, as",
        "  transactions of 100, 1000 or 10000 records; a transaction is `with",
        f"  client.transaction('{GROUP}') as txn:` and one `txn.produce(topic, batch)` per",
        f"  batch of up to {BATCH_RECORDS} records (so 1, 1 or 10 produce requests), committed",
        "  on leaving the block (begin, produce, commit all inside the clock). The plain",
        "  side produces the same batches with `client.produce(topic, batch)`. Records go",
        "  to one partition, or round-robin to 4 (`NewRecord.partition`), and are built",
        "  before the clock. Each round uses two fresh topics; the sides take turns",
        "  transaction by transaction, rotating which goes first; a rate is records over",
        "  the sum of that side's times; a figure is the median of its rounds and the",
        "  ratio median over median. Afterwards every partition's end offset is checked.",
        f"- Latency: {sizes.latency_rounds} rounds (after one short unmeasured one) of",
        f"  {sizes.latency_txns:,} {LATENCY_RECORDS}-record transactions into a one-partition",
        "  topic, perf_counter around `client.transaction(group)` (nothing reaches the",
        "  broker yet), `txn.produce(topic, 10 records)` (which begins the transaction in",
        "  the same request) and `txn.commit()`, which returns once the",
        "  records are in the log; in turn with each, a plain `client.produce` of the same",
        "  10 records. A round's p50 and p99 are nearest-rank; the figure is their median",
        "  over rounds. The ratio column is the transaction's p50 over the plain p50.",
        f"- Profile: cProfile around {sizes.profile_txns} transactions of 1000 records into",
        "  one partition (embedded, durability full), and around as many plain produces of",
        "  the same batch; per-function cumulative times per transaction or batch. Times",
        "  under the profiler are inflated for Python code, not for time inside SQLite.",
        "- fsyncs: `strace -f -c -e trace=fsync,fdatasync` of a child process that opens",
        f"  a fresh data directory (durability full) and runs {sizes.fsync_txns} such",
        "  transactions (1 or 4 partitions) or plain batches, less the same child running",
        "  none; per transaction or batch, WAL checkpoints included.",
    ]


def _findings(results: TxnResults) -> list[str]:
    judged = [t for t in results.throughputs if t.judged]
    profile = results.profile
    tp, pp = profile.txn_parts, profile.plain_parts
    prepare_and_apply = tp["commit"]
    lines = [
        "What the figures say:",
        "",
        "- At 1000 records per transaction the transactional rate is "
        + ", ".join(f"{t.ratio:.0%} ({t.deployment}, {t.partitions}p)" for t in judged)
        + " of the plain rate of the same batches.",
        f"- Where the time goes (cProfile, embedded full, {profile.transactions} transactions "
        f"of 1000 records into one partition): {profile.txn_ms:.1f} ms per transaction "
        f"against {profile.plain_ms:.1f} ms per plain batch, profiled. The begin with the "
        f"first produce into the data journal {tp['begin and produce']:.2f} ms, later "
        f"produces {tp['produce']:.2f} ms "
        f"(the journal's batch insert {tp['journal batch insert']:.2f} ms) against "
        f"the plain produce's {pp['produce']:.2f} ms (inserts into records "
        f"{pp['inserts into records']:.2f} ms); commit {prepare_and_apply:.2f} ms.",
        f"- In the commit: the copy into the log (batches unpacked, their records "
        f"inserted as a plain produce's) {tp['copy into the log']:.2f} ms "
        f"({tp['copy into the log'] * 1000 / TARGET_RECORDS:.2f} us per record); dropping "
        f"the copied journal batches "
        f"{tp['mark_applied (drop journal batches)']:.2f} ms. check_records, the same on "
        f"both sides, is {tp['check_records']:.2f} ms of a transaction and "
        f"{pp['check_records']:.2f} ms of a plain batch.",
        f"- {profile.writes_per_txn:.0f} SQLite write transactions per transaction (begin "
        "with the data, prepare (not synced on its own), apply with complete) against "
        f"{profile.writes_per_batch:.0f} per plain batch; their BEGIN IMMEDIATE and COMMIT "
        "(WAL write, fsync, checkpoints) take "
        f"{tp['BEGIN IMMEDIATE/COMMIT']:.2f} ms per transaction against "
        f"{pp['BEGIN IMMEDIATE/COMMIT']:.2f} ms per plain batch: every record is written "
        "twice (journal, log).",
    ]
    if profile.fsync_skipped:
        lines.append(f"- fsyncs were not counted: {profile.fsync_skipped}.")
    else:
        lines.append(
            "- fsyncs (strace, fdatasync + fsync, checkpoints included): "
            + ", ".join(f"{count:.2f} per {label}" for label, count in profile.fsyncs.items())
            + f"; one fdatasync took {profile.fsync_us:.0f} us here (strace's own figure)."
        )
    return lines


def _raw(results: TxnResults) -> list[str]:
    lines = []
    for t in results.throughputs:
        lines += [
            f"{t.name}: records/s per round",
            series("transactional", t.txn),
            series("plain", t.plain),
            series("ratio per round", t.round_ratios, 3),
        ]
    for latency in results.latencies:
        lines.append(f"{latency.deployment}: {LATENCY_RECORDS}-record transactions, ms per round")
        for step, figures in latency.steps.items():
            lines += [
                series(f"{step} p50", figures.p50_ms, 3),
                series(f"{step} p99", figures.p99_ms, 3),
            ]
    profile = results.profile
    lines.append(
        f"profile, ms per 1000-record transaction ({profile.txn_ms:.2f} wall, profiled, "
        f"{profile.writes_per_txn:.2f} write transactions)"
    )
    lines += [f"  {name:<44} {ms:.3f}" for name, ms in profile.txn_parts.items()]
    lines.append(
        f"profile, ms per plain batch of 1000 ({profile.plain_ms:.2f} wall, profiled, "
        f"{profile.writes_per_batch:.2f} write transactions)"
    )
    lines += [f"  {name:<44} {ms:.3f}" for name, ms in profile.plain_parts.items()]
    if profile.fsyncs:
        lines.append(f"fsyncs (strace), {profile.fsync_us:.1f} us per call")
        lines += [f"  per {label:<40} {count:.2f}" for label, count in profile.fsyncs.items()]
    return lines


def section(results: TxnResults) -> Section:
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=tuple(_rows(results)),
        method=tuple(_method(results)),
        findings=tuple(_findings(results)),
        raw=tuple(_raw(results)),
    )
