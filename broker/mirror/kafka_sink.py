"""A Kafka cluster as the mirror's sink, exactly once.

Each batch is one Kafka transaction (transactional.id = the mirror's group) with the
mirror's next source offsets committed in it for that group (send_offsets_to_transaction);
init_transactions at start fences an older mirror's producer and aborts what it left
open. A mirror fenced by a newer one of its group is PRODUCER_FENCED.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from broker.errors import BrokerError, ErrorCode
from broker.mirror.failpoints import from_environment
from broker.mirror.kafka_cluster import KafkaCluster
from broker.mirror.plan import TopicShape
from broker.mirror.records import MirrorRecord, PartitionEnds

PRODUCE_QUEUE_WAIT_S: Final = 0.1  # a full local queue: how long deliveries may drain it


class KafkaSink:
    def __init__(self, cluster: KafkaCluster, group: str) -> None:
        self.cluster = cluster
        self.name = cluster.url
        self.group = group
        self.kafka = cluster.kafka
        self._producer: Any = None
        self._reader = cluster.reader(group)
        self.failpoints = from_environment()

    def partitions(self, topic: str) -> int | None:
        return self.cluster.topic_partitions().get(topic)

    def create(self, topic: str, shape: TopicShape) -> None:
        admin = importlib.import_module("confluent_kafka.admin")
        config = {"cleanup.policy": shape.cleanup}
        config["retention.ms"] = str(-1 if shape.retention_ms is None else shape.retention_ms)
        retention_bytes = -1 if shape.retention_bytes is None else shape.retention_bytes
        config["retention.bytes"] = str(retention_bytes)
        new = admin.NewTopic(topic, shape.partitions, replication_factor=-1, config=config)
        self.cluster.wait(self.cluster.admin.create_topics([new])[topic], f"creating {topic}")
        deadline = time.monotonic() + self.cluster.timeout_s
        while self.partitions(topic) != shape.partitions and time.monotonic() < deadline:
            time.sleep(0.05)

    def begin(self) -> None:
        """The transactional producer: fences a killed mirror's, aborts its transaction."""
        self._producer = self.cluster.client(
            "Producer",
            {"transactional.id": self.group, "enable.idempotence": True},
        )
        try:
            self._producer.init_transactions(self.cluster.timeout_s)
        except self.kafka.KafkaException as exc:
            raise self.cluster.failed("starting the mirror's transactions", exc) from None

    def positions(self, topic: str, partitions: int) -> dict[int, int]:
        return self.cluster.committed(self.group, topic, partitions)

    def write(
        self, records: Sequence[MirrorRecord], positions: Mapping[str, Mapping[int, int]]
    ) -> None:
        producer = self._producer
        assert producer is not None, "begin() first"
        try:
            producer.begin_transaction()
            for record in records:
                self._produce(record)
            producer.flush(self.cluster.timeout_s)
            self.failpoints.reached("written")
            offsets = [
                self.kafka.TopicPartition(topic, partition, at)
                for topic, at_partition in positions.items()
                for partition, at in at_partition.items()
            ]
            metadata = self._reader.consumer_group_metadata()
            producer.send_offsets_to_transaction(offsets, metadata, self.cluster.timeout_s)
            self.failpoints.reached("positioned")
            producer.commit_transaction(self.cluster.timeout_s)
            self.failpoints.reached("committed")
        except self.kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if error is not None and error.code() in self._fenced_codes():
                raise BrokerError(
                    ErrorCode.PRODUCER_FENCED,
                    f"another mirror of group {self.group} took over on {self.name} "
                    f"(its transactional id fenced this one): {self.cluster.redact(exc)}",
                    hint="run one mirror per group; this one stopped where its last "
                    "transaction committed",
                ) from None
            self._abort(exc)
            raise self.cluster.failed("a transaction", exc) from None

    def _fenced_codes(self) -> set[int]:
        codes = self.kafka.KafkaError
        return {codes._FENCED, codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH}

    def _produce(self, record: MirrorRecord) -> None:
        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    timestamp=record.timestamp_ms,
                    headers=list(record.headers) or None,
                )
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(PRODUCE_QUEUE_WAIT_S)

    def _abort(self, exc: BaseException) -> None:
        error = exc.args[0] if exc.args else None
        if (
            error is not None
            and hasattr(error, "txn_requires_abort")
            and error.txn_requires_abort()
        ):
            try:
                self._producer.abort_transaction(self.cluster.timeout_s)
            except self.kafka.KafkaException:
                return  # a start's init_transactions aborts it

    def ends(self, topic: str) -> list[PartitionEnds]:
        partitions = self.partitions(topic) or 0
        return self.cluster.ends(self._reader, topic, partitions)

    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]:
        return self.cluster.offsets_between(topic, partition, start, end)

    def commit_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        self.cluster.commit_group(group, topic, offsets)

    def close(self) -> None:
        """Never raises: a close after a failure must not hide the failure (a fenced
        producer's flush raises its fatal error again)."""
        with contextlib.suppress(self.kafka.KafkaException, RuntimeError):
            if self._producer is not None:
                self._producer.flush(self.cluster.timeout_s)
        with contextlib.suppress(self.kafka.KafkaException, RuntimeError):
            self._reader.close()
