"""How long the pytest plugin's served fixture takes: `python -m bench.fixture_ready`.

Rules:
- A start is what `fencelog_server` does before a test runs: FencelogServer.start()
  (the `fencelog serve` process with a Kafka listener, until its ready file is there),
  timed with perf_counter around the call; a start with topics adds the first served
  connection and the topics' creation; a stop is SIGTERM until the process has exited.
- Each kind is run RUNS times after one unmeasured start (warm OS caches, as in a test
  run after the first fixture); the figure is the median, with the slowest beside it.
- The interpreter floor (`python -c pass`) is timed in rotation: no process start goes
  under it, and it says how loaded the machine was.
- Every server started is stopped, and the temporary directory removed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from broker.pytest_plugin import START_TIMEOUT_S, STOP_TIMEOUT_S, FencelogServer, Options

RUNS: Final = 11


def start_and_stop(root: Path, options: Options) -> tuple[float, float]:
    """(seconds until ready, seconds to stop) of one served fixture."""
    server = FencelogServer(
        root, options, start_timeout_s=START_TIMEOUT_S, stop_timeout_s=STOP_TIMEOUT_S
    )
    began = time.perf_counter()
    try:
        server.start()
        ready = time.perf_counter() - began
    finally:
        stopping = time.perf_counter()
        server.stop()
    return ready, time.perf_counter() - stopping


def interpreter_floor() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    runs = parser.parse_args().runs
    kinds = {"bare": Options(), "topics": Options(topics={"orders": 4, "events": 1})}
    ready: dict[str, list[float]] = {kind: [] for kind in kinds}
    stops: list[float] = []
    floor: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fencelog-bench-") as temporary:
        start_and_stop(Path(temporary) / "warm", Options())
        for run in range(runs):
            for kind, options in kinds.items():
                seconds, stop_seconds = start_and_stop(Path(temporary) / f"{kind}-{run}", options)
                ready[kind].append(seconds)
                stops.append(stop_seconds)
            floor.append(interpreter_floor())
    for kind, times in ready.items():
        print(f"ready ({kind}): median {_ms(statistics.median(times))}, max {_ms(max(times))}")
    print(f"stop: median {_ms(statistics.median(stops))}, max {_ms(max(stops))}")
    print(f"python -c pass: median {_ms(statistics.median(floor))}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    main()
