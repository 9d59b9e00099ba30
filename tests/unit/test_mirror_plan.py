"""The mirror's pure decisions (broker/mirror/plan.py): no cluster, no broker."""

from __future__ import annotations

import pytest

from broker.errors import BrokerError, ErrorCode
from broker.mirror.plan import (
    TopicShape,
    check_target,
    cluster_servers,
    config_file_lines,
    default_group,
    kafka_settings,
    select_topics,
    start_positions,
    translated_offset,
)


def refused(call: object, code: ErrorCode) -> BrokerError:
    assert callable(call)
    with pytest.raises(BrokerError) as caught:
        call()
    assert caught.value.code is code, caught.value
    return caught.value


def test_a_cluster_is_kafka_scheme_and_host_ports() -> None:
    assert cluster_servers("kafka://a:9092,10.0.0.2:9093") == "a:9092,10.0.0.2:9093"
    for bad in ("a:9092", "kafka://", "kafka://a", "kafka://a:0", "kafka://a:9092,", "tcp://a:1"):
        error = refused(lambda bad=bad: cluster_servers(bad), ErrorCode.INVALID_ARGUMENT)
        assert "kafka://HOST:PORT" in str(error.hint)


def test_kafka_settings_refuse_bad_lines_without_echoing_the_value() -> None:
    assert kafka_settings([("value 1", "sasl.password = s3cret")]) == {"sasl.password": "s3cret"}
    error = refused(
        lambda: kafka_settings([("value 1", "sasl.password:s3cret")]), ErrorCode.INVALID_ARGUMENT
    )
    assert "s3cret" not in error.message and "value 1" in error.message
    error = refused(
        lambda: kafka_settings([("value 2", "transactional.id=mine")]),
        ErrorCode.INVALID_ARGUMENT,
    )
    assert "transactional.id is set by the mirror" in error.message
    refused(lambda: kafka_settings([("value 3", "=x")]), ErrorCode.INVALID_ARGUMENT)


def test_a_config_file_skips_comments_and_blank_lines() -> None:
    text = "# TLS\n\nsecurity.protocol=SSL\n  ssl.ca.location=/ca.pem\n"
    assert config_file_lines(text, "k.conf") == [
        ("k.conf line 3", "security.protocol=SSL"),
        ("k.conf line 4", "ssl.ca.location=/ca.pem"),
    ]


def test_topics_by_name_or_whole_name_regex() -> None:
    available = ["orders", "orders-eu", "payments", "__consumer_offsets"]
    assert select_topics(["orders"], available, "src") == ["orders"]
    assert select_topics(["orders.*"], available, "src") == ["orders", "orders-eu"]
    assert select_topics(["pay.*", "orders"], available, "src") == ["orders", "payments"]
    assert select_topics([".*"], available, "src") == ["orders", "orders-eu", "payments"]
    error = refused(lambda: select_topics(["order"], available, "src"), ErrorCode.UNKNOWN_TOPIC)
    assert error.message == "topic order is not on the source (src)"
    refused(lambda: select_topics(["x.*"], available, "src"), ErrorCode.UNKNOWN_TOPIC)
    refused(lambda: select_topics(["(orders"], available, "src"), ErrorCode.INVALID_ARGUMENT)


def test_a_target_with_fewer_partitions_is_refused_never_remapped() -> None:
    shape = TopicShape(3)
    assert check_target("orders", shape, None) is True
    assert check_target("orders", shape, 3) is False
    assert check_target("orders", shape, 5) is False
    error = refused(lambda: check_target("orders", shape, 2), ErrorCode.UNKNOWN_PARTITION)
    assert "2 partitions on the target and 3 on the source" in error.message


def test_the_default_group_is_stable_and_a_valid_name() -> None:
    assert default_group(["orders"]) == "fencelog-mirror.orders"
    assert default_group(["b", "a"]) == default_group(["a", "b"])
    regex = default_group(["orders.*"])
    assert regex.startswith("fencelog-mirror.orders._")
    assert regex != default_group(["orders.+"])
    assert len(default_group(["x" * 500])) <= 200


def test_start_positions_resume_within_the_log() -> None:
    # partition 0 resumes at 5; 1 never committed: its log start; 2's start moved past
    # its commit (retention): the start
    assert start_positions({0: 5, 2: 1}, [0, 3, 4], [9, 9, 9]) == {0: 5, 1: 3, 2: 4}


def test_translation_counts_back_from_the_target_end() -> None:
    # the target's last records (a Kafka transaction's markers leave gaps)
    tail = [10, 11, 13, 14, 16]
    assert translated_offset(tail, 0, 17) == 17
    assert translated_offset(tail, 1, 17) == 16
    assert translated_offset(tail, 3, 17) == 13
    assert translated_offset(tail, 5, 17) == 10
