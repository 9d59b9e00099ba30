"""The values that cross fencelog's layers: what a caller appends and what a reader gets.

`Record`, `NewRecord`, `AppendResult` and `ProducerFields` are NamedTuples rather than
frozen dataclasses on purpose: one is built per stored or appended row, or per produce
request, and a tuple subclass is built at a fraction of a frozen dataclass's cost (see
bench/RESULTS.md). Everything else is a frozen dataclass.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal, NamedTuple, get_args

from msgspec import Struct, field

from broker.errors import BrokerError, ErrorCode

Headers = tuple[tuple[str, bytes], ...]
Clock = Callable[[], int]  # the broker's clock: milliseconds since the epoch


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


class PartitionInfo(Struct, frozen=True):
    partition: int
    start_offset: int
    end_offset: int
    records: int
    bytes: int


CLEANUP_POLICIES: Final = ("delete", "compact")


class TopicConfig(Struct, frozen=True):
    """A topic's retention and cleanup (schema 010). None: no limit."""

    retention_ms: int | None = None  # records older than this (by timestamp) are deleted
    retention_bytes: int | None = None  # per partition: the oldest go past this size
    cleanup: str = "delete"  # or "compact": the newest record of each key stays


class TopicInfo(Struct, frozen=True):
    name: str
    partitions: int
    created_ms: int
    owner_group: str | None = None
    partition_details: tuple[PartitionInfo, ...] = field(default=())
    config: TopicConfig = field(default=TopicConfig())

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partition_details)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partition_details)


class BrokerStatus(Struct, frozen=True):
    data_dir: str
    schema_version: int
    durability: str
    database_bytes: int
    wal_bytes: int
    topics: tuple[TopicInfo, ...]
    producer_ids: int = 0
    producer_evictions: int = 0


class Fence(Struct, frozen=True):
    group: str
    resource: str
    generation: int

    def __str__(self) -> str:
        return f"{self.group}:{self.resource}:{self.generation}"


class Access(enum.StrEnum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    WAIT_EXCLUSIVE = "wait-exclusive"


class Mode(enum.StrEnum):
    """What an attachment is now."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"
    WAITING = "waiting"


class Attached(Struct, frozen=True):
    attachment_id: int
    session_id: str
    name: str
    mode: Mode
    epoch: int
    live: bool


class ProducerEntry(NamedTuple):
    """The state of one pid on one partition, as rebuilt from the log."""

    producer_id: int
    generation: int
    high_water_sequence: int
    first_record_ms: int
    last_offset: int

    def expires_ms(self, pid_lease_ms: int) -> int:
        return self.first_record_ms + pid_lease_ms


Durability = Literal["full", "normal"]
DURABILITIES: Final[tuple[Durability, ...]] = get_args(Durability)


def check_durability(durability: object) -> Durability:
    """The one check of a durability taken from outside (the CLI's --durability,
    connect(), Engine.open, Server): the value as a Durability, or INVALID_ARGUMENT."""
    for known in DURABILITIES:
        if durability == known:
            return known
    raise BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        f"unknown durability {durability!r}",
        hint="use full or normal",
    )


class Claimed(Struct, frozen=True):
    group: str
    resource: str
    generation: int

    @property
    def fence(self) -> Fence:
        """The fence a write or read under this claim carries."""
        return Fence(self.group, self.resource, self.generation)


class OwnResult(Struct, frozen=True):
    claimed: tuple[Claimed, ...]
    severed: tuple[str, ...]  # sessions this claim severed


class ReleaseResult(Struct, frozen=True):
    released: tuple[str, ...]
    severed: tuple[str, ...]


class OwnershipInfo(Struct, frozen=True):
    group: str
    resource: str
    generation: int
    holder: str | None
    holder_live: bool
    claimed_ms: int


class SessionInfo(Struct, frozen=True):
    """A client session: a connection to the server (conn-...: no pid, no heartbeat
    row) or a process that opened the data directory and claimed something (proc-...)."""

    session_id: str
    kind: str  # "connection" or "process"
    pid: int | None
    started_ms: int | None
    heartbeat_ms: int | None
    severed: bool
    live: bool


class Lease(Struct, frozen=True):
    producer_id: int
    generation: int
    sequence: int  # the high-water mark: the next record carries sequence + 1
    expire_ms: int
    now_ms: int = 0  # the broker's clock when it answered: expiry is judged against it


class Attachment(Struct, frozen=True):
    attachment_id: int
    topic: str
    name: str
    mode: Mode
    epoch: int


class AccessInfo(Struct, frozen=True):
    epoch: int
    exclusive: Attached | None
    shared: tuple[Attached, ...]
    waiting: tuple[Attached, ...]

    @property
    def mode(self) -> str:
        if self.exclusive is not None:
            return "exclusive"
        return "shared" if self.shared else "free"


class TxnPartition(Struct, frozen=True):
    topic: str | None  # None: deleted after the transaction wrote to it
    partition: int
    records: int
    bytes: int
    base_offset: int | None  # where APPLY_COMMIT put the first record; None before


class TxnInfo(Struct, frozen=True):
    txn_id: int
    group: str
    key: str | None
    state: str
    journal: int
    began_ms: int
    deadline_ms: int
    ended_ms: int | None
    reason: str | None
    age_ms: int
    partitions: tuple[TxnPartition, ...] = ()
    existing: bool = False  # txn_begin with a key found this transaction already there

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)


class TxnMember(Struct, frozen=True):
    """A producer's place in a transaction: its pid and generation there. Joining again
    under the same member name bumps the generation and discards the older records."""

    txn_id: int
    member: str
    producer_id: int
    generation: int
    discarded: int = 0

    @property
    def producer(self) -> ProducerFields:
        return ProducerFields(self.producer_id, self.generation, txn_id=self.txn_id)


class JournalEntryInfo(Struct, frozen=True):
    journal: int
    position: int
    kind: str
    at_ms: int
    body: object


class TxnDetail(Struct, frozen=True):
    info: TxnInfo
    journal: tuple[JournalEntryInfo, ...]
    records: tuple[Record, ...]  # still in the data journals (offset: journal position)


class Inspection(Struct, frozen=True):
    """What SQLite's integrity check found in a data directory's database."""

    db_path: Path
    bytes: int
    schema_version: int | None  # None: the file could not be read as a database
    problems: tuple[str, ...]  # empty when the check passed

    @property
    def ok(self) -> bool:
        return not self.problems
