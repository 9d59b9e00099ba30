"""Cleaning killed mid-way: `fencelog serve` is SIGKILLed while it deletes a retention's
worth of records in steps; the next server finishes the job and the log is whole (each
step is one SQLite transaction: its records and the log start move together or not)."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from broker.client.client import connect
from broker.engine.engine import Engine
from broker.types import NewRecord, TopicConfig
from support.helpers import fencelog_script, user_env
from support.servers import serving
from support.values import present
from support.waiting import wait_until

OLD, NEW = 100_000, 50
STEP_S = 60.0


def test_a_server_killed_while_cleaning_leaves_a_whole_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = Engine.open(data_dir, durability="normal")
    try:
        engine.create_topic("events", config=TopicConfig(retention_ms=60_000))
        old_ms = int(time.time() * 1000) - 3_600_000
        for start in range(0, OLD, 10_000):
            engine.produce("events", [NewRecord(b"old-%d" % i, None, (), 0, old_ms)
                                      for i in range(start, start + 10_000)])  # fmt: skip
        engine.produce("events", [NewRecord(b"new-%d" % i) for i in range(NEW)])
    finally:
        engine.close()
    rng = random.Random(7)
    args = ("--no-unix", "--clean-interval", "50ms")
    durability = ("--durability", "normal")
    for round_ in range(3):
        ready = tmp_path / f"ready-{round_}.json"
        with serving(data_dir, ready, serve_args=args, global_args=durability) as server:
            time.sleep(rng.uniform(0.05, 0.4))  # somewhere inside the cleaning
            server.kill9()
    last = tmp_path / "ready-last.json"
    with (
        serving(data_dir, last, serve_args=args, global_args=durability) as server,
        connect(server.address) as client,
    ):

        def cleaned() -> bool:
            return client.describe_topic("events").partition_details[0].start_offset == OLD

        wait_until(cleaned, STEP_S, message="the last server finished the cleaning")
        kept = list(client.consume("events", partition=0, start="beginning"))
        (part,) = client.describe_topic("events").partition_details
    assert [(r.offset, r.value) for r in kept] == [(OLD + i, b"new-%d" % i) for i in range(NEW)]
    assert (part.end_offset, part.records) == (OLD + NEW, NEW)
    assert part.bytes == sum(len(present(r.value)) for r in kept)
    checked = subprocess.run(
        [str(fencelog_script()), "--broker", str(data_dir), "check"],
        capture_output=True,
        text=True,
        timeout=STEP_S,
        env=user_env(),
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
