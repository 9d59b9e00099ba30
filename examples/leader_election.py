"""Leader election on an exclusive producer (PIP-68's example), end to end.

    python examples/leader_election.py --broker tcp://127.0.0.1:7420 --name candidate-1

Each candidate asks for WaitForExclusive access to a control topic. The one that gets
it is the leader: it rebuilds its state from the compacted topic (the newest value of
every key), then writes its decisions. If it stalls (paused, partitioned) long enough
for its session to end, the next candidate is promoted, bumps the topic epoch and
takes over; when the old leader wakes up, its next write is refused (ProducerFenced)
and it steps down. The topic ends up as one segment per leader, never interleaved.

Output, one line per event: "elected EPOCH", "rebuilt N keys", "wrote KEY=VALUE",
"fenced" (exit status 3), "done" (after --decisions writes).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from broker.client import connect
from broker.client.producer import ProducerFenced
from broker.errors import BrokerError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="tcp://HOST:PORT or a data directory")
    parser.add_argument("--topic", default="control")
    parser.add_argument("--name", required=True, help="this candidate's name")
    parser.add_argument("--decisions", type=int, default=1000, help="writes, then exit 0")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between writes")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait to lead")
    args = parser.parse_args()

    with connect(args.broker) as client:
        with contextlib.suppress(BrokerError):  # another candidate created it
            client.create_topic(args.topic)
        leader = client.producer(
            args.topic,
            idempotent=False,
            access="wait-exclusive",
            name=args.name,
            wait_timeout_s=args.wait,
        )
        say(f"elected {leader.epoch}")
        state = {r.key: r.value for r in client.read_compacted(args.topic) if r.key}
        say(f"rebuilt {len(state)} keys")
        try:
            for number in range(args.decisions):
                key, value = f"k{number % 10}".encode(), f"{args.name}:{number}".encode()
                leader.send([value], key=key, partition=0)
                state[key] = value
                say(f"wrote {key.decode()}={value.decode()}")
                time.sleep(args.interval)
        except ProducerFenced:
            say("fenced")
            return 3
        leader.close()
    say("done")
    return 0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: closing the client above detached the producer
        say("interrupted")
        sys.exit(130)
