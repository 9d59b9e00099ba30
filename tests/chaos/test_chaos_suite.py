"""The fault suite (`make chaos`, chaos/run.py) with a small seed and a short duration:
idempotent producers and a transactional copier through a proxy that cuts, delays and
black-holes connections while the server is killed and restarted; an owner and an
exclusive producer stopped with SIGSTOP outside and inside a write transaction; every
run checked by `fencelog verify`. It must end on its own, report what it did, and find
no anomaly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support import REPO_ROOT

SEED = 7
DURATION_S = 16
BOUND_S = 110  # the suite bounds each of its waits; this bounds the whole run


@pytest.mark.slow
@pytest.mark.timeout(BOUND_S + 10)
def test_a_small_seed_of_the_fault_suite_finds_no_anomaly() -> None:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])}
    # Its own process group: should the run outlive its bound, it goes with every
    # process it started (the suite stops them itself when it ends).
    run = subprocess.Popen(
        [sys.executable, "-m", "chaos", "--seed", str(SEED), "--duration", str(DURATION_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = run.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        raise AssertionError(f"the run did not end within {BOUND_S}s: {stdout}") from None
    report = stdout
    assert f"chaos: seed {SEED}" in report, stderr
    assert "operations: " in report and "faults injected: " in report, report
    assert "verify " in report.split("operations: ", 1)[1], report  # verify ran
    assert "anomalies: none" in report, report
    assert run.returncode == 0, report + stderr
