"""What a benchmark run measured, and the summaries drawn from it.

Rules:
- A comparison runs fencelog and its baseline in one process, in alternating order
  (A B, B A, A B, ...), so that machine noise falls on both sides.
- Each side is summarised by the median of its rounds; the ratio is median over median.
  The per-round ratios are kept too, to show how much the ratio itself moved.
- Everything here is plain values: no clocks, no files.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least `fraction` of the values <= it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def interleaved(rounds: int, *measures: Callable[[], float]) -> tuple[tuple[float, ...], ...]:
    """Run every measure once per round, rotating which goes first (A B, B A, ...).

    Returns one tuple of results per measure, in the order the measures were given."""
    results: list[list[float]] = [[] for _ in measures]
    for round_index in range(rounds):
        for step in range(len(measures)):
            which = (round_index + step) % len(measures)
            results[which].append(measures[which]())
    return tuple(map(tuple, results))


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work one run does; --quick shrinks every figure."""

    rounds: int  # append rounds, per durability
    append_records: int
    read_rounds: int  # a read round is short, so it takes more of them to steady a median
    read_records: int
    cli_runs: int
    quick: bool


@dataclass(frozen=True, slots=True)
class RateComparison:
    """fencelog against raw SQLite over the same rows: rows per second, one per round."""

    name: str
    fencelog_rows_per_s: tuple[float, ...]
    raw_rows_per_s: tuple[float, ...]
    ratio_min: float

    @property
    def fencelog_median(self) -> float:
        return median(self.fencelog_rows_per_s)

    @property
    def raw_median(self) -> float:
        return median(self.raw_rows_per_s)

    @property
    def ratio(self) -> float:
        return self.fencelog_median / self.raw_median

    @property
    def round_ratios(self) -> tuple[float, ...]:
        pairs = zip(self.fencelog_rows_per_s, self.raw_rows_per_s, strict=True)
        return tuple(fencelog / raw for fencelog, raw in pairs)

    @property
    def passed(self) -> bool:
        return self.ratio >= self.ratio_min


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Whole-process wall times of one command: with Python's bytecode cache warm (the
    target applies to these), under PYTHONDONTWRITEBYTECODE=1, and the bare interpreter."""

    name: str
    run_ms: tuple[float, ...]
    dont_write_bytecode_ms: tuple[float, ...]
    dont_write_bytecode_label: str  # which modules that run had to compile
    interpreter_ms: tuple[float, ...]
    median_ms_max: float

    @property
    def median_ms(self) -> float:
        return median(self.run_ms)

    @property
    def p90_ms(self) -> float:
        return percentile(self.run_ms, 0.9)

    @property
    def dont_write_bytecode_median_ms(self) -> float:
        return median(self.dont_write_bytecode_ms)

    @property
    def dont_write_bytecode_p90_ms(self) -> float:
        return percentile(self.dont_write_bytecode_ms, 0.9)

    @property
    def interpreter_median_ms(self) -> float:
        return median(self.interpreter_ms)

    @property
    def passed(self) -> bool:
        return self.median_ms < self.median_ms_max


@dataclass(frozen=True, slots=True)
class ImportProfile:
    """`python -X importtime` of one command: self time per top-level package, a stdlib
    module counted with the package that imported it."""

    total_ms: float
    modules: int
    package_ms: tuple[tuple[str, float], ...]  # largest first

    @property
    def packages(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.package_ms)


@dataclass(frozen=True, slots=True)
class EngineCliResults:
    """Everything the "Engine and CLI (issue 2)" group measured in one run."""

    sizes: Sizes
    append: tuple[RateComparison, ...]
    read: RateComparison
    produce: LatencyResult
    imports: ImportProfile
