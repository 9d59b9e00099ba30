"""The old holder of a claim, as its own process: `python -m bench.holder BROKER
DURABILITY GROUP TOPIC`, driven line by line through stdin and stdout.

For each `hold RESOURCE` line it reads, it opens a new client (a new session: a severed
one cannot claim again), claims RESOURCE in GROUP, prints `ready`, and then writes one
record at a time to partition 0 of TOPIC carrying the claim's fence, until a write is
rejected. It then prints `rejected MONOTONIC_S CODE WRITES`: time.monotonic() as the
rejection reached it (CLOCK_MONOTONIC, comparable across processes on one machine),
the error code, and how many writes were accepted before. A holder that is never
rejected prints `timeout` after HOLD_TIMEOUT_S. It ends at `quit` or end of input.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Final

from broker.client.client import connect
from broker.errors import BrokerError
from broker.types import check_durability

HOLD_TIMEOUT_S: Final = 60.0  # beyond the busy timeout a new claim may wait (30 s)


def hold(broker: str, durability: str, group: str, topic: str, resource: str) -> str:
    """Claim `resource`, write under its fence until rejected; the line to report."""
    client = connect(broker, durability=check_durability(durability))
    try:
        (claimed,) = client.own(group, [resource])
        print("ready", flush=True)
        writes = 0
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                client.produce(topic, [b"x"], partition=0, fences=[claimed.fence])
            except BrokerError as error:
                return f"rejected {time.monotonic():.6f} {error.code.name} {writes}"
            writes += 1
        return "timeout"
    finally:
        with contextlib.suppress(BrokerError):
            client.close()


def main(argv: list[str]) -> int:
    broker, durability, group, topic = argv
    for line in sys.stdin:
        command, _, resource = line.strip().partition(" ")
        if command == "quit":
            break
        if command != "hold" or not resource:
            print(f"error: unknown command {line.strip()!r}", flush=True)
            return 2
        print(hold(broker, durability, group, topic, resource), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
