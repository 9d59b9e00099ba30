"""`fencelog verify`: the exactly-once claims of a topic checked against its log. Pure: the
records come in one by one (as a reader hands them over), with what was acknowledged or
what is expected; findings come out. Reading the log is the caller's (cli/verify.py).

What it finds, each a `kind` (their names are part of the JSON output):
- lost: an acknowledged record whose offset is missing or holds other bytes; with an
  expected list, an expected value (or key) absent from the log.
- duplicate: a value (or key, with by="key") stored more than once; with acks, only the
  acknowledged values are counted, each as many times as it was acknowledged at distinct
  offsets (a topic whose values repeat); with an expected list, only the expected ones.
- unexpected: with an expected list, a record whose value (or key) is not on it.
- out_of_order: records of one key (one partition) stored in another order than the
  expected list's (keyless records claim no order across producers); acks of one
  producer (one ack file) whose offsets go back on a partition. A producer's own order
  on a partition is its sequences'.
- gap: offsets missing between a partition's start and end offsets.
- sequence_skip, sequence_repeat: an idempotent producer's sequences on a partition that
  do not go up by one (pid 0 opts out, as it does in the broker); a newer generation
  that starts again at 1 is a Kafka producer's new epoch, which numbers from the start.
  A transaction member's records (`produce --txn ID --member NAME`, `join_transaction`,
  every Spark write) carry the member's pid and generation but no sequence (0): the
  broker orders them by the transaction, not by sequences, so none are checked.
- fenced_generation: a record of a pid's older generation after the first record of a
  newer one on the same partition (a zombie that was not fenced; for a member, a retried
  task's earlier attempt, which the commit discards).
- older_epoch: a record of an older exclusive-producer epoch after the first record of a
  newer one on the same partition (interleaved segments).
- open_txn, stale_txn: a transaction that touches the topic and is still open, or open
  (or committing) past its deadline.

Every finding is counted; a report keeps only the first `examples_max` of each kind per
partition.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from msgspec import Struct

from broker.types import PartitionInfo, Record, TxnInfo

KINDS: Final = (
    "lost",
    "duplicate",
    "unexpected",
    "out_of_order",
    "gap",
    "sequence_skip",
    "sequence_repeat",
    "fenced_generation",
    "older_epoch",
    "open_txn",
    "stale_txn",
)
By = Literal["value", "key"]
EXAMPLES_MAX: Final = 10


def sha256(data: bytes) -> str:
    """The digest `produce --json` prints as value_sha256."""
    return hashlib.sha256(data).hexdigest()


def value_sha256(value: bytes | None) -> str | None:
    """A record value's digest; a null value has none (value_sha256 null)."""
    return None if value is None else sha256(value)


class Ack(Struct, frozen=True):
    """One acknowledged record: where it landed and, when known, its value's digest.

    `source` names the ack file, `line` the line in it (for messages); acks of one source
    are one producer's, in the order it got them."""

    partition: int
    offset: int
    value_sha256: str | None = None
    source: str = ""
    line: int = 0

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source else f"ack {self.line}"


class Finding(Struct, frozen=True):
    kind: str
    partition: int | None  # None: the whole topic (an expected value nowhere, a txn)
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message} | self.details


@dataclass
class Section:
    """The findings of one partition (or of the whole topic: partition None)."""

    partition: int | None
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Finding]] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())

    def add(self, finding: Finding, examples_max: int) -> None:
        self.counts[finding.kind] += 1
        kept = self.examples.setdefault(finding.kind, [])
        if len(kept) < examples_max:
            kept.append(finding)


@dataclass
class Report:
    topic: str
    by: By
    acks: int
    expected: int
    partitions: dict[int, Section]
    topic_wide: Section

    @property
    def records(self) -> int:
        return sum(s.records for s in self.partitions.values())

    @property
    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter(self.topic_wide.counts)
        for section in self.partitions.values():
            total.update(section.counts)
        return total

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())

    @property
    def clean(self) -> bool:
        return self.anomalies == 0

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "topic": self.topic,
            "clean": self.clean,
            "anomalies": self.anomalies,
            "records": self.records,
            "acks": self.acks,
            "expected": self.expected,
            "by": self.by,
            "counts": {kind: counts[kind] for kind in KINDS},
            "partitions": [_section_dict(s) for _, s in sorted(self.partitions.items())],
            "topic_wide": _examples_dict(self.topic_wide),
        }


def _examples_dict(section: Section) -> dict[str, list[dict[str, Any]]]:
    return {
        kind: [f.to_dict() for f in section.examples[kind]]
        for kind in KINDS
        if kind in section.examples
    }


def _section_dict(section: Section) -> dict[str, Any]:
    return {
        "partition": section.partition,
        "records": section.records,
        "first_offset": section.first_offset,
        "last_offset": section.last_offset,
        "anomalies": section.anomalies,
        "counts": {kind: section.counts[kind] for kind in KINDS if section.counts[kind]},
        "examples": _examples_dict(section),
    }


@dataclass
class _Producer:
    """What one pid has written to one partition so far."""

    generation: int
    sequence: int
    offset: int


class Checker:
    """Feed it the log partition by partition in offset order (record()), then finish()."""

    def __init__(
        self,
        topic: str,
        partitions: Sequence[PartitionInfo],
        *,
        acks: Sequence[Ack] = (),
        expected: Sequence[bytes] | None = None,
        by: By = "value",
        examples_max: int = EXAMPLES_MAX,
    ) -> None:
        self.topic = topic
        self.by: By = by
        self.examples_max = examples_max
        self.infos = {p.partition: p for p in partitions}
        self.sections = {p.partition: Section(p.partition) for p in partitions}
        self.topic_wide = Section(None)
        self.acks = list(acks)
        self.expected = None if expected is None else list(expected)
        self._acked: dict[tuple[int, int], list[Ack]] = defaultdict(list)
        for ack in self.acks:
            self._acked[(ack.partition, ack.offset)].append(ack)
        self._acked_digests = {a.value_sha256 for a in self.acks if a.value_sha256}
        # a value may be stored as many times as it was acknowledged at distinct offsets
        self._acked_copies = Counter(
            digest
            for acks in self._acked.values()
            for digest in {ack.value_sha256 for ack in acks if ack.value_sha256}
        )
        self._expected_at: dict[bytes, int] = {}
        if self.expected is not None:
            for index, item in enumerate(self.expected):
                self._expected_at.setdefault(item, index)
        self._seen: dict[Any, list[tuple[int, int]]] = defaultdict(list)  # item: places
        self._next_offset: dict[int, int] = {}
        self._producers: dict[tuple[int, int], _Producer] = {}  # (pid, partition)
        self._members: dict[tuple[int, int], _Producer] = {}  # transaction members'
        self._epoch: dict[int, tuple[int, int]] = {}  # partition: (newest epoch, its offset)
        self._order: dict[tuple[int, bytes], tuple[int, int]] = {}  # (index, offset)

    def _add(self, kind: str, at: int | None, message: str, **details: Any) -> None:
        """A finding of partition `at` (None: of the whole topic)."""
        section = self.topic_wide if at is None else self.sections[at]
        details = {"partition": at, **details} if at is not None else details
        section.add(Finding(kind, at, message, details), self.examples_max)

    # the log ------------------------------------------------------------------------------

    def record(self, record: Record) -> None:
        p, offset = record.partition, record.offset
        section = self.sections[p]
        section.records += 1
        if section.first_offset is None:
            section.first_offset = offset
        section.last_offset = offset
        self._gap(p, self._next_offset.get(p, self.infos[p].start_offset), offset)
        self._next_offset[p] = offset + 1
        for ack in self._acked.pop((p, offset), ()):
            if ack.value_sha256 is not None and ack.value_sha256 != value_sha256(record.value):
                self._add(
                    "lost",
                    p,
                    f"{ack.where}: offset {offset} holds other bytes than were acknowledged",
                    offset=offset,
                    ack=ack.where,
                )
        self._items(record)
        if record.producer_id and record.sequence:
            self._sequence(record)
        elif record.producer_id:
            self._member(record)
        self._epochs(record)

    def _gap(self, partition: int, expected: int, offset: int) -> None:
        if offset > expected:
            self._add(
                "gap",
                partition,
                f"offsets {expected}-{offset - 1} are missing",
                first=expected,
                last=offset - 1,
                missing=offset - expected,
            )

    def _item(self, record: Record) -> bytes | None:
        return record.value if self.by == "value" else record.key

    def _items(self, record: Record) -> None:
        """Count the record's value (or key) for duplicates; check it against the
        expected list."""
        item = self._item(record)
        p, offset = record.partition, record.offset
        if self.expected is not None:
            if item is None or item not in self._expected_at:
                shown = _show(item) if item is not None else f"no {self.by}"
                self._add(
                    "unexpected",
                    p,
                    f"offset {offset} holds {shown}, which is not expected",
                    offset=offset,
                    item=None if item is None else _show(item),
                )
                return
            if record.key is not None:  # keyless records claim no order across producers
                self._in_order(record, record.key, self._expected_at[item])
        elif (
            self.by == "value"
            and self._acked_digests
            and value_sha256(record.value) not in self._acked_digests
        ):
            return  # with acks, only the acknowledged values are counted
        if item is not None:
            self._seen[item].append((p, offset))

    def _in_order(self, record: Record, key: bytes, index: int) -> None:
        group = (record.partition, key)  # a key's records share a partition
        before = self._order.get(group)
        if before is not None and index < before[0]:
            self._add(
                "out_of_order",
                record.partition,
                f"offset {record.offset} (expected #{index + 1}) comes after offset "
                f"{before[1]} (expected #{before[0] + 1})" + f" for key {_show(key)}",
                offset=record.offset,
                after=before[1],
            )
        if before is None or index > before[0]:
            self._order[group] = (index, record.offset)

    def _sequence(self, record: Record) -> None:
        p, pid = record.partition, record.producer_id
        before = self._producers.get((pid, p))
        if before is None:
            if record.sequence != 1 and self.infos[p].start_offset == 0:
                self._add(
                    "sequence_skip",
                    p,
                    f"pid {pid} starts at sequence {record.sequence}, not 1",
                    offset=record.offset,
                    pid=pid,
                    sequence=record.sequence,
                    expected_sequence=1,
                )
            self._producers[(pid, p)] = _Producer(record.generation, record.sequence, record.offset)
            return
        if record.generation < before.generation:
            self._fenced(record, before)
            return  # the zombie's sequences are not the producer's
        if record.generation > before.generation and record.sequence == 1:
            # a Kafka producer's new epoch numbers its records from the start again
            before.generation, before.sequence, before.offset = (
                record.generation,
                record.sequence,
                record.offset,
            )
            return
        expected = before.sequence + 1
        if record.sequence != expected:
            kind = "sequence_skip" if record.sequence > expected else "sequence_repeat"
            self._add(
                kind,
                p,
                f"offset {record.offset}: pid {pid} sequence {record.sequence} follows "
                f"{before.sequence} (offset {before.offset})",
                offset=record.offset,
                pid=pid,
                sequence=record.sequence,
                expected_sequence=expected,
            )
        before.generation = max(before.generation, record.generation)
        before.sequence = max(before.sequence, record.sequence)
        before.offset = record.offset

    def _member(self, record: Record) -> None:
        """A transaction member's record: its generation is checked, it has no sequence."""
        key = (record.producer_id, record.partition)
        before = self._members.get(key)
        if before is not None and record.generation < before.generation:
            self._fenced(record, before)
        elif before is None or record.generation > before.generation:
            self._members[key] = _Producer(record.generation, 0, record.offset)

    def _fenced(self, record: Record, newer: _Producer) -> None:
        self._add(
            "fenced_generation",
            record.partition,
            f"offset {record.offset}: pid {record.producer_id} generation {record.generation} "
            f"wrote after generation {newer.generation} (from offset {newer.offset})",
            offset=record.offset,
            pid=record.producer_id,
            generation=record.generation,
            newer_generation=newer.generation,
        )

    def _epochs(self, record: Record) -> None:
        p = record.partition
        newest = self._epoch.get(p)
        if newest is not None and record.epoch < newest[0]:
            self._add(
                "older_epoch",
                p,
                f"offset {record.offset}: epoch {record.epoch} after epoch {newest[0]} "
                f"(from offset {newest[1]})",
                offset=record.offset,
                epoch=record.epoch,
                newer_epoch=newest[0],
            )
        elif newest is None or record.epoch > newest[0]:
            self._epoch[p] = (record.epoch, record.offset)

    # the end ------------------------------------------------------------------------------

    def finish(self, transactions: Iterable[TxnInfo] = ()) -> Report:
        for p, info in self.infos.items():
            self._gap(p, self._next_offset.get(p, info.start_offset), info.end_offset)
        self._acks_left()
        self._acks_in_order()
        self._duplicates()
        if self.expected is not None:
            self._expected_missing()
        for txn in transactions:
            self._transaction(txn)
        return Report(
            self.topic,
            self.by,
            len(self.acks),
            0 if self.expected is None else len(self.expected),
            self.sections,
            self.topic_wide,
        )

    def _acks_left(self) -> None:
        for (p, offset), acks in sorted(self._acked.items()):
            for ack in acks:
                if p not in self.sections:
                    self._add(
                        "lost",
                        None,
                        f"{ack.where}: partition {p} does not exist",
                        partition=p,
                        offset=offset,
                        ack=ack.where,
                    )
                    continue
                self._add(
                    "lost",
                    p,
                    f"{ack.where}: offset {offset} is not in the log",
                    offset=offset,
                    ack=ack.where,
                )

    def _acks_in_order(self) -> None:
        last: dict[tuple[str, int], Ack] = {}
        for ack in self.acks:
            before = last.get((ack.source, ack.partition))
            if before is not None and ack.offset < before.offset and ack.partition in self.sections:
                self._add(
                    "out_of_order",
                    ack.partition,
                    f"{ack.where}: offset {ack.offset} acknowledged after offset "
                    f"{before.offset} ({before.where})",
                    offset=ack.offset,
                    ack=ack.where,
                )
            if before is None or ack.offset > before.offset:
                last[(ack.source, ack.partition)] = ack

    def _duplicates(self) -> None:
        for item, places in self._seen.items():
            if len(places) < 2:
                continue
            # with acks, a value acknowledged at N offsets is stored N times, once each
            acked = self.by == "value" and self.expected is None and self._acked_copies
            if acked and len(places) <= self._acked_copies[sha256(item)]:
                continue
            partition = places[1][0]
            self._add(
                "duplicate",
                partition,
                f"{self.by} {_show(item)} is stored {len(places)} times: "
                + ", ".join(f"{p}:{o}" for p, o in places[: self.examples_max]),
                item=_show(item),
                copies=len(places),
                places=[[p, o] for p, o in places[: self.examples_max]],
            )

    def _expected_missing(self) -> None:
        seen = set(self._seen)
        for index, item in enumerate(self.expected or ()):
            if item not in seen:
                seen.add(item)  # an item listed twice is missing once
                self._add(
                    "lost",
                    None,
                    f"expected #{index + 1} {self.by} {_show(item)} is not in the log",
                    item=_show(item),
                    line=index + 1,
                )

    def _transaction(self, txn: TxnInfo) -> None:
        touched = sorted({p.partition for p in txn.partitions if p.topic == self.topic})
        if not touched or txn.state not in ("open", "committing"):
            return
        now_ms = txn.began_ms + txn.age_ms
        stale = now_ms > txn.deadline_ms
        kind = "stale_txn" if stale else "open_txn"
        self._add(
            kind,
            None,
            f"transaction {txn.txn_id} of group {txn.group} is {txn.state}"
            + (f", past its deadline by {now_ms - txn.deadline_ms} ms" if stale else "")
            + f" ({'partition' if len(touched) == 1 else 'partitions'} "
            + f"{', '.join(map(str, touched))}, {txn.records} "
            + f"{'record' if txn.records == 1 else 'records'})",
            txn_id=txn.txn_id,
            group=txn.group,
            state=txn.state,
            partitions=touched,
            age_ms=txn.age_ms,
        )


def _show(item: bytes) -> str:
    """An item in a message: its text, or its hex when it is not UTF-8 text."""
    try:
        text = item.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + item.hex()
    shown = text if len(text) <= 60 else text[:57] + "..."
    return repr(shown)


# the text report (`fencelog verify`'s, and the pytest plugin's assertion) ----------------


def plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {counts[kind]}" for kind in KINDS if counts.get(kind))


def _section_lines(section: Section, indent: str) -> list[str]:
    lines = []
    for kind in KINDS:
        count = section.counts.get(kind, 0)
        if not count:
            continue
        lines.append(f"{indent}{kind}: {count}")
        shown = section.examples.get(kind, [])
        lines += [f"{indent}  {finding.message}" for finding in shown]
        if count > len(shown):
            lines.append(f"{indent}  ... and {count - len(shown)} more")
    return lines


def report_lines(report: Report) -> list[str]:
    """The text report: one summary per partition, its anomalies by kind with examples,
    the topic-wide ones, then the overall verdict."""
    lines = []
    for partition, section in sorted(report.partitions.items()):
        where = (
            f"offsets {section.first_offset}-{section.last_offset}"
            if section.records
            else "no records"
        )
        verdict = (
            "clean"
            if not section.anomalies
            else f"{section.anomalies} {plural(section.anomalies, 'anomaly', 'anomalies')}"
        )
        lines.append(
            f"partition {partition}: {section.records} "
            f"{plural(section.records, 'record', 'records')} ({where}): {verdict}"
        )
        lines += _section_lines(section, "  ")
    if report.topic_wide.anomalies:
        lines.append(f"topic {report.topic}:")
        lines += _section_lines(report.topic_wide, "  ")
    checked = [f"{report.records} {plural(report.records, 'record', 'records')}"]
    if report.acks:
        checked.append(f"{report.acks} {plural(report.acks, 'ack', 'acks')}")
    if report.expected:
        checked.append(f"{report.expected} expected")
    overall = (
        "clean"
        if report.clean
        else f"{report.anomalies} {plural(report.anomalies, 'anomaly', 'anomalies')} "
        f"({counts_text(report.counts)})"
    )
    lines.append(f"verify {report.topic}: {', '.join(checked)}: {overall}")
    return lines
