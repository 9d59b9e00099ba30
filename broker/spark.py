"""The PySpark connector: the "fencelog" format for batch and streaming reads and writes.

    import broker.spark
    broker.spark.register(spark)          # spark.dataSource.register(FencelogDataSource)
    df = (spark.read.format("fencelog").option("broker", "tcp://127.0.0.1:7420")
          .option("topic", "orders").load())

It is built on PySpark's Python data source API (pyspark.sql.datasource, 4.3) and talks
to the broker only through the client (broker.client.connect), served or embedded, so a
job runs the same against a broker on another machine. pyspark and pyarrow are imported
here and nowhere else in fencelog: install them with the `spark` extra.

Exactly once, and how:
- Reads see committed records only: a transaction's records enter the logs at commit.
  A batch read takes the offset range each partition had when the job was planned; a
  streaming read's offsets ({"PARTITION": next offset}) live in Spark's checkpoint.
- A batch write is one fencelog transaction: the driver begins it when the write is
  planned, every task joins it as member "partition-N" and journals its rows, and the
  driver commits it when every task succeeded (aborts it when the job fails). A retried
  task joins again under the same name: the generation bump discards the failed
  attempt's rows, so none is written twice. A driver that dies leaves a transaction
  that the broker aborts after its timeout; nothing of it was ever visible.
- A streaming write makes each micro-batch one transaction keyed by (query id, batch
  id), which the tasks read from Spark's local properties. When Spark replays a batch
  after a crash, its tasks find the transaction under the same key: still open (the
  replay's members replace what the crashed run journaled) or already committed (the
  replay writes nothing and the driver's commit is answered as already committed).

Options (case-insensitive): broker (a tcp://, unix:// URL or a data directory; default
$FENCELOG_BROKER or ./.fencelog), authTokenFile, topic; reads: startingOffsets,
endingOffsets ("earliest", "latest", or JSON {"PARTITION": offset} with -2 earliest and
-1 latest; earliest is the log start), failOnDataLoss (default true: an offset retention
deleted fails the query; false reads on from the log start), maxRecordsPerPartition
(split larger ranges), maxRecordsPerTrigger
(streaming admission control); writes: transactionalGroup (default spark-TOPIC),
transactionTimeout (ms; default 15 minutes: a job's transaction stays open while its
tasks run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.types import NewRecord

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

FORMAT: Final = "fencelog"
SCHEMA: Final = (
    "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, key BINARY, "
    "value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, producer_id BIGINT, "
    "generation INT, sequence INT, epoch INT, txn_id BIGINT"
)
EARLIEST: Final = -2
LATEST: Final = -1
# The columns a write takes, as Spark's Kafka sink does: value required, the rest optional.
WRITE_COLUMNS: Final = {
    "value": ("binary", "string"),
    "key": ("binary", "string"),
    "partition": ("int", "bigint", "smallint", "tinyint"),
    "headers": ("array<struct<key:string,value:binary>>",),
    "topic": ("string",),
}
FETCH_RECORDS: Final = 10_000
TXN_TIMEOUT_MS: Final = 15 * 60 * 1000


def register(spark: SparkSession | None = None) -> None:
    """Register the "fencelog" format with a session (default: the active one)."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                "no active SparkSession to register the fencelog format with",
                hint="call broker.spark.register(spark) once the session exists",
            )
    spark.dataSource.register(FencelogDataSource)


# options --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    broker: str
    token: str | None
    topic: str | None
    raw: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        lowered = {k.lower(): v for k, v in options.items()}
        broker = lowered.get("broker") or os.environ.get("FENCELOG_BROKER") or "./.fencelog"
        token_file = lowered.get("authtokenfile")
        token = Path(token_file).read_text(encoding="utf-8").strip() if token_file else None
        return cls(broker, token, lowered.get("topic"), lowered)

    def get(self, name: str) -> str | None:
        return self.raw.get(name.lower())

    def required_topic(self) -> str:
        if not self.topic:
            raise _option_error("the fencelog format needs .option('topic', NAME)")
        return self.topic

    def positive_int(self, name: str) -> int | None:
        text = self.get(name)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise _option_error(f"option {name} is a positive integer, not {text!r}")
        return value

    def fail_on_data_loss(self) -> bool:
        """Spark's Kafka option: fail a query whose offsets retention deleted (default),
        or read on from the log start."""
        text = (self.get("failOnDataLoss") or "true").strip().lower()
        if text not in {"true", "false"}:
            raise _option_error(f"option failOnDataLoss is true or false, not {text!r}")
        return text == "true"

    def connect(self) -> Client:
        return connect(self.broker, token=self.token)


def _option_error(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_ARGUMENT, message)


def offsets_option(
    text: str | None,
    default: str,
    ends: Sequence[int],
    name: str,
    firsts: Sequence[int] | None = None,
) -> list[int]:
    """One offset per partition from "earliest", "latest" or JSON {"PARTITION": offset}
    (-2: earliest, -1: latest), clamped to what the log holds. Earliest is each
    partition's log start (firsts; 0 when not given)."""
    firsts = list(firsts) if firsts is not None else [0] * len(ends)
    spec = (text or default).strip()
    if spec == "earliest":
        return firsts
    if spec == "latest":
        return list(ends)
    try:
        given = json.loads(spec)
    except ValueError as exc:
        raise _option_error(
            f'{name} is "earliest", "latest" or JSON like {{"0": 42}}, not {spec!r}'
        ) from exc
    if not isinstance(given, dict):
        raise _option_error(f'{name} JSON maps partitions to offsets, like {{"0": 42}}')
    chosen = list(firsts) if default == "earliest" else list(ends)
    for key, value in given.items():
        if not (str(key).isdigit() and int(key) < len(ends)):
            raise _option_error(f"{name} names partition {key!r}; the topic has {len(ends)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
            raise _option_error(f"{name}: partition {key} offset must be >= -2, not {value!r}")
        end = ends[int(key)]
        first = firsts[int(key)]
        chosen[int(key)] = (
            first if value == EARLIEST else end if value == LATEST else min(value, end)
        )
    return chosen


# reading ----------------------------------------------------------------------------------


class OffsetRange(InputPartition):
    """Records [start, end) of one topic partition: one Spark task's read."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def split_ranges(
    topic: str, starts: Sequence[int], ends: Sequence[int], per_split: int | None
) -> list[OffsetRange]:
    ranges = []
    for partition, (start, end) in enumerate(zip(starts, ends, strict=True)):
        step = per_split or max(end - start, 1)
        ranges += [
            OffsetRange(topic, partition, low, min(low + step, end))
            for low in range(start, end, step)
        ]
    return ranges


def read_range(options: Options, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of one offset range as Arrow record batches (Client.arrow_pages:
    built by SQLite, embedded or in the server; served, a page ahead)."""
    with options.connect() as client:
        start = part.start
        if not options.fail_on_data_loss():
            log_start = client.describe_topic(part.topic).partition_details[part.partition]
            start = min(max(start, log_start.start_offset), part.end)
        try:
            yield from client.arrow_pages(
                part.topic, part.partition, start, part.end, page_records=FETCH_RECORDS
            )
        except BrokerError as error:
            if error.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                details = {
                    **error.details,
                    "hint": ".option('failOnDataLoss', 'false') reads on from the log start",
                }
                raise BrokerError(
                    error.code,
                    f"{error.message} (data loss: Spark's failOnDataLoss is true)",
                    **details,
                ) from error
            raise


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.topic = options.required_topic()
        self.per_split = options.positive_int("maxRecordsPerPartition")
        with options.connect() as client:
            details = client.describe_topic(self.topic).partition_details
        ends = [p.end_offset for p in details]
        self.starts = offsets_option(
            options.get("startingOffsets"),
            "earliest",
            ends,
            "startingOffsets",
            [p.start_offset for p in details],
        )
        self.ends = offsets_option(
            options.get("endingOffsets"),
            "latest",
            ends,
            "endingOffsets",
            [p.start_offset for p in details],
        )

    def partitions(self) -> Sequence[InputPartition]:
        ranges = split_ranges(self.topic, self.starts, self.ends, self.per_split)
        return ranges or [OffsetRange(self.topic, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {"PARTITION": next offset}; Spark's checkpoint keeps them.

    With trigger(availableNow=True) the end offsets at the start of the run are the
    target: maxRecordsPerTrigger still splits the run into several micro-batches, and
    records produced after the start wait for the next run."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.topic = options.required_topic()
        self.per_split = options.positive_int("maxRecordsPerPartition")
        self.max_per_trigger = options.positive_int("maxRecordsPerTrigger")
        self._client: Client | None = None
        self._target: list[int] | None = None  # availableNow: the ends when it started

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection never travels to an executor
        return state

    def _ends(self) -> list[int]:
        if self._target is not None:
            return self._target
        if self._client is None:
            self._client = self.options.connect()
        return self._client.end_offsets(self.topic)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._ends()

    def initialOffset(self) -> dict[str, int]:
        ends = self._ends()
        if self._client is None:
            self._client = self.options.connect()
        firsts = [p.start_offset for p in self._client.describe_topic(self.topic).partition_details]
        starts = offsets_option(
            self.options.get("startingOffsets"), "latest", ends, "startingOffsets", firsts
        )
        return {str(p): offset for p, offset in enumerate(starts)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self._ends()
        positions = [int(start.get(str(p), 0)) for p in range(len(ends))]
        budget = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        return {str(p): o for p, o in enumerate(admit(positions, ends, budget))}

    def reportLatestOffset(self) -> dict[str, int]:
        return {str(p): offset for p, offset in enumerate(self._ends())}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        partitions = len(end)
        starts = [int(start.get(str(p), 0)) for p in range(partitions)]
        ends = [int(end[str(p)]) for p in range(partitions)]
        return split_ranges(self.topic, starts, ends, self.per_split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # the offsets live in Spark's checkpoint; fencelog keeps every record

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def admit(positions: Sequence[int], ends: Sequence[int], budget: int | None) -> list[int]:
    """End offsets for one trigger: everything available, or at most `budget` records
    shared fairly between the partitions that have some."""
    if budget is None:
        return list(ends)
    chosen = list(positions)
    remaining = budget
    while remaining > 0:
        behind = [p for p in range(len(ends)) if chosen[p] < ends[p]]
        if not behind:
            break
        share = max(1, remaining // len(behind))
        for p in behind:
            take = min(share, ends[p] - chosen[p], remaining)
            chosen[p] += take
            remaining -= take
            if remaining == 0:
                break
    return chosen


# writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """What one task journaled: into which transaction, as which member, how much."""

    txn_id: int
    member: str
    generation: int
    records: int
    skipped: bool = False  # the transaction was committed already (a replayed batch)


def check_write_schema(schema: StructType) -> None:
    """value required, key / partition / headers / topic optional, nothing else."""
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise _option_error(
            "writing to fencelog needs a value column (binary or string); "
            f"the DataFrame has {', '.join(names) or 'no columns'}"
        )
    for f in schema.fields:
        allowed = WRITE_COLUMNS.get(f.name)
        kind = f.dataType.simpleString()
        if allowed is None:
            raise _option_error(
                f"column {f.name!r} cannot be written to fencelog; the columns are "
                "value, key, partition, headers, topic (select them first)"
            )
        if kind not in allowed:
            raise _option_error(
                f"column {f.name!r} is {kind}; fencelog takes {' or '.join(allowed)}"
            )


def records_of(batch: pa.RecordBatch, default_topic: str | None) -> dict[str, list[NewRecord]]:
    """A record batch's rows as records, by topic."""
    names = batch.schema.names
    if "topic" not in names and "headers" not in names and default_topic is not None:
        return {default_topic: _column_records(batch)}
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    rows = batch.num_rows
    values = columns["value"]
    keys = columns.get("key", [None] * rows)
    partitions = columns.get("partition", [None] * rows)
    headers = columns.get("headers", [None] * rows)
    topics = columns.get("topic", [default_topic] * rows)
    by_topic: dict[str, list[NewRecord]] = {}
    for value, key, partition, header, topic in zip(
        values, keys, partitions, headers, topics, strict=True
    ):
        if value is None:
            raise _option_error("a row has a null value; fencelog records need one")
        name = topic or default_topic
        if name is None:
            raise _option_error("a row has no topic: set .option('topic', ...) or a topic column")
        by_topic.setdefault(name, []).append(
            NewRecord(
                _bytes(value),
                None if key is None else _bytes(key),
                tuple((h["key"], h["value"]) for h in header or ()),
                partition,
            )
        )
    return by_topic


def _column_records(batch: pa.RecordBatch) -> list[NewRecord]:
    """The usual batch (value, and maybe key and partition) as records, made column by
    column in C: no Python code runs per row."""
    names = batch.schema.names
    values = batch.column("value")
    if values.null_count:
        raise _option_error("a row has a null value; fencelog records need one")
    keys = _binary_list(batch.column("key")) if "key" in names else repeat(None)
    partitions = batch.column("partition").to_pylist() if "partition" in names else repeat(None)
    fields = zip(_binary_list(values), keys, repeat(()), partitions, repeat(None))
    return list(map(tuple.__new__, repeat(NewRecord), fields))


def _binary_list(column: pa.Array) -> list[bytes | None]:
    """A binary or string column's items as bytes (strings as their UTF-8)."""
    binary: list[bytes | None] = column.cast(pa.binary()).to_pylist()
    return binary


def _bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def journal_rows(
    client: Client, txn_id: int, member: str, batches: Iterator[pa.RecordBatch], topic: str | None
) -> Written:
    """Join txn_id as member and journal every row into it."""
    joined = client.join_transaction(txn_id, member)
    count = 0
    for batch in batches:
        for name, records in records_of(batch, topic).items():
            joined.produce(name, records)
            count += len(records)
    assert joined.member is not None
    return Written(txn_id, member, joined.member.generation, count)


def task_member() -> str:
    context = TaskContext.get()
    return f"partition-{context.partitionId() if context is not None else 0}"


class _Writing:
    """What both writers check and keep when Spark plans a write (on the driver)."""

    def __init__(self, options: Options, schema: StructType) -> None:
        check_write_schema(schema)
        self.options = options
        self.topic = options.topic
        if self.topic is None and "topic" not in schema.names:
            raise _option_error("set .option('topic', NAME) or write a topic column")
        self.group = options.get("transactionalGroup") or f"spark-{self.topic or 'topics'}"
        self.timeout_ms = options.positive_int("transactionTimeout") or TXN_TIMEOUT_MS
        if self.topic is not None:
            with options.connect() as client:
                client.describe_topic(self.topic)  # a missing topic fails the job now


class BatchWriter(_Writing, DataSourceArrowWriter):
    """One transaction for the whole job: begun here, on the driver, when Spark plans
    the write; committed by commit() once every task succeeded."""

    def __init__(self, options: Options, schema: StructType) -> None:
        super().__init__(options, schema)
        with options.connect() as client:
            self.txn_id = client.txn_begin(self.group, timeout_ms=self.timeout_ms).txn_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        with self.options.connect() as client:
            return journal_rows(client, self.txn_id, task_member(), iterator, self.topic)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        members = {m.member: m.generation for m in messages if isinstance(m, Written)}
        with self.options.connect() as client:
            client.txn_commit(self.txn_id, group=self.group, members=members)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        with self.options.connect() as client:
            client.txn_abort(self.txn_id, group=self.group)


class StreamWriter(_Writing, DataSourceStreamArrowWriter):
    """One transaction per micro-batch, keyed by (query id, batch id)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        key = batch_key()
        with self.options.connect() as client:
            info = client.txn_begin(self.group, key=key, timeout_ms=self.timeout_ms)
            if info.state != "open":  # committed already: this is a replay
                for _ in iterator:
                    pass
                return Written(info.txn_id, task_member(), 0, 0, skipped=True)
            return journal_rows(client, info.txn_id, task_member(), iterator, self.topic)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        written = [m for m in messages if isinstance(m, Written)]
        with self.options.connect() as client:
            for txn_id in sorted({m.txn_id for m in written}):
                members = {m.member: m.generation for m in written if m.txn_id == txn_id}
                skipped = any(m.skipped for m in written if m.txn_id == txn_id)
                # a replay's tasks found the batch committed: its commit is answered again
                client.txn_commit(txn_id, group=self.group, members=None if skipped else members)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        with self.options.connect() as client:
            for txn_id in sorted({m.txn_id for m in messages if isinstance(m, Written)}):
                try:
                    client.txn_abort(txn_id, group=self.group)
                except BrokerError as error:
                    if error.code is not ErrorCode.TXN_NOT_OPEN:
                        raise


def batch_key() -> str:
    """The transaction key of the running micro-batch: "QUERY_ID:BATCH_ID"."""
    context = TaskContext.get()
    query = context.getLocalProperty("sql.streaming.queryId") if context else None
    batch = context.getLocalProperty("streaming.sql.batchId") if context else None
    if not query or batch is None:
        raise BrokerError(
            ErrorCode.INTERNAL,
            "a streaming write task cannot see its query id and batch id",
            hint="this Spark version does not pass streaming local properties to Python",
        )
    return f"{query}:{batch}"


# the data source --------------------------------------------------------------------------


class FencelogDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("fencelog")."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(Options.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _refuse_overwrite(overwrite)
        return BatchWriter(Options.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _refuse_overwrite(overwrite)
        return StreamWriter(Options.parse(self.options), schema)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise _option_error("fencelog topics are append-only: use mode('append'), not overwrite")
