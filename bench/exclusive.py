"""Exclusive producers (issue 6): failover time and the cost of exclusive access.

    python -m bench.exclusive [--rounds 15] [--records 20000]

Failover: a served broker; an exclusive producer in its own process writes, a waiter
(WaitForExclusive) in this process is queued; the holder's process is killed (SIGKILL);
the figure is the time from the kill to the waiter's first acknowledged record. Served,
the takeover is driven by the connection closing, not by a timeout.
Rate: records/s of single-record sends (and of batches of 100) through an exclusive
producer and through a shared one, same broker, same run, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from broker.client.client import Client, connect

HOLDER = """
import sys, time
from broker.client.client import connect
client = connect(sys.argv[1])
producer = client.producer(sys.argv[2], idempotent=False, access="exclusive", name="holder")
print("holding", flush=True)
while True:
    producer.send([b"h"], partition=0)
    time.sleep(0.005)
"""


def serve(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = data_dir.parent / "ready.json"
    fencelog = Path(sys.executable).parent / "fencelog"
    process = subprocess.Popen(
        [
            str(fencelog),
            "--broker",
            str(data_dir),
            "--durability",
            "normal",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not ready.exists():
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("fencelog serve did not start")
        time.sleep(0.02)
    return process, "tcp://" + json.loads(ready.read_text())["tcp"]


def failover_once(url: str, topic: str) -> float:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, topic], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        promoted = threading.Event()
        outcome: dict[str, float] = {}

        def wait() -> None:
            with connect(url) as client:
                waiter = client.producer(
                    topic,
                    idempotent=False,
                    access="wait-exclusive",
                    name="waiter",
                    wait_timeout_s=30,
                )
                promoted.set()
                waiter.send([b"w"], partition=0)
                outcome["acked"] = time.perf_counter()
                waiter.close()

        thread = threading.Thread(target=wait)
        thread.start()
        with connect(url) as observer:  # the waiter is queued before the kill
            deadline = time.monotonic() + 10
            while not observer.topic_access(topic).waiting and time.monotonic() < deadline:
                time.sleep(0.005)
        killed = time.perf_counter()
        os.kill(holder.pid, signal.SIGKILL)
        thread.join(30)
        return (outcome["acked"] - killed) * 1000
    finally:
        holder.kill()
        holder.wait()


def rate(client: Client, topic: str, access: str, records: int, batch: int) -> float:
    producer = client.producer(topic, idempotent=False, access=access, name=f"rate-{access}")
    try:
        values = [b"x" * 100] * batch
        started = time.perf_counter()
        for _ in range(records // batch):
            producer.send(values, partition=0)
        return records / (time.perf_counter() - started)
    finally:
        producer.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server, url = serve(Path(scratch) / "data")
        try:
            with connect(url) as client:
                client.create_topic("failover")
                client.create_topic("rate")
                failovers = [failover_once(url, "failover") for _ in range(args.rounds)]
                rates: dict[str, list[float]] = {}
                for batch in (1, 100):
                    for _ in range(3):
                        for access in ("exclusive", "shared"):
                            figure = rate(
                                client,
                                "rate",
                                access,
                                args.records // (20 if batch == 1 else 1),
                                batch,
                            )
                            rates.setdefault(f"{access}, batches of {batch}", []).append(figure)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    print(
        f"failover ms: median {statistics.median(failovers):.1f}, "
        f"p90 {sorted(failovers)[int(len(failovers) * 0.9) - 1]:.1f}, "
        f"max {max(failovers):.1f} over {len(failovers)} rounds (target < 100)"
    )
    for name, figures in rates.items():
        print(f"{name}: {statistics.median(figures):,.0f} records/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
