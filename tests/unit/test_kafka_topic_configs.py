"""broker/kafka/topic_configs.py: a topic's configs as Kafka names them, described with
their sources and altered (set, deleted, appended, subtracted), bad ones refused."""

from __future__ import annotations

import pytest

from broker.kafka.topic_configs import (
    APPEND,
    DEFAULT_CONFIG,
    DELETE,
    DYNAMIC_TOPIC_CONFIG,
    SET,
    SUBTRACT,
    ConfigRefused,
    altered,
    described,
    incremental,
)
from broker.limits import DEFAULT_LIMITS
from broker.types import TopicConfig


def test_described_with_values_and_sources() -> None:
    found = {c.name: c for c in described(TopicConfig(retention_ms=5_000), DEFAULT_LIMITS, None)}
    assert (found["retention.ms"].value, found["retention.ms"].source) == (
        "5000",
        DYNAMIC_TOPIC_CONFIG,
    )
    assert (found["retention.bytes"].value, found["retention.bytes"].source) == (
        "-1",
        DEFAULT_CONFIG,
    )
    assert found["delete.retention.ms"].value == str(DEFAULT_LIMITS.tombstone_retention_ms)
    assert found["min.insync.replicas"].read_only and not found["cleanup.policy"].read_only
    asked = described(TopicConfig(), DEFAULT_LIMITS, ["cleanup.policy", "no.such"])
    assert [c.name for c in asked] == ["cleanup.policy"]


def test_altered_sets_and_resets() -> None:
    current = TopicConfig(retention_ms=5_000, cleanup="compact")
    changes = {"retention.bytes": "100", "retention.ms": None, "compression.type": "producer"}
    assert altered(current, changes, DEFAULT_LIMITS) == TopicConfig(None, 100, "compact")
    both = altered(current, {"cleanup.policy": "compact,delete"}, DEFAULT_LIMITS)
    assert both.cleanup == "compact"
    assert altered(current, {"retention.ms": "-1"}, DEFAULT_LIMITS).retention_ms is None


@pytest.mark.parametrize(
    "changes",
    [
        {"segment.bytes": "1"},  # a name fencelog does not keep
        {"retention.ms": "0"},
        {"retention.bytes": "ten"},
        {"cleanup.policy": "archive"},
        {"cleanup.policy": ""},
        {"min.insync.replicas": "2"},  # read-only: only its own value passes
        {"message.format.version": "ten"},  # taken and ignored, but only a version
    ],
)
def test_bad_changes_are_refused(changes: dict[str, str | None]) -> None:
    with pytest.raises(ConfigRefused):
        altered(TopicConfig(), changes, DEFAULT_LIMITS)


def test_incremental_operations() -> None:
    current = TopicConfig(retention_ms=5_000)
    operations = [
        ("cleanup.policy", APPEND, "compact"),
        ("retention.ms", DELETE, None),
        ("retention.bytes", SET, "9"),
    ]
    changes = incremental(current, operations, DEFAULT_LIMITS)
    assert changes == {
        "cleanup.policy": "delete,compact",
        "retention.ms": None,
        "retention.bytes": "9",
    }
    assert altered(current, changes, DEFAULT_LIMITS) == TopicConfig(None, 9, "compact")
    back = incremental(
        TopicConfig(cleanup="compact"), [("cleanup.policy", SUBTRACT, "compact")], DEFAULT_LIMITS
    )
    assert back == {"cleanup.policy": ""}
    with pytest.raises(ConfigRefused):
        incremental(current, [("retention.ms", APPEND, "1")], DEFAULT_LIMITS)
    with pytest.raises(ConfigRefused):
        incremental(current, [("no.such", SET, "1")], DEFAULT_LIMITS)


def test_message_format_version_is_taken_and_ignored() -> None:
    # Kafka 3.x takes it and ignores it (KIP-724); librdkafka's 0092 sets 0.10.0.0
    current = TopicConfig(retention_ms=5_000)
    for version in ("0.10.0.0", "2.8-IV1", "3.0"):
        assert altered(current, {"message.format.version": version}, DEFAULT_LIMITS) == current
    found = {c.name: c for c in described(current, DEFAULT_LIMITS, ["message.format.version"])}
    assert (found["message.format.version"].value, found["message.format.version"].source) == (
        "3.0-IV1",
        DEFAULT_CONFIG,
    )
