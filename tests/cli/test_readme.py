"""README.md runs as written, as a new user pastes it: every `sh` and `python` block, in
order within its section, in a fresh directory (so `./.fencelog` is a fresh data
directory); and the whole file top to bottom in one directory. Each block runs in a shell
that has only what README told the user to do: the test's own virtual environment is
taken off PATH, and README's activation line (run in the checkout, as it says) puts
`fencelog` and `python` on it. A block fails the test when it exits non-zero or prints a
traceback. pytest-codeblocks finds the blocks; a block the reader sees marked
`<!--pytest.mark.skip-->`, its reason on the line before (a cluster, the project's own
make targets), is not run. The Spark section runs where Java is installed, in the
top-to-bottom run only (a SparkSession takes tens of seconds to start).

A section that starts `fencelog serve` in the background stops it itself; should a block
fail first, the test stops every server a `ready.json` of the section names."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from pytest_codeblocks import extract_from_file

from support import REPO_ROOT
from support.helpers import fencelog_script, run_bounded, user_env

README = REPO_ROOT / "README.md"
BLOCK_TIMEOUT_S = 120
SPARK_BLOCK_TIMEOUT_S = 300
# What README's first section tells a new user to run in the checkout after `make demo`.
ACTIVATE = ". .venv/bin/activate"
SPARK_SECTION = "Spark: pipelines on fencelog, exactly once"


def sections() -> dict[str, list[tuple[int, str, str]]]:
    """{section title: [(line, syntax, code)]} for the blocks to run, in README order."""
    headings: list[tuple[int, str]] = []
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        if line.startswith("## "):
            headings.append((number, line[3:].strip()))
    found: dict[str, list[tuple[int, str, str]]] = {}
    for block in extract_from_file(README):
        if block.syntax not in ("sh", "python"):
            continue
        if any(m.startswith("pytest.mark.skip") for m in block.marks):
            continue
        title = [t for n, t in headings if n < block.lineno][-1]
        found.setdefault(title, []).append((block.lineno, block.syntax, block.code))
    return found


SECTIONS = sections()


def java_present() -> bool:
    return bool(os.environ.get("JAVA_HOME")) or shutil.which("java") is not None


def test_the_readme_has_blocks_to_run() -> None:
    assert len(SECTIONS) >= 8, sorted(SECTIONS)
    assert SPARK_SECTION in SECTIONS  # its snippet is paste-able, so it is run


def test_the_readme_says_how_to_put_fencelog_on_path() -> None:
    """`make demo` installs into .venv: without activating it, every block fails with
    `fencelog: command not found`. README's opening says so, and the demo ends saying it."""
    opening = README.read_text().split("\n## ", 2)[1]
    assert ACTIVATE in opening
    assert ACTIVATE in (REPO_ROOT / "Makefile").read_text()


def new_users_shell() -> dict[str, str]:
    """A user's environment: this test run's virtual environment is not on PATH, and
    nothing of the test run's own (PYTHONPATH, VIRTUAL_ENV) is set."""
    ours = {str(fencelog_script().parent), str(Path(sys.executable).parent)}
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p not in ours)
    env = user_env(PATH=path)
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def as_pasted(syntax: str, code: str) -> list[str]:
    """A block run as the user runs it: README's activation done in the checkout (where a
    checkout without .venv, such as a worktree, takes the running interpreter's), then
    back to the working directory."""
    venv = REPO_ROOT / ".venv"
    if not venv.exists():
        venv = Path(sys.prefix)  # a checkout without its own: the running environment
    activate = ACTIVATE.replace(".venv", shlex.quote(venv.name), 1)
    setup = f'cd {shlex.quote(str(venv.parent))} && {activate} && cd "$OLDPWD"'
    body = code if syntax == "sh" else f"python -c {shlex.quote(code)}"
    return ["bash", "-euo", "pipefail", "-c", f"{setup}\n{body}"]


def run_block(
    workdir: Path, env: Mapping[str, str], line: int, syntax: str, code: str, timeout_s: float
) -> None:
    status, stdout, stderr = run_bounded(
        as_pasted(syntax, code), cwd=workdir, env=env, timeout_s=timeout_s
    )
    shown = f"README.md line {line} ({syntax}):\n{code}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert status == 0, f"exit {status}; {shown}"
    assert "Traceback" not in stderr, shown


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for ready in tmp_path.rglob("ready*.json"):  # a server a failed section left running
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(json.loads(ready.read_text())["pid"]), signal.SIGTERM)


@pytest.mark.parametrize("title", sorted(t for t in SECTIONS if t != SPARK_SECTION))
def test_a_readme_section_runs_as_written(workdir: Path, title: str) -> None:
    env = new_users_shell()
    for line, syntax, code in SECTIONS[title]:
        run_block(workdir, env, line, syntax, code, BLOCK_TIMEOUT_S)


# Every block has its own bound; the whole file's (over 100 s alone here, the Spark
# section's session start most of it) is theirs together, not the suite's 120 s a test.
@pytest.mark.timeout(BLOCK_TIMEOUT_S * 3 + SPARK_BLOCK_TIMEOUT_S)
def test_the_readme_runs_top_to_bottom_in_one_directory(workdir: Path) -> None:
    """As people paste it: every section in order, in one place, names and all."""
    env = new_users_shell()
    for title, blocks in SECTIONS.items():
        if title == SPARK_SECTION and not java_present():
            continue  # CI's machines have Java; a checkout without it skips only this
        timeout_s = SPARK_BLOCK_TIMEOUT_S if title == SPARK_SECTION else BLOCK_TIMEOUT_S
        for line, syntax, code in blocks:
            run_block(workdir, env, line, syntax, code, timeout_s)


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
