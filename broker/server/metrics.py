"""What `serve --http-listen`'s /metrics tells, in Prometheus' text format.

Two kinds of figures:
- counted as requests are answered (requests, errors, latency, records and bytes in and
  out, group commits): plain integers and bucket lists on the event loop, a few
  hundred nanoseconds per request, turned into metric families only when scraped;
- read at scrape time (sessions, owners, transactions, producer ids, partitions' end
  offsets and sizes, consumer-group lag, the database and WAL files): the broker's state,
  read on the reader thread, so a scrape never waits for the writer.

prometheus-client writes the exposition format (and its parser reads it back in the
tests); the names follow its conventions: units in names, `_total` on counters.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from msgspec import Struct

from broker.engine.engine import Engine

if TYPE_CHECKING:  # prometheus-client loads at the first scrape, not with the server
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )

LATENCY_BOUNDS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
GROUP_SIZE_BOUNDS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, metric: HistogramMetricFamily, labels: list[str]) -> None:
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.buckets, strict=True):
            running += count
            cumulative.append((_bound(bound), running))
        metric.add_metric(labels, cumulative, self.total)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


class Metrics:
    """The counters of one server, and its registry."""

    def __init__(self, state: Callable[[], State]) -> None:
        self.requests: dict[str, int] = defaultdict(int)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = {}
        self.records_in: dict[str, int] = defaultdict(int)
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.records_out: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.records_cleaned: dict[str, int] = defaultdict(int)
        self.read_ahead: dict[str, int] = defaultdict(int)  # Kafka fetches', by outcome
        self.group_sizes = _Histogram(tuple(map(float, GROUP_SIZE_BOUNDS)))
        self.group_seconds = _Histogram(LATENCY_BOUNDS_S)
        self.started = time.time()
        self._state = state
        self._registry: CollectorRegistry | None = None

    # counted on the event loop ----------------------------------------------------------

    def answered(self, operation: str, seconds: float, error: str | None) -> None:
        self.requests[operation] += 1
        if error is not None:
            self.errors[(operation, error)] += 1
        histogram = self.latency.get(operation)
        if histogram is None:
            histogram = self.latency[operation] = _Histogram(LATENCY_BOUNDS_S)
        histogram.observe(seconds)

    def produced(self, topic: str, records: int, size: int) -> None:
        self.records_in[topic] += records
        self.bytes_in[topic] += size

    def fetched(self, topic: str, records: int, size: int) -> None:
        self.records_out[topic] += records
        self.bytes_out[topic] += size

    def cleaned(self, topic: str, records: int) -> None:
        self.records_cleaned[topic] += records

    def group_committed(self, requests: int, seconds: float) -> None:
        self.group_sizes.observe(requests)
        self.group_seconds.observe(seconds)

    def exposition(self) -> bytes:
        """The text a scrape gets (run it on the reader thread: it reads the state)."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Collector(self))
        return bytes(generate_latest(self._registry))

    def state(self) -> State:
        return self._state()


class State(Struct, frozen=True):
    """The broker's state at a scrape."""

    sessions: int
    kafka_connections: int
    engine: Engine  # the reader: what a scrape reads of the broker


class _Collector:
    """A prometheus-client collector (it needs only collect())."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            HistogramMetricFamily,
        )

        m = self.metrics
        yield _counter(
            "fencelog_requests",
            "Requests answered, by operation.",
            ["operation"],
            (((k,), v) for k, v in m.requests.items()),
        )
        yield _counter(
            "fencelog_request_errors",
            "Requests answered with an error, by operation and code.",
            ["operation", "code"],
            (((op, code), v) for (op, code), v in m.errors.items()),
        )
        latency = HistogramMetricFamily(
            "fencelog_request_duration_seconds",
            "Time from reading a request to its answer being ready, by operation.",
            labels=["operation"],
        )
        for operation, histogram in m.latency.items():
            histogram.family(latency, [operation])
        yield latency
        for name, values, text in (
            ("fencelog_records_in", m.records_in, "Records appended, by topic."),
            ("fencelog_bytes_in", m.bytes_in, "Value bytes appended, by topic."),
            ("fencelog_records_out", m.records_out, "Records fetched, by topic."),
            ("fencelog_bytes_out", m.bytes_out, "Value bytes fetched, by topic."),
            (
                "fencelog_records_cleaned",
                m.records_cleaned,
                "Records retention or compaction deleted.",
            ),
        ):
            yield _counter(name, text, ["topic"], (((k,), v) for k, v in values.items()))
        yield _counter(
            "fencelog_kafka_fetch_read_ahead",
            "Kafka fetches read before they were asked for (a consumer catching up), by "
            "what became of the read: used, stale (a topic it read deleted or created "
            "again since), failed, dropped (the next fetch asked for other offsets).",
            ["outcome"],
            (((k,), v) for k, v in m.read_ahead.items()),
        )
        sizes = HistogramMetricFamily(
            "fencelog_group_commit_requests", "Produce requests per group commit."
        )
        if m.group_sizes.buckets:
            m.group_sizes.family(sizes, [])
        yield sizes
        seconds = HistogramMetricFamily(
            "fencelog_group_commit_duration_seconds", "Time one group commit took."
        )
        if m.group_seconds.buckets:
            m.group_seconds.family(seconds, [])
        yield seconds
        yield from _state_families(m.state(), m.started)


def _counter(
    name: str, text: str, labels: list[str], values: Iterable[tuple[tuple[str, ...], int]]
) -> CounterMetricFamily:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, text, labels=labels)
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, text, value=value)


def _state_families(state: State, started: float) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    engine = state.engine
    status = engine.status()
    yield _gauge("fencelog_start_time_seconds", "When this server started (Unix time).", started)
    yield _gauge("fencelog_sessions", "Native sessions connected.", state.sessions)
    yield _gauge("fencelog_kafka_connections", "Kafka clients connected.", state.kafka_connections)
    yield _gauge("fencelog_database_bytes", "Size of fencelog.db.", status.database_bytes)
    yield _gauge("fencelog_wal_bytes", "Size of fencelog.db-wal.", status.wal_bytes)
    yield _gauge(
        "fencelog_producer_ids", "Producer ids the producer table holds.", status.producer_ids
    )
    evicted = CounterMetricFamily(
        "fencelog_producer_id_evictions", "Producer ids evicted from the producer table."
    )
    evicted.add_metric([], status.producer_evictions)
    yield evicted
    end = GaugeMetricFamily(
        "fencelog_partition_end_offset", "A partition's end offset.", labels=["topic", "partition"]
    )
    start = GaugeMetricFamily(
        "fencelog_partition_start_offset",
        "A partition's log start offset (retention deleted the records below it).",
        labels=["topic", "partition"],
    )
    size = GaugeMetricFamily(
        "fencelog_partition_log_bytes",
        "Key and value bytes in a partition's log.",
        labels=["topic", "partition"],
    )
    for topic in status.topics:
        for part in topic.partition_details:
            end.add_metric([topic.name, str(part.partition)], part.end_offset)
            start.add_metric([topic.name, str(part.partition)], part.start_offset)
            size.add_metric([topic.name, str(part.partition)], part.bytes)
    yield end
    yield start
    yield size
    owners = GaugeMetricFamily(
        "fencelog_owned_resources", "Resources held by a live owner, by group.", labels=["group"]
    )
    held: dict[str, int] = defaultdict(int)
    for holding in engine.owners.holdings(None):
        if holding.holder_live:
            held[holding.group] += 1
    for group, count in sorted(held.items()):
        owners.add_metric([group], count)
    yield owners
    txns = GaugeMetricFamily(
        "fencelog_transactions", "Transactions not yet ended, by state.", labels=["state"]
    )
    states: dict[str, int] = {"open": 0, "prepared": 0}
    for info in engine.txn_list(False, 100_000):
        states[info.state] = states.get(info.state, 0) + 1
    for name, count in sorted(states.items()):
        txns.add_metric([name], count)
    yield txns
    lag = GaugeMetricFamily(
        "fencelog_consumer_group_lag",
        "End offset minus the group's committed offset.",
        labels=["group", "topic", "partition"],
    )
    ends = {
        (topic.name, part.partition): part.end_offset
        for topic in status.topics
        for part in topic.partition_details
    }
    for committed in engine.consumer_groups():
        end_offset = ends.get((committed.topic, committed.partition))
        if end_offset is not None:
            behind = max(0, end_offset - committed.next_offset)
            lag.add_metric([committed.group, committed.topic, str(committed.partition)], behind)
    yield lag
