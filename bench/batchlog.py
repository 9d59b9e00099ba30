"""Issue 36's goals, before and after the log of batches, side by side in one run:

    python -m bench.batchlog [--quick] [--before REV] [--after PATH]
    python -m bench.run --only batchlog [--quick]

Rules:
- Two trees: --before REV (default a423392, the last commit before the batch log), as a
  temporary `git worktree add --detach` removed at the end, and --after PATH (default:
  the checkout this file is in), measured as it is on disk.
- Every measurement runs in a process of its own: bench/batchlog_worker.py of the after
  tree (of this checkout if the after tree has none), as a script, with PYTHONPATH set
  to the tree being measured, so `broker`, `cli` (the `fencelog` console script's too)
  and the bench modules it reuses are that tree's. The versions take turns (before,
  after, after, before, ...) measure by measure; each figure pools a version's values
  over its turns and takes their median.
- Each goal of the issue is judged on the after tree; the before column shows where the
  code started. A "no regression" item passes when the after value is within
  REGRESSION_TOLERANCE of the before value measured in the same run (bytes on disk per
  record, which do not vary from run to run: no more than before at all).
- A measure whose tool is missing here (kcat, confluent-kafka, Java) is "skipped" with
  the reason, counted neither way.
- Everything temporary lives in one directory removed at the end; every server started
  is stopped (the worker's bench modules stop theirs; a worker that overruns or is
  interrupted is ended with its process group); 127.0.0.1 only. A failed worker fails
  its rows and the run goes on.
- A full run rewrites its section of bench/RESULTS.md; --quick writes nothing unless
  --results is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench import report
from bench.machine import Machine, describe, finished
from bench.sections import FAIL, PASS, SKIPPED, machine_line

TITLE: Final = "A log of batches (issue 36): before and after"
DEFAULT_BEFORE: Final = "a423392"
REPOSITORY: Final = Path(__file__).resolve().parent.parent
RESULTS_FILE: Final = REPOSITORY / "bench" / "RESULTS.md"
WORKER: Final = Path("bench") / "batchlog_worker.py"
VERSIONS: Final = ("before", "after")
REGRESSION_TOLERANCE: Final = 0.10
WORKER_TIMEOUT_S: Final = 1800.0
STOP_GRACE_S: Final = 20.0
LOG_TAIL_CHARS: Final = 1500
_HEADER: Final = ("Measure", "before", "after", "goal", "met?")
_MEASURED_PATHS: Final = ("broker", "cli", "pyproject.toml")

Series = dict[str, list[float]]


@dataclass(frozen=True, slots=True)
class Plan:
    """One worker measure: its parameters, and how many turns each version takes."""

    turns: int
    parameters: dict[str, int]

    def text(self) -> str:
        sizes = ", ".join(f"{name} {value:,}" for name, value in self.parameters.items())
        return f"{self.turns} turn{'s' * (self.turns > 1)} per version ({sizes})"


FULL: Final = {
    "produce_embedded": Plan(5, {"records": 200_000}),
    "consume_embedded": Plan(3, {"records": 200_000, "rounds": 5}),
    "served": Plan(2, {"records": 100_000, "singles": 5_000, "rounds": 3}),
    "kafka": Plan(2, {"records": 200_000, "read_records": 1_000_000, "rounds": 2}),
    "spark": Plan(1, {"records": 1_000_000, "rounds": 3}),
    "disk": Plan(1, {"records": 10_000_000, "dd_megabytes": 2048}),  # ~3 min a turn here
    "txn": Plan(2, {"records": 50_000, "rounds": 3}),
    "cli_start": Plan(2, {"runs": 25}),
}
QUICK: Final = {
    "produce_embedded": Plan(1, {"records": 20_000}),
    "consume_embedded": Plan(1, {"records": 20_000, "rounds": 3}),
    "served": Plan(1, {"records": 20_000, "singles": 500, "rounds": 2}),
    "kafka": Plan(1, {"records": 10_000, "read_records": 50_000, "rounds": 1}),
    "spark": Plan(1, {"records": 100_000, "rounds": 1}),
    "disk": Plan(1, {"records": 200_000, "dd_megabytes": 64}),
    "txn": Plan(1, {"records": 10_000, "rounds": 1}),
    "cli_start": Plan(1, {"runs": 5}),
}


@dataclass(slots=True)
class Results:
    plans: dict[str, Plan]
    quick: bool
    codes: dict[str, str]  # version -> what was measured
    found: dict[str, dict[str, Series]] = field(default_factory=dict)  # measure -> version
    skipped: dict[str, str] = field(default_factory=dict)  # measure -> why
    failed: dict[str, str] = field(default_factory=dict)  # measure -> how its worker failed
    raw: list[str] = field(default_factory=list)  # each turn's values, in run order

    def series(self, measure: str, version: str, name: str) -> list[float]:
        return self.found.get(measure, {}).get(version, {}).get(name, [])


# running --------------------------------------------------------------------------------


def _git(tree: Path, *arguments: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), *arguments], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(arguments)} in {tree}: {done.stderr.strip()}")
    return done.stdout.strip()


def _repository_of(after: Path) -> Path:
    """Where the before commit is looked up: the after tree if it is a git work tree,
    else this checkout."""
    try:
        _git(after, "rev-parse", "--git-dir")
    except RuntimeError:
        return REPOSITORY
    return after


@contextlib.contextmanager
def before_tree(repository: Path, revision: str, parent: Path) -> Iterator[Path]:
    """A detached worktree of `revision` under `parent`, removed however the block ends."""
    tree = parent / "before"
    _git(repository, "worktree", "add", "--detach", "--quiet", str(tree), revision)
    try:
        yield tree
    finally:
        _git(repository, "worktree", "remove", "--force", str(tree))


def code_of(tree: Path, label: str) -> str:
    """The commit of `tree` and the measured paths that differ from it, if any."""
    try:
        commit = _git(tree, "rev-parse", "--short", "HEAD")
    except RuntimeError:
        return f"{label}: not a git checkout"
    status = _git(tree, "status", "--porcelain", "--untracked-files=all", "--", *_MEASURED_PATHS)
    changed = sorted({line[3:] for line in status.splitlines()})
    extra = f" plus uncommitted changes to {', '.join(changed)}" if changed else ""
    return f"{label}: commit {commit}{extra}"


def _environment(tree: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FENCELOG_")}
    return env | {"PYTHONPATH": str(tree), "NO_COLOR": "1"}


class WorkerFailed(RuntimeError):
    pass


def run_worker(
    tree: Path, worker_file: Path, measure: str, parameters: dict[str, int], parent: Path
) -> dict[str, object]:
    """One measure in a fresh process (and process group) against `tree`; its JSON
    answer. A worker past WORKER_TIMEOUT_S, or still running when this run is
    interrupted, is ended with its whole group, so a server it started goes with it."""
    work = Path(tempfile.mkdtemp(prefix=f"{measure}-", dir=parent))
    log_path = parent / f"{measure}.log"
    argv = [sys.executable, str(worker_file), measure, str(work), json.dumps(parameters)]
    try:
        with log_path.open("w+b") as log:
            worker = subprocess.Popen(
                argv,
                cwd=work,
                env=_environment(tree),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
            try:
                stdout, _ = worker.communicate(timeout=WORKER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _end_group(worker)
                raise WorkerFailed(f"not done after {WORKER_TIMEOUT_S:.0f} s") from None
            except BaseException:  # Ctrl-C: its own session does not get the SIGINT
                _end_group(worker)
                raise
            log.seek(0)
            tail = log.read().decode(errors="replace")[-LOG_TAIL_CHARS:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        log_path.unlink(missing_ok=True)
    if worker.returncode != 0:
        raise WorkerFailed(f"exited {worker.returncode}; its stderr ends:\n{tail}")
    answer: dict[str, object] = json.loads(stdout.decode().strip().splitlines()[-1])
    return answer


def _end_group(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's process group, SIGKILL after a grace period."""
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal_number)
        try:
            worker.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _progress(text: str, started_s: float) -> None:
    sys.stderr.write(f"[{time.monotonic() - started_s:6.1f}s] batchlog: {text}\n")
    sys.stderr.flush()


def _turn_line(measure: str, version: str, turn: int, series: Series) -> str:
    shown = "; ".join(
        f"{name} "
        + " ".join(f"{value:,.1f}" for value in values[:12])
        + (f" ... ({len(values)} values)" if len(values) > 12 else "")
        for name, values in series.items()
    )
    return f"{measure} {version} turn {turn + 1}: {shown}"


def _series_of(answer: dict[str, object]) -> Series:
    """A worker's answer as named lists of floats."""
    found: Series = {}
    for name, values in answer.items():
        assert isinstance(values, list), f"{name}: {values!r} is not a list of numbers"
        found[name] = [float(value) for value in values]
    return found


def measure_all(
    trees: dict[str, Path],
    worker_file: Path,
    plans: dict[str, Plan],
    parent: Path,
    results: Results,
) -> None:
    started_s = time.monotonic()
    for measure, plan in plans.items():
        for turn in range(plan.turns):
            order = VERSIONS if turn % 2 == 0 else VERSIONS[::-1]
            for version in order:
                _progress(f"{measure}, {version}, turn {turn + 1} of {plan.turns}", started_s)
                try:
                    answer = run_worker(
                        trees[version], worker_file, measure, plan.parameters, parent
                    )
                except WorkerFailed as failure:
                    results.failed[measure] = f"{version}, turn {turn + 1}: {failure}"
                    sys.stderr.write(f"bench.batchlog: {measure} {results.failed[measure]}\n")
                    break
                if "skipped" in answer:
                    results.skipped[measure] = str(answer["skipped"])
                    break
                pooled = results.found.setdefault(measure, {}).setdefault(version, {})
                got = _series_of(answer)
                for name, values in got.items():
                    pooled.setdefault(name, []).extend(values)
                results.raw.append(_turn_line(measure, version, turn, got))
            if measure in results.skipped or measure in results.failed:
                break


def measure(
    work_dir: Path, plans: dict[str, Plan], quick: bool, before: str, after: Path
) -> Results:
    after = after.resolve()
    if not (after / "broker").is_dir():
        raise SystemExit(f"bench.batchlog: {after} has no broker/ to measure")
    # The after tree's worker where it has one (the usual case: it is this checkout);
    # else this checkout's.
    worker_file = after / WORKER if (after / WORKER).exists() else REPOSITORY / WORKER
    with before_tree(_repository_of(after), before, work_dir) as tree:
        codes = {
            "before": code_of(tree, f"before ({before})"),
            "after": code_of(after, f"after ({after})"),
        }
        results = Results(plans, quick, codes)
        measure_all({"before": tree, "after": after}, worker_file, plans, work_dir, results)
    return results


# judging --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    measure: str
    before: str
    after: str
    goal: str
    met: str

    @property
    def cells(self) -> tuple[str, str, str, str, str]:
        return (self.measure, self.before, self.after, self.goal, self.met)


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _verdict(passed: bool | None) -> str:
    return SKIPPED if passed is None else (PASS if passed else FAIL)


Figure = Callable[[Results, str], float | None]  # (results, version) -> a value
Shown = Callable[[Results, str], str]


def _pooled(measure: str, name: str) -> Figure:
    return lambda results, version: _median(results.series(measure, version, name))


def _ratio(measure: str, top: str, bottom: str) -> Figure:
    def figure(results: Results, version: str) -> float | None:
        over, under = (
            _pooled(measure, top)(results, version),
            _pooled(measure, bottom)(results, version),
        )
        return None if over is None or under is None else over / under

    return figure


def _lowest_ratio(measure: str, top: str, bottom: str) -> Figure:
    """The smallest per-round ratio: a goal that must hold in every run."""

    def figure(results: Results, version: str) -> float | None:
        pairs = zip(
            results.series(measure, version, top),
            results.series(measure, version, bottom),
            strict=True,
        )
        ratios = [over / under for over, under in pairs]
        return min(ratios) if ratios else None

    return figure


@dataclass(frozen=True, slots=True)
class Goal:
    """One row: what it measures, how a version's value is shown, and its goal: at least
    (or at most) a fixed value, or within REGRESSION_TOLERANCE of the before value."""

    label: str
    measure: str
    figure: Figure
    shown: Callable[[float, Results, str], str]
    goal: str
    at_least: float | None = None
    at_most: float | None = None
    no_regression: bool = False  # higher is better unless `lower_is_better`
    information: bool = False  # no goal: shown beside the goals it explains
    lower_is_better: bool = False
    tolerance: float = REGRESSION_TOLERANCE  # of the before value, for no_regression

    def row(self, results: Results) -> Row:
        if self.measure in results.failed:
            return Row(self.label, "-", "-", self.goal, f"{FAIL} (the measure failed)")
        if self.measure in results.skipped:
            why = f"skipped: {results.skipped[self.measure]}"
            return Row(self.label, why, why, self.goal, SKIPPED)
        before, after = self.figure(results, "before"), self.figure(results, "after")
        cells = [
            "-" if value is None else self.shown(value, results, version)
            for value, version in ((before, "before"), (after, "after"))
        ]
        met = "-" if self.information else _verdict(self.met(before, after))
        return Row(self.label, cells[0], cells[1], self.goal, met)

    def met(self, before: float | None, after: float | None) -> bool | None:
        if after is None or self.information:
            return None
        if self.no_regression:
            if before is None:
                return None
            if self.lower_is_better:
                return after <= before * (1 + self.tolerance)
            return after >= before * (1 - self.tolerance)
        if self.at_most is not None:
            return after <= self.at_most
        assert self.at_least is not None
        return after >= self.at_least


def _rate(measure: str, name: str) -> Callable[[float, Results, str], str]:
    return lambda value, results, version: f"{value:,.0f} records/s"


def _times_raw(measure: str) -> Callable[[float, Results, str], str]:
    def shown(value: float, results: Results, version: str) -> str:
        fencelog = _pooled(measure, "fencelog")(results, version) or 0.0
        raw = _pooled(measure, "raw")(results, version) or 0.0
        return f"{value:.2f}x ({fencelog:,.0f} vs raw {raw:,.0f} records/s)"

    return shown


def _of(what: str) -> Callable[[float, Results, str], str]:
    return lambda value, results, version: f"{value:.2f} of {what}"


def _bandwidth(value: float, results: Results, version: str) -> str:
    produced = _pooled("disk", "value_bytes_per_s")(results, version) or 0.0
    dd = _pooled("disk", "dd_bytes_per_s")(results, version) or 0.0
    return f"{value:.3f} of dd ({produced / 1e6:,.1f} vs dd {dd / 1e6:,.0f} MB/s)"


def _blob_bandwidth(value: float, results: Results, version: str) -> str:
    blobs = _pooled("disk", "sqlite_blob_bytes_per_s")(results, version) or 0.0
    return f"{value:.3f} of dd ({blobs / 1e6:,.1f} MB/s)"


def _disk_figure(results: Results, version: str) -> float | None:
    return _pooled("disk", "bytes_per_record")(results, version)


GOALS: Final = (
    Goal(
        "embedded produce, batches of 1000, 100-byte values, durability full, against raw "
        "SQLite row inserts",
        "produce_embedded",
        _ratio("produce_embedded", "fencelog", "raw"),
        _times_raw("produce_embedded"),
        ">= 4x raw",
        at_least=4.0,
    ),
    Goal(
        "embedded consume from offset 0 (Engine.read) against raw SQLite SELECT",
        "consume_embedded",
        _ratio("consume_embedded", "fencelog", "raw"),
        _times_raw("consume_embedded"),
        ">= 3x raw",
        at_least=3.0,
    ),
    Goal(
        "produce over TCP, batches of 1000, 4 in flight, durability full",
        "served",
        _pooled("served", "produce"),
        _rate("served", "produce"),
        ">= 1,000,000 records/s",
        at_least=1_000_000.0,
    ),
    Goal(
        "native consume over TCP from offset 0 (client.consume)",
        "served",
        _pooled("served", "consume"),
        _rate("served", "consume"),
        ">= 2,000,000 records/s",
        at_least=2_000_000.0,
    ),
    Goal(
        "Kafka listener: confluent-kafka idempotent producer",
        "kafka",
        _pooled("kafka", "produce"),
        _rate("kafka", "produce"),
        ">= 400,000 records/s",
        at_least=400_000.0,
    ),
    Goal(
        "Kafka listener: kcat read from the beginning",
        "kafka",
        _pooled("kafka", "kcat"),
        _rate("kafka", "kcat"),
        ">= 1,500,000 records/s",
        at_least=1_500_000.0,
    ),
    Goal(
        "Spark read (embedded) against Parquet, lowest round",
        "spark",
        _lowest_ratio("spark", "fencelog_read", "parquet_read"),
        _of("Parquet"),
        ">= 0.50 in every round",
        at_least=0.5,
    ),
    Goal(
        "Spark read against the Python data source ceiling",
        "spark",
        _ratio("spark", "fencelog_read", "ceiling_read"),
        _of("the ceiling"),
        ">= 0.90",
        at_least=0.9,
    ),
    Goal(
        "Spark write (embedded) against Parquet",
        "spark",
        _ratio("spark", "fencelog_write", "parquet_write"),
        _of("Parquet"),
        ">= 0.50",
        at_least=0.5,
    ),
    Goal(
        "long embedded produce: value bytes/s against dd's sequential write (fdatasync)",
        "disk",
        _ratio("disk", "value_bytes_per_s", "dd_bytes_per_s"),
        _bandwidth,
        ">= 0.30 of dd",
        at_least=0.3,
    ),
    Goal(
        "SQLite alone: the long produce's bytes as one blob a batch, a commit each (WAL, "
        "synchronous FULL), against dd",
        "disk",
        _ratio("disk", "sqlite_blob_bytes_per_s", "dd_bytes_per_s"),
        _blob_bandwidth,
        "(information: the ceiling of the row above)",
        information=True,
    ),
    Goal(
        "bytes on disk per 100-byte record after the long produce",
        "disk",
        _disk_figure,
        lambda value, results, version: f"{value:,.1f} bytes",
        "no more than before",
        no_regression=True,
        lower_is_better=True,
        tolerance=0.0,
    ),
    Goal(
        "one-record produce p50 over TCP, one at a time, de-duplicated, durability normal",
        "served",
        _pooled("served", "latency_us"),
        lambda value, results, version: f"{value:,.0f} us",
        "no regression (<= before + 10%)",
        no_regression=True,
        lower_is_better=True,
    ),
    Goal(
        "de-duplicated one-record requests, 32 in flight, durability normal",
        "served",
        _pooled("served", "dedup"),
        _rate("served", "dedup"),
        "no regression (>= before - 10%)",
        no_regression=True,
    ),
    Goal(
        "transactions of 1000 against plain produce of the same batches (embedded, full)",
        "txn",
        _ratio("txn", "txn", "plain"),
        lambda value, results, version: f"{value:.2f} of plain",
        "no regression (>= before - 10%)",
        no_regression=True,
    ),
    Goal(
        "the same: a transaction's time beyond the plain produce of its batch",
        "txn",
        _pooled("txn", "extra_ms"),
        lambda value, results, version: f"{value:.2f} ms",
        "no regression (<= before + 10%)",
        no_regression=True,
        lower_is_better=True,
    ),
    Goal(
        "CLI start: `fencelog produce` (embedded) CPU per process",
        "cli_start",
        _pooled("cli_start", "produce_cpu_ms"),
        lambda value, results, version: f"{value:,.0f} ms",
        "no regression (<= before + 10%)",
        no_regression=True,
        lower_is_better=True,
    ),
)


def rows(results: Results) -> list[Row]:
    return [goal.row(results) for goal in GOALS if goal.measure in results.plans]


def passed(results: Results) -> bool:
    return not results.failed and all(row.met != FAIL for row in rows(results))


def _notes(results: Results) -> list[str]:
    skipped = [f"Skipped: {name}, {why}." for name, why in results.skipped.items()]
    return skipped + [f"Failed: {name}, {_one_line(how)}" for name, how in results.failed.items()]


def _one_line(text: str) -> str:
    """A failure's first line and the last line of its stderr, for a one-line note."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


# showing --------------------------------------------------------------------------------


def summary(results: Results) -> str:
    plans = "; ".join(f"{name}: {plan.text()}" for name, plan in results.plans.items())
    return plans + (" (--quick)" if results.quick else "")


def table(results: Results) -> str:
    """The plain-text table printed at the end of a run."""
    lines = [_HEADER, *(row.cells for row in rows(results))]
    widths = [max(len(line[column]) for line in lines) for column in range(len(_HEADER))]
    text = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join([f"{TITLE}", *results.codes.values(), *text, *_notes(results)])


METHOD: Final = (
    "How it is measured (bench/batchlog.py, bench/batchlog_worker.py):",
    "",
    "- The before tree is a temporary `git worktree add --detach` of the before commit; the",
    "  after tree is the checkout as it is on disk. Each measure runs in a new process (the",
    "  after tree's bench/batchlog_worker.py as a script, PYTHONPATH the measured tree), so",
    "  `broker`, `cli`, the `fencelog` console script's code and the reused bench modules",
    "  are the measured tree's. The versions take turns measure by measure (before, after,",
    "  after, before, ...); a figure is the median of a version's values over its turns.",
    "- Embedded produce: 100-byte values in batches of 1000 through `connect(dir,",
    '  durability="full").produce`, against `executemany` of the same rows into the',
    "  one-row-per-record table of the schema before the batch log (kept fixed in the",
    "  worker, so the baseline does not move with the schema), WAL, synchronous FULL, one",
    "  BEGIN IMMEDIATE/COMMIT per batch, batch by batch in turns (bench/append.py's way).",
    "- Embedded consume: bench/read.py's `Engine.read` paging from offset 0 of a",
    "  checkpointed partition, against one `SELECT * ... ORDER BY offset` fetchall of the",
    "  same values in the fixed raw table, rounds in turns after one unmeasured scan each.",
    "- Over TCP (bench/served.py's patterns, bench/processes.py's `fencelog serve --listen",
    "  127.0.0.1:0`, clients polling 500 us for a reply as bench/serving.py's): batches of",
    "  1000, 4 in flight, durability full; `client.consume` of that partition from offset",
    "  0; de-duplicated one-record requests, 32 in flight, and one at a time (the p50 of",
    "  every request), durability normal.",
    "- Kafka (bench/kafka_listener.py's servers and sides): confluent-kafka's Producer",
    "  with enable.idempotence, one produce() per record, then flush(), a fresh server per",
    "  turn; `kcat -C -o beginning -e -c N` of a filled partition of N records, timed as a",
    "  whole process (-c: it stops at the last record rather than wait out the 500 ms",
    "  fetch.wait.max.ms of the fetch that finds the end, which a Kafka broker holds too).",
    "- Spark (bench/spark_parquet.py's approach, one local[2] session per turn): the",
    "  connector's embedded read -> noop and write against Parquet's, and the read against",
    "  bench/spark.py's in-memory Python data source (the ceiling), rounds in turns. The",
    "  Parquet read goal is judged on the lowest round, as it must hold in every run.",
    "- Disk: `dd if=/dev/zero of=FILE bs=1M count=N conv=fdatasync` timed whole, then, in",
    "  the same process and filesystem, an embedded produce (batches of 1000, durability",
    "  full) of distinct 100-byte values cycled from a pool of 100,000; value bytes/s over",
    "  dd's bytes/s, and the data directory's bytes (every file) per record once closed.",
    "  Then SQLite alone, the same bytes with no fencelog: each batch's values joined into",
    "  one blob, a row and a COMMIT each, WAL, synchronous FULL (the same for both",
    "  versions: it runs no fencelog code).",
    "- Transactions: 1000-record transactions against plain produce of the same batches",
    "  (bench/txn.py's steps), embedded, durability full, in turns, each side in a data",
    "  directory of its own, so each pays for its own WAL's checkpoints. CLI start:",
    "  bench/cli_start.py's CPU ms of an embedded `fencelog produce` process.",
    f"- No regression: within {REGRESSION_TOLERANCE:.0%} of the before value of the same run;",
    "  bytes on disk per record: no more than before at all.",
)


def markdown(results: Results, machine: Machine) -> str:
    """This measure's whole RESULTS.md section, heading included."""
    notes = _notes(results)
    lines = [
        f"## {TITLE}",
        "",
        f"Measured {machine.date} by `python -m bench.batchlog`: {summary(results)}.",
        "",
        machine_line(machine),
        "",
        "Code: " + "; ".join(results.codes.values()) + ".",
        "",
        "| " + " | ".join(_HEADER) + " |",
        "|---|--:|--:|---|---|",
        *("| " + " | ".join(row.cells) + " |" for row in rows(results)),
        "",
        *([*notes, ""] if notes else []),
        *METHOD,
        "",
        "Raw numbers, in run order:",
        "",
        "```text",
        *results.raw,
        "```",
    ]
    return "\n".join(lines) + "\n"


# the command ----------------------------------------------------------------------------


def run_group(
    work_dir: Path,
    quick: bool,
    before: str = DEFAULT_BEFORE,
    after: Path = REPOSITORY,
    only: Sequence[str] = (),
) -> tuple[str, str, bool]:
    """(printed table, RESULTS.md section, whether every goal was met), as bench.run's
    groups answer; `only` names the measures to run (default: all)."""
    plans = {
        name: plan for name, plan in (QUICK if quick else FULL).items() if name in (only or FULL)
    }
    started = describe(work_dir)
    results = measure(work_dir, plans, quick, before, after)
    machine = finished(started)
    return table(results), markdown(results, machine), passed(results)


def write_section(path: Path, section_text: str) -> None:
    document = path.read_text(encoding="utf-8") if path.exists() else report.DOCUMENT_HEAD
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(report.replace_section(document, section_text), encoding="utf-8")
    temporary.replace(path)


def _measures(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in FULL]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown measure {', '.join(unknown) or '(none)'}; choose from {', '.join(FULL)}"
        )
    return chosen


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batchlog",
        description="Issue 36's goals measured before and after the log of batches in one "
        "run; exit 1 if a goal of the after tree is missed.",
    )
    parser.add_argument(
        "--before", default=DEFAULT_BEFORE, metavar="REV", help=f"default {DEFAULT_BEFORE}"
    )
    parser.add_argument(
        "--after", type=Path, default=REPOSITORY, metavar="PATH", help="default: this checkout"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--only",
        type=_measures,
        default=(),
        metavar="MEASURE[,MEASURE...]",
        help=f"run only these measures, of {', '.join(FULL)} (a run of some writes nothing "
        "unless --results is given)",
    )
    parser.add_argument("--dir", type=Path, help="where to make the temporary directory")
    parser.add_argument(
        "--results",
        type=Path,
        help="RESULTS.md to update (default: bench/RESULTS.md on a full run; a --quick "
        "run updates nothing unless given)",
    )
    parser.add_argument("--no-results", action="store_true", help="print only; write nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    destination: Path | None = arguments.results
    if destination is None and not arguments.quick and not arguments.only:
        destination = RESULTS_FILE
    if arguments.no_results:
        destination = None
    with tempfile.TemporaryDirectory(prefix="fencelog-bench-batchlog-", dir=arguments.dir) as d:
        printed, section_text, all_met = run_group(
            Path(d), arguments.quick, arguments.before, arguments.after, arguments.only
        )
    print(printed + "\n", flush=True)
    if destination is not None:
        write_section(destination, section_text)
        print(f"wrote section {TITLE!r} of {destination}", flush=True)
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
