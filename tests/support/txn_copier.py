"""A consume-transform-produce copier with transactions, run as a subprocess by
tests/chaos/test_txn_crash.py (and killed with SIGKILL at random points).

    python tests/support/txn_copier.py BROKER --group G --chunk N [--pause-ms M] [--seed S]

It copies every record of topic `input` to the same partition of topic `output` with
its value prefixed by b"copied:". Each round reads up to N records from every partition
of `input` and, in ONE transaction, produces their copies and commits the consumer
offsets of group G (DESIGN.md section 6: consume-transform-produce is exactly once).

On start it first aborts every open transaction of G: they belong to a killed
predecessor, and one whose commit is still on its way must not be copied again. Only
then does it read the committed offsets (a transaction that did prepare has moved them).

stdout, one JSON object per line: {"resumed": {partition: offset}}, then per commit
{"committed": txn_id, "offsets": {...}, "records": n}, and {"done": total} at the end.
A BrokerError prints {"error": NAME, "message": ...} and exits with the error's code.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode

INPUT = "input"
OUTPUT = "output"
PREFIX = b"copied:"
TXN_TIMEOUT_MS = 20_000


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def transform(value: bytes) -> bytes:
    return PREFIX + value


def abort_stale(client: Client, group: str) -> list[int]:
    """Abort the open transactions a killed copier of this group left behind."""
    aborted = []
    for info in client.txn_list(limit=1000):
        if info.group != group or info.state != "open":
            continue
        try:
            client.txn_abort(info.txn_id, group=group)
        except BrokerError as error:
            if error.code is not ErrorCode.TXN_NOT_OPEN:  # prepared meanwhile: it commits
                raise
        aborted.append(info.txn_id)
    return aborted


def copy(client: Client, group: str, chunk: int, pause_s: float, rng: random.Random) -> int:
    def pause() -> None:
        if pause_s:
            time.sleep(rng.uniform(0, pause_s))  # pacing: random points to be killed at

    stale = abort_stale(client, group)
    committed, _ = client.committed_offsets(group, INPUT)
    partitions = client.describe_topic(INPUT).partitions
    positions = {p: committed.get(p, 0) for p in range(partitions)}
    say(resumed=positions, aborted=stale)
    while True:
        ends = client.end_offsets(INPUT)
        pending = {p: o for p, o in positions.items() if o < ends[p]}
        if not pending:
            return sum(positions.values())
        batches = {}
        for partition, offset in sorted(pending.items()):
            records = client.fetch(INPUT, {partition: offset}, max_records=chunk)
            offsets = [r.offset for r in records]
            if offsets != list(range(offset, offset + len(offsets))) or not records:
                say(error="GAP", message=f"partition {partition} from {offset}: {offsets}")
                sys.exit(3)
            batches[partition] = records
        with client.transaction(group, timeout_ms=TXN_TIMEOUT_MS) as txn:
            for partition, records in batches.items():
                txn.produce(
                    OUTPUT, [transform(present(r.value)) for r in records], partition=partition
                )
                pause()
            after = {p: records[-1].offset + 1 for p, records in batches.items()}
            txn.commit_offsets(group, INPUT, after)
            pause()
        positions.update(after)
        say(
            committed=txn.txn_id,
            offsets=positions,
            records=sum(len(records) for records in batches.values()),
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("broker")
    parser.add_argument("--group", required=True)
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--pause-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    try:
        with connect(args.broker) as client:
            total = copy(client, args.group, args.chunk, args.pause_ms / 1000, rng)
    except BrokerError as error:
        say(error=error.code.name, message=error.message)
        return int(error.code)
    say(done=total)
    return 0


def present(value: bytes | None) -> bytes:
    """The value, which the copier's input never holds null (this runs as a script: no
    import of the tests' support package)."""
    assert value is not None, "a null value in the copier's input"
    return value


if __name__ == "__main__":
    sys.exit(main())
