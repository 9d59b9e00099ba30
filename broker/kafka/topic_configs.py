"""A topic's configs as Kafka names them, over fencelog's TopicConfig: pure, no I/O.

fencelog keeps three of a topic's configs: cleanup.policy, retention.ms and
retention.bytes (schema 010). Kafka tools also expect to see others; fencelog describes
the ones that mean something here, read-only, with the value that holds here (a
tombstone's retention is the broker's, records are stored as sent, one replica...).
`message.format.version` is taken and ignored, as Kafka 3.x does (KIP-724: deprecated,
its value ignored since 3.0): records are always stored as v2 batches.

- described: every config of a topic, each with its value, whether it is read-only,
  its source (DYNAMIC_TOPIC_CONFIG when set on the topic, else DEFAULT_CONFIG) and type.
- altered: a TopicConfig with changes applied (name -> value, None: back to the
  default). An unknown name, a read-only one set to another value, or a value Kafka
  would refuse is ConfigRefused, which the handlers answer INVALID_CONFIG.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple

from broker.limits import Limits
from broker.types import TopicConfig

# Kafka's DescribeConfigs sources and types (org.apache.kafka.common.requests)
DYNAMIC_TOPIC_CONFIG: Final = 1
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
BOOLEAN: Final = 1
STRING: Final = 2
INT: Final = 3
LONG: Final = 5
LIST: Final = 7
NO_LIMIT: Final = "-1"
MESSAGE_FORMAT_VERSION: Final = "3.0-IV1"  # what Kafka 3.x describes, whatever is set
_VERSION: Final = re.compile(r"\d+\.\d+(\.\d+){0,2}(-IV\d+)?")  # 0.10.0, 2.8-IV1, 3.0


class ConfigRefused(Exception):
    """A config change Kafka's INVALID_CONFIG answers; the message says why."""


class Described(NamedTuple):
    name: str
    value: str
    read_only: bool
    source: int
    config_type: int
    documentation: str


class _Config(NamedTuple):
    config_type: int
    read_only: bool
    value: Callable[[TopicConfig, Limits], str]
    default: Callable[[Limits], str]
    documentation: str


def _limit(value: int | None) -> str:
    return NO_LIMIT if value is None else str(value)


def _fixed(text: str) -> Callable[[Limits], str]:
    return lambda limits: text


def _read_only(config_type: int, value: Callable[[Limits], str], doc: str) -> _Config:
    return _Config(config_type, True, lambda config, limits: value(limits), value, doc)


TOPIC_CONFIGS: Final[Mapping[str, _Config]] = {
    "cleanup.policy": _Config(
        LIST,
        False,
        lambda config, limits: config.cleanup,
        _fixed("delete"),
        "delete: retention cuts the front; compact: the newest record of each key stays",
    ),
    "retention.ms": _Config(
        LONG,
        False,
        lambda config, limits: _limit(config.retention_ms),
        _fixed(NO_LIMIT),
        "records older than this are deleted (-1: kept for ever, fencelog's default)",
    ),
    "retention.bytes": _Config(
        LONG,
        False,
        lambda config, limits: _limit(config.retention_bytes),
        _fixed(NO_LIMIT),
        "a partition's oldest records are deleted past this size (-1: no limit)",
    ),
    "delete.retention.ms": _read_only(
        LONG,
        lambda limits: str(limits.tombstone_retention_ms),
        "how long a compacted topic keeps a tombstone (the broker's, for every topic)",
    ),
    "max.message.bytes": _read_only(
        INT,
        lambda limits: str(limits.record_value_bytes_max),
        "the largest record value the broker stores",
    ),
    "compression.type": _read_only(
        STRING, _fixed("producer"), "records are kept as the producer sent them"
    ),
    "message.timestamp.type": _read_only(
        STRING, _fixed("CreateTime"), "a record's timestamp is the producer's"
    ),
    "message.format.version": _Config(
        STRING,
        False,
        lambda config, limits: MESSAGE_FORMAT_VERSION,
        _fixed(MESSAGE_FORMAT_VERSION),
        "deprecated and ignored, as in Kafka 3.x: records are stored as v2 batches",
    ),
    "min.insync.replicas": _read_only(INT, _fixed("1"), "fencelog is one broker"),
    "unclean.leader.election.enable": _read_only(
        BOOLEAN, _fixed("false"), "fencelog is one broker: there is no other leader"
    ),
}
# the values of LIST configs fencelog knows
CLEANUP_POLICIES: Final = frozenset({"delete", "compact"})


def described(config: TopicConfig, limits: Limits, names: list[str] | None) -> list[Described]:
    """The topic's configs (only those named, when names is not None; unknown names are
    left out, as Kafka does)."""
    wanted = TOPIC_CONFIGS if names is None else [n for n in names if n in TOPIC_CONFIGS]
    answers = []
    for name in wanted:
        entry = TOPIC_CONFIGS[name]
        value = entry.value(config, limits)
        source = DEFAULT_CONFIG if value == entry.default(limits) else DYNAMIC_TOPIC_CONFIG
        answers.append(
            Described(name, value, entry.read_only, source, entry.config_type, entry.documentation)
        )
    return answers


def altered(current: TopicConfig, changes: Mapping[str, str | None], limits: Limits) -> TopicConfig:
    """current with changes applied (None: the default); ConfigRefused says why not."""
    retention_ms, retention_bytes, cleanup = (
        current.retention_ms,
        current.retention_bytes,
        current.cleanup,
    )
    for name, value in changes.items():
        entry = TOPIC_CONFIGS.get(name)
        if entry is None:
            raise ConfigRefused(f"{name} is not a topic config fencelog knows")
        text = entry.default(limits) if value is None else value
        if entry.read_only:
            if text != entry.value(current, limits):
                raise ConfigRefused(f"{name} is read-only in fencelog (it is {text!r} here)")
        elif name == "message.format.version":
            if not _VERSION.fullmatch(text):
                raise ConfigRefused(f"{name} is a Kafka version such as 2.8, not {text!r}")
        elif name == "cleanup.policy":
            cleanup = _cleanup(text)
        elif name == "retention.ms":
            retention_ms = _positive_or_none(name, text)
        else:
            retention_bytes = _positive_or_none(name, text)
    return TopicConfig(retention_ms, retention_bytes, cleanup)


def list_values(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _cleanup(text: str) -> str:
    policies = set(list_values(text))
    if not policies or not policies <= CLEANUP_POLICIES:
        raise ConfigRefused(f"cleanup.policy is delete, compact or both, not {text!r}")
    return "compact" if "compact" in policies else "delete"


def _positive_or_none(name: str, text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value == -1:
        return None
    if value <= 0:
        raise ConfigRefused(f"{name} is -1 (no limit) or a positive number, not {text!r}")
    return value


def broker_configs(limits: Limits, default_partitions: int, auto_create: bool) -> list[Described]:
    """The broker's configs Kafka tools look at, all read-only and static."""
    values = {
        "broker.id": ("0", INT),
        "num.partitions": (str(default_partitions), INT),
        "auto.create.topics.enable": (str(auto_create).lower(), BOOLEAN),
        "default.replication.factor": ("1", INT),
        "min.insync.replicas": ("1", INT),
        "offsets.topic.replication.factor": ("1", INT),
        "transaction.state.log.replication.factor": ("1", INT),
        "transaction.max.timeout.ms": (str(limits.txn_timeout_max_ms), INT),
        "message.max.bytes": (str(limits.record_value_bytes_max), INT),
        "socket.request.max.bytes": (str(limits.frame_bytes_max), INT),
    }
    return [
        Described(name, value, True, STATIC_BROKER_CONFIG, config_type, "")
        for name, (value, config_type) in values.items()
    ]


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations


def incremental(
    current: TopicConfig, operations: list[tuple[str, int, str | None]], limits: Limits
) -> dict[str, str | None]:
    """IncrementalAlterConfigs' (name, operation, value) as altered's changes: APPEND
    and SUBTRACT edit a LIST config's current items; ConfigRefused says why not."""
    changes: dict[str, str | None] = {}
    for name, operation, value in operations:
        entry = TOPIC_CONFIGS.get(name)
        if entry is None:
            raise ConfigRefused(f"{name} is not a topic config fencelog knows")
        if operation == SET:
            changes[name] = value
        elif operation == DELETE:
            changes[name] = None
        elif operation in (APPEND, SUBTRACT) and entry.config_type == LIST:
            before = changes.get(name) or entry.value(current, limits)
            items = list_values(before)
            edits = list_values(value or "")
            if operation == APPEND:
                items += [item for item in edits if item not in items]
            else:
                items = [item for item in items if item not in edits]
            changes[name] = ",".join(items)
        else:
            raise ConfigRefused(f"operation {operation} does not apply to {name}")
    return changes
