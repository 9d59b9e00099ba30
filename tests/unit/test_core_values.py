"""broker/core's checks given values of the wrong type (a null from a Kafka request, a
number where a name goes, a string where a count goes): each refuses with
INVALID_ARGUMENT naming what was wrong, never a Python TypeError (issue 39: a null group
id made check_name fail building its own message)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker.core import exclusive, ownership, records, txn
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS

NOT_STRINGS = [None, 7, 2.5, b"bytes", ["a"], {"a": 1}, True]
NOT_INTEGERS = [None, "7", 2.5, b"7", [7], True]

NAME_CHECKS: dict[str, Callable[[Any], None]] = {
    "check_name": lambda name: ownership.check_name("consumer group", name),
    "check_claims group": lambda name: ownership.check_claims(name, [("r", 1)]),
    "check_claims resource": lambda name: ownership.check_claims("g", [(name, 1)]),
    "check_topic_name": lambda name: records.check_topic_name(name, DEFAULT_LIMITS),
    "txn.check_group": txn.check_group,
    "txn.check_member": txn.check_member,
    "txn.check_key": txn.check_key,
}
NUMBER_CHECKS: dict[str, Callable[[Any], None]] = {
    "check_claims generation": lambda number: ownership.check_claims("g", [("r", number)]),
    "check_partition_count": lambda n: records.check_partition_count(n, DEFAULT_LIMITS),
    "check_partition": lambda number: records.check_partition("t", number, 3),
    "check_offset": records.check_offset,
    "txn.check_timeout": lambda number: txn.check_timeout(number, 60_000),
    "exclusive.check_wait_ms": exclusive.check_wait_ms,
}


@pytest.mark.parametrize("value", NOT_STRINGS, ids=repr)
@pytest.mark.parametrize("check", list(NAME_CHECKS))
def test_a_name_that_is_no_string_is_an_invalid_argument(check: str, value: Any) -> None:
    with pytest.raises(BrokerError) as refused:
        NAME_CHECKS[check](value)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "must be a string, not" in refused.value.message


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
@pytest.mark.parametrize("check", list(NUMBER_CHECKS))
def test_a_number_that_is_no_integer_is_an_invalid_argument(check: str, value: Any) -> None:
    with pytest.raises(BrokerError) as refused:
        NUMBER_CHECKS[check](value)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "must be an integer, not" in refused.value.message


def test_a_null_name_is_said_to_be_null() -> None:
    with pytest.raises(BrokerError) as refused:
        ownership.check_name("consumer group", None)  # type: ignore[arg-type]
    assert refused.value.message == "consumer group must be a string, not null"


def test_strings_and_integers_still_meet_the_checks_they_met() -> None:
    ownership.check_name("consumer group", "orders")
    records.check_topic_name("orders", DEFAULT_LIMITS)
    records.check_partition_count(3, DEFAULT_LIMITS)
    records.check_offset(0)
    with pytest.raises(BrokerError) as refused:
        ownership.check_name("consumer group", "")
    assert refused.value.code is ErrorCode.INVALID_NAME
