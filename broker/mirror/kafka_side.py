"""A Kafka-protocol cluster as the mirror's source or sink, through confluent-kafka.

confluent-kafka (librdkafka) is the `mirror` extra: without it, a clear error says how
to install it. Every call to the cluster is bounded by the mirror's timeout, and a
failure is one BrokerError: CONNECTION_FAILED when the cluster cannot be reached,
INVALID_ARGUMENT for a setting librdkafka refuses, AUTH_FAILED for a refused SASL
login (the cluster's own words added). A --kafka-config value (a password)
never appears in a message: librdkafka's own text is redacted first. librdkafka's log
goes to the logger `fencelog.mirror.librdkafka`, not to stderr.

As a sink, each batch is one Kafka transaction (transactional.id = the mirror's group)
with the mirror's next source offsets committed in it for that group
(send_offsets_to_transaction); init_transactions at start fences a killed mirror's
producer and aborts what it left open. Reads are read_committed.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final

from broker.errors import BrokerError, ErrorCode
from broker.mirror.failpoints import from_environment
from broker.mirror.plan import TopicShape
from broker.mirror.records import MirrorRecord, PartitionEnds

LOG: Final = logging.getLogger("fencelog.mirror.librdkafka")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
OFFSET_NONE: Final = -1001  # librdkafka's OFFSET_INVALID: no committed offset
PRODUCE_QUEUE_WAIT_S: Final = 0.1
ERRORS_KEPT_MAX: Final = 16  # the cluster's latest errors (error_cb), for a failure's message


def confluent() -> ModuleType:
    """confluent_kafka, or a clear error where it is not installed."""
    try:
        return importlib.import_module("confluent_kafka")
    except ImportError as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"fencelog mirror needs confluent-kafka, which this Python cannot import ({exc})",
            hint="install fencelog's mirror extra: pip install 'fencelog[mirror]'",
        ) from exc


class KafkaCluster:
    """One cluster: its address, the user's librdkafka settings and the timeout."""

    def __init__(
        self, url: str, servers: str, settings: Mapping[str, str], timeout_s: float
    ) -> None:
        self.url = url
        self.errors: collections.deque[Any] = collections.deque(maxlen=ERRORS_KEPT_MAX)
        self.settings = {
            "bootstrap.servers": servers,
            **settings,
            "logger": LOG,
            "error_cb": self.errors.append,
        }
        self.secrets = [value for value in settings.values() if value]
        self.timeout_s = timeout_s
        self.kafka = confluent()
        self.admin = self.client("AdminClient", {})

    def client(self, kind: str, extra: Mapping[str, Any]) -> Any:
        """A confluent-kafka client of this cluster; a refused setting is one error."""
        module = importlib.import_module("confluent_kafka.admin") if kind == "AdminClient" else None
        factory = getattr(module or self.kafka, kind)
        try:
            return factory({**self.settings, **extra})
        except (self.kafka.KafkaException, ValueError, TypeError) as exc:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"librdkafka refused the settings: {self.redact(exc)}",
                hint="--kafka-config takes librdkafka's names (CONFIGURATION.md)",
            ) from None

    def redact(self, exc: BaseException | str) -> str:
        """librdkafka's own words for exc, with every --kafka-config value masked
        (where it stands alone, not inside another word)."""
        error = exc.args[0] if isinstance(exc, BaseException) and exc.args else None
        text = str(error.str()) if error is not None and hasattr(error, "str") else str(exc)
        for secret in self.secrets:
            text = re.sub(rf"(?<![\w.-]){re.escape(secret)}(?![\w.-])", "***", text)
        return text

    def failed(self, what: str, exc: BaseException) -> BrokerError:
        """CONNECTION_FAILED, with the cluster's last error when it says more (a SASL
        login refused, a TLS handshake failed), which librdkafka reports apart."""
        with contextlib.suppress(Exception):
            self.admin.poll(0)  # delivers the error callbacks queued meanwhile
        message = f"{what} on the Kafka cluster {self.url} failed: {self.redact(exc)}"
        cause = self.errors[-1] if self.errors else None
        refused_login = cause is not None and cause.code() == self.kafka.KafkaError._AUTHENTICATION
        if cause is not None and str(cause.str()) not in message:
            message += f"; the cluster's last error: {self.redact(str(cause.str()))}"
        return BrokerError(
            ErrorCode.AUTH_FAILED if refused_login else ErrorCode.CONNECTION_FAILED,
            message,
            hint="check --to/--from, the cluster, and --kafka-config (TLS, SASL)",
        )

    def topic_partitions(self) -> dict[str, int]:
        """Every topic and its partition count (a Metadata request that creates nothing)."""
        try:
            metadata = self.admin.list_topics(timeout=self.timeout_s)
        except self.kafka.KafkaException as exc:
            raise self.failed("reading the topics", exc) from None
        return {name: len(topic.partitions) for name, topic in metadata.topics.items()}

    def wait(self, future: Any, what: str) -> Any:
        try:
            return future.result(timeout=self.timeout_s)
        except self.kafka.KafkaException as exc:
            raise self.failed(what, exc) from None
        except TimeoutError:
            raise self.failed(what, TimeoutError(f"no answer in {self.timeout_s:g} s")) from None

    def reader(self, group: str) -> Any:
        return self.client(
            "Consumer",
            {
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            },
        )

    def ends(self, consumer: Any, topic: str, partitions: int) -> list[PartitionEnds]:
        ends = []
        for partition in range(partitions):
            where = self.kafka.TopicPartition(topic, partition)
            try:
                low, high = consumer.get_watermark_offsets(where, timeout=self.timeout_s)
            except self.kafka.KafkaException as exc:
                raise self.failed(f"reading the offsets of {topic}/{partition}", exc) from None
            ends.append(PartitionEnds(low, high))
        return ends

    def offsets_between(self, topic: str, partition: int, start: int, end: int) -> list[int]:
        """The offsets of the records in [start, end) (read_committed: no markers)."""
        if start >= end:
            return []
        consumer = self.reader(f"fencelog-mirror-scan.{topic}")
        try:
            consumer.assign([self.kafka.TopicPartition(topic, partition, start)])
            offsets: list[int] = []
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error() is not None:
                    if message.error().code() == self.kafka.KafkaError._PARTITION_EOF:
                        return offsets
                    raise self.failed(f"reading {topic}/{partition}", message.error())
                if message.offset() >= end:
                    return offsets
                offsets.append(message.offset())
                deadline = time.monotonic() + self.timeout_s
            raise self.failed(f"reading {topic}/{partition}", TimeoutError("no end reached"))
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        consumer = self.client("Consumer", {"group.id": group, "enable.auto.commit": False})
        try:
            wanted = [self.kafka.TopicPartition(topic, p) for p in range(partitions)]
            found = consumer.committed(wanted, timeout=self.timeout_s)
        except self.kafka.KafkaException as exc:
            raise self.failed(f"reading group {group}'s offsets", exc) from None
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def commit_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        consumer = self.client("Consumer", {"group.id": group, "enable.auto.commit": False})
        try:
            consumer.commit(
                offsets=[self.kafka.TopicPartition(topic, p, at) for p, at in offsets.items()],
                asynchronous=False,
            )
        except self.kafka.KafkaException as exc:
            raise self.failed(f"committing group {group}'s offsets", exc) from None
        finally:
            consumer.close()


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
