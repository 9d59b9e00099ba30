"""The values that cross fencelog's layers: what a caller appends and what a reader gets.

`Record`, `NewRecord`, `AppendResult` and `ProducerFields` are NamedTuples rather than
frozen dataclasses on purpose: one is built per stored or appended row, or per produce
request, and a tuple subclass is built at a fraction of a frozen dataclass's cost (see
bench/RESULTS.md). Everything else is a frozen dataclass.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import operator
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, TypeGuard, cast, get_args, overload

from msgspec import Struct, field

from broker.errors import BrokerError, ErrorCode

Headers = tuple[tuple[str, bytes | None], ...]  # a header value None: Kafka's null
Clock = Callable[[], int]  # the broker's clock: milliseconds since the epoch


class Record(NamedTuple):
    """One record as stored in a partition's log. Producer fields are 0/None when unused."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None  # None: Kafka's null (a tombstone), distinct from b""
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

    value: bytes | None  # None: a null value (Kafka's tombstone), distinct from b""
    key: bytes | None = None
    headers: Headers = ()
    partition: int | None = None
    timestamp_ms: int | None = None


class RecordColumns(Sequence[NewRecord]):
    """A batch of records given as columns: their values, and their keys, partitions and
    timestamps (None: no record has one). A Sequence of NewRecord whose records are made
    only when something asks for one; what reads a batch column by column (the checks,
    the partitioner, a transaction's data journal, the wire) takes the columns as they
    are, without a Python object per record (Client.produce_arrow, PRODUCE's columns, a
    Kafka producer's batch). No record of a RecordColumns has headers."""

    __slots__ = ("_records", "_sizes", "keys", "partitions", "timestamps", "values")

    def __init__(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        partitions: Sequence[int | None] | None = None,
        timestamps: Sequence[int | None] | None = None,  # None: the append's time
        *,
        sizes: list[int] | None = None,  # each value's bytes, where the maker has them
    ) -> None:
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        if partitions is not None and len(partitions) != len(values):
            raise ValueError(f"{len(partitions)} partitions for {len(values)} values")
        if timestamps is not None and len(timestamps) != len(values):
            raise ValueError(f"{len(timestamps)} timestamps for {len(values)} values")
        if sizes is not None and len(sizes) != len(values):
            raise ValueError(f"{len(sizes)} sizes for {len(values)} values")
        self.values = values
        self.keys = keys
        self.partitions = partitions
        self.timestamps = timestamps
        self._records: list[NewRecord] | None = None
        self._sizes = sizes  # value_sizes(), counted once

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> NewRecord: ...
    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...
    def __getitem__(self, index: int | slice) -> NewRecord | RecordColumns:
        if isinstance(index, slice):
            part = RecordColumns(
                self.values[index],
                None if self.keys is None else self.keys[index],
                None if self.partitions is None else self.partitions[index],
                None if self.timestamps is None else self.timestamps[index],
            )
            if self._sizes is not None:
                part._sizes = self._sizes[index]
            return part
        return self.records()[index]

    def __iter__(self) -> Iterator[NewRecord]:
        return iter(self.records())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordColumns | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable columns, as a list's

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records)"

    def value_sizes(self) -> list[int]:
        """Each value's bytes (value_sizes of the values), counted once: the server
        counts them for its metrics, the checks and the split, one batch each time.
        (The columns are not changed once a batch is made of them.)"""
        if self._sizes is None:
            self._sizes = value_sizes(self.values)
        return self._sizes

    def records(self) -> list[NewRecord]:
        """The batch as NewRecords, made once, in C, with the collector paused."""
        if self._records is None:
            fields = zip(
                self.values,
                repeat(None) if self.keys is None else self.keys,
                repeat(()),
                repeat(None) if self.partitions is None else self.partitions,
                repeat(None) if self.timestamps is None else self.timestamps,
            )
            with collector_paused():
                self._records = list(map(tuple.__new__, repeat(NewRecord), fields))
        return self._records

    def picked(self, indexes: Sequence[int]) -> RecordColumns:
        """The records at indexes, as columns (a range of them in one slice)."""
        if isinstance(indexes, range):
            return self[indexes.start : indexes.stop : indexes.step]
        return RecordColumns(
            [self.values[i] for i in indexes],
            None if self.keys is None else [self.keys[i] for i in indexes],
            None if self.partitions is None else [self.partitions[i] for i in indexes],
            None if self.timestamps is None else [self.timestamps[i] for i in indexes],
        )


def is_columns(records: object) -> TypeGuard[RecordColumns]:
    """isinstance(records, RecordColumns) in 30 ns, not 400: RecordColumns is a Sequence,
    and an ABC's isinstance of a list looks through its caches, several times a produce
    of one record. (Nothing derives from RecordColumns.)"""
    return type(records) is RecordColumns


def values_of(records: Sequence[NewRecord]) -> Sequence[bytes | None]:
    """A batch's values as a column (a RecordColumns' own)."""
    if is_columns(records):
        return records.values
    return list(map(_VALUE, records))


def sizes_of(records: Sequence[NewRecord]) -> list[int]:
    """Each record's value bytes, a null value's 0 (a RecordColumns' counted once)."""
    if is_columns(records):
        return records.value_sizes()
    return value_sizes(list(map(_VALUE, records)))


def value_sizes(values: Sequence[bytes | None]) -> list[int]:
    """Each value's bytes, a null value's 0 (it has none): counted in C while no value
    is null, the usual batch."""
    try:
        return list(map(len, cast(Sequence[bytes], values)))
    except TypeError:  # a null among them
        return [0 if value is None else len(value) for value in values]


def value_size(value: bytes | None) -> int:
    """A value's bytes; a null value has none."""
    return 0 if value is None else len(value)


def keys_of(records: Sequence[NewRecord]) -> Sequence[bytes | None] | None:
    """A batch's keys as a column; None when no record has one."""
    keys = records.keys if is_columns(records) else list(map(_KEY, records))
    return None if keys is None or keys.count(None) == len(keys) else keys


def partitions_of(records: Sequence[NewRecord]) -> Sequence[int | None] | None:
    """The partitions a batch's records name, as a column; None when none names one."""
    named = records.partitions if is_columns(records) else list(map(_PARTITION, records))
    return None if named is None or named.count(None) == len(named) else named


def any_unnamed(records: Sequence[NewRecord]) -> bool:
    """Some record names no partition (a RecordColumns' told by its column)."""
    if is_columns(records):
        return records.partitions is None or None in records.partitions
    if len(records) == 1:
        return _PARTITION(records[0]) is None
    return None in map(_PARTITION, records)


def values_only(records: Sequence[NewRecord]) -> bool:
    """No record has headers or a timestamp of its own (a RecordColumns' never has
    headers)."""
    if is_columns(records):
        return records.timestamps is None
    return not any(map(_HEADERS, records)) and list(map(_TIMESTAMP, records)).count(None) == len(
        records
    )


_VALUE: Final = operator.itemgetter(0)
_KEY: Final = operator.itemgetter(1)
_HEADERS: Final = operator.itemgetter(2)
_PARTITION: Final = operator.itemgetter(3)
_TIMESTAMP: Final = operator.itemgetter(4)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a batch of records (a page's Records, a
    produce's NewRecords, its results) is made: they hold numbers, bytes and strings,
    no cycles, and a run of the collector every 700 new tuples cost a third of the time
    of making them (0.35 us a record, measured), more as the process holds more."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class AppendResult(NamedTuple):
    """Where one record landed (a NamedTuple: one is built per appended record)."""

    topic: str
    partition: int
    offset: int
    duplicate: bool = False


# Produce results as columns: how many, then each record's partition, offset and
# duplicate flag, a column given as one value when every record has the same.
ResultColumns = tuple[int, int | Sequence[int], int | Sequence[int], bool | Sequence[bool]]


def _column(column: int | Sequence[int], count: int) -> Sequence[int]:
    return repeat(column, count) if isinstance(column, int) else column  # type: ignore[return-value]


class AppendResults(Sequence[AppendResult]):
    """Where a produce's records landed, in the order given: an AppendResult per record,
    made when it is read. An append learns a partition and a first offset for a whole
    batch; building a thousand tuples for it cost a tenth of an embedded append of
    1000 records (0.3 us each), so the results are kept as columns (ResultColumns: a
    column one value when every record has it, the offsets a range when they run on)
    and a served reply sends them as they are.

    It reads as the list it replaces: len, indexes and slices, iteration, and equality
    with any sequence of AppendResults (a list of them included)."""

    __slots__ = ("_count", "_parts", "_starts", "topic")

    def __init__(self, topic: str, parts: Sequence[ResultColumns] = ()) -> None:
        self.topic = topic
        self._parts = [part for part in parts if part[0]]
        self._starts: list[int] = []
        count = 0
        for part in self._parts:
            self._starts.append(count)
            count += part[0]
        self._count = count

    @classmethod
    def run(cls, topic: str, partition: int, first: int, count: int) -> AppendResults:
        """count records appended to one partition from offset first."""
        return cls(topic, [(count, partition, range(first, first + count), False)])

    @classmethod
    def joined(cls, topic: str, pieces: Sequence[Sequence[AppendResult]]) -> AppendResults:
        """The results of several appends (of one topic) one after the other."""
        parts: list[ResultColumns] = []
        for piece in pieces:
            if isinstance(piece, AppendResults):
                parts += piece._parts
            elif piece:
                parts.append(columns_of(piece))
        return cls(topic, parts)

    def columns(self) -> ResultColumns:
        """All the results as columns (one value for a column that is the same for all)."""
        if len(self._parts) == 1:
            return self._parts[0]
        if not self._parts:
            return 0, [], [], []
        count = self._count
        partitions, offsets, duplicates = (
            _compact([x for part in self._parts for x in _column(part[i], part[0])])
            for i in (1, 2, 3)
        )
        return count, partitions, offsets, duplicates

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[AppendResult]:
        topic = self.topic
        for count, partitions, offsets, duplicates in self._parts:
            fields = zip(
                repeat(topic, count),
                _column(partitions, count),
                _column(offsets, count),
                _column(duplicates, count),
                strict=True,
            )
            with collector_paused():
                made = list(map(tuple.__new__, repeat(AppendResult), fields))
            yield from made

    @overload
    def __getitem__(self, index: int) -> AppendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[AppendResult]: ...

    def __getitem__(self, index: int | slice) -> AppendResult | list[AppendResult]:
        if isinstance(index, slice):
            return list(self)[index]
        count = self._count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("append result index out of range")
        at = bisect_right(self._starts, index) - 1
        _, partitions, offsets, duplicates = self._parts[at]
        i = index - self._starts[at]
        return AppendResult(
            self.topic,
            partitions if isinstance(partitions, int) else partitions[i],
            offsets if isinstance(offsets, int) else offsets[i],
            duplicates if isinstance(duplicates, bool) else duplicates[i],
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._count and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[AppendResult]) -> AppendResults:
        return AppendResults.joined(self.topic, [self, other])

    def __repr__(self) -> str:
        return repr(list(self))


def columns_of(results: Sequence[AppendResult]) -> ResultColumns:
    """Results as columns, each given once when every result has the same (a
    transaction's: offset -1, not a duplicate)."""
    if isinstance(results, AppendResults):
        return results.columns()
    with collector_paused():
        partitions, offsets, duplicates = (
            _compact(list(map(getter, results))) for getter in _RESULT_GETTERS
        )
    return len(results), partitions, offsets, duplicates


_RESULT_GETTERS: Final = tuple(operator.itemgetter(i) for i in (1, 2, 3))


def _compact(column: list[Any]) -> Any:
    return column[0] if column and column.count(column[0]) == len(column) else column


class OffsetMetadata(NamedTuple):
    """What a consumer commits beside a partition's next offset (Kafka's OffsetCommit
    carries both): its metadata text (None: none) and the leader epoch of the last
    record it read (-1: none; one broker: 0)."""

    metadata: str | None = None
    leader_epoch: int = -1


NO_OFFSET_METADATA: Final = OffsetMetadata()


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


class KafkaGroupMember(Struct, frozen=True):
    """A live member of a Kafka consumer group (the Kafka listener's coordinator)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    assignment: tuple[tuple[str, tuple[int, ...]], ...]  # (topic, partitions)


class KafkaGroup(Struct, frozen=True):
    """A Kafka consumer group the Kafka listener's coordinator holds, with its state
    (Kafka's names: Empty, PreparingRebalance, CompletingRebalance, Stable), protocol
    type and assignor, and its live members."""

    group: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[KafkaGroupMember, ...]


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
