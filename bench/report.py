"""Results as text: the table `bench.run` prints and its section of bench/RESULTS.md.

Rules:
- Pure functions of measured values: no clocks, no files (run.py reads and writes).
- RESULTS.md holds one `## ` section per benchmark group; writing a group's section
  replaces that section only and keeps every other one as it was.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from bench.machine import Machine
from bench.measures import EngineCliResults, LatencyResult, Sizes

SECTION_TITLE: Final = "Engine and CLI (issue 2)"
DOCUMENT_HEAD: Final = """# Benchmark results

`make bench` (`python -m bench.run`) measures fencelog against its baselines (plain
SQLite, the embedded engine, NATS JetStream) on the same machine in the same run, so a
ratio holds where an absolute rate would not. Each benchmark group owns one section below
and rewrites only that section; `python -m bench.run --only GROUP` runs one group
(engine, server, ownership, idempotence), and `--quick` a small run that writes nothing.
"""
_IMPORTS_SHOWN: Final = 8


def _load(machine: Machine) -> str:
    after = "?" if machine.load_after is None else f"{machine.load_after:.2f}"
    return f"1-minute load average {machine.load_before:.2f} at the start, {after} at the end"


def _rate(rows_per_s: float) -> str:
    return f"{rows_per_s:,.0f} rows/s"


def _verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def _sizes_text(sizes: Sizes) -> str:
    return (
        f"{sizes.rounds} append rounds of {sizes.append_records:,} records per durability, "
        f"{sizes.read_rounds} read rounds of a {sizes.read_records:,}-record partition, "
        f"{sizes.cli_runs} CLI runs" + (" (--quick)" if sizes.quick else "")
    )


def _rows(results: EngineCliResults) -> Iterator[tuple[str, str, str, str, str, str]]:
    """(benchmark, fencelog, baseline, ratio, target, result) for every figure."""
    for comparison in (*results.append, results.read):
        yield (
            comparison.name,
            _rate(comparison.fencelog_median),
            _rate(comparison.raw_median),
            f"{comparison.ratio:.2f}",
            f"ratio >= {comparison.ratio_min:.2f}",
            _verdict(comparison.passed),
        )
    produce = results.produce
    yield (
        produce.name,
        f"median {produce.median_ms:.0f} ms, p90 {produce.p90_ms:.0f} ms",
        f"python -c pass: {produce.interpreter_median_ms:.0f} ms",
        "-",
        f"median < {produce.median_ms_max:.0f} ms",
        _verdict(produce.passed),
    )
    yield (
        f"the same, {produce.dont_write_bytecode_label}",
        f"median {produce.dont_write_bytecode_median_ms:.0f} ms, "
        f"p90 {produce.dont_write_bytecode_p90_ms:.0f} ms",
        "",
        "-",
        "(information)",
        "-",
    )


def _padded(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))


def table(results: EngineCliResults) -> str:
    """The plain-text table printed at the end of a run."""
    header = ("benchmark", "fencelog", "raw SQLite / floor", "ratio", "target", "result")
    rows = [header, *_rows(results)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [_padded(row, widths) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return f"{SECTION_TITLE}: {_sizes_text(results.sizes)}\n" + "\n".join(
        line.rstrip() for line in lines
    )


def _markdown_table(results: EngineCliResults) -> list[str]:
    lines = [
        "| Benchmark | fencelog | raw SQLite (or floor) | ratio | target | result |",
        "|---|--:|--:|--:|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    return lines


def _method() -> list[str]:
    return [
        "How it is measured (bench/append.py, bench/read.py, bench/cli_produce.py):",
        "",
        "- Append: `broker.client.connect(dir).produce(topic, values)`, one call per batch of",
        "  1000 distinct 100-byte values, into a fresh one-partition topic; against",
        "  `executemany` of the same rows (EMPTY_HEADERS headers) into a fresh database made",
        "  from broker/storage/schema/*.sql, with the engine's pragmas (WAL, synchronous FULL",
        "  or NORMAL) and one BEGIN IMMEDIATE/COMMIT per batch. In each round the two sides",
        "  take turns batch by batch; a rate is rows over the sum of that side's batch times.",
        "  The clock covers appends only; raw rows are built before it starts, fencelog's",
        "  records (from the values) inside it. The raw side is the plain one-row-a-statement",
        "  `executemany` the issue names; the engine inserts a plain batch 64 rows to a",
        "  statement (queries.sql, record_insert_run), which is why it can run ahead of it.",
        "- Read: `Engine.read` paging from offset 0 with max_records = read_records_max",
        "  (10,000) to the end of the partition; against one",
        "  `SELECT * FROM records WHERE topic_id=? AND partition=? ORDER BY offset` fetchall",
        "  on a plain connection to the same (checkpointed) database file, in the same process.",
        "  One unmeasured scan each first.",
        "- CLI: `fencelog --broker DIR produce TOPIC --value x` (durability full) as a whole",
        "  process, perf_counter around subprocess.run, after one unmeasured run. The target",
        "  applies with Python's bytecode cache warm (kept in a temporary",
        "  PYTHONPYCACHEPREFIX). Timed in rotation with it: the same command under",
        "  PYTHONDONTWRITEBYTECODE=1 (installed packages load their own bytecode; modules",
        "  without any compile on every run), and `python -c pass`, the floor.",
        "- Turns alternate which side goes first; each figure is the median of its rounds",
        "  and the ratio is median over median.",
    ]


def _imports(results: EngineCliResults) -> list[str]:
    imports = results.imports
    shown = ", ".join(f"{name} {ms:.0f} ms" for name, ms in imports.package_ms[:_IMPORTS_SHOWN])
    return [
        "What `fencelog produce` imports (`python -X importtime`, which inflates times; self",
        "time per top-level package, a stdlib module counted with the package that imported",
        f"it): {imports.modules} modules, {imports.total_ms:.0f} ms in all; {shown}.",
    ]


def _series(label: str, values: Sequence[float], digits: int) -> str:
    return f"{label:<34}" + " ".join(f"{value:,.{digits}f}" for value in values)


def _raw_block(results: EngineCliResults) -> list[str]:
    lines = ["```text"]
    for comparison in (*results.append, results.read):
        lines += [
            f"{comparison.name}",
            _series("  fencelog rows/s per round", comparison.fencelog_rows_per_s, 0),
            _series("  raw SQLite rows/s per round", comparison.raw_rows_per_s, 0),
            _series("  ratio per round", comparison.round_ratios, 3),
            f"  median fencelog {comparison.fencelog_median:,.0f}, "
            f"median raw {comparison.raw_median:,.0f}, ratio {comparison.ratio:.3f}",
        ]
    produce: LatencyResult = results.produce
    lines += [
        produce.name,
        _series("  produce ms, bytecode cached", produce.run_ms, 1),
        _series("  produce ms, DONTWRITEBYTECODE", produce.dont_write_bytecode_ms, 1),
        _series("  python -c pass ms", produce.interpreter_ms, 1),
        f"  cached: median {produce.median_ms:.1f} ms, p90 {produce.p90_ms:.1f} ms; "
        f"DONTWRITEBYTECODE: median {produce.dont_write_bytecode_median_ms:.1f} ms, "
        f"p90 {produce.dont_write_bytecode_p90_ms:.1f} ms; "
        f"python -c pass median {produce.interpreter_median_ms:.1f} ms",
        "imports of fencelog produce, ms of self time per package",
        "  " + ", ".join(f"{name} {ms:.1f}" for name, ms in results.imports.package_ms),
        "```",
    ]
    return lines


def section(results: EngineCliResults, machine: Machine) -> str:
    """This group's whole RESULTS.md section, heading included."""
    lines = [
        f"## {SECTION_TITLE}",
        "",
        f"Measured {machine.date} by `python -m bench.run`: {_sizes_text(results.sizes)}.",
        "",
        f"Machine: {machine.cpus} CPUs (nproc), {machine.cpu_model}; {machine.python}; "
        f"SQLite {machine.sqlite}; databases on {machine.filesystem}; {_load(machine)}.",
        "",
        f"Code: {machine.code}.",
        "",
        *_markdown_table(results),
        "",
        *_method(),
        "",
        *_imports(results),
        "",
        "Raw numbers, in run order:",
        "",
        *_raw_block(results),
    ]
    return "\n".join(lines) + "\n"


def replace_section(document: str, new_section: str) -> str:
    """`document` with the section titled like `new_section` replaced, or appended."""
    heading = new_section.splitlines()[0]
    lines = document.splitlines(keepends=True)
    headings = list(_heading_indexes(lines))
    start = next((i for i in headings if lines[i].rstrip("\n") == heading), None)
    if start is None:
        return document.rstrip("\n") + "\n\n" + new_section
    end = next((i for i in headings if i > start), len(lines))
    rest = "".join(lines[end:])
    return "".join(lines[:start]) + new_section + ("\n" + rest if rest else "")


def _heading_indexes(lines: Sequence[str]) -> Iterator[int]:
    """Indexes of `## ` lines outside fenced code blocks."""
    fenced = False
    for index, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            yield index
