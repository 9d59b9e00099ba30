"""The values that cross fencelog's layers: what a caller appends and what a reader gets.

`Record`, `NewRecord`, `AppendResult` and `ProducerFields` are NamedTuples rather than
frozen dataclasses on purpose: one is built per stored or appended row, or per produce
request, and a tuple subclass is built at a fraction of a frozen dataclass's cost (see
bench/RESULTS.md). Everything else is a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

Headers = tuple[tuple[str, bytes], ...]


class Record(NamedTuple):
    """One record as stored in a partition's log. Producer fields are 0/None when unused."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: Headers
    producer_id: int
    generation: int
    sequence: int
    epoch: int
    txn_id: int | None


class ProducerFields(NamedTuple):
    """Who wrote a batch: an idempotent producer's (pid, generation, first sequence), the
    exclusive epoch it was written under, and its transaction. All zero/None: nobody.
    It travels on the wire as the array it already is."""

    producer_id: int = 0
    generation: int = 0
    first_sequence: int = 0
    epoch: int = 0
    txn_id: int | None = None


NO_PRODUCER = ProducerFields()


class NewRecord(NamedTuple):
    """A record a caller wants appended. `partition` None lets the broker choose.

    A NamedTuple like Record: one is built per appended row (by the CLI, the wire codec,
    the Spark writer), and it travels on the wire as the array it already is."""

    value: bytes
    key: bytes | None = None
    headers: Headers = ()
    partition: int | None = None
    timestamp_ms: int | None = None


class AppendResult(NamedTuple):
    """Where one record landed (a NamedTuple: one is built per appended record)."""

    topic: str
    partition: int
    offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    start_offset: int
    end_offset: int
    records: int
    bytes: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    created_ms: int
    owner_group: str | None = None
    partition_details: tuple[PartitionInfo, ...] = field(default=())

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partition_details)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partition_details)


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    data_dir: str
    schema_version: int
    durability: str
    database_bytes: int
    wal_bytes: int
    topics: tuple[TopicInfo, ...]
    producer_ids: int = 0
    producer_evictions: int = 0
