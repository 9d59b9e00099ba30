"""broker/core/records.py: topic names, partition counts, record bounds, partition choice.

Pure rules: no SQLite, no clock. Small custom Limits make the bounds cheap to reach.
"""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from broker.core.records import (
    check_partition,
    check_partition_count,
    check_records,
    check_topic_name,
    choose_partition,
    split_batches,
)
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.types import NewRecord
from support.values import present

SMALL = Limits(
    topic_partitions_max=8,
    record_key_bytes_max=4,
    record_value_bytes_max=10,
    record_headers_max=2,
    header_key_chars_max=5,
    header_value_bytes_max=3,
    append_records_max=3,
    append_bytes_max=25,
)


def code_of(excinfo: pytest.ExceptionInfo[BrokerError]) -> ErrorCode:
    return excinfo.value.code


# topic names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["orders", "a", "A.b_c-9", "...", "x" * DEFAULT_LIMITS.topic_name_chars_max]
)
def test_valid_topic_names_are_accepted(name: str) -> None:
    check_topic_name(name, DEFAULT_LIMITS)


def test_empty_topic_name_is_refused() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_topic_name("", DEFAULT_LIMITS)
    assert code_of(excinfo) is ErrorCode.INVALID_TOPIC_NAME
    assert "empty" in excinfo.value.message


def test_topic_name_of_250_characters_is_too_long() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_topic_name("x" * 250, DEFAULT_LIMITS)
    assert code_of(excinfo) is ErrorCode.INVALID_TOPIC_NAME
    assert "250" in excinfo.value.message
    assert "249" in excinfo.value.message


def test_topic_name_limit_comes_from_limits() -> None:
    check_topic_name("abcd", Limits(topic_name_chars_max=4))
    with pytest.raises(BrokerError) as excinfo:
        check_topic_name("abcde", Limits(topic_name_chars_max=4))
    assert code_of(excinfo) is ErrorCode.INVALID_TOPIC_NAME


@pytest.mark.parametrize(
    "name",
    [
        "a b",
        "a/b",
        "../etc",
        "a\\b",
        "caf\u00e9",
        "a\x00b",
        "tab\t",
        "new\nline",
        "orders\n",  # a trailing newline is a character outside the set too
        "a:b",
        "*",
    ],
)
def test_topic_name_with_bad_characters_is_refused(name: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_topic_name(name, DEFAULT_LIMITS)
    assert code_of(excinfo) is ErrorCode.INVALID_TOPIC_NAME


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_and_dot_dot_are_not_topic_names(name: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_topic_name(name, DEFAULT_LIMITS)
    assert code_of(excinfo) is ErrorCode.INVALID_TOPIC_NAME


# partition counts ---------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, SMALL.topic_partitions_max])
def test_partition_counts_within_bounds_are_accepted(count: int) -> None:
    check_partition_count(count, SMALL)


@pytest.mark.parametrize("count", [0, -1, SMALL.topic_partitions_max + 1])
def test_partition_counts_out_of_bounds_are_refused(count: int) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_partition_count(count, SMALL)
    assert code_of(excinfo) is ErrorCode.INVALID_ARGUMENT
    assert str(SMALL.topic_partitions_max) in excinfo.value.message


def test_default_partition_bound_is_1024() -> None:
    check_partition_count(1024, DEFAULT_LIMITS)
    with pytest.raises(BrokerError):
        check_partition_count(1025, DEFAULT_LIMITS)


@pytest.mark.parametrize("partition", [-1, 4, 5])
def test_partition_outside_topic_is_unknown(partition: int) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_partition("orders", partition, 4)
    assert code_of(excinfo) is ErrorCode.UNKNOWN_PARTITION
    assert excinfo.value.details["partition"] == partition
    assert "0..3" in excinfo.value.message


# record bounds ------------------------------------------------------------------------


def test_records_at_every_bound_are_accepted() -> None:
    check_records(
        [NewRecord(b"v" * 10, key=b"k" * 4, headers=(("abcde", b"xyz"), ("h", b"")))],
        SMALL,
    )


def test_value_over_the_bound_is_too_large() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"ok"), NewRecord(b"v" * 11)], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE
    assert excinfo.value.details["index"] == 1
    assert excinfo.value.details["size"] == 11
    assert excinfo.value.details["limit"] == 10


def test_default_value_bound_is_one_mebibyte() -> None:
    check_records([NewRecord(b"\0" * (1024 * 1024))], DEFAULT_LIMITS)
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"\0" * (1024 * 1024 + 1))], DEFAULT_LIMITS)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE


def test_key_over_the_bound_is_too_large() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v", key=b"k" * 5)], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE
    assert "key" in excinfo.value.message


def test_too_many_headers_is_too_large() -> None:
    headers = (("a", b""), ("b", b""), ("c", b""))
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v", headers=headers)], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE


def test_header_value_over_the_bound_is_too_large() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v", headers=(("h", b"abcd"),))], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE


@pytest.mark.parametrize("name", ["", "abcdef"])
def test_header_names_must_be_1_to_max_characters(name: str) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v", headers=((name, b"x"),))], SMALL)
    assert code_of(excinfo) is ErrorCode.INVALID_ARGUMENT


def test_a_kafka_batch_has_no_record_bounds_only_its_bytes() -> None:
    """Kafka bounds a batch by its bytes alone: a key, a value, headers beyond
    fencelog's record bounds pass; the batch's bytes still have theirs."""
    wide = NewRecord(b"v" * 11, key=b"k" * 5, headers=(("", b"abcd"), ("b", b""), ("c", b"")))
    check_records([wide], SMALL, kafka=True)
    with pytest.raises(BrokerError) as excinfo:
        check_records([wide], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE
    with pytest.raises(BrokerError) as excinfo:
        check_records([wide, wide], SMALL, kafka=True)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE
    assert "at most 25 bytes, not 44" in excinfo.value.message


def test_empty_batch_is_refused() -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([], SMALL)
    assert code_of(excinfo) is ErrorCode.INVALID_ARGUMENT


def test_batch_over_the_record_count_bound_is_too_large() -> None:
    check_records([NewRecord(b"v")] * 3, SMALL)
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v")] * 4, SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE


def test_batch_over_the_byte_bound_is_too_large() -> None:
    # keys and header values count towards the batch's bytes, not only values
    check_records([NewRecord(b"v" * 10, key=b"kkkk"), NewRecord(b"v" * 10, key=b"k")], SMALL)
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v" * 10, key=b"kkkk"), NewRecord(b"v" * 10, key=b"kk")], SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE


def test_header_names_count_towards_the_batch_bytes() -> None:
    """They travel as much as values do: a batch of long names that the client let
    through as small broke the served connection with a frame over the limit."""
    named = [NewRecord(b"v", headers=(("hhhhh", b"x"),))] * 3  # 3 x (1 + 5 + 1) = 21 bytes
    check_records(named, SMALL)
    heavier = [NewRecord(b"vvv", headers=(("hhhhh", b"xx"),))] * 3  # 3 x 10 = 30 bytes
    with pytest.raises(BrokerError) as excinfo:
        check_records(heavier, SMALL)
    assert code_of(excinfo) is ErrorCode.RECORD_TOO_LARGE
    assert [len(batch) for batch in split_batches(heavier, SMALL)] == [2, 1]


@pytest.mark.parametrize("stamp", [1.5, 2**63, -(2**63) - 1, "1700000000000"])
def test_a_timestamp_is_a_64_bit_integer(stamp: object) -> None:
    with pytest.raises(BrokerError) as excinfo:
        check_records([NewRecord(b"v"), NewRecord(b"v", timestamp_ms=stamp)], SMALL)  # type: ignore[arg-type]
    assert code_of(excinfo) is ErrorCode.INVALID_ARGUMENT
    assert "record 1: timestamp_ms" in excinfo.value.message
    check_records(
        [NewRecord(b"v", timestamp_ms=-1), NewRecord(b"v", timestamp_ms=2**63 - 1)], SMALL
    )


# choosing a partition -----------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3, 4, 16])
def test_same_key_always_goes_to_the_same_partition(partitions: int) -> None:
    for key in (b"k1", b"", b"\x00\xff", "caf\u00e9".encode()):
        chosen = {choose_partition(key, partitions, round_robin) for round_robin in range(20)}
        assert len(chosen) == 1
        assert 0 <= chosen.pop() < partitions


def test_keys_spread_over_every_partition() -> None:
    chosen = {choose_partition(f"key-{i}".encode(), 4, 0) for i in range(200)}
    assert chosen == {0, 1, 2, 3}


def test_records_without_key_go_round_robin_from_the_starting_point() -> None:
    assert [choose_partition(None, 4, 6 + i) for i in range(8)] == [2, 3, 0, 1, 2, 3, 0, 1]
    assert [choose_partition(None, 1, i) for i in range(3)] == [0, 0, 0]


def test_split_batches_keeps_each_batch_within_both_limits() -> None:
    limits = replace(DEFAULT_LIMITS, append_records_max=3, append_bytes_max=10)
    records = [NewRecord(b"x" * size) for size in (4, 4, 4, 1, 1, 1, 1, 11, 2)]
    batches = split_batches(records, limits)
    assert [[len(present(r.value)) for r in batch] for batch in batches] == [
        [4, 4],  # a third 4 would pass 10 bytes
        [4, 1, 1],  # three records at most
        [1, 1],
        [11],  # too large alone: its own batch, for check_records to refuse
        [2],
    ]
    assert [r for batch in batches for r in batch] == records
    assert split_batches([], limits) == []


@pytest.mark.parametrize("header", [("h", "text"), (b"h", b"v"), ("h", 1)])
def test_a_header_of_other_types_is_refused_before_it_is_stored(
    header: tuple[object, object],
) -> None:
    """An embedded client hands NewRecords to the engine as they are: a header whose
    value is text was stored, and every later read of it failed."""
    record = NewRecord(b"v", headers=(header,))  # type: ignore[arg-type]
    with pytest.raises(BrokerError) as raised:
        check_records([record], DEFAULT_LIMITS)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT
    assert "a header is (name: str, value: bytes or None)" in raised.value.message


def test_a_null_header_value_is_a_header_of_no_bytes() -> None:
    """Kafka's null header value, kept distinct from an empty one."""
    check_records([NewRecord(b"v", headers=(("gone", None), ("empty", b"")))], SMALL)
