"""fencelog verify: check a topic's log against what was acknowledged or expected.

The log is read through the client (embedded or served, as every command); the checking
itself is broker/core/verify.py. Anomalies found exit with VERIFY_FAILED (90) after the
report; bad input (an unreadable file, a garbage ack line) is a one-line error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.core.verify import EXAMPLES_MAX, Ack, By, Checker, counts_text, plural, report_lines
from broker.errors import BrokerError, ErrorCode
from cli.context import state
from cli.formats import Format, decode_input
from cli.options import FormatOption, JsonFlag
from cli.output import Output


def verify(
    topic: Annotated[str, typer.Argument(help="Topic to check.")],
    acks: Annotated[
        list[Path] | None,
        typer.Option(
            "--acks",
            help="`produce --json` output (one ack per line: partition, offset, "
            "value_sha256): every acknowledged record must be in the log once, at its "
            "offset, with the same bytes. Repeatable, one file per producer; - is stdin.",
            metavar="FILE",
        ),
    ] = None,
    expect: Annotated[
        Path | None,
        typer.Option(
            "--expect",
            help="Expected values (or keys, with --by key), one per line in --format, in "
            "the order they were produced: each must be in the log exactly once, and "
            "nothing else. - is stdin.",
            metavar="FILE",
        ),
    ] = None,
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="What makes two records duplicates: value, or key.",
            metavar="value|key",
        ),
    ] = "value",
    examples: Annotated[
        int,
        typer.Option(
            "--examples",
            help="Anomalies listed per kind and partition (all are counted).",
            min=0,
        ),
    ] = EXAMPLES_MAX,
    fmt: FormatOption = Format.text,
    as_json: JsonFlag = False,
) -> None:
    """Check a topic for lost, duplicated or misordered records.

    Reports, per partition and overall: acknowledged records lost (missing, or other
    bytes at their offset), duplicates, records out of order (per key against --expect,
    per ack file against its acks), offset gaps, an idempotent producer's sequences that
    skip or repeat, records of a fenced generation or an older epoch written after a
    newer one's first record, and transactions on the topic still open or past their
    deadline. Exit 0 when clean; 90 (VERIFY_FAILED) when anomalies were found.
    With --json, one object: counts per kind, per-partition findings with examples.
    """
    checked_by = _by(by)
    parsed_acks = [ack for path in acks or [] for ack in read_acks(path, topic)]
    expected = None if expect is None else read_expected(expect, fmt)
    client = state().client()
    info = client.describe_topic(topic)
    checker = Checker(
        topic,
        info.partition_details,
        acks=parsed_acks,
        expected=expected,
        by=checked_by,
        examples_max=examples,
    )
    for record in client.consume(topic):
        checker.record(record)
    report = checker.finish(client.txn_list(limit=10_000))
    out = Output(as_json)
    if as_json:
        out.json(report.to_dict())
    else:
        for line in report_lines(report):
            out.line(line)
    out.flush()
    if not report.clean:
        raise BrokerError(
            ErrorCode.VERIFY_FAILED,
            f"{report.anomalies} {plural(report.anomalies, 'anomaly', 'anomalies')} in "
            f"{topic}: {counts_text(report.counts)}",
            hint="the report on stdout lists them",
        )


def _by(text: str) -> By:
    if text == "value":
        return "value"
    if text == "key":
        return "key"
    raise BrokerError(
        ErrorCode.INVALID_ARGUMENT, f"--by {text!r} is not value or key", hint="e.g. --by key"
    )


def _read(path: Path, what: str) -> bytes:
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"cannot read {what} {str(path)!r}: {exc.strerror or exc}",
        ) from None


def read_acks(path: Path, topic: str) -> list[Ack]:
    """The acks of one file: JSON objects with partition and offset (and topic,
    value_sha256, as `produce --json` prints them); blank lines are skipped. Acks of a
    transaction (offset null) have no place in the log yet and are left out."""
    acks = []
    for number, line in enumerate(_read(path, "ack file").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise _bad_ack(where, "is not a JSON object", line) from None
        if not isinstance(obj, dict):
            raise _bad_ack(where, "is not a JSON object", line)
        if obj.get("topic", topic) != topic:
            raise _bad_ack(where, f"is an ack of topic {obj['topic']!r}, not {topic!r}", line)
        if "offset" in obj and obj["offset"] is None:
            continue
        partition, offset = _count(obj.get("partition")), _count(obj.get("offset"))
        if partition is None or offset is None:
            raise _bad_ack(where, "needs a partition and an offset (integers >= 0)", line)
        digest = obj.get("value_sha256")
        if digest is not None and not _is_sha256(digest):
            raise _bad_ack(where, "has a value_sha256 that is not a SHA-256 hex digest", line)
        acks.append(Ack(partition, offset, digest, str(path), number))
    return acks


def _count(value: Any) -> int | None:
    """value when it is an integer >= 0 (an offset, a partition), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def _is_sha256(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def _bad_ack(where: str, what: str, line: bytes) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        f"ack {where} {what}: {line[:60]!r}",
        hint="pass the output of `fencelog produce --json`",
    )


def read_expected(path: Path, fmt: Format) -> list[bytes]:
    lines = _read(path, "expected file").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the last line's newline
    return [
        decode_input(line.removesuffix(b"\r"), fmt, f"{path} line {number}")
        for number, line in enumerate(lines, start=1)
    ]
