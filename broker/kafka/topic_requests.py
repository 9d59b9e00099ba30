"""What a CreateTopics request asks for, decided as Kafka decides it, without I/O.

- Partitions: num_partitions (-1: the listener's default), or, when the request gives
  explicit replica assignments, one partition per assignment. Kafka's rules for those:
  num_partitions and replication_factor are then -1 (INVALID_REQUEST otherwise), the
  partition indexes are 0..n-1 and each lists existing brokers once
  (INVALID_REPLICA_ASSIGNMENT otherwise): here, broker 0 alone.
- Replication: one broker, so the replication factor is 1 (or -1, the default).
- Configs: a name Kafka's topics do not have is INVALID_CONFIG, as Kafka answers it. The
  ones fencelog keeps (cleanup.policy, retention.ms, retention.bytes) are applied and
  their values checked; Kafka's others are accepted and have no effect here (segments,
  replicas, message formats...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from broker.errors import BrokerError, ErrorCode
from broker.kafka import wire
from broker.types import TopicConfig

NODE_ID: Final = 0  # the one broker
DEFAULT: Final = -1  # num_partitions or replication_factor left to the broker

# what CreateTopics applies
KAFKA_TOPIC_CONFIGS: Final = ("cleanup.policy", "retention.ms", "retention.bytes")
# every topic config Kafka (4.0) knows (org.apache.kafka.common.config.TopicConfig)
KAFKA_TOPIC_CONFIG_NAMES: Final = frozenset(
    {
        *KAFKA_TOPIC_CONFIGS,
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    }
)


class Refused(Exception):
    """A topic CreateTopics cannot create as asked; `code` is the Kafka error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def partitions_asked(
    topic: str,
    num_partitions: int,
    replication_factor: int,
    assignments: Sequence[tuple[int, Sequence[int]]],
    default_partitions: int,
) -> int:
    """The partitions a CreateTopics topic asks for (assignments: (partition index,
    broker ids) each); Refused when the request cannot be met."""
    if not assignments:
        if replication_factor not in (DEFAULT, 1):
            raise Refused(
                wire.INVALID_REPLICATION_FACTOR,
                f"fencelog is one broker: the replication factor is 1, not {replication_factor}",
            )
        return default_partitions if num_partitions == DEFAULT else num_partitions
    if num_partitions != DEFAULT or replication_factor != DEFAULT:
        raise Refused(
            wire.INVALID_REQUEST,
            f"topic {topic}: replica assignments are given with num_partitions and "
            "replication_factor -1, not beside them",
        )
    indexes = sorted(index for index, _ in assignments)
    if indexes != list(range(len(assignments))):
        raise Refused(
            wire.INVALID_REPLICA_ASSIGNMENT,
            f"topic {topic}: replica assignments name partitions {indexes}, not 0 to "
            f"{len(assignments) - 1} each once",
        )
    for index, brokers in assignments:
        if list(brokers) != [NODE_ID]:
            raise Refused(
                wire.INVALID_REPLICA_ASSIGNMENT,
                f"topic {topic}: partition {index} is assigned to brokers {list(brokers)}; "
                f"fencelog is one broker, {NODE_ID}",
            )
    return len(assignments)


def topic_config(topic: str, configs: Mapping[str, str | None]) -> TopicConfig | None:
    """CreateTopics' configs as fencelog's TopicConfig (None: none of them given); a
    name Kafka does not know, or a value that is not Kafka's, is INVALID_ARGUMENT,
    answered INVALID_CONFIG."""
    unknown = sorted(set(configs) - KAFKA_TOPIC_CONFIG_NAMES)
    if unknown:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"topic {topic}: unknown topic config {', '.join(unknown)}",
        )
    if not any(name in configs for name in KAFKA_TOPIC_CONFIGS):
        return None

    def limit(name: str) -> int | None:
        text = configs.get(name)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            value = -2
        if value == -1:
            return None  # Kafka's "no limit"
        if value <= 0:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"topic {topic}: {name} is -1 (no limit) or a positive number, not {text!r}",
            )
        return value

    policies = {p.strip() for p in (configs.get("cleanup.policy") or "delete").split(",")}
    if not policies <= {"delete", "compact"}:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"topic {topic}: cleanup.policy is delete, compact or both, not "
            f"{configs.get('cleanup.policy')!r}",
        )
    cleanup = "compact" if "compact" in policies else "delete"
    return TopicConfig(limit("retention.ms"), limit("retention.bytes"), cleanup)
