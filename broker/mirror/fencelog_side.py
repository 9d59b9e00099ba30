"""fencelog as the mirror's source or sink, reached only through broker.client.

As a sink, each batch is one fencelog transaction of the group `mirror:<group>`: the
records and the mirror's next source offsets (group offsets of <group>) commit together.
A start aborts what a killed mirror left open in that transaction group, and claims the
resource <group> in the ownership group `fencelog-mirror`, so that a second mirror of
the same group is refused while the first is live.

A null value (Kafka's tombstone) and a null header value are kept null both ways,
distinct from empty ones, as fencelog stores them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from broker.client.client import Client
from broker.errors import BrokerError, ErrorCode
from broker.mirror.failpoints import from_environment
from broker.mirror.plan import TopicShape
from broker.mirror.records import MirrorRecord, PartitionEnds
from broker.types import NewRecord, Record, TopicConfig

OWNERSHIP_GROUP = "fencelog-mirror"
TXN_GROUP_PREFIX = "mirror:"
IDLE_SLEEP_S = 0.1  # several topics followed: the pause between empty rounds


def _mirror_record(record: Record) -> MirrorRecord:
    return MirrorRecord(
        record.topic,
        record.partition,
        record.offset,
        record.timestamp_ms,
        record.key,
        record.value,
        tuple(record.headers),
    )


def _new_record(record: MirrorRecord) -> NewRecord:
    return NewRecord(
        record.value, record.key, tuple(record.headers), record.partition, record.timestamp_ms
    )


class _Reading:
    """What both sides read from fencelog: partition ends and record offsets."""

    client: Client

    def ends(self, topic: str) -> list[PartitionEnds]:
        details = self.client.describe_topic(topic).partition_details
        return [PartitionEnds(p.start_offset, p.end_offset) for p in details]

    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]:
        offsets: list[int] = []
        at = start
        while at < end:
            batch = self.client.fetch(topic, {partition: at}, max_records=end - at)
            offsets += [r.offset for r in batch if r.offset < end]
            if not batch:
                break
            at = batch[-1].offset + 1
        return offsets


class FencelogSource(_Reading):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.name = client.target
        self._positions: dict[str, dict[int, int]] = {}
        self.warnings: list[str] = []

    def topics(self) -> list[str]:
        return [info.name for info in self.client.list_topics()]

    def shape(self, topic: str) -> TopicShape:
        info = self.client.describe_topic(topic)
        config = info.config
        return TopicShape(
            info.partitions, config.cleanup, config.retention_ms, config.retention_bytes
        )

    def assign(self, positions: Mapping[str, Mapping[int, int]]) -> None:
        self._positions = {topic: dict(at) for topic, at in positions.items() if at}

    def pause(self, topic: str, partition: int) -> None:
        at = self._positions.get(topic, {})
        at.pop(partition, None)
        if not at:
            self._positions.pop(topic, None)

    def read(self, max_records: int, wait_ms: int) -> tuple[list[MirrorRecord], dict[str, int]]:
        """Records from every assigned partition (at most max_records per topic); waits
        up to wait_ms when none is there. No end-of-partition marks (offsets are
        contiguous: a position reaches the end offset)."""
        single = len(self._positions) == 1
        found: list[MirrorRecord] = []
        for topic, positions in self._positions.items():
            wait = wait_ms if single else 0
            batch = self.client.fetch(topic, positions, max_records=max_records, wait_ms=wait)
            for record in batch:
                positions[record.partition] = record.offset + 1
            found += map(_mirror_record, batch)
        if not found and not single and wait_ms:
            time.sleep(min(wait_ms / 1000, IDLE_SLEEP_S))
        return found, {}

    def committed(self, group: str, topic: str) -> dict[int, int]:
        return self.client.committed_offsets(group, topic)[0]

    def live_groups(self, groups: Sequence[str]) -> list[str]:
        """The named groups with live members on the server's Kafka listener (fencelog's
        own groups have no members: they only commit offsets)."""
        live = self.client.kafka_groups() or []
        return sorted(g.group for g in live if g.group in groups and g.members)

    def close(self) -> None:
        """The client is the caller's."""


class FencelogSink(_Reading):
    def __init__(self, client: Client, group: str) -> None:
        self.client = client
        self.name = client.target
        self.group = group
        self.txn_group = TXN_GROUP_PREFIX + group
        self.failpoints = from_environment()

    def partitions(self, topic: str) -> int | None:
        try:
            return self.client.describe_topic(topic).partitions
        except BrokerError as error:
            if error.code is ErrorCode.UNKNOWN_TOPIC:
                return None
            raise

    def create(self, topic: str, shape: TopicShape) -> None:
        config = TopicConfig(shape.retention_ms, shape.retention_bytes, shape.cleanup)
        self.client.create_topic(topic, shape.partitions, config=config, if_not_exists=True)

    def begin(self) -> None:
        """Refuse while another mirror of this group is live; abort what a killed one
        left open."""
        for held in self.client.ownership(OWNERSHIP_GROUP):
            if held.resource == self.group and held.holder_live:
                raise BrokerError(
                    ErrorCode.OWNED_BY_HIGHER_GENERATION,
                    f"another mirror of group {self.group} is running into {self.name} "
                    f"(session {held.holder})",
                    hint="stop it first, or give this one another --group",
                )
        self.client.own(OWNERSHIP_GROUP, [self.group])
        for txn in self.client.txn_list(limit=10_000):
            if txn.group == self.txn_group and txn.state == "open":
                self.client.txn_abort(txn.txn_id, group=self.txn_group)

    def positions(self, topic: str, partitions: int) -> dict[int, int]:
        committed = self.client.committed_offsets(self.group, topic)[0]
        return {p: at for p, at in committed.items() if p < partitions}

    def write(
        self, records: Sequence[MirrorRecord], positions: Mapping[str, Mapping[int, int]]
    ) -> None:
        by_topic: dict[str, list[NewRecord]] = {}
        for record in records:
            by_topic.setdefault(record.topic, []).append(_new_record(record))
        with self.client.transaction(self.txn_group) as txn:
            for topic, new_records in by_topic.items():
                txn.produce(topic, new_records)
            self.failpoints.reached("written")
            for topic, at in positions.items():
                txn.commit_offsets(self.group, topic, at)
            self.failpoints.reached("positioned")
        self.failpoints.reached("committed")

    def commit_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        self.client.commit_offsets(group, topic, offsets)

    def close(self) -> None:
        """The client is the caller's; its claim goes with its session."""
        try:
            self.client.release(OWNERSHIP_GROUP, [self.group])
        except BrokerError:
            return
