"""The differential test's reads and topic steps, and the state a run leaves: one read
three (or four) ways, a topic deleted under transactions and created again, compaction,
producer snapshots; then every record of every log, the ownership listing and its audit
log, the transactions, producer states, access, topics, groups and offsets."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from broker.client.client import Client
from broker.rows import records_of
from broker.types import Record
from support.differential.base import RunBase
from support.differential.world import (
    ARROW,
    COUNT_MAX,
    EXCLUSIVE_TOPIC,
    FENCED_TOPIC,
    KEYED_TOPIC,
    LEDGER_TOPIC,
    PLAIN_TOPIC,
    TOPICS,
    Answer,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from support.differential.plan import Step


class ReadingSteps(RunBase):
    def _read(self, index: int, step: Step) -> Answer:
        """One read every way: fetch (from inside a batch too), stored rows, consume of
        one partition and of all (in pages), and Arrow (one page, and pages of 2)."""
        topic = (PLAIN_TOPIC, LEDGER_TOPIC, EXCLUSIVE_TOPIC, FENCED_TOPIC, KEYED_TOPIC)[
            step.ref % 5
        ]
        partition = step.partition % TOPICS[topic]
        client = self.actors[step.actor].client
        end = client.end_offsets(topic)[partition]
        start = step.ref % (end + 1)
        limit = 2 * step.count
        ways = [
            client.fetch(topic, {partition: start}, max_records=limit),
            records_of(topic, client.fetch_rows(topic, {partition: start}, max_records=limit)),
            list(client.consume(topic, partition=partition, start=start, max_records=limit)),
            [
                r
                for batch in client.consume_batches(topic, start=start, max_records=limit)
                for r in batch
            ],
        ]
        if ARROW:
            arrow = client.fetch_arrow(topic, partition, start, max_records=limit)
            pages = client.arrow_pages(topic, partition, start, end, page_records=2)
            ways += [_arrow_records(arrow), [r for page in pages for r in _arrow_records(page)]]
        return tuple(tuple(self._record(r) for r in way) for way in ways)

    def _recreate_ledger(self, index: int, step: Step) -> Answer:
        """A topic transactions write to, deleted under them and created again."""
        client = self.actors[step.actor].client
        client.delete_topic(LEDGER_TOPIC)
        client.create_topic(LEDGER_TOPIC, TOPICS[LEDGER_TOPIC])
        return ("recreated",)

    def _clean(self, index: int, step: Step) -> Answer:
        return (self.actors[step.actor].client.clean_topic(KEYED_TOPIC),)

    def _snapshot_producers(self, index: int, step: Step) -> Answer:
        return (self.actors[step.actor].client.snapshot_producers(),)

    def state(self) -> dict[str, object]:
        """Everything the operations left behind, normalised."""
        observer = self.observer
        return {
            "logs": {topic: self._log(topic) for topic in TOPICS},
            "ownership": [
                (o.group, o.resource, o.generation, self.label(o.holder), o.holder_live)
                for o in observer.ownership()
            ],
            "audit": self._audit(),
            "txns": sorted(
                (self._txn(t) for t in observer.txn_list(include_ended=True, limit=10_000)),
                key=repr,
            ),
            "producers": {topic: self._producer_states(topic) for topic in TOPICS},
            "access": self._access(),
            "compacted": [self._record(r) for r in observer.read_compacted(PLAIN_TOPIC)],
            "offsets_for_times": [
                observer.offset_for_time(PLAIN_TOPIC, p, t)
                for p in range(TOPICS[PLAIN_TOPIC])
                for t in (0, 1_050, 1_150, 1_300, 10**13)
            ],
            "topics": [
                (t.name, t.partitions, t.owner_group, t.partition_details, t.config)
                for t in sorted(observer.list_topics(), key=lambda t: t.name)
            ],
            "consumer_groups": sorted(
                (g.group, g.topic, g.partition, g.next_offset) for g in observer.consumer_groups()
            ),
            "producer_snapshots": [
                # a snapshot's size depends on the pids' numbers and generations
                (r.snapshot_id, r.producers, r.evictions)
                for r in observer.producer_snapshots()
            ],
            "offsets": [
                observer.committed_offsets(f"readers-{count}", PLAIN_TOPIC)[0]
                for count in range(1, COUNT_MAX + 1)
            ],
        }

    def _audit(self) -> list[tuple[object, ...]]:
        rows = sorted(self.observer.ownership_history(limit=10_000), key=lambda a: a.audit_id)
        entries = [
            (
                a.group,
                a.resource,
                a.event,
                self.label(a.session_id),
                a.generation,
                a.requested,
                self.label(a.other),
            )
            for a in rows
        ]
        # One claim or release that severs several sessions audits them in the order of
        # their session ids, which differ between brokers: each such run is sorted.
        runs = itertools.groupby(entries, key=lambda e: (e[2] == "severed", e[6]))
        return [
            entry
            for (severed, _), run in runs
            for entry in (sorted(run, key=repr) if severed else run)
        ]

    def _log(self, topic: str) -> list[tuple[object, ...]]:
        partitions = {p: 0 for p in range(TOPICS[topic])}
        return [self._record(r) for r in _read_all(self.observer, topic, partitions)]

    def _producer_states(self, topic: str) -> list[tuple[object, ...]]:
        return sorted(
            (
                p,
                self.ids.pid(e.producer_id),
                self._relative(e.producer_id, e.generation),
                e.high_water_sequence,
                e.last_offset,
            )
            for p, e in self.observer.producer_states(topic)
        )

    def _access(self) -> tuple[object, ...]:
        access = self.observer.topic_access(EXCLUSIVE_TOPIC)
        attached = [access.exclusive] if access.exclusive is not None else []
        return (
            access.epoch,
            tuple(
                (a.attachment_id, self.label(a.session_id), a.name, str(a.mode), a.epoch, a.live)
                for a in [*attached, *access.shared, *access.waiting]
            ),
        )


def _arrow_records(batch: pa.RecordBatch) -> list[Record]:
    """An Arrow page's rows as Records, to be compared as any read is."""
    return [
        Record(
            row["topic"],
            row["partition"],
            row["offset"],
            int(row["timestamp"].timestamp() * 1000),
            row["key"],
            row["value"],
            tuple((h["key"], h["value"]) for h in row["headers"] or ()),
            row["producer_id"],
            row["generation"],
            row["sequence"],
            row["epoch"],
            row["txn_id"],
        )
        for row in batch.to_pylist()
    ]


def _read_all(client: Client, topic: str, positions: dict[int, int]) -> Iterator[Record]:
    ends = client.end_offsets(topic)
    for partition in positions:
        offset = 0
        while offset < ends[partition]:
            page = client.fetch(topic, {partition: offset})
            if not page:
                break
            yield from page
            offset = page[-1].offset + 1
