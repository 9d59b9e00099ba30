"""Helpers for the tests of fencelog's users: wait until a topic holds records, produce and
collect, and `fencelog verify`'s check as an assertion. They take any Client (embedded or
served); the pytest plugin's fixtures offer them as methods too.

Rules they keep:
- Every wait is bounded (`timeout_s`) and fails with an AssertionError that says what was
  awaited and what the topic held at the end, partition by partition.
- Reading is bounded too: a helper reads up to the end offsets it saw, never follows.
- A failed check raises AssertionError (pytest shows its message as the failure); the
  verify assertion's message is a diff of the expected values against the log, then the
  report `fencelog verify` prints.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from broker.client.client import Client, Value
from broker.core.verify import Ack, By, Checker, Report, report_lines, sha256
from broker.errors import BrokerError, ErrorCode
from broker.types import AppendResult, NewRecord, Record

WAIT_S: Final = 10.0  # the default bound of a wait for records
POLL_S: Final = 0.01  # between two looks at a topic's end offsets
DIFF_LINES_MAX: Final = 40  # the diff's lines shown; the rest are counted

AckLike = Ack | AppendResult | tuple[bytes | str, AppendResult]


def held(client: Client, topic: str, since: Mapping[int, int] | None = None) -> dict[int, int]:
    """{partition: records held} of topic, counted from `since` (partition: offset) or from
    each partition's start; {} while the topic does not exist."""
    try:
        info = client.describe_topic(topic)
    except BrokerError as error:
        if error.code == ErrorCode.UNKNOWN_TOPIC:
            return {}
        raise
    since = since or {}
    return {
        p.partition: max(0, p.end_offset - max(p.start_offset, since.get(p.partition, 0)))
        for p in info.partition_details
    }


def end_offsets(client: Client, topic: str) -> dict[int, int]:
    """{partition: end offset} of topic; {} while it does not exist."""
    try:
        return dict(enumerate(client.end_offsets(topic)))
    except BrokerError as error:
        if error.code == ErrorCode.UNKNOWN_TOPIC:
            return {}
        raise


def wait_for_records(
    client: Client,
    topic: str,
    count: int,
    *,
    timeout_s: float = WAIT_S,
    since: Mapping[int, int] | None = None,
) -> list[Record]:
    """The records of topic (from `since`, partition: offset; default the beginning), once
    it holds at least `count` of them; AssertionError after timeout_s. The topic need not
    exist yet. Records come partition by partition, in offset order."""
    __tracebackhide__ = True  # a failure points at the test's line
    deadline = time.monotonic() + timeout_s
    while True:
        counts = held(client, topic, since)
        if sum(counts.values()) >= count:
            return read_from(client, topic, since or {})
        if time.monotonic() >= deadline:
            raise AssertionError(_not_held(topic, count, counts, timeout_s, since))
        time.sleep(POLL_S)


def _not_held(
    topic: str,
    count: int,
    counts: Mapping[int, int],
    timeout_s: float,
    since: Mapping[int, int] | None,
) -> str:
    where = " new" if since else ""
    if not counts:
        return f"topic {topic} does not exist after {timeout_s}s (waited for {count} records)"
    per_partition = ", ".join(f"partition {p}: {n}" for p, n in sorted(counts.items()))
    return (
        f"topic {topic} holds {sum(counts.values())} of {count}{where} records after "
        f"{timeout_s}s ({per_partition})"
    )


def read_from(client: Client, topic: str, since: Mapping[int, int]) -> list[Record]:
    """Every record of topic at or after `since` (partition: offset), up to the end
    offsets of now, partition by partition."""
    ends = client.end_offsets(topic)
    records: list[Record] = []
    for partition, end in enumerate(ends):
        start = since.get(partition, 0)
        if start < end:
            records += client.consume(topic, partition=partition, start=start)
    return records


def produce_and_collect(
    client: Client,
    topic: str,
    values: Iterable[Value],
    *,
    key: bytes | str | None = None,
    collect_from: str | None = None,
    count: int | None = None,
    timeout_s: float = WAIT_S,
) -> list[Record]:
    """Produce values to topic, then collect what arrives in `collect_from` (default:
    topic itself): the records appended there after the produce began, once there are
    `count` of them (default: as many as were produced). For a pipeline under test,
    produce its input and collect its output; AssertionError after timeout_s."""
    __tracebackhide__ = True  # a failure points at the test's line
    collected = collect_from or topic
    before = end_offsets(client, collected)
    produced = list(values)
    if produced:
        client.produce(topic, produced, key=key)
    expected = len(produced) if count is None else count
    return wait_for_records(client, collected, expected, timeout_s=timeout_s, since=before)


def as_ack(ack: AckLike, line: int) -> Ack | None:
    """An Ack for the checker: what client.produce returned (the position is checked), a
    (value, result) pair (its bytes too), or an Ack. None for a transaction's
    result (offset -1: it has no place in the log yet)."""
    if isinstance(ack, Ack):
        return ack
    if isinstance(ack, AppendResult):
        return Ack(ack.partition, ack.offset, None, "acks", line) if ack.offset >= 0 else None
    value, result = ack
    if result.offset < 0:
        return None
    data = value.encode() if isinstance(value, str) else value
    return Ack(result.partition, result.offset, sha256(data), "acks", line)


def verify(
    client: Client,
    topic: str,
    *,
    expected: Sequence[Value] | None = None,
    acks: Iterable[AckLike] = (),
    by: By = "value",
) -> Report:
    """`fencelog verify`'s report of topic, read through client."""
    checked_acks = [a for n, ack in enumerate(acks, start=1) if (a := as_ack(ack, n))]
    checker = Checker(
        topic,
        client.describe_topic(topic).partition_details,
        acks=checked_acks,
        expected=None if expected is None else [_item(v, by) for v in expected],
        by=by,
    )
    for record in client.consume(topic):
        checker.record(record)
    return checker.finish(client.txn_list(limit=10_000))


def _item(value: Value, by: By) -> bytes:
    if isinstance(value, NewRecord):
        item = value.value if by == "value" else value.key
        if item is None:
            raise ValueError(f"an expected record without a {by}, checked by {by}: {value!r}")
        return item
    if value is None:
        raise ValueError("an expected null value: records are checked by their value or key")
    return value.encode() if isinstance(value, str) else value


def assert_exactly_once(
    client: Client,
    topic: str,
    *,
    expected: Sequence[Value] | None = None,
    acks: Iterable[AckLike] = (),
    by: By = "value",
) -> Report:
    """`fencelog verify` as an assertion: every acknowledged record (`acks`) in the log
    once, at its offset; every `expected` value (or key, by="key") exactly once and
    nothing else; no gaps, sequence skips or repeats, zombie writes or open
    transactions. The clean report, or AssertionError with a diff of expected against
    the log and verify's report."""
    __tracebackhide__ = True  # a failure points at the test's line
    report = verify(client, topic, expected=expected, acks=acks, by=by)
    if report.clean:
        return report
    lines = [f"fencelog verify {topic}: not exactly once"]
    if expected is not None:
        lines += diff_lines(client, topic, [_item(v, by) for v in expected], by)
    lines += ["", "fencelog verify's report:", *report_lines(report)]
    raise AssertionError("\n".join(lines))


def diff_lines(client: Client, topic: str, expected: Sequence[bytes], by: By) -> list[str]:
    """Expected items against the log's, as `-` (expected, missing from the log) and `+`
    (in the log more often than expected, or not expected at all) lines, in the order of
    the expected list and then of the log."""
    places: dict[bytes | None, list[str]] = {}
    for record in client.consume(topic):
        item = record.value if by == "value" else record.key
        places.setdefault(item, []).append(f"{record.partition}:{record.offset}")
    wanted = Counter(expected)
    shown: list[str] = []
    for item in dict.fromkeys([*expected, *places]):
        found = places.get(item, [])
        want = wanted.get(item, 0) if item is not None else 0
        if len(found) < want:
            shown.append(f"- {item!r}  expected {_times(want)}, in the log {_times(len(found))}")
        elif len(found) > want:
            where = ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
            reason = "not expected" if not want else f"expected {_times(want)}"
            shown.append(f"+ {item!r}  {reason}, in the log {_times(len(found))} (at {where})")
    header = [f"{by}s: - expected but missing, + in the log but not expected (partition:offset)"]
    if len(shown) > DIFF_LINES_MAX:
        shown = [*shown[:DIFF_LINES_MAX], f"... and {len(shown) - DIFF_LINES_MAX} more lines"]
    return header + shown


def _times(count: int) -> str:
    return {0: "0 times", 1: "once", 2: "twice"}.get(count, f"{count} times")
