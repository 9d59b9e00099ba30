"""The layering contracts in pyproject.toml (`lint-imports`, run by `make lint`) hold for
the tree, and they catch what they are for: each test plants one forbidden import in a
copy of the tree and checks that lint-imports fails on it, naming the contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="lint-imports is installed with the test extra"
)


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    for package in ("broker", "cli"):
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("broker.core.records", "import sqlite3", "core decides in pure code"),
        ("broker.protocol.codec", "import asyncio", "the protocol is sans-I/O"),
        ("broker.client.client", "import broker.storage.logs", "the client reaches the engine"),
        ("cli.topic", "import broker.engine.engine", "the CLI goes through the client"),
        ("broker.types", "import broker.core.ownership", "the shared values"),
        ("broker.engine.backup", "import broker.engine.engine", "no import circles"),
    ],
    ids=["core-io", "protocol-asyncio", "client-storage", "cli-engine", "types-core", "circle"],
)
def test_a_forbidden_import_breaks_its_contract(
    tree: Path, module: str, line: str, contract: str
) -> None:
    _plant(tree, module, line)
    result = _lint(tree)
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if " BROKEN" in row]
    assert any(contract in row for row in broken), result.stdout
