"""The machine a run happened on, as RESULTS.md reports it."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import broker

_REPOSITORY: Final = Path(__file__).resolve().parent.parent
_MEASURED_PATHS: Final = ("broker", "cli", "pyproject.toml")


@dataclass(frozen=True, slots=True)
class Machine:
    cpus: int  # what `nproc` reports: the CPUs this process may run on
    cpu_model: str
    python: str
    sqlite: str
    filesystem: str  # where the benchmark's databases lived
    code: str  # the commit measured, and whether the working tree differed from it
    date: str
    load_before: float  # 1-minute load average when the run started
    load_after: float | None = None  # ... and when it ended: other work on the machine


def describe(work_dir: Path) -> Machine:
    return Machine(
        cpus=len(os.sched_getaffinity(0)),
        cpu_model=_cpu_model(),
        python=f"{platform.python_implementation()} {platform.python_version()}",
        sqlite=sqlite3.sqlite_version,
        filesystem=_filesystem(work_dir),
        code=_code(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load_before=os.getloadavg()[0],
    )


def finished(machine: Machine) -> Machine:
    """`machine` with the load average at the end of the run."""
    return dataclasses.replace(machine, load_after=os.getloadavg()[0])


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown"
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return platform.processor() or "unknown"


def _filesystem(path: Path) -> str:
    """The type and mount point of the filesystem holding `path` (from /proc/mounts)."""
    try:
        lines = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    resolved = path.resolve()
    best = ("unknown", "")
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point, fs_type = fields[1], fields[2]
        if resolved.is_relative_to(mount_point) and len(mount_point) > len(best[1]):
            best = (fs_type, mount_point)
    return f"{best[0]} on {best[1]}" if best[1] else "unknown"


def _git(*arguments: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(_REPOSITORY), *arguments], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None


def _code() -> str:
    """The commit measured, and the measured paths that differ from it, if any."""
    imported_from = Path(broker.__file__ or "").resolve().parent.parent
    if imported_from != _REPOSITORY:
        return f"broker imported from {imported_from}, not from this checkout ({_REPOSITORY})"
    commit = _git("rev-parse", "--short", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *_MEASURED_PATHS)
    if commit is None or status is None:
        return f"{_REPOSITORY}, not a git checkout"
    changed = sorted({line[3:] for line in status.splitlines()})
    if not changed:
        return f"commit {commit.strip()}; broker/, cli/ and pyproject.toml as committed"
    return f"commit {commit.strip()} plus uncommitted changes to {', '.join(changed)}"
