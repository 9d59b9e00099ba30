"""A benchmark group's results as rows, and the two ways a run shows them: the table it
prints and the group's section of bench/RESULTS.md.

Rules:
- Pure functions of measured values: no clocks, no files (run.py reads and writes).
- Every group's section has the same shape as "Engine and CLI (issue 2)": when and how
  much, the machine, the code, a table with a target and a result per figure, how it
  is measured, what the figures say, and the raw numbers in run order.
- A result is "pass" or "FAIL" against a target, "-" for a figure shown for
  information, and "skipped" when its baseline could not run (it then counts as
  neither).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bench.machine import Machine

PASS: Final = "pass"
FAIL: Final = "FAIL"
INFORMATION: Final = "-"
SKIPPED: Final = "skipped"
_HEADER: Final = ("Benchmark", "fencelog", "baseline", "ratio", "target", "result")
_LABEL_CHARS: Final = 44


def verdict(passed: bool) -> str:
    return PASS if passed else FAIL


@dataclass(frozen=True, slots=True)
class Row:
    """One figure: what was measured, fencelog's value, its baseline's, their ratio,
    the target and whether it was met."""

    benchmark: str
    fencelog: str
    baseline: str = ""
    ratio: str = "-"
    target: str = "(information)"
    result: str = INFORMATION

    @property
    def cells(self) -> tuple[str, str, str, str, str, str]:
        return (self.benchmark, self.fencelog, self.baseline, self.ratio, self.target, self.result)


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    summary: str  # what the run did, e.g. "5 rounds of ..."
    rows: tuple[Row, ...]
    method: tuple[str, ...]  # markdown lines: how each figure is measured
    findings: tuple[str, ...]  # markdown lines: what the figures say, with evidence
    raw: tuple[str, ...]  # plain lines: every measured value, in run order
    software: str = ""  # versions beyond the machine line (e.g. the baseline server's)

    @property
    def passed(self) -> bool:
        return all(row.result != FAIL for row in self.rows)


def rate(per_s: float, unit: str = "records/s") -> str:
    return f"{per_s:,.0f} {unit}"


def series(label: str, values: Sequence[float], digits: int = 0) -> str:
    return f"  {label:<{_LABEL_CHARS}} " + " ".join(f"{value:,.{digits}f}" for value in values)


def _load(machine: Machine) -> str:
    after = "?" if machine.load_after is None else f"{machine.load_after:.2f}"
    return f"1-minute load average {machine.load_before:.2f} at the start, {after} at the end"


def machine_line(machine: Machine) -> str:
    return (
        f"Machine: {machine.cpus} CPUs (nproc), {machine.cpu_model}; {machine.python}; "
        f"SQLite {machine.sqlite}; databases on {machine.filesystem}; {_load(machine)}."
    )


def markdown(section: Section, machine: Machine) -> str:
    """The group's whole RESULTS.md section, heading included."""
    lines = [
        f"## {section.title}",
        "",
        f"Measured {machine.date} by `python -m bench.run`: {section.summary}.",
        "",
        machine_line(machine),
        *([f"{section.software}"] if section.software else []),
        "",
        f"Code: {machine.code}.",
        "",
        "| " + " | ".join(_HEADER) + " |",
        "|---|--:|--:|--:|---|---|",
        *("| " + " | ".join(row.cells) + " |" for row in section.rows),
        "",
        *section.method,
        "",
        *section.findings,
        "",
        "Raw numbers, in run order:",
        "",
        "```text",
        *section.raw,
        "```",
    ]
    return "\n".join(lines) + "\n"


def table(section: Section) -> str:
    """The plain-text table printed at the end of a run."""
    rows = [_HEADER, *(row.cells for row in section.rows)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return f"{section.title}: {section.summary}\n" + "\n".join(line.rstrip() for line in lines)
