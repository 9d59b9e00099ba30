"""The differential test: the same seeded random sequence of operations through the Python
client, embedded (a data directory opened in this process) and served (a Server on
127.0.0.1 in a thread), each answer and the resulting state compared.

The operations (tests/support/differential.py): claims with generations below, at and
above the current one and resets, releases (own and an operator's), fenced writes with
current, stale and wrong fences; leased pids and idempotent batches in order, duplicated,
overlapping, with gaps, stale and far generations, and leases resumed; plain writes;
shared and exclusive producers attached (with and without their last epoch), writing
and closed; transactions begun (with and without keys, and with their first records),
written by their owner and by joined members (stale joins too), committed (whole, or the
members named) and aborted, twice and after each other; clients closing. Compared: every
step's answer (value or error code), then every record of every log, the ownership
listing and its audit log, the transactions, producer states and the exclusive topic's
access. What legitimately differs is normalised where the runner reads it (session ids,
timestamps, the random generations leases start from).

A seed fixes the plan; a difference is reported with its step, so `plan(seed, ...)`
reproduces it.

Beside it, the CLI: a fixed script of commands (the issue's released claim among them)
through the CLI embedded and served, each exit status, stdout and stderr compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker.client.client import connect
from cli.main import command
from support.differential import LIMITS, Run, Step, plan
from support.servers import served
from support.waiting import wait_until

SEEDS = (1, 2, 3, 4, 5, 6)
STEPS = 300


def run_embedded(data_dir: Path, steps: list[Step]) -> Run:
    with connect(str(data_dir), limits=LIMITS) as observer:
        run = Run(lambda: connect(str(data_dir), limits=LIMITS), observer, served=False)
        return finish(run, steps)


def run_served(data_dir: Path, steps: list[Step]) -> Run:
    with served(data_dir, limits=LIMITS) as server, connect(server.address) as observer:
        run = Run(lambda: connect(server.address), observer, served=True)
        return finish(run, steps)


def finish(run: Run, steps: list[Step]) -> Run:
    run.start()
    try:
        run.run(steps)
        run.final = run.state()
    finally:
        run.close()
    return run


def first_difference(steps: list[Step], embedded: Run, served_run: Run) -> str | None:
    for index, (step, mine, theirs) in enumerate(
        zip(steps, embedded.answers, served_run.answers, strict=True)
    ):
        if mine != theirs:
            return f"step {index} {step}:\n  embedded {mine}\n  served   {theirs}"
    return None


@pytest.mark.parametrize("seed", SEEDS)
def test_embedded_and_served_answer_alike(tmp_path: Path, seed: int) -> None:
    steps = plan(seed, STEPS)
    for name in ("embedded", "served"):
        (tmp_path / name).mkdir(mode=0o700)
    embedded = run_embedded(tmp_path / "embedded", steps)
    served_run = run_served(tmp_path / "served", steps)
    assert first_difference(steps, embedded, served_run) is None, first_difference(
        steps, embedded, served_run
    )
    for part in embedded.final:
        assert embedded.final[part] == served_run.final[part], part


# The CLI, embedded and served: the sequence (a claim held by `-- CMD`, released,
# listed, claimed again) and its neighbours, as a user types them; {name}s are filled in
# from the run's own earlier answers (a leased pid and generation, a transaction id).
CLI_SCRIPT = (
    "topic create journal -p 2 --owner-group samza",
    "topic create plain -p 2",
    "topic create excl",
    "own g r --generation 4 -- true",
    "own release g r",
    "own list",
    "own g r --once",
    "own list --json",
    "own g r --generation 0 --once",
    "own samza journal/0 --generation 4 --once",
    "own release samza",
    "own history",
    "produce journal -p 0 --fence samza:journal/0:4 -v a",
    "produce journal -p 0 --fence samza:journal/0:3 -v b",
    "produce journal -p 1 -v c",
    "lease-pid plain 0 --json",
    "produce plain -p 0 --pid {pid} --generation {generation} --sequence 1 -v i1",
    "produce plain -p 0 --pid {pid} --generation {generation} --sequence 1 -v i1",
    "produce plain -p 0 --pid {pid} --generation {generation} --sequence 5 -v i5",
    "produce plain -p 0 --pid {pid} --generation {next_generation} --sequence 2 -v i2",
    "produce plain -p 0 --pid {pid} --generation {generation} --sequence 3 -v stale",
    "lease-pid plain 0 --pid {pid} --json",
    "produce plain -p 1 --idempotent -v auto1 -v auto2",
    "txn-begin -g billing --json",
    "produce plain -p 0 --txn {txn} -v t1",
    "produce plain -p 1 --txn {txn} --member m1 -v t2",
    "produce plain -p 1 --txn {txn} --member m1 -v t3",
    "txn show {txn} --json",
    "txn-commit {txn}",
    "txn-commit {txn}",
    "txn-abort {txn}",
    "txn-begin -g billing --key k1 --json",
    "txn-begin -g billing --key k1 --json",
    "txn-abort {txn}",
    "txn-commit {txn}",
    "txn list --all --json",
    "produce excl --access exclusive -v x1",
    "produce excl --access shared -v x2",
    "topic describe excl --json",
    "consume plain --json",
    "consume journal --json",
    "topic list",
    "own release nobody",
    "produce missing -v x",
    "txn-commit 999999",
)
# Clock readings, in the JSON objects commands print.
CLOCK_KEYS = frozenset(
    {"timestamp_ms", "claimed_ms", "began_ms", "deadline_ms", "ended_ms", "age_ms"}
    | {"expire_ms", "at_ms", "created_ms", "committed_ms", "heartbeat_ms", "started_ms"}
)


class CliRun:
    """CLI_SCRIPT's commands against one broker target, each answer normalised."""

    def __init__(self, target: str, settle: Callable[[], None]) -> None:
        self.target = target
        self.settle = settle  # waits until the last command's session has ended
        self.filled: dict[str, int] = {}
        self.txns: dict[int, str] = {}

    def run(self, line: str) -> tuple[int, str, str]:
        argv = ["--broker", self.target, *line.format(**self.filled).split()]
        result = CliRunner().invoke(command(argv), argv, env={"FENCELOG_BROKER": None})
        self.settle()
        if result.exit_code == 0 and line.startswith(("lease-pid", "txn-begin")):
            self.learn(json.loads(result.stdout))
        return result.exit_code, self.normal(result.stdout), self.normal(result.stderr)

    def learn(self, answer: dict[str, Any]) -> None:
        if "txn_id" in answer:
            self.filled["txn"] = answer["txn_id"]
            self.txns.setdefault(answer["txn_id"], f"txn#{len(self.txns) + 1}")
        else:
            self.filled.setdefault("pid", answer["pid"])
            self.filled.setdefault("generation", answer["generation"])
            self.filled["next_generation"] = self.filled["generation"] + 1

    def normal(self, text: str) -> str:
        """Session ids, clock readings, transaction ids (each engine takes its own block
        of them: a CLI command embedded is an engine of its own), the leased pid (its
        block, likewise) and its generations (a random start) stand for what they are."""
        return "\n".join(self.normal_line(line) for line in text.splitlines())

    def normal_line(self, line: str) -> str:
        if line.startswith("{"):
            line = json.dumps(self.without_clock(json.loads(line)), sort_keys=True)
        line = re.sub(r"\b(conn|proc)-[0-9a-f-]+", "SESSION", line)
        line = re.sub(r"\b1[0-9]{12}\b", "CLOCK", line)
        for raw, name in self.txns.items():
            line = re.sub(rf'((?:transaction |txn_id": )|^){raw}\b', rf"\g<1>{name}", line)
        if "pid" in self.filled:
            line = re.sub(rf'(producer |"pid": ){self.filled["pid"]}\b', r"\1PID", line)
            for key in ("generation", "next_generation"):
                line = re.sub(rf"\b{self.filled[key]}\b", key.upper(), line)
        return line

    def without_clock(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.without_clock(v) for k, v in value.items() if k not in CLOCK_KEYS}
        if isinstance(value, list):
            return [self.without_clock(v) for v in value]
        return value


def test_the_cli_answers_alike_embedded_and_served(tmp_path: Path) -> None:
    for name in ("embedded", "served"):
        (tmp_path / name).mkdir(mode=0o700)
    embedded = CliRun(str(tmp_path / "embedded"), lambda: None)
    answers = [embedded.run(line) for line in CLI_SCRIPT]
    with served(tmp_path / "served") as server, connect(server.address) as observer:

        def settle() -> None:  # a command's connection ends as it exits: its session soon
            wait_until(
                lambda: (
                    [s.session_id for s in observer.sessions() if s.live] == [observer.session_id]
                ),
                message="the command's session has ended",
            )

        served_run = CliRun(server.address, settle)
        for line, embedded_answer in zip(CLI_SCRIPT, answers, strict=True):
            assert served_run.run(line) == embedded_answer, line


pytestmark = pytest.mark.usefixtures("no_thread_is_left")
