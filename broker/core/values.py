"""The types a core check expects of a value that came from outside.

A core check compares and measures its arguments; given a value of another type (a
null from a Kafka request, a number where a name goes, a string where a count goes) it
would fail with Python's TypeError, an internal error, where the caller deserves
INVALID_ARGUMENT saying what was wrong. Every check of broker/core that takes a name or
a number from outside calls one of these first. bool is no integer here; int
subclasses are.
"""

from __future__ import annotations

import numbers
from typing import Any, Final

from broker.errors import BrokerError, ErrorCode

_SHOWN_CHARS_MAX: Final = 40


def check_string(what: str, value: Any) -> None:
    """value is a str, else INVALID_ARGUMENT naming what."""
    if not isinstance(value, str):
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{what} must be a string, not {_shown(value)}",
        )


def check_integer(what: str, value: Any) -> None:
    """value is an integer (not a bool), else INVALID_ARGUMENT naming what."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{what} must be an integer, not {_shown(value)}",
        )


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > _SHOWN_CHARS_MAX:
        text = text[: _SHOWN_CHARS_MAX - 3] + "..."
    return f"{type(value).__name__} {text}"
