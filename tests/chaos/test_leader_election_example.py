"""examples/leader_election.py, run as a user runs it: two candidates on one control
topic. The first is elected, rebuilds its state from the compacted topic and writes its
decisions; it is paused (SIGSTOP) until the second is elected, rebuilds and writes; then
it is resumed (SIGCONT), is fenced on its next write and exits 3, while the second
finishes its decisions and exits 0. The log (`fencelog consume --json`) is one segment
per leader: epochs never go down and nothing of epoch 1 follows the first record of
epoch 2.

Served, the paused candidate's session ends after `--session-timeout 1s`; embedded, after
the default session timeout (15 s: the example has no option for it), so that run is
marked slow. A candidate paused while it holds SQLite's write lock (embedded) would
block the other: it is then resumed for one more write and paused again.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.client.client import connect
from broker.limits import DEFAULT_LIMITS
from cli.main import command
from support import EXAMPLES
from support.exclusive import STEP_S, access_view
from support.helpers import Processes, expect, json_lines, user_env
from support.owning import resumed_and_killed, serving
from support.waiting import wait_until

EXAMPLE = EXAMPLES / "leader_election.py"
FENCED_EXIT = 3
SECOND_DECISIONS = 5
PAUSE_ATTEMPTS = 3


class Candidate:
    """One run of the example and what it printed."""

    def __init__(self, processes: Processes, broker: str, name: str, decisions: int) -> None:
        self.name = name
        self.process = processes.start(
            [
                sys.executable,
                EXAMPLE,
                "--broker",
                broker,
                "--name",
                name,
                "--decisions",
                str(decisions),
                "--interval",
                "0.05",
                "--wait",
                "60",
            ],
            env=user_env(),
        )
        self.said: list[str] = []

    def until(self, prefix: str, timeout_s: float = STEP_S) -> str:
        """Lines until one starting with prefix; that line."""
        while True:
            line = self.process.line(timeout_s).strip()
            self.said.append(line)
            if line.startswith(prefix):
                return line
            assert not line.startswith("fenced"), f"{self.name} fenced early: {self.said}"

    def catch_up(self) -> None:
        """Take every line it printed so far, so that the next until() waits for a new one."""
        self.said += [line.strip() for line in self.process.lines_now()]

    def wrote(self) -> list[str]:
        """KEY=VALUE of every "wrote" line: what it says it has written."""
        return [line.split()[1] for line in self.said if line.startswith("wrote ")]

    def rest(self) -> list[str]:
        """After it exited: the lines not read yet."""
        self.said += [line.strip() for line in self.process.remaining_lines()]
        return self.said


@pytest.fixture(params=["served", pytest.param("embedded", marks=pytest.mark.slow)])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, float]]:
    """The --broker to pass, and how long a paused candidate's session lasts."""
    data_dir = tmp_path / "data"
    if request.param == "embedded":
        yield str(data_dir), DEFAULT_LIMITS.session_timeout_ms / 1000
        return
    with serving(data_dir, session_timeout="1s") as url:
        yield url, 1.0


def test_two_candidates_one_leader_at_a_time_and_the_paused_one_is_fenced(
    broker: tuple[str, float], processes: Processes, runner: CliRunner
) -> None:
    target, session_s = broker
    first = Candidate(processes, target, "c1", decisions=100_000)
    with resumed_and_killed(first.process):
        assert first.until("elected") == "elected 1"
        assert first.until("rebuilt") == "rebuilt 0 keys"
        for _ in range(12):  # every key k0..k9 written at least once
            first.until("wrote")
        second = Candidate(processes, target, "c2", decisions=SECOND_DECISIONS)
        with connect(target) as client:
            wait_until(
                lambda: access_view(client, "control").waiting == ("c2",),
                STEP_S,
                message="c2 waits for c1",
            )
        pause_until_elected(first, second, session_s)
        try:
            assert second.until("rebuilt") == "rebuilt 10 keys"
            second.until("wrote")
        finally:
            first.process.signal(signal.SIGCONT)  # while the new leader writes
        assert first.process.wait(STEP_S) == FENCED_EXIT, first.process.stderr_text()
        assert first.rest()[-1] == "fenced"
        assert second.process.wait(STEP_S) == 0, second.process.stderr_text()
    assert second.rest()[-1] == "done" and len(second.wrote()) == SECOND_DECISIONS

    log = expect(runner.invoke(command(), ["--broker", target, "consume", "control", "--json"]), 0)
    records = [(r["key"], r["value"], r["epoch"]) for r in json_lines(log.stdout)]
    epochs = [epoch for _, _, epoch in records]
    assert epochs == sorted(epochs), records
    first_of_2 = epochs.index(2)
    assert set(epochs[:first_of_2]) == {1} and set(epochs[first_of_2:]) == {2}, records
    assert all(value.startswith("c1:") for _, value, _ in records[:first_of_2]), records
    assert [f"{k}={v}" for k, v, _ in records[first_of_2:]] == second.wrote()
    # Everything c1 said it wrote is there, before c2's first record.
    assert set(first.wrote()) <= {f"{k}={v}" for k, v, _ in records[:first_of_2]}


def pause_until_elected(first: Candidate, second: Candidate, session_s: float) -> None:
    """Pause the leader just after a write until the second candidate is elected (epoch 2).

    The leader's lines queue up while the test waits on the second candidate, so each
    attempt first takes the old ones: the "wrote" it then waits for is a write that ended
    just now, not one from seconds ago. Pausing on a stale line could stop the leader
    within milliseconds of a resume, while it or its heartbeat thread (overdue after the
    pause) holds SQLite's write lock, and every later attempt would fail the same way."""
    missed: AssertionError | None = None
    for _ in range(PAUSE_ATTEMPTS):
        first.catch_up()
        first.until("wrote")
        first.process.signal(signal.SIGSTOP)
        try:
            elected = second.until("elected", session_s + 5.0)
        except AssertionError as exc:  # embedded: the paused leader may hold the write lock
            missed = exc
            first.process.signal(signal.SIGCONT)
            continue
        assert elected == "elected 2", second.said
        return
    raise AssertionError(
        f"c2 was never elected in {PAUSE_ATTEMPTS} pauses: c1 said {first.said[-3:]}, "
        f"c2 said {second.said[-3:]}"
    ) from missed


def test_ctrl_c_ends_a_candidate_without_a_traceback(processes: Processes, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    candidate = Candidate(processes, str(data_dir), "c1", decisions=10_000)
    candidate.until("wrote ")
    candidate.process.signal(signal.SIGINT)
    assert candidate.process.wait(STEP_S) == 130
    assert "interrupted" in candidate.rest()
    assert "Traceback" not in candidate.process.stderr_text()
    with connect(data_dir) as client:
        assert access_view(client, "control").exclusive is None, "it detached on its way out"
