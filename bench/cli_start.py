"""A CLI start a shell loop can afford (issue 23): the CPU time of one-record `fencelog
produce` and `fencelog consume --max 1` as whole processes, against `python -c pass`.

    python -m bench.run --only cli-start [--quick]

Rules:
- Each command is the installed console script as a user types it (bench/cli_produce.py's
  environment: FENCELOG_* unset, output piped, the bytecode cache warm in a temporary
  PYTHONPYCACHEPREFIX). Embedded: `--broker DIR`; served: `--broker tcp://...` of a
  `fencelog serve` (durability full) on 127.0.0.1.
- A figure is the CPU time (user + system) of the child, from getrusage(RUSAGE_CHILDREN)
  around it, the median of the runs; every command takes turns with `python -c pass`,
  measured in the same rounds, whose median is the baseline. Target: at most 4x.
- A shell loop: `for i in $(seq 50); do fencelog produce ...; done`, wall time, embedded.
- The same embedded produce under PYTHONDONTWRITEBYTECODE=1 (many containers set it),
  with the bytecode that `make` compiles at install beside the sources, against
  `python -c pass` in the same environment. Target: at most 4x there too.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.cli_produce import (
    cached_environment,
    dont_write_bytecode_environment,
    dont_write_bytecode_label,
    fencelog_script,
)
from bench.measures import interleaved, median
from bench.processes import fencelog_server
from bench.sections import Row, Section, series, verdict
from broker.client.client import connect

TITLE: Final = "CLI start (issue 23)"
RATIO_MAX: Final = 4.0
TOPIC: Final = "start"
LOOP: Final = 50


FINDINGS: Final = (
    "- Where a start went (b94129e: 127 ms embedded, 136 ms served, against 22 ms), and "
    "what took it, measured by -X importtime, cProfile and this bench in one session:",
    "  - 51 frozen dataclasses, about 24 ms to define: each compiles six generated methods. "
    "They are msgspec Structs now, made in C (about 10 us each; msgspec's import costs "
    "about 5 ms of that back).",
    "  - The collector's passes at interpreter exit over every module's objects, about 12 "
    "ms: cli.main's run freezes them when the command ends. Its passes while the imports "
    "are made, about 3 ms: cli/start.py imports cli.main with it paused, then freezes what "
    "was made.",
    "  - Served, asyncio and uvloop, about 16 ms to import (ssl alone 4-6 ms): the sync "
    "client now sends plain requests over a blocking socket and moves to the event loop "
    "only for what needs a live session.",
    "  - Typer evaluating produce's and consume's string annotations, twice each: about "
    "2 ms; those modules keep their annotations as objects.",
    "- What is left, about 50 ms over `python -c pass`: click and Typer with their own "
    "imports (uuid, platform, gettext, subprocess, inspect) about 25 ms; the client, its "
    "types and the table of operations about 10 ms; the engine and SQLite's open, "
    "embedded, about 8 ms; building the one command from its signature about 3 ms.",
)


@dataclass(frozen=True, slots=True)
class Sizes:
    runs: int
    quick: bool


FULL: Final = Sizes(25, False)
QUICK: Final = Sizes(7, True)


@dataclass(frozen=True, slots=True)
class Results:
    sizes: Sizes
    interpreter_ms: tuple[float, ...]
    commands: dict[str, tuple[float, ...]]  # label -> CPU ms per run
    loop_s: float


def cpu_ms(argv: Sequence[str], env: dict[str, str]) -> float:
    """CPU time (user + system) of one whole process, in ms; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return used * 1000


def measure(work_dir: Path, sizes: Sizes) -> Results:
    data_dir = work_dir / "start"
    with connect(data_dir) as client:
        client.create_topic(TOPIC)
        client.produce(TOPIC, [b"seed"])
    env = cached_environment(work_dir / "pycache")
    script = str(fencelog_script())
    interpreter = [sys.executable, "-c", "pass"]

    def argvs(broker: str) -> dict[str, list[str]]:
        return {
            "produce": [script, "--broker", broker, "produce", TOPIC, "--value", "x"],
            "consume --max 1": [script, "--broker", broker, "consume", TOPIC, "--max", "1"],
        }

    commands: dict[str, tuple[float, ...]] = {}
    embedded = argvs(str(data_dir))
    for argv in embedded.values():
        cpu_ms(argv, env)  # unmeasured: the bytecode cache filled, the OS caches warm
    base, *found = interleaved(
        sizes.runs,
        lambda: cpu_ms(interpreter, env),
        *(lambda argv=argv: cpu_ms(argv, env) for argv in embedded.values()),
    )
    commands |= {f"embedded: {label}": f for label, f in zip(embedded, found, strict=True)}
    commands |= _without_writing_bytecode(embedded["produce"], sizes)
    start = time.perf_counter()
    for _ in range(LOOP):
        subprocess.run(embedded["produce"], env=env, capture_output=True, check=True)
    loop_s = time.perf_counter() - start
    with fencelog_server(work_dir, "start", "full") as server:
        served = argvs(server.address)
        for argv in served.values():
            cpu_ms(argv, env)
        more_base, *found = interleaved(
            sizes.runs,
            lambda: cpu_ms(interpreter, env),
            *(lambda argv=argv: cpu_ms(argv, env) for argv in served.values()),
        )
        commands |= {f"served: {label}": f for label, f in zip(served, found, strict=True)}
    return Results(sizes, (*base, *more_base), commands, loop_s)


def _without_writing_bytecode(produce: list[str], sizes: Sizes) -> dict[str, tuple[float, ...]]:
    """produce, and python -c pass, where nothing writes bytecode: what a command costs
    in a container that sets PYTHONDONTWRITEBYTECODE=1."""
    env = dont_write_bytecode_environment()
    interpreter = [sys.executable, "-c", "pass"]
    base, found = interleaved(
        sizes.runs, lambda: cpu_ms(interpreter, env), lambda: cpu_ms(produce, env)
    )
    label = dont_write_bytecode_label()
    return {f"{label}: python -c pass": base, f"{label}: embedded: produce": found}


def section(results: Results) -> Section:
    base = median(results.interpreter_ms)
    rows = [Row("python -c pass (CPU)", f"{base:.1f} ms")]
    bases = {
        label.removesuffix("python -c pass"): median(values)
        for label, values in results.commands.items()
        if label.endswith("python -c pass")
    }
    for label, values in results.commands.items():
        if label.endswith("python -c pass"):
            rows.append(Row(f"{label} (CPU)", f"{median(values):.1f} ms"))
            continue
        against = next((b for prefix, b in bases.items() if label.startswith(prefix)), base)
        figure = median(values)
        rows.append(
            Row(
                f"{label} (CPU)",
                f"{figure:.1f} ms",
                f"python -c pass {against:.1f} ms",
                f"{figure / against:.1f}",
                f"<= {RATIO_MAX:.0f}x",
                verdict(figure / against <= RATIO_MAX),
            )
        )
    rows.append(Row(f"shell loop of {LOOP} embedded produces (wall)", f"{results.loop_s:.1f} s"))
    doc = (__doc__ or "").split("Rules:")[1].strip().splitlines()
    return Section(
        title=TITLE,
        summary=f"{results.sizes.runs} runs of each command"
        + (" (--quick)" if results.sizes.quick else ""),
        rows=tuple(rows),
        method=tuple(line.strip() for line in doc),
        findings=FINDINGS,
        raw=(
            series("python -c pass CPU ms", results.interpreter_ms, 1),
            *(series(f"{label} CPU ms", v, 1) for label, v in results.commands.items()),
        ),
    )
