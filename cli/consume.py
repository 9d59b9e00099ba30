"""fencelog consume: read records from a topic, or tail it with --follow."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated, Any

import typer

from broker.client.client import Start
from broker.errors import BrokerError, ErrorCode
from broker.types import Record
from cli.context import state
from cli.formats import Format, Rendering, parse_duration
from cli.options import FenceOption, FormatOption, JsonFlag
from cli.output import Output, progress, warn
from cli.own import fences_from


def consume(
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    partitions: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", help="Partition to read (repeatable). Default: all."),
    ] = None,
    start: Annotated[
        str,
        typer.Option(
            "--from", help="Where to start: beginning, end, or an offset.", metavar="WHERE"
        ),
    ] = "beginning",
    max_records: Annotated[
        int | None, typer.Option("--max", "-n", help="Stop after N records.", min=0)
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-F", help="Keep waiting for new records (Ctrl-C stops, exit 0)."),
    ] = False,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            help="With --follow: stop after this long with no new record (500ms, 30s, 2m).",
            metavar="DURATION",
        ),
    ] = None,
    compacted: Annotated[
        bool,
        typer.Option(
            "--compacted", help="Only the newest record of every key (records without a key: none)."
        ),
    ] = False,
    fence: FenceOption = None,
    fmt: FormatOption = Format.text,
    as_json: JsonFlag = False,
) -> None:
    """Print a topic's records: up to the end offsets, or (--follow) as they arrive.

    With --json, one object per record: topic, partition, offset, timestamp_ms, key, value,
    headers, epoch (the exclusive-producer epoch it was written under). Text values that
    are not valid UTF-8 are shown with U+FFFD; use --format base64 to see their exact
    bytes. --compacted prints the newest record of every key (the compacted view).
    """
    timeout_s = parse_duration(timeout) if timeout is not None else None
    client = state().client()
    if compacted:
        if follow or start != "beginning" or fence:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                "--compacted reads a snapshot of every key: no --follow, --from or --fence",
            )
        out = Output(as_json)
        rendering = Rendering(fmt)
        chosen: list[int | None] = list(partitions) if partitions else [None]
        latest = [r for p in chosen for r in client.read_compacted(topic, p)]
        for record in latest[:max_records] if max_records is not None else latest:
            _print(out, rendering, record)
        out.flush()
        return
    records = client.consume(
        topic,
        partition=partitions or None,
        start=_start(start),
        max_records=max_records,
        follow=follow,
        timeout_s=timeout_s,
        fences=fences_from(fence or []),
    )
    out = Output(as_json)
    rendering = Rendering(fmt)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    total = None if follow else _bounded_total(client.end_offsets(topic), partitions, start)
    try:
        with progress(f"consuming {topic}", total) as advance:
            for record in records:
                _print(out, rendering, record)
                advance(1)
                if follow:  # a tail reaches a pipe record by record
                    out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        out.flush()
    if rendering.lossy:
        warn(
            f"{rendering.lossy} {'record' if rendering.lossy == 1 else 'records'} had bytes "
            "that are not UTF-8, shown as U+FFFD; "
            "use --format base64 to see them exactly"
        )


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _start(text: str) -> Start:
    if text in ("beginning", "end"):
        return "beginning" if text == "beginning" else "end"
    if _is_offset(text):
        return int(text)
    raise BrokerError(
        ErrorCode.INVALID_ARGUMENT,
        f"--from {text!r} is not beginning, end or an offset",
        hint="e.g. --from beginning, --from end, --from 42",
    )


def _is_offset(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _bounded_total(ends: list[int], partitions: list[int] | None, start: str) -> int | None:
    if not _is_offset(start) and start != "beginning":
        return None
    first = int(start) if _is_offset(start) else 0
    chosen = partitions or range(len(ends))
    return sum(max(0, ends[p] - first) for p in chosen if 0 <= p < len(ends))


def record_dict(record: Record, rendering: Rendering) -> dict[str, Any]:
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": rendering.show(record.key),
        "value": rendering.show(record.value),
        "headers": [[name, rendering.show(value)] for name, value in record.headers],
        "epoch": record.epoch,
    } | ({"txn_id": record.txn_id} if record.txn_id is not None else {})


def _print(out: Output, rendering: Rendering, record: Record) -> None:
    if out.as_json:
        out.json(record_dict(record, rendering))
        return
    key = rendering.show(record.key)
    value = rendering.show(record.value) or ""
    out.line(f"{record.partition}\t{record.offset}\t{'' if key is None else key}\t{value}")
