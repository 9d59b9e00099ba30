"""Embedded sessions are judged by a pulse that never waits for SQLite's lock.

An exclusive producer is stopped (SIGSTOP) while its process holds the write lock,
longer than the session timeout, while a second producer waits for exclusive access.
The waiter, alive all along, must not be judged dead by whoever writes first once the
lock is free; the stopped one must be: once it lets go, it is detached, the waiter is
promoted, and the stopped one, resumed, is fenced. The writers are chaos/writer.py with
a session timeout of 1.5 s."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from broker.client.client import connect
from support import REPO_ROOT
from support.helpers import Process, Processes, user_env
from support.values import present
from support.waiting import wait_until

TOPIC = "control"
STEP_S = 30.0
STOPPED_S = 4.0  # well past the writers' 1.5 s session timeout


def writer(processes: Processes, data_dir: Path, name: str) -> Process:
    env = user_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    args = [sys.executable, "-m", "chaos.writer", str(data_dir), TOPIC, name, "exclusive"]
    return processes.start([*args, "0.05", "60"], env=env, stdin=True, cwd=REPO_ROOT)


def next_line(process: Process, prefix: str) -> str:
    while True:
        line = process.line(STEP_S).strip()
        if line.startswith(prefix) or line.startswith(("error", "fenced")):
            return line


def test_a_live_waiter_outlives_a_producer_stopped_inside_a_write(
    processes: Processes, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with connect(data_dir) as client:
        client.create_topic(TOPIC)
    first = writer(processes, data_dir, "a")
    assert next_line(first, "ready").startswith("ready")
    assert next_line(first, "ack").startswith("ack")
    second = writer(processes, data_dir, "b")

    def waiting() -> bool:
        with connect(data_dir) as client:
            return [a.name for a in client.topic_access(TOPIC).waiting] == ["b"]

    wait_until(waiting, STEP_S, message="b waits for exclusive access")
    first.stdin.write(b"hold\n")
    first.stdin.flush()
    assert next_line(first, "holding") == "holding"
    first.signal(signal.SIGSTOP)
    time.sleep(STOPPED_S)  # the fault itself: stopped with the lock, past the timeout
    first.signal(signal.SIGCONT)
    first.stdin.write(b"release\n")
    first.stdin.flush()
    # the waiter is promoted and writes; the stopped one, resumed, is fenced
    promoted = next_line(second, "ready")
    assert promoted.startswith("ready"), f"{promoted}; {second.stderr_text()}"
    assert next_line(second, "ack").startswith("ack"), second.stderr_text()
    assert next_line(first, "fenced") == "fenced", first.stderr_text()
    assert first.wait(STEP_S) == 3
    with connect(data_dir) as client:
        values = [present(r.value).decode() for r in client.consume(TOPIC, start="beginning")]
    writers = [v.split(":")[0] for v in values]
    assert writers == sorted(writers), f"a's records after b's first: {values}"
