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
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
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


def links(path: Path) -> list[str]:
    tokens = MarkdownIt().parse(path.read_text(encoding="utf-8"))
    return [
        str(child.attrs["href"])
        for token in tokens
        for child in token.children or ()
        if child.type == "link_open"
    ]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("document", [README, REPO_ROOT / "docs" / "design.md"], ids=str)
def test_links_resolve_inside_the_repository(document: Path) -> None:
    broken = []
    for href in links(document):
        if re.match(r"[a-z]+:", href):
            continue  # an address outside the repository, on purpose (https:)
        target, _, anchor = href.partition("#")
        path = (document.parent / target).resolve() if target else document
        if not path.is_relative_to(REPO_ROOT) or not path.exists():
            broken.append(href)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
            if anchor not in {slug(h) for h in headings}:
                broken.append(href)
    assert not broken, f"{document.name}: links that do not resolve in the repository: {broken}"
    assert "DESIGN.md" not in document.read_text(encoding="utf-8")
