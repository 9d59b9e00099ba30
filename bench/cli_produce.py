"""`fencelog produce` of one record as a whole process, embedded, and what it imports.

Rules:
- The command is the installed console script, run with its arguments as a user types
  them, with FENCELOG_* unset and output piped (no terminal, so no rich).
- Each run is timed from before the fork to after the exit (perf_counter around
  subprocess.run); one unmeasured run first, so the OS caches are warm for every run.
- The target applies to the normal state of an installed command: Python's bytecode
  cache warm. It is kept in a temporary PYTHONPYCACHEPREFIX, so the checkout is never
  written to.
- The same command under PYTHONDONTWRITEBYTECODE=1 without a prefix is timed beside it:
  installed packages load from their own __pycache__, and fencelog's modules compile
  from source on every run unless the checkout holds their bytecode. Environments that
  set that variable (some CI and sandboxes do) see this figure.
- The bare interpreter (`python -c pass`) is timed in rotation with both: the floor no
  command can go under, and a gauge of how noisy the machine was.
- The import profile is `python -X importtime` of the same command, self times summed
  per top-level package; a standard-library module counts for the package that
  imported it, so a dependency's cost includes the stdlib it pulls in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import broker
import cli
from bench.measures import ImportProfile, LatencyResult, interleaved
from broker.engine.engine import Engine

TOPIC: Final = "bench"
MEDIAN_MS_MAX: Final = 250.0
STDLIB: Final = "(stdlib)"
# "import time: self [us] | cumulative | imported package"
_IMPORT_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|( *)(\S+)\s*$")


def fencelog_script() -> Path:
    """The console script beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("fencelog")
    if beside.exists():
        return beside
    found = shutil.which("fencelog")
    if found is None:
        raise SystemExit("bench: no fencelog console script; run `make bench` (pip install -e .)")
    return Path(found)


def _base_environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FENCELOG_")}
    env["NO_COLOR"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def cached_environment(pycache_dir: Path) -> dict[str, str]:
    """Bytecode written to and read from `pycache_dir` (the checkout stays untouched)."""
    return _base_environment() | {"PYTHONPYCACHEPREFIX": str(pycache_dir)}


def dont_write_bytecode_environment() -> dict[str, str]:
    """Bytecode read where it already is, never written."""
    return _base_environment() | {"PYTHONDONTWRITEBYTECODE": "1"}


def dont_write_bytecode_label() -> str:
    compiled = [
        package.__name__
        for package in (broker, cli)
        if not (Path(package.__file__ or "").parent / "__pycache__").is_dir()
    ]
    if not compiled:
        return "PYTHONDONTWRITEBYTECODE=1 (broker/ and cli/ have __pycache__ here)"
    return f"PYTHONDONTWRITEBYTECODE=1, {'/ and '.join(compiled)}/ compiled each run"


def run_ms(argv: Sequence[str], env: dict[str, str]) -> float:
    """Wall time of one whole process, in milliseconds; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed_ms = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed_ms


def produce_argv(data_dir: Path) -> list[str]:
    return [str(fencelog_script()), "--broker", str(data_dir), "produce", TOPIC, "--value", "x"]


def measure(work_dir: Path, runs: int) -> LatencyResult:
    data_dir = work_dir / "cli"
    with Engine.open(data_dir) as engine:
        engine.create_topic(TOPIC, partitions=1)
    cached = cached_environment(work_dir / "pycache")
    dont_write = dont_write_bytecode_environment()
    produce = produce_argv(data_dir)
    interpreter = [sys.executable, "-c", "pass"]
    run_ms(produce, cached)  # unmeasured: fill the bytecode cache, warm the OS caches
    run_ms(interpreter, cached)
    produce_ms, dont_write_ms, interpreter_ms = interleaved(
        runs,
        lambda: run_ms(produce, cached),
        lambda: run_ms(produce, dont_write),
        lambda: run_ms(interpreter, cached),
    )
    with Engine.open(data_dir) as engine:
        assert engine.end_offsets(TOPIC) == [2 * runs + 1], "a produce run did not append"
    return LatencyResult(
        name="fencelog produce, 1 record, embedded",
        run_ms=produce_ms,
        dont_write_bytecode_ms=dont_write_ms,
        dont_write_bytecode_label=dont_write_bytecode_label(),
        interpreter_ms=interpreter_ms,
        median_ms_max=MEDIAN_MS_MAX,
    )


def import_profile(work_dir: Path) -> ImportProfile:
    """What `fencelog produce` imports, from one `python -X importtime` run of it with
    the bytecode cache `measure` filled."""
    data_dir = work_dir / "cli"
    script = "from cli.main import run; run()"
    argv = [sys.executable, "-X", "importtime", "-c", script, *produce_argv(data_dir)[1:]]
    env = cached_environment(work_dir / "pycache")
    done = subprocess.run(argv, env=env, capture_output=True, check=True)
    return parse_importtime(done.stderr.decode())


def _package(module: str) -> str:
    top = module.split(".", maxsplit=1)[0]
    return STDLIB if top in sys.stdlib_module_names else top


def parse_importtime(stderr: str) -> ImportProfile:
    """Self time per package, each standard-library module counted with the innermost
    non-stdlib package that imported it (stdlib only when nothing else did)."""
    entries = []
    for line in stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match is not None:
            depth = (len(match.group(3)) - 1) // 2
            entries.append((depth, match.group(4), int(match.group(1))))
    self_us: dict[str, int] = defaultdict(int)
    # -X importtime prints a module after everything it imported: walking backwards,
    # the chain of importers of a line is the last line seen at each shallower depth.
    importers: list[str] = []
    for depth, module, module_us in reversed(entries):
        del importers[depth:]
        importers.append(_package(module))
        owner = next((name for name in reversed(importers) if name != STDLIB), STDLIB)
        self_us[owner] += module_us
    ranked = sorted(self_us.items(), key=lambda item: item[1], reverse=True)
    return ImportProfile(
        total_ms=sum(self_us.values()) / 1000,
        modules=len(entries),
        package_ms=tuple((name, us / 1000) for name, us in ranked),
    )
