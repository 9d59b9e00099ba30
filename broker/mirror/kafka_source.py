"""A Kafka cluster as the mirror's source: a read_committed consumer that assigns
partitions (it never joins a group), and the cluster's topics, configs and groups."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from broker.errors import BrokerError
from broker.mirror.kafka_cluster import KafkaCluster
from broker.mirror.plan import TopicShape
from broker.mirror.records import MirrorRecord, PartitionEnds


def _mirror_record(message: Any) -> MirrorRecord:
    return MirrorRecord(
        message.topic(),
        message.partition(),
        message.offset(),
        message.timestamp()[1],
        message.key(),
        message.value(),
        tuple(message.headers() or ()),
    )


class KafkaSource:
    def __init__(self, cluster: KafkaCluster, group: str) -> None:
        self.cluster = cluster
        self.name = cluster.url
        self._partitions: dict[str, int] | None = None
        self._consumer = cluster.reader(group)
        self.kafka = cluster.kafka
        self.warnings: list[str] = []

    def _known(self) -> dict[str, int]:
        if self._partitions is None:
            self._partitions = self.cluster.topic_partitions()
        return self._partitions

    def topics(self) -> list[str]:
        return list(self._known())

    def shape(self, topic: str) -> TopicShape:
        """The topic's partitions, cleanup policy and retention. A cluster that does not
        describe configs (no DescribeConfigs permission; librdkafka's mock cluster) gives
        the partitions alone, with a warning: the target then gets fencelog's defaults."""
        admin = importlib.import_module("confluent_kafka.admin")
        resource = admin.ConfigResource("topic", topic)
        try:
            found = self.cluster.wait(
                self.cluster.admin.describe_configs([resource])[resource],
                f"reading the configs of {topic}",
            )
        except BrokerError as error:
            self.warnings.append(
                f"{error.message}; {topic} is created with cleanup.policy delete and no "
                "retention where it is missing"
            )
            return TopicShape(self._known()[topic])

        def limit(name: str) -> int | None:
            entry = found.get(name)
            value = None if entry is None or entry.value is None else int(entry.value)
            return None if value is None or value < 0 else value

        policy = found.get("cleanup.policy")
        cleanup = "compact" if policy is not None and "compact" in str(policy.value) else "delete"
        return TopicShape(
            self._known()[topic], cleanup, limit("retention.ms"), limit("retention.bytes")
        )

    def ends(self, topic: str) -> list[PartitionEnds]:
        return self.cluster.ends(self._consumer, topic, self._known()[topic])

    def assign(self, positions: Mapping[str, Mapping[int, int]]) -> None:
        self._consumer.assign(
            [
                self.kafka.TopicPartition(topic, partition, at)
                for topic, at_partition in positions.items()
                for partition, at in at_partition.items()
            ]
        )

    def pause(self, topic: str, partition: int) -> None:
        self._consumer.pause([self.kafka.TopicPartition(topic, partition)])

    def read(self, max_records: int, wait_ms: int) -> tuple[list[MirrorRecord], dict[str, int]]:
        """Records in order, and the partitions whose end was reached ("topic/p": the
        end offset), which may lie past the last record (a transaction's marker)."""
        try:
            messages = self._consumer.consume(max_records, wait_ms / 1000)
        except self.kafka.KafkaException as exc:
            raise self.cluster.failed("reading", exc) from None
        records, ends = [], {}
        for message in messages:
            error = message.error()
            if error is None:
                records.append(_mirror_record(message))
            elif error.code() == self.kafka.KafkaError._PARTITION_EOF:
                ends[f"{message.topic()}/{message.partition()}"] = message.offset()
            elif error.fatal() or not error.retriable():
                raise self.cluster.failed("reading", self.kafka.KafkaException(error))
        return records, ends

    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]:
        return self.cluster.offsets_between(topic, partition, start, end)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        return self.cluster.committed(group, topic, self._known()[topic])

    def live_groups(self, groups: Sequence[str]) -> list[str]:
        """The groups with members. A cluster that cannot describe groups at all
        (librdkafka's mock cluster) gives a warning: their liveness is not checked."""
        if not groups:
            return []
        futures = self.cluster.admin.describe_consumer_groups(list(groups))
        live = []
        for group, future in futures.items():
            try:
                described = future.result(timeout=self.cluster.timeout_s)
            except self.kafka.KafkaException as exc:
                if exc.args[0].code() != self.kafka.KafkaError._UNSUPPORTED_FEATURE:
                    raise self.cluster.failed(f"describing group {group}", exc) from None
                self.warnings.append(
                    f"the cluster cannot describe consumer groups: whether {group} has live "
                    "members is not checked"
                )
                continue
            except TimeoutError as exc:
                raise self.cluster.failed(f"describing group {group}", exc) from None
            if described.members:
                live.append(group)
        return sorted(live)

    def close(self) -> None:
        with contextlib.suppress(self.kafka.KafkaException, RuntimeError):
            self._consumer.close()
