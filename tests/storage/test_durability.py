"""An acknowledged record survives the producing process being killed (kill -9).

A real `fencelog produce --json` reads values from a pipe and prints one acknowledgement
per record once its batch is committed. The test kills it with SIGKILL mid-stream, then
reopens the directory: every acknowledged record must be there with its value, and the
log must hold the values in the order they were sent, with no gap.

Both durability levels promise this much (a process crash); `full` also promises power
loss, which a test on one machine cannot cut: test_engine checks it sets synchronous=FULL.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest

import broker
from support.helpers import Process, Processes

ACKS_BEFORE_KILL = 300


def feed(producer: Process, stop: threading.Event) -> None:
    """Write value-0, value-1, ... to the producer's stdin until it dies or stop is set."""
    number = 0
    with contextlib.suppress(OSError, ValueError):
        while not stop.is_set():
            chunk = "".join(f"value-{number + i}\n" for i in range(20))
            producer.stdin.write(chunk.encode())
            producer.stdin.flush()
            number += 20


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_acknowledged_records_survive_sigkill(
    processes: Processes, data_dir: Path, durability: str
) -> None:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders")
    producer = processes.fencelog(
        "--broker", data_dir, "--durability", durability, "produce", "orders", "--json",
        stdin=True,
    )  # fmt: skip
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(producer, stop), daemon=True)
    feeder.start()
    acks: list[dict[str, object]] = []
    try:
        while len(acks) < ACKS_BEFORE_KILL:
            acks.append(json.loads(producer.line(timeout_s=15)))
        producer.kill()  # SIGKILL, mid-stream
        acks += [json.loads(line) for line in producer.remaining_lines()]
    finally:
        stop.set()
        producer.kill()
        feeder.join(timeout=10)
    assert producer.popen.returncode == -9

    with broker.open(data_dir, durability="full") as engine:
        stored = [r.value for r in engine.read("orders", 0, 0, max_records=10_000)]
        end = engine.end_offsets("orders")[0]
    # every acknowledgement names a record that is there, holding the value it was for
    for number, ack in enumerate(acks):
        assert ack["topic"] == "orders"
        assert ack["partition"] == 0
        assert ack["offset"] == number
        assert stored[number] == f"value-{number}".encode(), f"acknowledged record {number}"
    # and the log is the sent values in order: possibly a few more than were
    # acknowledged (committed, then killed before printing), never fewer, never a gap
    assert len(stored) == end >= len(acks)
    assert stored == [f"value-{n}".encode() for n in range(end)]
