"""README.md runs as written: every `sh` and `python` block, in order within its section,
in a fresh directory (so `./.fencelog` is a fresh data directory), with this checkout's
`fencelog` on PATH. A block fails the test when it exits non-zero or prints a
traceback. pytest-codeblocks finds the blocks; a block the reader sees marked
`<!--pytest.mark.skip-->`, its reason on the line before (a cluster, a SparkSession,
the project's own make targets), is not run.

A section that starts `fencelog serve` in the background stops it itself; should a block
fail first, the test stops every server a `ready.json` of the section names."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

from support import REPO_ROOT
from support.helpers import fencelog_script, run_bounded, user_env

README = REPO_ROOT / "README.md"
BLOCK_TIMEOUT_S = 120
RUN = {"sh": ["bash", "-euo", "pipefail", "-c"], "python": [sys.executable, "-c"]}


def sections() -> dict[str, list[tuple[int, str, str]]]:
    """{section title: [(line, syntax, code)]} for the blocks to run, in README order."""
    headings: list[tuple[int, str]] = []
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        if line.startswith("## "):
            headings.append((number, line[3:].strip()))
    found: dict[str, list[tuple[int, str, str]]] = {}
    for block in extract_from_file(README):
        if block.syntax not in RUN or any(m.startswith("pytest.mark.skip") for m in block.marks):
            continue
        title = [t for n, t in headings if n < block.lineno][-1]
        found.setdefault(title, []).append((block.lineno, block.syntax, block.code))
    return found


SECTIONS = sections()


def test_the_readme_has_blocks_to_run() -> None:
    assert len(SECTIONS) >= 8, sorted(SECTIONS)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for ready in tmp_path.rglob("ready*.json"):  # a server a failed section left running
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(json.loads(ready.read_text())["pid"]), signal.SIGTERM)


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_a_readme_section_runs_as_written(workdir: Path, title: str) -> None:
    env = user_env(
        PATH=f"{fencelog_script().parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(REPO_ROOT),
    )
    for line, syntax, code in SECTIONS[title]:
        status, stdout, stderr = run_bounded(
            [*RUN[syntax], code], cwd=workdir, env=env, timeout_s=BLOCK_TIMEOUT_S
        )
        shown = f"README.md line {line} ({syntax}):\n{code}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        assert status == 0, f"exit {status}; {shown}"
        assert "Traceback" not in stderr, shown
