"""Where a consumer starts (consume --from) and where a group is moved to (group reset
--to): beginning (earliest), end (latest), an offset, -N (the last N of each partition)
or @TIME (the first record at or after a time).

@TIME is an ISO 8601 time (2026-11-24T10:00:00Z; without a zone, UTC), @-DURATION before
now (@-1h, @-30m, @-90s) or @MS since the epoch. A time in the future is refused: no record
can be at or after it yet, which is more likely a typo than a wish. A partition whose
records are all older than the time starts at its end.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Literal

from msgspec import Struct

from broker.client.client import Client
from broker.errors import BrokerError, ErrorCode
from cli.formats import parse_duration

Kind = Literal["beginning", "end", "offset", "last", "time"]
_NAMES: dict[str, Kind] = {
    "beginning": "beginning",
    "earliest": "beginning",
    "end": "end",
    "latest": "end",
}


class Where(Struct, frozen=True):
    kind: Kind
    value: int = 0  # the offset, the N of -N, or the time in ms since the epoch


def parse_where(text: str, option: str, now_ms: int | None = None) -> Where:
    """--from/--to's value; INVALID_ARGUMENT (10) for anything else."""
    now_ms = round(time.time() * 1000) if now_ms is None else now_ms
    if text in _NAMES:
        return Where(_NAMES[text])
    if text.isascii() and text.isdigit():
        return Where("offset", int(text))
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        return Where("last", int(text[1:]))
    if text.startswith("@"):
        return Where("time", parse_time(text[1:], option, now_ms))
    raise BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        f"{option} {text!r} is not beginning, end, an offset, -N or @TIME",
        hint=f"e.g. {option} beginning, {option} 42, {option} -10, "
        f"{option} @2026-11-24T10:00:00Z, {option} @-1h",
    )


def parse_time(text: str, option: str, now_ms: int) -> int:
    """Milliseconds since the epoch of an ISO 8601 time, -DURATION before now, or ms."""
    if text.startswith("-"):
        try:
            return now_ms - round(parse_duration(text[1:]) * 1000)
        except BrokerError as exc:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{option} @{text} is not a duration ago",
                hint="e.g. @-1h, @-30m, @-90s",
            ) from exc
    if text.isascii() and text.isdigit():
        at_ms = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError as exc:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{option} @{text!r} is not a time",
                hint="use ISO 8601 (@2026-11-24T10:00:00Z), @-1h or @MS since the epoch",
            ) from exc
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        at_ms = round(moment.timestamp() * 1000)
    if at_ms > now_ms:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{option} @{text} is in the future: no record is at or after it yet",
            hint="give a time up to now, e.g. @-1h",
        )
    return at_ms


def offsets_for(
    client: Client, topic: str, partitions: Sequence[int] | None, where: Where
) -> dict[int, int]:
    """The offset each chosen partition (default: all) starts at for `where`."""
    chosen = client.positions(topic, partitions or None, "beginning")  # checks partitions
    details = {p.partition: p for p in client.describe_topic(topic).partition_details}
    offsets = {}
    for partition in chosen:
        start, end = details[partition].start_offset, details[partition].end_offset
        match where.kind:
            case "beginning":
                offsets[partition] = start
            case "end":
                offsets[partition] = end
            case "offset":
                offsets[partition] = where.value
            case "last":
                offsets[partition] = max(start, end - where.value)
            case "time":
                found = client.offset_for_time(topic, partition, where.value)
                offsets[partition] = end if found is None else found
    return offsets
