"""A Kafka consumer group's committed offsets: OffsetCommit's and TxnOffsetCommit's
offsets, metadata and leader epochs in, OffsetFetch's out, all kept in fencelog's group
offsets (what `fencelog consume --group` reads and commits).

Kafka's rules kept here: a commit's metadata is at most offset_metadata_chars_max
characters (Kafka's offset.metadata.max.bytes), a partition over it is
OFFSET_METADATA_TOO_LARGE and the others of the request are committed; a leader epoch
is kept as the client sent it (-1 from a client version without one). OffsetFetch
answers a partition without a committed offset as offset -1, metadata "" and epoch -1,
as Kafka does, and a committed offset with the metadata and epoch committed with it
(null metadata as "").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.kafka import wire
from broker.limits import Limits
from broker.types import OffsetMetadata


class CommitAsked(NamedTuple):
    """One topic's partitions of a commit: what to commit, and those refused at once."""

    offsets: dict[int, int]
    details: dict[int, OffsetMetadata]
    refused: dict[int, int]  # partition: Kafka error


class Committed(NamedTuple):
    """One partition's answer to OffsetFetch."""

    partition: int
    offset: int  # -1: none committed
    metadata: str
    leader_epoch: int
    error: int


def commit_asked(partitions: Any, limits: Limits, *, with_epochs: bool) -> CommitAsked:
    """The partitions of one topic of an OffsetCommit or TxnOffsetCommit request
    (with_epochs: the request's version carries committed_leader_epoch)."""
    asked = CommitAsked({}, {}, {})
    for part in partitions:
        metadata = part.committed_metadata
        if metadata is not None and len(metadata) > limits.offset_metadata_chars_max:
            asked.refused[part.partition_index] = wire.OFFSET_METADATA_TOO_LARGE
            continue
        epoch = part.committed_leader_epoch if with_epochs else -1
        asked.offsets[part.partition_index] = part.committed_offset
        asked.details[part.partition_index] = OffsetMetadata(metadata, epoch)
    return asked


def read_committed(
    reader: Engine, group: str, asked: list[tuple[str, list[int]]] | None, stable: bool = False
) -> list[tuple[str, list[Committed]]]:
    """Per topic, each partition's answer (asked None: every topic the group committed
    offsets of). stable (OffsetFetch's require_stable, KIP-447): a partition whose
    offset an open transaction holds is UNSTABLE_OFFSET_COMMIT, which the client asks
    again after. A BrokerError of the group (its name) is raised."""
    topics = [t.name for t in reader.list_topics()] if asked is None else [n for n, _ in asked]
    partitions = dict(asked) if asked is not None else {}
    answers = []
    for topic in topics:
        try:
            rows = {row.partition: row for row in reader.committed_offsets(group, topic)}
        except BrokerError as error:
            if error.code not in {ErrorCode.UNKNOWN_TOPIC, ErrorCode.INVALID_TOPIC_NAME}:
                raise
            unknown = wire.UNKNOWN_TOPIC_OR_PARTITION
            answers.append(
                (topic, [Committed(p, -1, "", -1, unknown) for p in partitions.get(topic, [])])
            )
            continue
        if asked is None and not rows:
            continue
        wanted = partitions.get(topic, []) if asked is not None else sorted(rows)
        unstable = set(reader.pending_offsets(group, topic)) if stable else set()
        found = []
        for p in wanted:
            row = rows.get(p)
            if p in unstable:
                found.append(Committed(p, -1, "", -1, wire.UNSTABLE_OFFSET_COMMIT))
            elif row is None:
                found.append(Committed(p, -1, "", -1, wire.NONE))
            else:
                metadata = row.metadata or ""
                found.append(Committed(p, row.next_offset, metadata, row.leader_epoch, wire.NONE))
        answers.append((topic, found))
    return answers
