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
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client.client import connect
from support.differential import Run, Step, plan
from support.servers import served

SEEDS = (1, 2, 3, 4, 5, 6)
STEPS = 300


def run_embedded(data_dir: Path, steps: list[Step]) -> Run:
    with connect(str(data_dir)) as observer:
        run = Run(lambda: connect(str(data_dir)), observer, served=False)
        return finish(run, steps)


def run_served(data_dir: Path, steps: list[Step]) -> Run:
    with served(data_dir) as server, connect(server.address) as observer:
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


pytestmark = pytest.mark.usefixtures("no_thread_is_left")
