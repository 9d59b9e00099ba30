"""The fault suite (`make chaos`, chaos/run.py) with a small seed and a short duration:
idempotent producers and a transactional copier through a proxy that cuts, delays and
black-holes connections while the server is killed and restarted; an owner and an
exclusive producer stopped with SIGSTOP outside and inside a write transaction; every
run checked by `fencelog verify`. It must end on its own, report what it did, and find
no anomaly."""

from __future__ import annotations

import os
import sys

import pytest

from support import REPO_ROOT
from support.helpers import run_bounded

SEED = 7
DURATION_S = 16
BOUND_S = 110  # the suite bounds each of its waits; this bounds the whole run


@pytest.mark.slow
@pytest.mark.alone  # under a second test's load its producers met its first cuts starting
@pytest.mark.timeout(BOUND_S + 10)
def test_a_small_seed_of_the_fault_suite_finds_no_anomaly() -> None:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])}
    # Its own session: should the run outlive its bound, it goes with every process it
    # started (the suite stops them itself when it ends).
    args = [sys.executable, "-m", "chaos", "--seed", str(SEED), "--duration", str(DURATION_S)]
    status, stdout, stderr = run_bounded(args, cwd=REPO_ROOT, env=env, timeout_s=BOUND_S)
    report = stdout
    assert f"chaos: seed {SEED}" in report, stderr
    assert "operations: " in report and "faults injected: " in report, report
    assert "verify " in report.split("operations: ", 1)[1], report  # verify ran
    assert "anomalies: none" in report, report
    assert status == 0, report + stderr
