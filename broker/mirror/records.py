"""The one record shape the mirror moves, and what a source and a sink must do.

A record keeps its partition, timestamp, key, value and headers; its offset is the
source's (the target gives its own). A value or header value None is Kafka's null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from broker.mirror.plan import TopicShape


class MirrorRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class PartitionEnds(NamedTuple):
    """A partition's log start and end (next offset) as a source or target sees it."""

    start: int
    end: int


class Source(Protocol):
    """Where records come from; `warnings` collects what the caller should be told."""

    name: str
    warnings: list[str]

    def topics(self) -> list[str]: ...
    def shape(self, topic: str) -> TopicShape: ...
    def ends(self, topic: str) -> list[PartitionEnds]: ...
    def assign(self, positions: Mapping[str, Mapping[int, int]]) -> None: ...
    def pause(self, topic: str, partition: int) -> None: ...
    def read(self, max_records: int, wait_ms: int) -> tuple[list[MirrorRecord], dict[str, int]]: ...
    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]: ...
    def committed(self, group: str, topic: str) -> dict[int, int]: ...
    def live_groups(self, groups: Sequence[str]) -> list[str]: ...
    def close(self) -> None: ...


class Sink(Protocol):
    """Where records go, each batch in one transaction with the mirror's position."""

    name: str

    def partitions(self, topic: str) -> int | None: ...
    def create(self, topic: str, shape: TopicShape) -> None: ...
    def begin(self) -> None: ...
    def positions(self, topic: str, partitions: int) -> dict[int, int]: ...
    def write(
        self, records: Sequence[MirrorRecord], positions: Mapping[str, Mapping[int, int]]
    ) -> None: ...
    def ends(self, topic: str) -> list[PartitionEnds]: ...
    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]: ...
    def commit_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> None: ...
    def close(self) -> None: ...
