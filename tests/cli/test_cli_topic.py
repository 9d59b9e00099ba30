"""fencelog topic create | list | describe | delete, as a user sees them: stdout lines,
JSON objects, stderr messages and exit statuses (the ErrorCode number)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import ErrorCode
from support.helpers import Invoke, expect, json_error, json_lines, stored_rows


def test_create_topic_with_partitions(invoke: Invoke) -> None:
    result = expect(invoke("topic", "create", "orders", "--partitions", "4"), 0)
    assert result.stdout == "topic orders: 4 partitions\n"
    assert result.stderr == ""
    listed = json_lines(expect(invoke("topic", "list", "--json"), 0).stdout)
    assert [(t["topic"], t["partitions"]) for t in listed] == [("orders", 4)]


def test_create_topic_defaults_to_one_partition(invoke: Invoke) -> None:
    [created] = json_lines(expect(invoke("topic", "create", "orders", "--json"), 0).stdout)
    assert created["topic"] == "orders"
    assert created["partitions"] == 1
    assert created["records"] == 0


def test_topic_list_json_one_object_per_topic(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "4"), 0)
    expect(invoke("topic", "create", "audit"), 0)
    expect(invoke("produce", "orders", "--partition", "1", "--value", "abc"), 0)
    listed = json_lines(expect(invoke("topic", "list", "--json"), 0).stdout)
    assert [t["topic"] for t in listed] == ["audit", "orders"]
    orders = listed[1]
    assert orders["partitions"] == 4
    assert orders["records"] == 1
    assert orders["bytes"] == 3
    assert orders["owner_group"] is None
    assert isinstance(orders["created_ms"], int)


def test_topic_list_empty(invoke: Invoke) -> None:
    assert expect(invoke("topic", "list", "--json"), 0).stdout == ""


def test_topic_list_plain_is_tab_separated(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "4"), 0)
    expect(invoke("produce", "orders", "--partition", "0", "--value", "ab"), 0)
    result = expect(invoke("topic", "list"), 0)
    assert result.stdout == "orders\t4\t1\t2\t\n"
    assert "\x1b" not in result.stdout


def test_describe_shows_each_partitions_offsets(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "3"), 0)
    expect(invoke("produce", "orders", "--partition", "2", "-v", "a", "-v", "b"), 0)
    [described] = json_lines(expect(invoke("topic", "describe", "orders", "--json"), 0).stdout)
    assert [
        (p["partition"], p["start_offset"], p["end_offset"]) for p in described["partition_details"]
    ] == [(0, 0, 0), (1, 0, 0), (2, 0, 2)]
    plain = expect(invoke("topic", "describe", "orders"), 0).stdout
    assert plain.splitlines() == ["0\t0\t0\t0\t0", "1\t0\t0\t0\t0", "2\t0\t2\t2\t2"]


def test_create_existing_topic_fails_with_22(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "2"), 0)
    result = expect(invoke("topic", "create", "orders"), ErrorCode.TOPIC_EXISTS)
    assert result.stdout == ""
    assert "orders already exists" in result.stderr
    assert "[TOPIC_EXISTS]" in result.stderr


def test_create_existing_topic_json_error(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders"), 0)
    result = expect(invoke("topic", "create", "orders", "--json"), 22)
    error = json_error(result)
    assert error["error"] == "TOPIC_EXISTS"
    assert error["code"] == 22
    assert error["topic"] == "orders"


def test_if_not_exists_succeeds_and_keeps_the_topic(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "4"), 0)
    expect(invoke("produce", "orders", "--partition", "3", "--value", "kept"), 0)
    result = expect(
        invoke("topic", "create", "orders", "--partitions", "2", "--if-not-exists", "--json"), 0
    )
    [info] = json_lines(result.stdout)
    assert info["partitions"] == 4  # the existing topic, unchanged
    assert info["records"] == 1
    assert info["existing"] is True
    assert "already exists with 4 partitions, not 2: left as it is" in result.stderr
    again = expect(invoke("topic", "create", "orders", "-p", "4", "--if-not-exists"), 0)
    assert again.stdout == "topic orders: 4 partitions (already there: left as it is)\n"
    assert again.stderr == ""
    refused = expect(invoke("topic", "create", "orders"), 22)
    assert "topic create --if-not-exists accepts it as it is" in refused.stderr


def test_if_not_exists_creates_a_missing_topic(invoke: Invoke) -> None:
    created = expect(invoke("topic", "create", "orders", "--if-not-exists", "--json"), 0)
    assert json_lines(created.stdout)[0]["existing"] is False
    listed = json_lines(expect(invoke("topic", "list", "--json"), 0).stdout)
    assert [t["topic"] for t in listed] == ["orders"]


@pytest.mark.parametrize(
    "name",
    ["x" * 250, "bad name", "a/b", ".", "..", "caf\u00e9", "orders\n"],
    ids=["250-chars", "space", "slash", "dot", "dot-dot", "non-ascii", "trailing-newline"],
)
def test_invalid_topic_name_exits_12(invoke: Invoke, name: str) -> None:
    result = expect(invoke("topic", "create", name), ErrorCode.INVALID_TOPIC_NAME)
    assert result.stdout == ""
    assert "[INVALID_TOPIC_NAME]" in result.stderr
    assert json_lines(expect(invoke("topic", "list", "--json"), 0).stdout) == []


def test_too_long_topic_name_says_the_limit(invoke: Invoke) -> None:
    result = expect(invoke("topic", "create", "x" * 250, "--json"), 12)
    error = json_error(result)
    assert error["error"] == "INVALID_TOPIC_NAME"
    assert "250" in error["message"]
    assert "249" in error["message"]


def test_empty_topic_name_exits_12(invoke: Invoke) -> None:
    expect(invoke("topic", "create", ""), ErrorCode.INVALID_TOPIC_NAME)


@pytest.mark.parametrize("partitions", ["0", "-3", "1025"])
def test_partition_count_out_of_range_exits_10(invoke: Invoke, partitions: str) -> None:
    result = expect(
        invoke("topic", "create", "orders", "--partitions", partitions), ErrorCode.INVALID_ARGUMENT
    )
    assert "1 to 1024 partitions" in result.stderr
    assert json_lines(expect(invoke("topic", "list", "--json"), 0).stdout) == []


def test_delete_topic(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "2"), 0)
    expect(invoke("topic", "create", "audit"), 0)
    expect(invoke("produce", "orders", "--partition", "1", "--value", "gone"), 0)
    result = expect(invoke("topic", "delete", "orders"), 0)
    assert result.stdout == "deleted topic orders\n"
    listed = json_lines(expect(invoke("topic", "list", "--json"), 0).stdout)
    assert [t["topic"] for t in listed] == ["audit"]
    expect(invoke("consume", "orders"), ErrorCode.UNKNOWN_TOPIC)


def test_delete_then_recreate_starts_empty(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "orders"), 0)
    expect(invoke("produce", "orders", "-v", "a", "-v", "b"), 0)
    [deleted] = json_lines(expect(invoke("topic", "delete", "orders", "--json"), 0).stdout)
    assert deleted == {"topic": "orders", "deleted": True}
    expect(invoke("topic", "create", "orders"), 0)
    assert expect(invoke("consume", "orders"), 0).stdout == ""
    [produced] = json_lines(expect(invoke("produce", "orders", "-v", "c", "--json"), 0).stdout)
    assert produced["offset"] == 0


@pytest.mark.parametrize("command", ["delete", "describe"])
def test_unknown_topic_exits_20(invoke: Invoke, command: str) -> None:
    result = expect(invoke("topic", command, "nope"), ErrorCode.UNKNOWN_TOPIC)
    assert "topic nope does not exist" in result.stderr
    assert "fencelog topic create nope" in result.stderr  # what to do
    error = json_error(expect(invoke("topic", command, "nope", "--json"), 20))
    assert error["error"] == "UNKNOWN_TOPIC"


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "create", "orders"],
        ["topic", "create", "bad name"],
        ["topic", "create", "new", "--partitions", "0"],
        ["topic", "delete", "nope"],
        ["topic", "describe", "nope"],
    ],
)
def test_failed_topic_command_touches_nothing(
    invoke: Invoke, data_dir: Path, args: list[str]
) -> None:
    expect(invoke("topic", "create", "orders", "--partitions", "2"), 0)
    expect(invoke("produce", "orders", "--partition", "1", "-v", "a", "-v", "b"), 0)
    before = stored_rows(data_dir)
    assert invoke(*args).exit_code >= 10
    assert stored_rows(data_dir) == before


@pytest.mark.parametrize(
    "args",
    [
        ["topic", "create"],
        ["topic", "create", "orders", "--partitions", "many"],
        ["topic", "create", "orders", "--bogus"],
        ["topic", "frobnicate"],
    ],
    ids=["missing-name", "partitions-not-a-number", "unknown-option", "unknown-command"],
)
def test_usage_errors_exit_2(invoke: Invoke, args: list[str]) -> None:
    result = expect(invoke(*args), 2)
    assert result.stdout == ""
    assert "Usage:" in result.stderr
