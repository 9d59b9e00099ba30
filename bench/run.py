"""The benchmark entry point: `python -m bench.run` (`make bench`).

Runs the benchmark groups (all of them, or those named with --only), prints each
group's table and rewrites that group's section of bench/RESULTS.md as soon as it ends:
- engine: "Engine and CLI (issue 2)": append and read against raw SQLite, and the
  `fencelog produce` process;
- server: "Server (issue 3)": `fencelog serve` as a process beside NATS JetStream,
  served batches and reads beside the embedded engine;
- ownership: "Ownership (issue 4)": claim + release round trips, severing;
- idempotence: "Idempotent producers (issue 5)": the producer fields' overhead, restart;
- txn: "Transactions (issue 7)": transactional against plain produce, commit latency;
- spark: "PySpark connector (issue 8)": batch and streaming reads and writes through
  broker/spark.py in one warm SparkSession, next to the Python data source ceiling;
- spark-parquet: "PySpark connector against Parquet; the first micro-batch (issue 21)":
  the connector's reads and writes beside Parquet's in one session, and a stream's
  first micro-batch after a restart beside its steady ones;
- cli-start: "CLI start (issue 23)": the CPU of one-shot produce and consume, embedded
  and served, against `python -c pass`;
- growth: "Growth curves (issue 23)": produce, consume, a read from the middle,
  restart and snapshot on a partition of 0, 1M and 10M records;
- kafka: "Kafka listener": `serve --kafka-listen` driven by confluent-kafka and kcat
  beside the native client on the same server command (also `python -m
  bench.kafka_listener`);
- retention: "Retention cleaning": 10M old records cleaned by `serve`'s background
  cleaner, produce latency with and without it, each step timed in process (also
  `python -m bench.retention_clean`);
- batchlog: "A log of batches (issue 36): before and after": issue 36's goals measured
  against the commit before the batch log (a temporary git worktree) and this checkout,
  each measure in a process of its own, the versions taking turns (also `python -m
  bench.batchlog`, which takes --before REV and --after PATH).
All databases and servers live in one temporary directory, removed at the end; every
server started is stopped. Exit status 0 when every target is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from bench import (
    append,
    cli_produce,
    idempotence,
    jetstream,
    kafka_listener,
    ownership,
    read,
    report,
    retention_clean,
    sections,
    serving,
    txn,
)
from bench.machine import Machine, describe, finished
from bench.measures import EngineCliResults, Sizes
from broker.types import DURABILITIES

RESULTS_FILE: Final = Path(__file__).resolve().parent / "RESULTS.md"
FULL: Final = Sizes(
    rounds=7,
    append_records=200_000,
    read_rounds=15,
    read_records=200_000,
    cli_runs=20,
    quick=False,
)
QUICK: Final = Sizes(
    rounds=3, append_records=50_000, read_rounds=5, read_records=50_000, cli_runs=10, quick=True
)
SERVER_FULL: Final = serving.ServerSizes(
    rounds=5,
    window_records=10_000,
    latency_requests=2_000,
    batch_records=100_000,
    consume_rounds=9,
    consume_records=200_000,
    quick=False,
)
SERVER_QUICK: Final = serving.ServerSizes(
    rounds=3,
    window_records=2_000,
    latency_requests=500,
    batch_records=20_000,
    consume_rounds=3,
    consume_records=50_000,
    quick=True,
)
OWNERSHIP_FULL: Final = ownership.OwnershipSizes(rounds=5, pairs=300, sever_rounds=10, quick=False)
OWNERSHIP_QUICK: Final = ownership.OwnershipSizes(rounds=3, pairs=100, sever_rounds=4, quick=True)
IDEMPOTENCE_FULL: Final = idempotence.IdempotenceSizes(
    rounds=5,
    embedded_batch_records=100_000,
    embedded_single_records=5_000,
    served_batch_records=100_000,
    served_single_records=10_000,
    restart_records=1_000_000,
    restart_tail=10_000,
    restart_rounds=5,
    quick=False,
)
IDEMPOTENCE_QUICK: Final = idempotence.IdempotenceSizes(
    rounds=3,
    embedded_batch_records=20_000,
    embedded_single_records=1_000,
    served_batch_records=20_000,
    served_single_records=2_000,
    restart_records=100_000,
    restart_tail=10_000,
    restart_rounds=3,
    quick=True,
)
TXN_FULL: Final = txn.TxnSizes(
    rounds=5,
    records=50_000,
    latency_rounds=5,
    latency_txns=300,
    profile_txns=30,
    fsync_txns=50,
    quick=False,
)
TXN_QUICK: Final = txn.TxnSizes(
    rounds=3,
    records=10_000,
    latency_rounds=3,
    latency_txns=100,
    profile_txns=10,
    fsync_txns=20,
    quick=True,
)
GROUPS: Final = (
    "engine",
    "server",
    "ownership",
    "idempotence",
    "txn",
    "spark",
    "spark-parquet",
    "cli-start",
    "growth",
    "kafka",
    "retention",
    "batchlog",
)
# batchlog measures a second tree and everything twice: it runs only when named.
DEFAULT_GROUPS: Final = tuple(name for name in GROUPS if name != "batchlog")


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _groups(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in GROUPS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown group {', '.join(unknown) or '(none)'}; choose from {', '.join(GROUPS)}"
        )
    return tuple(name for name in GROUPS if name in chosen)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="fencelog benchmarks against raw SQLite, the embedded engine and NATS "
        "JetStream; exit 1 if a target is missed.",
    )
    parser.add_argument(
        "--only",
        type=_groups,
        default=DEFAULT_GROUPS,
        metavar="GROUP[,GROUP...]",
        help=f"run only these groups, of {', '.join(GROUPS)} (default: all but batchlog)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of ~1 min")
    engine = parser.add_argument_group("the engine group's sizes")
    engine.add_argument("--rounds", type=_positive, help="append rounds per durability")
    engine.add_argument("--append-records", type=_positive, help="records per append round")
    engine.add_argument("--read-rounds", type=_positive, help="rounds of the read comparison")
    engine.add_argument("--read-records", type=_positive, help="records in the read partition")
    engine.add_argument("--cli-runs", type=_positive, help="timed `fencelog produce` runs")
    parser.add_argument(
        "--dir", type=Path, help="where to make the temporary directory (default: system temp)"
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="RESULTS.md to update (default: bench/RESULTS.md on a full run; "
        "a --quick run updates nothing unless given)",
    )
    parser.add_argument("--no-results", action="store_true", help="print only; write nothing")
    return parser.parse_args(argv)


def chosen_sizes(arguments: argparse.Namespace) -> Sizes:
    base = QUICK if arguments.quick else FULL
    return Sizes(
        rounds=arguments.rounds or base.rounds,
        append_records=arguments.append_records or base.append_records,
        read_rounds=arguments.read_rounds or base.read_rounds,
        read_records=arguments.read_records or base.read_records,
        cli_runs=arguments.cli_runs or base.cli_runs,
        quick=arguments.quick,
    )


def results_path(arguments: argparse.Namespace) -> Path | None:
    if arguments.no_results:
        return None
    if arguments.results is not None:
        return Path(arguments.results)
    return None if arguments.quick else RESULTS_FILE


def _step(text: str, started_s: float) -> None:
    sys.stderr.write(f"[{time.monotonic() - started_s:6.1f}s] {text}\n")
    sys.stderr.flush()


def measure_all(work_dir: Path, sizes: Sizes) -> EngineCliResults:
    started_s = time.monotonic()
    appends = []
    for durability in DURABILITIES:
        _step(f"append, durability {durability}", started_s)
        appends.append(append.compare(work_dir, durability, sizes.append_records, sizes.rounds))
    _step("read a partition from offset 0", started_s)
    read_result = read.compare(work_dir, sizes.read_records, sizes.read_rounds)
    _step("fencelog produce as a process", started_s)
    produce = cli_produce.measure(work_dir, sizes.cli_runs)
    imports = cli_produce.import_profile(work_dir)
    _step("done", started_s)
    return EngineCliResults(sizes, tuple(appends), read_result, produce, imports)


def write_section(path: Path, section_text: str) -> None:
    document = path.read_text(encoding="utf-8") if path.exists() else report.DOCUMENT_HEAD
    updated = report.replace_section(document, section_text)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(updated, encoding="utf-8")
    temporary.replace(path)


# groups ---------------------------------------------------------------------------------

# One group's run: (printed table, RESULTS.md section, whether every target was met).
Outcome = tuple[str, str, bool]


def run_engine(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    started = describe(work_dir)
    results = measure_all(work_dir, chosen_sizes(arguments))
    machine = finished(started)
    comparisons = (*results.append, results.read)
    passed = all(c.passed for c in comparisons) and results.produce.passed
    return report.table(results), report.section(results, machine), passed


def _section_outcome(section: sections.Section, machine: Machine) -> Outcome:
    return sections.table(section), sections.markdown(section, machine), section.passed


def run_server(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    skipped = jetstream.unavailable()
    if skipped:
        sys.stderr.write(f"bench: the NATS JetStream baseline is skipped: {skipped}\n")
    started = describe(work_dir)
    sizes = SERVER_QUICK if arguments.quick else SERVER_FULL
    results = serving.measure(work_dir, sizes)
    return _section_outcome(serving.section(results), finished(started))


def run_ownership(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    started = describe(work_dir)
    sizes = OWNERSHIP_QUICK if arguments.quick else OWNERSHIP_FULL
    results = ownership.measure(work_dir, sizes)
    return _section_outcome(ownership.section(results), finished(started))


def run_idempotence(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    started = describe(work_dir)
    sizes = IDEMPOTENCE_QUICK if arguments.quick else IDEMPOTENCE_FULL
    results = idempotence.measure(work_dir, sizes)
    return _section_outcome(idempotence.section(results), finished(started))


def run_txn(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    started = describe(work_dir)
    sizes = TXN_QUICK if arguments.quick else TXN_FULL
    results = txn.measure(work_dir, sizes)
    return _section_outcome(txn.section(results), finished(started))


def run_spark(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    from bench import spark  # imports pyspark (the spark extra): only when the group runs

    started = describe(work_dir)
    results = spark.measure(work_dir, spark.QUICK if arguments.quick else spark.FULL)
    return _section_outcome(spark.section(results), finished(started))


def run_cli_start(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    from bench import cli_start

    started = describe(work_dir)
    sizes = cli_start.QUICK if arguments.quick else cli_start.FULL
    return _section_outcome(
        cli_start.section(cli_start.measure(work_dir, sizes)), finished(started)
    )


def run_growth(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    from bench import growth

    started = describe(work_dir)
    sizes = growth.QUICK if arguments.quick else growth.FULL
    return _section_outcome(growth.section(growth.measure(work_dir, sizes)), finished(started))


def run_spark_parquet(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    from bench import spark_parquet  # imports pyspark, as run_spark

    started = describe(work_dir)
    sizes = spark_parquet.QUICK if arguments.quick else spark_parquet.FULL
    results = spark_parquet.measure(work_dir, sizes)
    return _section_outcome(spark_parquet.section(results), finished(started))


def run_kafka(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    sizes = kafka_listener.QUICK if arguments.quick else kafka_listener.FULL
    command = kafka_listener.command_line("bench.run")
    return kafka_listener.run_group(work_dir, sizes, None, command)


def run_retention(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    sizes = retention_clean.QUICK if arguments.quick else retention_clean.FULL
    return retention_clean.run_group(work_dir, sizes, retention_clean.command_line("bench.run"))


def run_batchlog(work_dir: Path, arguments: argparse.Namespace) -> Outcome:
    from bench import batchlog

    return batchlog.run_group(work_dir, arguments.quick)


RUNNERS: Final[dict[str, Callable[[Path, argparse.Namespace], Outcome]]] = {
    "engine": run_engine,
    "server": run_server,
    "ownership": run_ownership,
    "idempotence": run_idempotence,
    "txn": run_txn,
    "spark": run_spark,
    "spark-parquet": run_spark_parquet,
    "cli-start": run_cli_start,
    "growth": run_growth,
    "kafka": run_kafka,
    "retention": run_retention,
    "batchlog": run_batchlog,
}


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    destination = results_path(arguments)
    started_s = time.monotonic()
    passed = True
    for name in arguments.only:
        _step(f"group {name}", started_s)
        with tempfile.TemporaryDirectory(prefix=f"fencelog-bench-{name}-", dir=arguments.dir) as d:
            printed, section_text, group_passed = RUNNERS[name](Path(d), arguments)
        passed = passed and group_passed
        print(printed + "\n", flush=True)
        if destination is not None:
            write_section(destination, section_text)
            title = section_text.splitlines()[0].removeprefix("## ")
            print(f"wrote section {title!r} of {destination}\n", flush=True)
    _step(f"all done: every target {'met' if passed else 'NOT met'}", started_s)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
