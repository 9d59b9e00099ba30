"""man/ and completions/ are generated from the CLI and must be current; README's table
of the Kafka APIs is what the listener advertises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from broker.kafka import wire
from cli import docs


def test_man_pages_and_completions_are_current() -> None:
    stale = [str(path.relative_to(docs.ROOT)) for path in docs.stale_files()]
    assert stale == [], f"regenerate with `make docs`: {stale}"


def test_every_command_has_a_man_page() -> None:
    pages = {path.name for path in (docs.ROOT / "man").iterdir()}
    for name in ("fencelog.1", "fencelog-produce.1", "fencelog-consume.1", "fencelog-status.1"):
        assert name in pages
    assert {f"fencelog-topic-{c}.1" for c in ("create", "list", "describe", "delete")} <= pages


def test_main_page_lists_every_exit_status() -> None:
    page = (docs.ROOT / "man" / "fencelog.1").read_text()
    assert ".SH EXIT STATUS" in page
    for name in ("UNKNOWN_TOPIC", "UNKNOWN_PARTITION", "FOREIGN_DATA_DIR", "SCHEMA_TOO_NEW"):
        assert name in page


def _complete(words: str, cword: int) -> list[str]:
    script = Path(sys.executable).parent / "fencelog"
    env = os.environ | {
        "_FENCELOG_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
    }
    done = subprocess.run(
        [script], check=False, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_bash_completion_answers_through_the_generated_protocol() -> None:
    assert (
        "_FENCELOG_COMPLETE=bash_complete"
        in (docs.ROOT / "completions" / "fencelog.bash").read_text()
    )
    assert "plain,topic" in _complete("fencelog to", 1)
    assert "plain,--follow" in _complete("fencelog consume orders --fol", 3)
    modes = _complete("fencelog produce orders --access ", 4)
    assert modes == ["plain,shared", "plain,exclusive", "plain,wait-exclusive"]
    assert _complete("fencelog produce orders --access w", 4) == ["plain,wait-exclusive"]


# what the repository's root holds: the README's layout and nothing a run left behind
ROOT_ENTRIES = {
    ".ci", ".gitignore", "CHANGELOG.md", "Makefile", "README.md", "bench", "broker", "chaos",
    "cli", "completions", "docs", "examples", "man", "pyproject.toml", "tests",
}  # fmt: skip


def _git(*args: str) -> list[str]:
    done = subprocess.run(
        ["git", "-C", str(docs.ROOT), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.splitlines()


def test_the_root_holds_no_stray_files() -> None:
    """A file a command left at the root (a pid file, a server's log) is never committed:
    the root holds the project's layout only. (Files README's examples write when pasted
    in the checkout are the user's, and untracked.)"""
    if not (docs.ROOT / ".git").exists():
        return  # an installed copy, not a checkout
    tracked = {path.split("/", 1)[0] for path in _git("ls-files")}
    assert tracked <= ROOT_ENTRIES, f"stray files committed at the root: {tracked - ROOT_ENTRIES}"


def test_readme_lists_the_kafka_apis_and_versions_apiversions_advertises() -> None:
    readme = (docs.ROOT / "README.md").read_text()
    listed = {
        (name, int(key), versions)
        for name, key, versions in re.findall(r"\| (\w+) \((\d+)\) \| ([\d-]+) \|", readme)
    }
    advertised = {
        (
            api.name,
            api.key,
            f"{api.min_version}-{api.max_version}"
            if api.min_version != api.max_version
            else str(api.min_version),
        )
        for api in wire.APIS.values()
    }
    assert listed == advertised
