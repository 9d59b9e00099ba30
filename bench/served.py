"""Load patterns against a served broker, through `broker.client.async_client.AsyncClient`.

Rules:
- One AsyncClient (one TCP connection, one session) per pattern; everything runs on the
  event loop of the caller's `asyncio.Runner`, so a connection outlives a round.
- "In flight" means that many requests sent and not yet answered on the connection:
  `window` coroutines each send one request and wait for its reply before the next.
- An idempotent pattern leases one pid for the partition and numbers its records from
  the lease's sequence + 1. Each coroutine takes the next sequence and sends at once,
  with no await between (AsyncConnection writes the frame before its first await), so
  the frames leave in sequence order, as the broker requires of one pid.
- The clock covers sending and acknowledgement only; values are built before it starts.
  Every pattern checks afterwards that each record landed exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Final

from broker.client.async_client import AsyncClient
from broker.client.served import Address
from broker.protocol import ops
from broker.protocol.messages import Op
from broker.types import NO_PRODUCER, NewRecord, ProducerFields

PARTITION: Final = 0


def async_client(address: str, busy_poll_us: int = 0) -> AsyncClient:
    return AsyncClient(Address.parse(address), busy_poll_us=busy_poll_us)


async def end_offset(client: AsyncClient, topic: str) -> int:
    info = await client.call(ops.DESCRIBE_TOPIC, topic)
    return info.partition_details[PARTITION].end_offset


class Numbering:
    """The producer fields of the next batch: a leased pid's sequences, or nobody's."""

    def __init__(self, producer_id: int = 0, generation: int = 0, sequence: int = 0) -> None:
        self.producer_id = producer_id
        self.generation = generation
        self.next_sequence = sequence + 1

    def take(self, count: int) -> ProducerFields:
        if not self.producer_id:
            return NO_PRODUCER
        first = self.next_sequence
        self.next_sequence += count
        return ProducerFields(self.producer_id, self.generation, first)


async def numbering(client: AsyncClient, topic: str, idempotent: bool) -> Numbering:
    """A fresh pid's numbering for the partition, or none (pid 0)."""
    if not idempotent:
        return Numbering()
    lease = await client.call(ops.LEASE_PID, topic, PARTITION)
    return Numbering(lease.producer_id, lease.generation, lease.sequence)


async def one_record_requests(
    client: AsyncClient, topic: str, values: Sequence[bytes], window: int, *, idempotent: bool
) -> float:
    """Seconds to append each value as its own acknowledged request, `window` in flight."""
    fields = await numbering(client, topic, idempotent)
    before = await end_offset(client, topic)
    pending = iter(values)

    async def sender() -> None:
        for value in pending:
            record = [NewRecord(value, None, (), PARTITION)]
            await client.produce(topic, record, producer=fields.take(1))

    start = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(window)))
    elapsed_s = time.perf_counter() - start
    assert await end_offset(client, topic) == before + len(values), "lost or added records"
    return elapsed_s


async def one_record_latencies(
    client: AsyncClient, topic: str, values: Sequence[bytes], *, idempotent: bool
) -> list[float]:
    """Seconds of each acknowledged one-record request, sent one at a time."""
    fields = await numbering(client, topic, idempotent)
    before = await end_offset(client, topic)
    latencies = []
    for value in values:
        record = [NewRecord(value, None, (), PARTITION)]
        producer = fields.take(1)
        start = time.perf_counter()
        await client.produce(topic, record, producer=producer)
        latencies.append(time.perf_counter() - start)
    assert await end_offset(client, topic) == before + len(values), "lost or added records"
    return latencies


async def heartbeat_latencies(client: AsyncClient, count: int) -> list[float]:
    """Seconds of each HEARTBEAT request, one at a time: a round trip through the
    connection and the server's event loop that touches no engine."""
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        await client.request(Op.HEARTBEAT, {})
        latencies.append(time.perf_counter() - start)
    return latencies


async def batches_pipelined(
    client: AsyncClient,
    topic: str,
    batches: Sequence[Sequence[NewRecord]],
    in_flight: int,
    *,
    idempotent: bool,
) -> float:
    """Seconds to append every batch as one request, `in_flight` requests outstanding."""
    fields = await numbering(client, topic, idempotent)
    before = await end_offset(client, topic)
    pending = iter(batches)

    async def sender() -> None:
        for batch in pending:
            await client.produce(topic, batch, producer=fields.take(len(batch)))

    start = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    elapsed_s = time.perf_counter() - start
    records = sum(map(len, batches))
    assert await end_offset(client, topic) == before + records, "lost or added records"
    return elapsed_s


async def consume_from_zero(client: AsyncClient, topic: str, records: int) -> float:
    """Seconds to fetch a partition from offset 0 to `records`, the largest pages the
    broker allows, with no waiting."""
    page_records = (await client.limits()).read_records_max
    offset = 0
    start = time.perf_counter()
    while offset < records:
        page = await client.fetch(topic, {PARTITION: offset}, page_records, 0)
        assert page, f"fetch returned nothing at offset {offset} of {records}"
        offset = page[-1].offset + 1
    elapsed_s = time.perf_counter() - start
    assert offset == records
    return elapsed_s
