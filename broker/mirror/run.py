"""The copy loop: a source, a sink, and the mirror's position between them.

Order of a run, each step before anything of the next is done:
1. the topics the --topic values select on the source (UNKNOWN_TOPIC if none);
2. the --groups to translate must have no live members on the source (GROUP_NOT_EMPTY);
3. every target topic checked (fewer partitions: refused), then the missing ones
   created with the source's partitions, cleanup policy and retention;
4. the sink begins: a killed mirror's open transaction is aborted, its producer fenced;
5. the position: the offsets the sink committed for the mirror's group, else each
   partition's log start; with once, the source's end offsets now are where it stops;
6. batches: read, written with the next positions in one transaction of the sink;
7. with --groups, once the copy ends (once, or stopped by the caller), each group's
   committed source offsets translated to the target's (plan.translated_offset).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from broker.errors import BrokerError, ErrorCode
from broker.mirror.plan import TopicShape, check_target, select_topics, start_positions
from broker.mirror.plan import translated_offset as translated
from broker.mirror.records import MirrorRecord, Sink, Source

Event = dict[str, Any]
Positions = dict[str, dict[int, int]]


class MirrorOptions(NamedTuple):
    topics: tuple[str, ...]
    group: str
    once: bool = False
    groups: tuple[str, ...] = ()
    batch_records: int = 1000
    wait_ms: int = 500


class MirrorSummary(NamedTuple):
    records: int
    per_topic: dict[str, int]
    created: list[str]
    groups: list[Event]
    stopped: bool


def run(
    source: Source,
    sink: Sink,
    options: MirrorOptions,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_event: Callable[[Event], None] = lambda _event: None,
) -> MirrorSummary:
    topics = select_topics(options.topics, source.topics(), source.name)
    _check_groups(source, options.groups)
    shapes = {topic: source.shape(topic) for topic in topics}
    for warning in source.warnings:
        on_event({"event": "warning", "message": warning})
    created = _prepare_targets(sink, shapes, on_event)
    sink.begin()
    positions, stops = _positions(source, sink, shapes, options.once)
    copy = _Copy(source, sink, options, positions, stops, on_event)
    stopped = copy.until_done(should_stop)
    groups = [
        translation
        for group in options.groups
        for topic in topics
        for translation in [_translate(source, sink, group, topic, positions[topic])]
        if translation["offsets"]
    ]
    for translation in groups:
        on_event(translation)
    return MirrorSummary(copy.total, copy.per_topic, created, groups, stopped)


def _check_groups(source: Source, groups: Sequence[str]) -> None:
    live = source.live_groups(groups)
    if live:
        raise BrokerError(
            ErrorCode.GROUP_NOT_EMPTY,
            f"consumer group {', '.join(live)} has live members on the source "
            f"({source.name}); its offsets would move on after they were translated",
            group=live[0],
            hint="stop its consumers (or wait for them to leave), then run the mirror again",
        )


def _prepare_targets(
    sink: Sink, shapes: Mapping[str, TopicShape], on_event: Callable[[Event], None]
) -> list[str]:
    missing = [
        topic
        for topic, shape in shapes.items()
        if check_target(topic, shape, sink.partitions(topic))
    ]
    for topic in missing:
        shape = shapes[topic]
        sink.create(topic, shape)
        on_event({"event": "created", "topic": topic, "partitions": shape.partitions})
    return missing


def _positions(
    source: Source, sink: Sink, shapes: Mapping[str, TopicShape], once: bool
) -> tuple[Positions, Positions | None]:
    positions: Positions = {}
    stops: Positions = {}
    for topic, shape in shapes.items():
        ends = source.ends(topic)
        committed = sink.positions(topic, shape.partitions)
        positions[topic] = start_positions(
            committed, [e.start for e in ends], [e.end for e in ends]
        )
        stops[topic] = {partition: e.end for partition, e in enumerate(ends)}
    return positions, stops if once else None


class _Copy:
    """Batches from the source into the sink, each with the positions after it."""

    def __init__(
        self,
        source: Source,
        sink: Sink,
        options: MirrorOptions,
        positions: Positions,
        stops: Positions | None,
        on_event: Callable[[Event], None],
    ) -> None:
        self.source, self.sink, self.options = source, sink, options
        self.positions, self.stops, self.on_event = positions, stops, on_event
        self.total = 0
        self.per_topic = dict.fromkeys(positions, 0)
        self.active = {
            (topic, partition)
            for topic, at in positions.items()
            for partition, offset in at.items()
            if stops is None or offset < stops[topic][partition]
        }

    def until_done(self, should_stop: Callable[[], bool]) -> bool:
        """Copies until the stops are reached (once), or until should_stop(): True then."""
        self.source.assign(
            {
                t: {p: at for p, at in self.positions[t].items() if (t, p) in self.active}
                for t in self.positions
            }
        )
        while self.active or self.stops is None:
            if should_stop():
                return True
            records, ends = self.source.read(self.options.batch_records, self.options.wait_ms)
            wanted = [r for r in records if self._wanted(r)]
            if wanted:
                self._write(wanted)
            self._reached(ends)  # after the records: an end comes after its partition's
        return False

    def _wanted(self, record: MirrorRecord) -> bool:
        where = (record.topic, record.partition)
        if where not in self.active:
            return False
        if self.stops is not None and record.offset >= self.stops[record.topic][record.partition]:
            self._done(*where)
            return False
        return True

    def _reached(self, ends: Mapping[str, int]) -> None:
        """A partition's readable end, which may lie past its last record (markers) or
        before the end offset seen at the start (a Kafka transaction open then: its
        records come with the next run). With once, the partition is done either way."""
        for where, end in ends.items():
            topic, _, partition_text = where.rpartition("/")
            partition = int(partition_text)
            at = self.positions[topic]
            at[partition] = max(at[partition], end)
            if self.stops is not None:
                self._done(topic, partition)

    def _write(self, records: list[MirrorRecord]) -> None:
        moved: Positions = {}
        for record in records:
            moved.setdefault(record.topic, {})[record.partition] = record.offset + 1
        self.sink.write(records, moved)
        for topic, at in moved.items():
            self.positions[topic].update(at)
            for partition, offset in at.items():
                if self.stops is not None and offset >= self.stops[topic][partition]:
                    self._done(topic, partition)
        for record in records:
            self.per_topic[record.topic] += 1
        self.total += len(records)
        self.on_event({"event": "copied", "records": len(records), "total": self.total})

    def _done(self, topic: str, partition: int) -> None:
        if (topic, partition) in self.active:
            self.active.discard((topic, partition))
            self.source.pause(topic, partition)


def _translate(
    source: Source, sink: Sink, group: str, topic: str, positions: Mapping[int, int]
) -> Event:
    """One group's offsets on one topic, translated: {partition: {source, target}}."""
    committed = source.committed(group, topic)
    source_ends = source.ends(topic)
    target_ends = sink.ends(topic)
    offsets: dict[int, dict[str, int]] = {}
    ahead: list[int] = []
    for partition, at in sorted(committed.items()):
        if partition >= len(source_ends):
            continue
        position = positions[partition]
        if at > position:
            ahead.append(partition)  # read past what is copied yet: left as it is
            continue
        start = max(at, source_ends[partition].start)
        after = len(source.offsets_between(topic, partition, start, position))
        tail = _tail(
            sink, topic, partition, after, target_ends[partition].start, target_ends[partition].end
        )
        offsets[partition] = {
            "source": at,
            "target": translated(tail, after, target_ends[partition].end),
        }
    if offsets:
        sink.commit_group(group, topic, {p: o["target"] for p, o in offsets.items()})
    return {"event": "group", "group": group, "topic": topic, "offsets": offsets, "ahead": ahead}


def _tail(sink: Sink, topic: str, partition: int, count: int, start: int, end: int) -> list[int]:
    """The offsets of the target partition's last `count` records (or all it has)."""
    if count == 0:
        return []
    low = max(start, end - count)
    while True:
        offsets = sink.offsets_between(topic, partition, low, end)
        if len(offsets) >= count:
            return offsets
        if low <= start:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{topic}/{partition} on the target has {len(offsets)} records where the "
                f"mirror copied {count}: its offsets cannot be translated",
                topic=topic,
                partition=partition,
                hint="was the target topic written by something else, or cleaned?",
            )
        low = max(start, end - 2 * (end - low))
