"""A Kafka-protocol cluster as the mirror reaches it, through confluent-kafka.

confluent-kafka (librdkafka) is the `mirror` extra: without it, a clear error says how
to install it. Every call to the cluster is bounded by the mirror's timeout, and a
failure is one BrokerError: CONNECTION_FAILED when the cluster cannot be reached,
INVALID_ARGUMENT for a setting librdkafka refuses, AUTH_FAILED for a refused SASL
login (the cluster's own last error added). A --kafka-config value (a password) never
appears in a message: librdkafka's own text is redacted first. librdkafka's log goes to
the logger `fencelog.mirror.librdkafka`, not to stderr. Reads are read_committed.
kafka_source.py and kafka_sink.py are the mirror's two uses of a cluster.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import re
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Final

from broker.errors import BrokerError, ErrorCode
from broker.mirror.records import PartitionEnds

LOG: Final = logging.getLogger("fencelog.mirror.librdkafka")
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
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
