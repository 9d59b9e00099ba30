"""A partition log with every kind of record, for tests that read it back: plain and
keyed records, empty and null values, empty keys, headers, explicit timestamps, an idempotent
producer's batches, committed and aborted transactions, over two partitions.

`OPERATIONS` is a hypothesis strategy of produce operations; `apply` runs them;
`mixed_log` opens a data directory holding what they wrote.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

from hypothesis import strategies as st

from broker.client.client import Client, connect
from broker.types import NewRecord

TOPIC = "t"

# produce operations: (kind, partition, count, seed)
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["plain", "keyed", "mixed", "idempotent", "txn", "aborted"]),
        st.integers(0, 1),
        st.integers(1, 12),
        st.integers(0, 2**32),
    ),
    min_size=1,
    max_size=8,
)


def new_records(kind: str, partition: int, count: int, rng: random.Random) -> list[NewRecord]:
    records = []
    for _ in range(count):
        value = rng.randbytes(rng.choice([0, 1, 5, 100]) if kind != "plain" else 10)
        if kind == "plain":
            records.append(NewRecord(value, partition=partition))
            continue
        key = rng.choice([None, b"", rng.randbytes(rng.randint(1, 9))])
        headers = rng.choice([(), (("h", rng.randbytes(3)),), (("a", b""), ("b", b"\x00"))])
        timestamp = rng.choice([None, rng.randint(0, 2**41)])
        null = rng.random() < 0.2  # a null value (Kafka's tombstone), in any batch
        records.append(NewRecord(None if null else value, key, headers, partition, timestamp))
    return records


def apply(client: Client, operations: list[tuple[str, int, int, int]]) -> None:
    producer = client.producer(TOPIC)
    for kind, partition, count, seed in operations:
        records = new_records(kind, partition, count, random.Random(seed))
        if kind == "idempotent":
            producer.send(records)
        elif kind in ("txn", "aborted"):
            with client.transaction("g") as txn:
                txn.produce(TOPIC, records)
                if kind == "aborted":
                    txn.abort()
        else:
            client.produce(TOPIC, records)


@contextlib.contextmanager
def mixed_log(
    data_dir: Path, operations: list[tuple[str, int, int, int]]
) -> Iterator[tuple[Client, int]]:
    """An embedded client of TOPIC (two partitions) after `operations`, and how many
    records they committed."""
    with connect(data_dir, durability="normal") as client:
        client.create_topic(TOPIC, 2)
        apply(client, operations)
        yield client, sum(count for kind, _, count, _ in operations if kind != "aborted")
