"""The PySpark connector: the "fencelog" format for batch and streaming reads and writes.

    import broker.spark
    broker.spark.register(spark)          # spark.dataSource.register(FencelogDataSource)
    df = (spark.read.format("fencelog").option("broker", "tcp://127.0.0.1:7420")
          .option("subscribe", "orders").load())

It is built on PySpark's Python data source API (pyspark.sql.datasource, 4.3) and talks
to the broker only through the client (broker.client.connect), served or embedded, so a
job runs the same against a broker on another machine. pyspark and pyarrow are imported
here and nowhere else in fencelog: install them with the `spark` extra. Its options and
behaviour follow Spark's own Kafka source and sink wherever the meaning is the same.

Exactly once, and how:
- Reads see committed records only: a transaction's records enter the logs at commit.
  A batch read takes the offset range each partition had when the job was planned; a
  streaming read's offsets ({"TOPIC": {"PARTITION": next offset}}, Kafka's form) live in
  Spark's checkpoint. Offsets that went backwards (a topic deleted and created again) or
  records deleted before they were read fail the query unless failOnDataLoss is false.
- A batch write is one fencelog transaction: the driver begins it when the write is
  planned and keeps it alive while the job runs (broker.client.keepalive, watching the
  driver's JVM), every task joins it as member "partition-N" and journals its rows, and
  the driver commits it when every task succeeded (aborts it when the job fails). A
  retried task joins again under the same name: the generation bump discards the failed
  attempt's rows, so none is written twice. A driver that dies leaves a transaction
  that the broker aborts after its timeout; nothing of it was ever visible.
- A streaming write makes each micro-batch one transaction keyed by (query id, batch
  id), which the tasks read from Spark's local properties. When Spark replays a batch
  after a crash, its tasks find the transaction under the same key: still open (the
  replay's members replace what the crashed run journaled) or already committed (the
  replay writes nothing and the driver's commit is answered as already committed).

The options are READ_OPTIONS and WRITE_OPTIONS (case-insensitive); any other is refused
with the list. A failure the user can act on reaches Spark as one line, fencelog's
message, without a Python traceback before it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from msgspec import Struct
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

from broker import columnar
from broker.client import keepalive
from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from broker.types import NewRecord, TopicInfo

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
COMMON_OPTIONS: Final = ("broker", "authTokenFile", "topic")
ENDING_OPTIONS: Final = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
READ_OPTIONS: Final = (
    *COMMON_OPTIONS,
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "failOnDataLoss",
    "maxRecordsPerPartition",
    "maxRecordsPerTrigger",
    "maxOffsetsPerTrigger",
    "minPartitions",
)
WRITE_OPTIONS: Final = (*COMMON_OPTIONS, "transactionalGroup", "transactionTimeout")
SPARK_OPTIONS: Final = frozenset({"checkpointlocation"})  # Spark's own, passed along
# Running in a Python worker Spark started (planning, a task, a commit): each exits after
# answering an exception, so what it sets in its environment ends with it.
IN_SPARK_WORKER: Final = "PYTHON_WORKER_FACTORY_SECRET"


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


# errors: one line first -------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def one_line(error: BrokerError) -> BrokerError:
    """The error as Spark shows it: fencelog's message, its hint and its code on one
    line, and (inside a Spark worker) without the traceback PySpark would put before it."""
    hint = f" ({error.hint})" if error.hint else ""
    line = f"{error.message}{hint} [{error.code.name}]"
    if IN_SPARK_WORKER in os.environ:
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"  # read by PySpark as this worker answers
    return BrokerError(error.code, line, **error.details)


def spark_facing(method: Callable[P, R]) -> Callable[P, R]:
    """A method Spark calls: a BrokerError leaves it as one line (one_line)."""

    @functools.wraps(method)
    def facing(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except BrokerError as error:
            raise one_line(error) from None

    return facing


def spark_facing_iterator(method: Callable[P, Iterator[R]]) -> Callable[P, Iterator[R]]:
    """spark_facing for a generator method (a task's read)."""

    @functools.wraps(method)
    def facing(*args: P.args, **kwargs: P.kwargs) -> Iterator[R]:
        try:
            yield from method(*args, **kwargs)
        except BrokerError as error:
            raise one_line(error) from None

    return facing


def _option_error(message: str, **details: Any) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_ARGUMENT, message, **details)


# options --------------------------------------------------------------------------------


class Options(Struct, frozen=True):
    broker: str
    token: str | None
    topic: str | None
    raw: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str], known: Sequence[str] = READ_OPTIONS) -> Options:
        """The options a reader (known=READ_OPTIONS) or writer (WRITE_OPTIONS) was given;
        any other is refused with the list of the known ones."""
        lowered = {k.lower(): v for k, v in options.items()}
        check_known(lowered, known)
        broker = lowered.get("broker") or os.environ.get("FENCELOG_BROKER") or "./.fencelog"
        token_file = lowered.get("authtokenfile")
        token = None
        if token_file:
            try:
                token = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise _option_error(
                    f"authTokenFile {token_file}: {exc.strerror or exc}",
                    hint="the driver reads it when Spark plans the job: give a path on the driver",
                ) from exc
        return cls(broker, token, lowered.get("topic"), lowered)

    def get(self, name: str) -> str | None:
        return self.raw.get(name.lower())

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

    def boolean(self, name: str, default: bool) -> bool:
        text = (self.get(name) or str(default)).strip().lower()
        if text not in {"true", "false"}:
            raise _option_error(f"option {name} is true or false, not {text!r}")
        return text == "true"

    def fail_on_data_loss(self) -> bool:
        """Spark's Kafka option: fail a query that lost records it had not read yet
        (default), or read on from where the log now starts."""
        return self.boolean("failOnDataLoss", True)

    def max_per_trigger(self) -> int | None:
        """maxRecordsPerTrigger, or Kafka's name for it, maxOffsetsPerTrigger."""
        ours = self.positive_int("maxRecordsPerTrigger")
        kafka = self.positive_int("maxOffsetsPerTrigger")
        if ours is not None and kafka is not None and ours != kafka:
            raise _option_error(
                f"maxRecordsPerTrigger ({ours}) and maxOffsetsPerTrigger ({kafka}) are one "
                "option under two names: give one"
            )
        return ours if ours is not None else kafka

    def connect(self) -> Client:
        return connect(self.broker, token=self.token, create=False)


def check_known(lowered: Mapping[str, str], known: Sequence[str]) -> None:
    names = {name.lower(): name for name in known}
    for given in lowered:
        if given in names or given in SPARK_OPTIONS:
            continue
        side = "reading" if known is READ_OPTIONS else "writing"
        if given == "path":
            raise _option_error(
                "the fencelog format takes no path: name the topic with .option('topic', NAME)"
            )
        close = difflib.get_close_matches(given, names, n=1, cutoff=0.75)
        if close:
            guess = f" (did you mean {names[close[0]]}?)"
        elif given.startswith("kafka."):
            guess = " (fencelog takes the broker's address as .option('broker', URL))"
        else:
            guess = ""
        raise _option_error(
            f"unknown option {given!r} for {side} fencelog{guess}; "
            f"the options are {', '.join(known)}"
        )


# what a read subscribes to ----------------------------------------------------------------


class Subscription(Struct, frozen=True):
    """topic (one name), subscribe (a comma list) or subscribePattern (a regular
    expression that must match a whole topic name), as Kafka's source has them."""

    names: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    @classmethod
    def of(cls, options: Options) -> Subscription:
        given = {
            name: options.get(name)
            for name in ("topic", "subscribe", "subscribePattern")
            if options.get(name) is not None
        }
        if len(given) != 1:
            what = ", ".join(given) if given else "none"
            raise _option_error(
                "the fencelog format needs .option('topic', NAME), or subscribe (a comma "
                f"list of topics) or subscribePattern (a regular expression): one of them, "
                f"not {what}"
            )
        [(name, text)] = given.items()
        assert text is not None
        if name == "subscribePattern":
            try:
                return cls(pattern=re.compile(text))
            except re.error as exc:
                raise _option_error(
                    f"subscribePattern {text!r} is not a regular expression: {exc}"
                ) from exc
        names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not names:
            raise _option_error(f"option {name} names no topic: {text!r}")
        return cls(names=names)

    def topics(self, client: Client, *, deleted: Iterable[str] = ()) -> dict[str, TopicInfo]:
        """The topics it reads now, by name. A named topic that does not exist fails
        (UNKNOWN_TOPIC), but those in `deleted` (a stream has read them): they are left
        out, for the stream to tell as data loss."""
        if self.pattern is not None:
            found = [t for t in client.list_topics() if self.pattern.fullmatch(t.name)]
            return {t.name: t for t in sorted(found, key=lambda t: t.name)}
        named = {}
        for name in self.names:
            try:
                named[name] = client.describe_topic(name)
            except BrokerError as error:
                if error.code is not ErrorCode.UNKNOWN_TOPIC or name not in deleted:
                    raise
        return named

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern={self.pattern.pattern}"
        return ",".join(self.names)


# offsets ----------------------------------------------------------------------------------

# {"TOPIC": [offset of partition 0, of partition 1, ...]}
Offsets = dict[str, list[int]]


def to_spark(offsets: Mapping[str, Sequence[int]]) -> dict[str, dict[str, int]]:
    """Offsets as Spark keeps them in its checkpoint: Kafka's {"TOPIC": {"P": offset}}."""
    return {t: {str(p): o for p, o in enumerate(offs)} for t, offs in offsets.items()}


def from_spark(offsets: Mapping[str, Any], topics: Sequence[str]) -> dict[str, dict[int, int]]:
    """Spark's offsets back: Kafka's form, or a checkpoint written by an earlier
    fencelog for one topic ({"P": offset})."""
    if offsets and all(not isinstance(v, dict) for v in offsets.values()):
        if len(topics) != 1:
            raise _option_error(
                f"the checkpoint's offsets {json.dumps(offsets)} name no topic; this query "
                f"reads {len(topics)} topics",
                hint="start it with a new checkpointLocation",
            )
        return {topics[0]: {int(p): int(o) for p, o in offsets.items()}}
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()}


@dataclass(slots=True)
class Positions:
    """Where each partition of each topic begins and ends now."""

    firsts: Offsets = field(default_factory=dict)
    ends: Offsets = field(default_factory=dict)

    @classmethod
    def of(cls, topics: Mapping[str, TopicInfo]) -> Positions:
        return cls(
            {t: [p.start_offset for p in info.partition_details] for t, info in topics.items()},
            {t: [p.end_offset for p in info.partition_details] for t, info in topics.items()},
        )


def resolve_offsets(
    text: str | None, default: str, at: Positions, name: str, *, fail_on_data_loss: bool
) -> Offsets:
    """Offsets per topic from "earliest", "latest" or JSON: Kafka's {"TOPIC": {"P":
    offset}} or, reading one topic, {"P": offset}; -2 is earliest (the log start), -1
    latest. A partition left out takes the default. An offset past the end fails; one
    below the log start fails as data loss, or is the log start (failOnDataLoss false)."""
    spec = (text or default).strip()
    if spec in ("earliest", "latest"):
        return {t: list(at.firsts[t] if spec == "earliest" else at.ends[t]) for t in at.ends}
    given = _json_object(
        spec,
        f'{name} is "earliest", "latest" or JSON like {{"orders": {{"0": 42}}}}, not {spec!r}',
        f'{name} JSON maps partitions to offsets, like {{"orders": {{"0": 42}}}}',
    )
    chosen = resolve_offsets(default, default, at, name, fail_on_data_loss=fail_on_data_loss)
    for topic, parts in _by_topic(given, list(at.ends), name).items():
        ends, firsts = at.ends[topic], at.firsts[topic]
        for key, value in parts.items():
            if not (str(key).isdigit() and int(key) < len(ends)):
                raise _option_error(
                    f"{name} names partition {key!r} of {topic}; it has {len(ends)}"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
                raise _option_error(f"{name}: partition {key} offset must be >= -2, not {value!r}")
            p = int(key)
            chosen[topic][p] = _checked(
                firsts[p] if value == EARLIEST else ends[p] if value == LATEST else value,
                f"{topic}/{p}",
                firsts[p],
                ends[p],
                name,
                fail_on_data_loss,
            )
    return chosen


def refuse_empty_bound(text: str | None, name: str, word: str, number: int, hint: str) -> None:
    """A batch read starting at latest or ending at earliest (as a word, or a
    partition's -1 / -2) is refused, as Spark's Kafka source refuses it: it reads none
    of that partition's records, which is never what a batch query means."""
    spec = (text or "").strip()
    if not spec:
        return
    found = spec == word
    if not found and spec.startswith("{"):
        with contextlib.suppress(ValueError):
            found = number in _offset_values(json.loads(spec))
    if found:
        raise _option_error(
            f"{name} {word} ({number}) is not allowed in a batch read: it reads nothing "
            "of that partition",
            hint=hint,
        )


def _offset_values(given: object) -> list[int]:
    """The offsets of an offsets JSON (Kafka's form by topic, or one topic's)."""
    if not isinstance(given, dict):
        return []
    found: list[int] = []
    for value in given.values():
        if isinstance(value, dict):
            found += _offset_values(value)
        elif type(value) is int:
            found.append(value)
    return found


def _json_object(text: str, not_json: str, not_an_object: str) -> dict[str, Any]:
    """An option's JSON text, which must be an object."""
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise _option_error(not_json) from exc
    if not isinstance(given, dict):
        raise _option_error(not_an_object)
    return given


def _by_topic(given: dict[str, Any], topics: Sequence[str], name: str) -> dict[str, dict[str, Any]]:
    if any(isinstance(v, dict) for v in given.values()):
        for topic, parts in given.items():
            if topic not in topics:
                raise _option_error(
                    f"{name} names topic {topic!r}, which this read does not subscribe to "
                    f"({', '.join(topics) or 'no topic'})"
                )
            if not isinstance(parts, dict):
                raise _option_error(
                    f'{name} JSON maps partitions to offsets, like {{"{topic}": {{"0": 42}}}}'
                )
        return given
    if len(topics) != 1:
        raise _option_error(
            f'{name} reads {len(topics)} topics: name each, like {{"TOPIC": {{"0": 42}}}}'
        )
    return {topics[0]: given}


def _checked(
    offset: int, where: str, first: int, end: int, name: str, fail_on_data_loss: bool
) -> int:
    if offset > end:
        raise _option_error(
            f"{name}: offset {offset} of {where} is past its end ({end})",
            hint="the end is the next offset to be written; latest is -1",
        )
    if offset < first:
        if fail_on_data_loss:
            raise data_loss(f"{name}: offset {offset} of {where} is below its log start {first}")
        return first
    return offset


def data_loss(what: str) -> BrokerError:
    return BrokerError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"{what}: records this query has not read are gone (failOnDataLoss is true)",
        hint=".option('failOnDataLoss', 'false') reads on from where the log starts now",
    )


def timestamps_option(
    options: Options, side: str, at: Positions
) -> dict[str, dict[int, int]] | None:
    """startingTimestamp / startingOffsetsByTimestamp (side "starting"), or the ending
    pair: a time in ms since the epoch per partition, the single one first, as Kafka."""
    single = options.get(f"{side}Timestamp")
    if single is not None:
        stamp = _stamp(single, f"{side}Timestamp")
        return {t: dict.fromkeys(range(len(ends)), stamp) for t, ends in at.ends.items()}
    name = f"{side}OffsetsByTimestamp"
    text = options.get(name)
    if text is None:
        return None
    like = f'{name} is JSON like {{"orders": {{"0": 1700000000000}}}}'
    given = _json_object(text, f"{like}, not {text!r}", like)
    stamps: dict[str, dict[int, int]] = {}
    for topic, parts in _by_topic(given, list(at.ends), name).items():
        count = len(at.ends[topic])
        for key, value in parts.items():
            if not (str(key).isdigit() and int(key) < count):
                raise _option_error(f"{name} names partition {key!r} of {topic}; it has {count}")
            stamps.setdefault(topic, {})[int(key)] = _stamp(value, name)
    return stamps


def _stamp(value: object, name: str) -> int:
    try:
        stamp = int(str(value))
    except ValueError:
        stamp = -1
    if stamp < 0:
        raise _option_error(f"{name}: a time is milliseconds since the epoch, not {value!r}")
    return stamp


def by_time(
    client: Client,
    stamps: Mapping[str, Mapping[int, int]],
    offsets: Offsets,
    at: Positions,
    *,
    starting: bool,
    strategy: str,
) -> Offsets:
    """offsets with each partition given a time replaced by the first offset at or after
    it. None found: ending reads to the end; starting fails (strategy "error", Kafka's
    default) or starts at the end ("latest")."""
    chosen = {t: list(offs) for t, offs in offsets.items()}
    for topic, parts in stamps.items():
        for p, stamp in parts.items():
            found = client.offset_for_time(topic, p, stamp)
            if found is None and starting and strategy == "error":
                raise BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"no record of {topic}/{p} at or after {stamp} ms",
                    hint="startingOffsetsByTimestampStrategy=latest starts at the end instead",
                )
            chosen[topic][p] = at.ends[topic][p] if found is None else found
    return chosen


def strategy_option(options: Options) -> str:
    text = (options.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if text not in {"error", "latest"}:
        raise _option_error(
            f"option startingOffsetsByTimestampStrategy is error or latest, not {text!r}"
        )
    return text


def starting_offsets(client: Client, options: Options, at: Positions, default: str) -> Offsets:
    """Where a read starts: startingTimestamp, startingOffsetsByTimestamp or
    startingOffsets, in Kafka's order of precedence."""
    fail = options.fail_on_data_loss()
    offsets = resolve_offsets(
        options.get("startingOffsets"), default, at, "startingOffsets", fail_on_data_loss=fail
    )
    stamps = timestamps_option(options, "starting", at)
    if stamps is None:
        return offsets
    return by_time(client, stamps, offsets, at, starting=True, strategy=strategy_option(options))


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


def plan_ranges(
    starts: Mapping[str, Sequence[int]],
    ends: Mapping[str, Sequence[int]],
    per_split: int | None,
    min_partitions: int | None,
) -> list[OffsetRange]:
    """The Spark partitions of a read: one per topic partition with records, split at
    per_split records, then (minPartitions, as Kafka's source) larger ranges split
    further in proportion to their size until there are at least min_partitions."""
    ranges = [r for t in ends for r in split_ranges(t, starts[t], ends[t], per_split)]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    split = []
    for r in ranges:
        size = r.end - r.start
        parts = min(size, max(1, math.ceil(size * min_partitions / total)))
        cuts = [r.start + size * i // parts for i in range(parts + 1)]
        split += [OffsetRange(r.topic, r.partition, a, b) for a, b in pairwise(cuts)]
    return split


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
                raise data_loss(f"{part.topic}/{part.partition}: {error.message}") from error
            raise


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.subscription = Subscription.of(options)
        self.per_split = options.positive_int("maxRecordsPerPartition")
        self.min_partitions = options.positive_int("minPartitions")
        options.max_per_trigger()  # checked here too: a streaming option, no use in a batch
        fail = options.fail_on_data_loss()
        refuse_empty_bound(
            options.get("startingOffsets"),
            "startingOffsets",
            "latest",
            LATEST,
            hint="a stream (spark.readStream) may start at latest, reading what comes next",
        )
        refuse_empty_bound(
            options.get("endingOffsets"),
            "endingOffsets",
            "earliest",
            EARLIEST,
            hint="endingOffsets latest (-1) reads to the end, the default",
        )
        with options.connect() as client:
            at = Positions.of(self.subscription.topics(client))
            self.starts = starting_offsets(client, options, at, "earliest")
            self.ends = resolve_offsets(
                options.get("endingOffsets"), "latest", at, "endingOffsets", fail_on_data_loss=fail
            )
            stamps = timestamps_option(options, "ending", at)
            if stamps is not None:
                self.ends = by_time(
                    client, stamps, self.ends, at, starting=False, strategy="latest"
                )
        for topic, ends in self.ends.items():
            for p, (start, end) in enumerate(zip(self.starts[topic], ends, strict=True)):
                if start > end:
                    raise _option_error(
                        f"{topic}/{p}: the starting offset {start} is after the ending offset {end}"
                    )

    @spark_facing
    def partitions(self) -> Sequence[InputPartition]:
        ranges = plan_ranges(self.starts, self.ends, self.per_split, self.min_partitions)
        return ranges or [OffsetRange(next(iter(self.ends), ""), 0, 0, 0)]

    @spark_facing_iterator
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        if partition.start == partition.end:
            return
        yield from read_range(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Kafka's {"TOPIC": {"PARTITION": next offset}}; Spark's checkpoint
    keeps them. Each trigger lists the topics again: a topic created that matches
    subscribePattern, or a partition added, is read from its start.

    With trigger(availableNow=True) the end offsets at the start of the run are the
    target: maxRecordsPerTrigger still splits the run into several micro-batches, and
    records produced after the start wait for the next run."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.subscription = Subscription.of(options)
        self.per_split = options.positive_int("maxRecordsPerPartition")
        self.min_partitions = options.positive_int("minPartitions")
        self.max_per_trigger = options.max_per_trigger()
        self.fail_on_data_loss = options.fail_on_data_loss()
        strategy_option(options)
        for name in ENDING_OPTIONS:
            if options.get(name) is not None:
                raise _option_error(
                    f"option {name} is for a batch read (spark.read): a stream reads on "
                    "as records arrive",
                    hint="stop the query when it has read what you need, or read a batch",
                )
        self._client: Client | None = None
        self._target: Positions | None = None  # availableNow: the ends when it started
        self._created: dict[str, int] = {}  # when each topic read was created, as first seen
        # failOnDataLoss false: a topic created again is read from its log start; these
        # are Spark's start offsets of the old one, void until the micro-batch commits
        self._voided: dict[str, dict[int, int]] = {}
        self._latest: Positions | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection never travels to an executor
        return state

    def _connected(self) -> Client:
        if self._client is None:
            self._client = self.options.connect()
        return self._client

    def _now(self, start: Mapping[str, Any] | None = None) -> Positions:
        """Every topic read and its partitions' log starts and ends, now. A topic
        deleted and created again since this query first saw it is data loss; with
        failOnDataLoss false, its offsets in `start` (Spark's) are void and it is read
        from its log start. A named topic the query read before and that is gone now is
        left out (positions() tells)."""
        start = start or {}
        named = [t for t, parts in start.items() if isinstance(parts, dict)]  # Kafka's form
        topics = self.subscription.topics(self._connected(), deleted={*self._created, *named})
        for name, info in topics.items():
            seen = self._created.setdefault(name, info.created_ms)
            if seen != info.created_ms:
                self._created[name] = info.created_ms
                if self.fail_on_data_loss:
                    raise data_loss(f"topic {name} was deleted and created again")
                given = from_spark(start, self.subscription.names or list(topics))
                if name in given:
                    self._voided[name] = given[name]
        self._latest = Positions.of(topics)
        return self._latest

    @spark_facing
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._now()

    @spark_facing
    def initialOffset(self) -> dict[str, dict[str, int]]:
        at = self._now()
        return to_spark(starting_offsets(self._connected(), self.options, at, "latest"))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_per_trigger)

    def positions(self, start: Mapping[str, Any], at: Positions) -> Offsets:
        """Where each partition read now stands, from Spark's start offsets: a topic or
        partition new to the query at its log start; offsets that went backwards (the
        topic created again) or that retention deleted are data loss, or (failOnDataLoss
        false) the log start."""
        given = from_spark(start, self.subscription.names or list(at.ends))
        for topic in given:
            if topic not in at.ends and self.fail_on_data_loss:
                raise data_loss(f"topic {topic} was deleted")
        positions: Offsets = {}
        for topic, ends in at.ends.items():
            firsts, known = at.firsts[topic], given.get(topic, {})
            if known and self._voided.get(topic) == known:
                known = {}  # the offsets of the topic before it was created again
            if known and max(known) >= len(ends) and self.fail_on_data_loss:
                raise data_loss(f"topic {topic} has {len(ends)} partitions, fewer than before")
            positions[topic] = []
            for p, (first, end) in enumerate(zip(firsts, ends, strict=True)):
                position = known.get(p, first)
                if position > end:
                    if self.fail_on_data_loss:
                        raise data_loss(
                            f"{topic}/{p} ends at {end}, before this query's position "
                            f"{position} (was the topic deleted and created again?)"
                        )
                    position = first
                elif position < first:
                    if self.fail_on_data_loss:
                        raise data_loss(
                            f"{topic}/{p} starts at {first}: records {position}..{first - 1} "
                            "were deleted"
                        )
                    position = first
                positions[topic].append(position)
        return positions

    @spark_facing
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        at = self._now(start)
        positions = self.positions(start, at)
        ends = at.ends
        if self._target is not None:  # availableNow: no further than the run's start
            ends = capped(ends, positions, self._target.ends)
        budget = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        return to_spark(admit(positions, ends, budget))

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_spark(self._latest.ends)

    @spark_facing
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        named = from_spark(end, self.subscription.names)
        ends = {t: [o for _, o in sorted(parts.items())] for t, parts in named.items()}
        at = self._now(start)
        known = Positions(
            {t: at.firsts.get(t, [0] * len(e))[: len(e)] for t, e in ends.items()}, ends
        )
        positions = self.positions(start, known)
        return plan_ranges(positions, ends, self.per_split, self.min_partitions)

    @spark_facing_iterator
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        # the offsets live in Spark's checkpoint; fencelog keeps every record. Offsets
        # voided by a topic created again are behind the query once a batch commits.
        self._voided.clear()

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def capped(ends: Offsets, positions: Offsets, target: Offsets) -> Offsets:
    """ends, no further than target (availableNow: the ends when the run started); a
    topic or partition target does not know stays where it stands."""
    return {
        t: [
            max(positions[t][p], min(end, target[t][p]))
            if p < len(target.get(t, ()))
            else positions[t][p]
            for p, end in enumerate(e)
        ]
        for t, e in ends.items()
    }


class RefusedStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream reader that could not be made, failing at Spark's first call. PySpark
    4.3 loses an error raised by streamReader() itself (its runner then stops a reader
    it never got), so the error waits here to be raised where Spark reports it."""

    def __init__(self, error: BrokerError) -> None:
        self.error = error

    def _fail(self) -> Any:
        raise one_line(self.error)

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._fail()  # type: ignore[no-any-return]

    def initialOffset(self) -> dict[str, Any]:
        return self._fail()  # type: ignore[no-any-return]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self._fail()  # type: ignore[no-any-return]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._fail()  # type: ignore[no-any-return]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._fail()  # type: ignore[no-any-return]

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        pass


def admit(
    positions: Mapping[str, Sequence[int]], ends: Mapping[str, Sequence[int]], budget: int | None
) -> Offsets:
    """End offsets for one trigger: everything available, or at most `budget` records
    shared fairly between the partitions that have some."""
    if budget is None:
        return {t: list(e) for t, e in ends.items()}
    chosen = {t: list(p) for t, p in positions.items()}
    remaining = budget
    while remaining > 0:
        behind = [(t, p) for t in ends for p in range(len(ends[t])) if chosen[t][p] < ends[t][p]]
        if not behind:
            break
        share = max(1, remaining // len(behind))
        for t, p in behind:
            take = min(share, ends[t][p] - chosen[t][p], remaining)
            chosen[t][p] += take
            remaining -= take
            if remaining == 0:
                break
    return chosen


def offsets_behind(progress: Any) -> dict[str, dict[str, int]]:
    """How far each fencelog source of a streaming query's progress (query.lastProgress,
    or its JSON as a dict) was from the latest offsets once its micro-batch was read:
    {"TOPIC": {"PARTITION": records}}. PySpark's Python data sources cannot add metrics
    of their own to the progress; this is what Kafka's source reports as
    offsetsBehindLatest."""
    data = progress if isinstance(progress, dict) else json.loads(progress.json)
    behind: dict[str, dict[str, int]] = {}
    for source in data.get("sources", []):
        end, latest = (
            _offsets_json(source.get("endOffset")),
            _offsets_json(source.get("latestOffset")),
        )
        for topic, parts in latest.items():
            done = end.get(topic)
            if isinstance(parts, dict) and isinstance(done, dict):
                behind[topic] = {p: max(0, int(o) - int(done.get(p, 0))) for p, o in parts.items()}
    return behind


def _offsets_json(value: object) -> dict[str, Any]:
    """A progress offset (JSON text, or already decoded) as a dict; {} when not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


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
    """A record batch's rows as records, by topic. The topic option (default_topic)
    overrides a topic column, as in Spark's Kafka sink."""
    columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    rows = batch.num_rows
    values = columns["value"]
    keys = columns.get("key", [None] * rows)
    partitions = columns.get("partition", [None] * rows)
    headers = columns.get("headers", [None] * rows)
    topics = (
        [default_topic] * rows if default_topic is not None else columns.get("topic", [None] * rows)
    )
    by_topic: dict[str, list[NewRecord]] = {}
    for value, key, partition, header, topic in zip(
        values, keys, partitions, headers, topics, strict=True
    ):
        if topic is None:
            raise _option_error("a row has no topic: set .option('topic', ...) or a topic column")
        by_topic.setdefault(topic, []).append(
            NewRecord(
                None if value is None else _bytes(value),  # null: a tombstone, as Kafka's sink
                None if key is None else _bytes(key),
                tuple(_header(h) for h in header or ()),
                partition,
            )
        )
    return by_topic


def _header(header: Mapping[str, Any]) -> tuple[str, bytes | None]:
    """A headers element as a record's header: a null value is kept null, as the Kafka
    listener keeps one (Kafka's sink accepts it); a null key is refused."""
    key, value = header["key"], header["value"]
    if key is None:
        raise _option_error("a row has a header with a null key; header keys are strings")
    return key, value


def _bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def journal_rows(
    client: Client, txn_id: int, member: str, batches: Iterator[pa.RecordBatch], topic: str | None
) -> Written:
    """Join txn_id as member and journal every row into it: as columns
    (Transaction.produce_arrow), topic by topic, unless a row has headers."""
    joined = client.join_transaction(txn_id, member)
    count = 0
    for batch in map(without_empty_headers, batches):
        names = batch.schema.names
        if "headers" in names:
            for name, records in records_of(batch, topic).items():
                joined.produce(name, records)
                count += len(records)
            continue
        chosen = [name for name in columnar.PRODUCE_COLUMNS if name in names]
        for name, rows in by_topic(batch, topic):
            joined.produce_arrow(name, rows.select(chosen))
            count += rows.num_rows
    assert joined.member is not None
    return Written(txn_id, member, joined.member.generation, count)


def without_empty_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without its headers column where no row has a header: a DataFrame
    read from fencelog or Kafka carries one, on most rows empty."""
    if "headers" not in batch.schema.names:
        return batch
    lengths = pc.list_value_length(batch.column("headers"))
    if pc.max(lengths).as_py() in (None, 0):  # null: no header either
        return batch.drop_columns(["headers"])
    return batch


def by_topic(batch: pa.RecordBatch, topic: str | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows by topic, each topic's in their order: all of them to the
    topic option, which overrides a topic column as in Spark's Kafka sink."""
    if topic is not None:
        yield topic, batch
        return
    topics = batch.column("topic")
    if topics.null_count:
        raise _option_error("a row has no topic: set .option('topic', ...) or a topic column")
    for name in pc.unique(topics).to_pylist():
        yield name, batch.filter(pc.equal(topics, name))


def task_member() -> str:
    context = TaskContext.get()
    return f"partition-{context.partitionId() if context is not None else 0}"


def driver_pid() -> int | None:
    """The Spark driver's JVM: the nearest ancestor of this planning worker named java."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                head, _, tail = stat.read().rpartition(")")
        except OSError:
            return None
        if head.partition("(")[2] == "java":
            return pid
        pid = int(tail.split()[1])
    return None


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

    def expired(self, error: BrokerError) -> BrokerError:
        """A transaction that timed out, said in Spark's terms."""
        if error.code is not ErrorCode.TXN_ABORTED or error.details.get("reason") != "timed out":
            return error
        return BrokerError(
            error.code,
            f"{error.message}: the write outlived its transactionTimeout ({self.timeout_ms} ms)",
            **{
                **error.details,
                "hint": "the driver keeps the transaction alive while it runs: did it stop? "
                "else raise .option('transactionTimeout', MS)",
            },
        )


class BatchWriter(_Writing, DataSourceArrowWriter):
    """One transaction for the whole job: begun here, on the driver, when Spark plans
    the write, kept alive while the driver's JVM runs; committed by commit() once every
    task succeeded."""

    def __init__(self, options: Options, schema: StructType) -> None:
        super().__init__(options, schema)
        with options.connect() as client:
            self.txn_id = client.txn_begin(self.group, timeout_ms=self.timeout_ms).txn_id
        driver = driver_pid()
        if driver is not None:
            keepalive.start(
                keepalive.Keeping(
                    options.broker, self.txn_id, self.timeout_ms, driver, self.group, options.token
                )
            )

    @spark_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        with self.options.connect() as client:
            try:
                return journal_rows(client, self.txn_id, task_member(), iterator, self.topic)
            except BrokerError as error:
                raise self.expired(error) from None

    @spark_facing
    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        members = {m.member: m.generation for m in messages if isinstance(m, Written)}
        with self.options.connect() as client:
            try:
                client.txn_commit(self.txn_id, group=self.group, members=members)
            except BrokerError as error:
                raise self.expired(error) from None

    @spark_facing
    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        with self.options.connect() as client:
            client.txn_abort(self.txn_id, group=self.group)


class StreamWriter(_Writing, DataSourceStreamArrowWriter):
    """One transaction per micro-batch, keyed by (query id, batch id)."""

    @spark_facing
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        key = batch_key()
        with self.options.connect() as client:
            info = client.txn_begin(self.group, key=key, timeout_ms=self.timeout_ms)
            if info.state != "open":  # committed already: this is a replay
                for _ in iterator:
                    pass
                return Written(info.txn_id, task_member(), 0, 0, skipped=True)
            try:
                return journal_rows(client, info.txn_id, task_member(), iterator, self.topic)
            except BrokerError as error:
                raise self.expired(error) from None

    @spark_facing
    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        written = [m for m in messages if isinstance(m, Written)]
        with self.options.connect() as client:
            for txn_id in sorted({m.txn_id for m in written}):
                members = {m.member: m.generation for m in written if m.txn_id == txn_id}
                skipped = any(m.skipped for m in written if m.txn_id == txn_id)
                # a replay's tasks found the batch committed: its commit is answered again
                try:
                    client.txn_commit(
                        txn_id, group=self.group, members=None if skipped else members
                    )
                except BrokerError as error:
                    raise self.expired(error) from None

    @spark_facing
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

    @spark_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(Options.parse(self.options, READ_OPTIONS))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return StreamReader(Options.parse(self.options, READ_OPTIONS))
        except BrokerError as error:
            return RefusedStream(error)

    @spark_facing
    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _refuse_overwrite(overwrite)
        return BatchWriter(Options.parse(self.options, WRITE_OPTIONS), schema)

    @spark_facing
    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _refuse_overwrite(overwrite)
        return StreamWriter(Options.parse(self.options, WRITE_OPTIONS), schema)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise _option_error("fencelog topics are append-only: use mode('append'), not overwrite")
