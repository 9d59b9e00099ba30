"""The closed, numbered set of errors fencelog reports, and the one exception class.

Rules:
- A code's number is stable forever and never reused; new codes take new numbers.
- The number is also the CLI's exit status for that error (see cli/errors.py), so every
  number stays within 10..119; 0, 1, 2, 126, 127 and 130 belong to the shell
  conventions. INTERNAL alone exits 1, the status of any failure that is a bug.
- The library raises `BrokerError(code, message, details)`; `details` carries what an
  operator needs (the topic, the partition, the expected and the received value) and a
  `hint` that says what to do. Nothing below the CLI prints or exits.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class ErrorCode(enum.IntEnum):
    # the request itself
    INVALID_ARGUMENT = 10
    RECORD_TOO_LARGE = 11
    INVALID_TOPIC_NAME = 12
    INVALID_NAME = 13
    INVALID_FENCE = 15
    # topics and partitions
    UNKNOWN_TOPIC = 20
    UNKNOWN_PARTITION = 21
    TOPIC_EXISTS = 22
    OFFSET_OUT_OF_RANGE = 23
    # the data directory
    DATA_DIR_UNREADABLE = 30
    FOREIGN_DATA_DIR = 31
    SCHEMA_TOO_NEW = 32
    STORAGE_BUSY = 33
    STORAGE_FAILED = 34
    DATA_DIR_IN_USE = 35
    DATA_DIR_MISSING = 36
    DATA_CORRUPT = 37
    # ownership (seeds/single-reader-writer.txt)
    OWNED_BY_HIGHER_GENERATION = 40
    FENCED = 41
    SEVERED = 42
    UNKNOWN_GROUP = 43
    NOT_HELD = 44
    GROUP_LIVE = 45  # a consumer group with live members (fencelog mirror --groups)
    # idempotent producers (seeds/idempotent-producer.txt)
    OUT_OF_ORDER_SEQUENCE = 50
    INVALID_GENERATION = 51
    PID_EXPIRED = 52
    UNKNOWN_PID = 53
    # exclusive producers (seeds/pip-68-exclusive-producer.md)
    PRODUCER_BUSY = 60
    PRODUCER_FENCED = 61
    WAIT_TIMEOUT = 62
    # transactions (seeds/transactions-double-journaling.txt)
    UNKNOWN_TXN = 70
    TXN_ABORTED = 71
    TXN_NOT_OPEN = 72
    TXN_WRONG_GROUP = 73
    # the connection to a served broker
    CONNECTION_FAILED = 80
    PROTOCOL_ERROR = 81
    AUTH_FAILED = 82
    BROKER_SHUTTING_DOWN = 83
    TOO_MANY_REQUESTS = 84
    LISTEN_FAILED = 85
    # fencelog verify: the log breaks an exactly-once claim (the report says how)
    VERIFY_FAILED = 90
    # fencelog itself
    INTERNAL = 119


class BrokerError(Exception):
    """A failure the caller can act on: a stable code, a one-line message, details."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: Mapping[str, Any] = details

    @property
    def hint(self) -> str | None:
        hint = self.details.get("hint")
        return str(hint) if hint is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code.name, "code": int(self.code), "message": self.message} | {
            key: value for key, value in self.details.items() if value is not None
        }

    def __repr__(self) -> str:
        return f"BrokerError({self.code.name}, {self.message!r})"
