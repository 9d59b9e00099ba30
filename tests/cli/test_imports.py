"""What a one-shot command imports: only what it uses, so a shell loop of `fencelog
produce` pays for little more than Python's own start (bench/RESULTS.md, "CLI start").
Each command runs in a fresh interpreter, as a shell runs it; the modules it must not
load are pinned here, so they cannot creep back in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import user_env
from support.servers import served

# Neither a one-shot produce nor consume needs any of these, embedded or served.
NEVER = (
    "asyncio",  # the event loop transport's, for sessions kept alive
    "broker.client.async_client",
    "broker.server",
    "broker.kafka",
    "broker.engine.kafka_producers",  # made when first used
    "broker.engine.cleaner",
    "broker.engine.backup",
    "broker.core.verify",  # produce --json only
    "importlib.resources",
    "cli.top",  # the other subcommands
    "cli.serve",
    "cli.check",
    "cli.verify",
    "cli.topic",
    "rich",
    "pyarrow",
    "numpy",  # the Kafka listener's and numeric text columns' (150 ms to import)
    "prometheus_client",
    "kafka",
    "watchfiles",
    "sqlite_utils",
    "pyspark",
)
RUN = """
import json, sys
sys.argv = ["fencelog", *sys.argv[1:]]
from cli.start import run  # the console script's entry
try:
    run()
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps(sorted(sys.modules)))
"""


def imported(broker: Path | str, *args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, "--broker", str(broker), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=user_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(modules)


def loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(f"{name}.") for m in modules)


@pytest.mark.parametrize(
    "args",
    [("produce", "orders", "--value", "x"), ("consume", "orders", "--max", "1")],
    ids=["produce", "consume"],
)
def test_a_one_shot_command_imports_only_what_it_uses(data_dir: Path, args: tuple[str]) -> None:
    imported(data_dir, "topic", "create", "orders")
    modules = imported(data_dir, *args)
    assert "broker.engine.engine" in modules  # embedded: it did open the directory
    assert f"cli.{args[0]}" in modules
    assert [name for name in NEVER if loaded(modules, name)] == []


@pytest.mark.parametrize(
    "args",
    [("produce", "orders", "--value", "x"), ("consume", "orders", "--max", "1")],
    ids=["produce", "consume"],
)
def test_a_served_one_shot_command_imports_no_event_loop_and_no_engine(
    data_dir: Path, args: tuple[str]
) -> None:
    with served(data_dir) as server:
        imported(server.address, "topic", "create", "orders")
        modules = imported(server.address, *args)
    assert "broker.client.served" in modules  # it did go through the server
    assert [name for name in (*NEVER, "broker.engine") if loaded(modules, name)] == []
