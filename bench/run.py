"""The benchmark entry point: `python -m bench.run` (`make bench`).

Runs the "Engine and CLI (issue 2)" group (append and read against raw SQLite, and the
`fencelog produce` process), prints a table and rewrites that group's section of
bench/RESULTS.md. All databases live in one temporary directory, removed at the end.
Exit status 0 when every target is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench import append, cli_produce, read, report
from bench.machine import Machine, describe, finished
from bench.measures import EngineCliResults, Sizes
from broker.storage.database import DURABILITIES

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


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="fencelog benchmarks against raw SQLite; exit 1 if a target is missed.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of ~20 s")
    parser.add_argument("--rounds", type=_positive, help="append rounds per durability")
    parser.add_argument("--append-records", type=_positive, help="records per append round")
    parser.add_argument("--read-rounds", type=_positive, help="rounds of the read comparison")
    parser.add_argument("--read-records", type=_positive, help="records in the read partition")
    parser.add_argument("--cli-runs", type=_positive, help="timed `fencelog produce` runs")
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


def write_results(path: Path, results: EngineCliResults, machine: Machine) -> None:
    document = path.read_text(encoding="utf-8") if path.exists() else report.DOCUMENT_HEAD
    updated = report.replace_section(document, report.section(results, machine))
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(updated, encoding="utf-8")
    temporary.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    sizes = chosen_sizes(arguments)
    with tempfile.TemporaryDirectory(prefix="fencelog-bench-", dir=arguments.dir) as name:
        work_dir = Path(name)
        started = describe(work_dir)
        results = measure_all(work_dir, sizes)
    machine = finished(started)
    print(report.table(results))
    destination = results_path(arguments)
    if destination is not None:
        write_results(destination, results, machine)
        print(f"\nwrote section {report.SECTION_TITLE!r} of {destination}")
    comparisons = (*results.append, results.read)
    passed = all(c.passed for c in comparisons) and results.produce.passed
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
