"""The mirror for Python callers (and `fencelog mirror`):

    from broker.client import connect
    from broker.mirror import mirror_to_kafka, mirror_from_kafka

    with connect("tcp://127.0.0.1:7420") as client:
        summary = mirror_to_kafka(client, "kafka://kafka-1:9092", ["orders"], once=True)
        print(summary.records, "records copied")

Both copy exactly once and resume where a previous run of the same group stopped:
see broker/mirror/run.py for the order of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.client.client import Client
from broker.errors import BrokerError, ErrorCode
from broker.mirror.fencelog_side import FencelogSink, FencelogSource
from broker.mirror.kafka_cluster import KafkaCluster
from broker.mirror.kafka_sink import KafkaSink
from broker.mirror.kafka_source import KafkaSource
from broker.mirror.plan import cluster_servers, default_group, kafka_settings
from broker.mirror.records import Sink, Source
from broker.mirror.run import Event, MirrorOptions, MirrorSummary, run

DEFAULT_TIMEOUT_S = 10.0
BATCH_RECORDS_MAX = 100_000


def mirror_to_kafka(
    client: Client,
    cluster: str,
    topics: str | Sequence[str],
    **options: Any,
) -> MirrorSummary:
    """Copy the client's topics (names or regular expressions) into the Kafka cluster
    (kafka://HOST:PORT[,...]). Keyword options: see mirror()."""
    return mirror(client, cluster, topics, into_kafka=True, **options)


def mirror_from_kafka(
    client: Client,
    cluster: str,
    topics: str | Sequence[str],
    **options: Any,
) -> MirrorSummary:
    """Copy the Kafka cluster's topics into the client's broker. Options: see mirror()."""
    return mirror(client, cluster, topics, into_kafka=False, **options)


def mirror(
    client: Client,
    cluster: str,
    topics: str | Sequence[str],
    *,
    into_kafka: bool,
    group: str | None = None,
    once: bool = True,
    groups: Sequence[str] = (),
    kafka_config: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_records: int = 1000,
    should_stop: Callable[[], bool] = lambda: False,
    on_event: Callable[[Event], None] = lambda _event: None,
) -> MirrorSummary:
    """Copy topics between the client's broker and a Kafka cluster, exactly once.

    group: where the mirror keeps its position on the target (default: derived from
    topics). once: stop at the source's end offsets as they are now; otherwise follow
    until should_stop() is true. groups: consumer groups of the source whose committed
    offsets are translated to the target's once the copy ends. kafka_config:
    librdkafka settings (TLS, SASL). on_event gets each step as a dict."""
    if isinstance(topics, str):
        topics = [topics]  # one name or pattern, not its characters
    if not topics:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "name at least one topic to mirror")
    if not 1 <= batch_records <= BATCH_RECORDS_MAX:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"batch_records must be 1 to {BATCH_RECORDS_MAX}, not {batch_records}",
        )
    if timeout_s <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "the Kafka timeout must be positive")
    settings = kafka_settings(
        (f"{key}=", f"{key}={value}") for key, value in (kafka_config or {}).items()
    )
    kafka = KafkaCluster(cluster, cluster_servers(cluster), settings, timeout_s)
    name = group or default_group(topics)
    source: Source
    sink: Sink
    if into_kafka:
        source, sink = FencelogSource(client), KafkaSink(kafka, name)
    else:
        source, sink = KafkaSource(kafka, name), FencelogSink(client, name)
    options = MirrorOptions(tuple(topics), name, once, tuple(groups), batch_records)
    try:
        return run(source, sink, options, should_stop=should_stop, on_event=on_event)
    finally:
        source.close()
        sink.close()
