"""fencelog consume: read records from a topic, or tail it with --follow."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated, Any, Final

import typer

from broker.client.client import Start
from broker.errors import BrokerError, ErrorCode
from broker.types import Record
from cli.context import state
from cli.formats import Format, Rendering, parse_duration
from cli.options import FenceOption, FormatOption, JsonFlag
from cli.output import Output, progress, warn
from cli.own import fences_from

# The columns of consume's text output (tab-separated when piped; a stable contract).
TEXT_COLUMNS: Final = ("partition", "offset", "key", "value")
_TABLE_ROWS: Final = 1000


def consume(
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    partitions: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", help="Partition to read (repeatable). Default: all."),
    ] = None,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            "-o",
            help="Where to start: beginning, end, or an offset (kcat's -o).",
            metavar="WHERE",
        ),
    ] = "beginning",
    max_records: Annotated[
        int | None,
        typer.Option("--max", "-c", "-n", help="Stop after N records (kcat's -c).", min=0),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            "-F",
            help="Keep waiting for new records, as tail -f (Ctrl-C stops, exit 0).",
        ),
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
        compact = _Shown(Output(as_json), Rendering(fmt), table=True)
        chosen: list[int | None] = list(partitions) if partitions else [None]
        latest = [r for p in chosen for r in client.read_compacted(topic, p)]
        for record in latest[:max_records] if max_records is not None else latest:
            compact.add(record)
        compact.flush()
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
    shown = _Shown(out, Rendering(fmt), table=not follow)
    first = _start(start)
    ends = client.end_offsets(topic) if not follow or isinstance(first, int) else []
    if isinstance(first, int):
        _warn_past_end(topic, ends, partitions, first, follow)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    total = None if follow else _bounded_total(ends, partitions, start)
    try:
        with progress(f"consuming {topic}", total) as advance:
            for record in records:
                shown.add(record)
                advance(1)
                if follow:  # a tail reaches a pipe record by record
                    out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        shown.flush()
    if shown.rendering.lossy:
        lossy = shown.rendering.lossy
        warn(
            f"{lossy} {'record' if lossy == 1 else 'records'} had bytes "
            "that are not UTF-8, shown as U+FFFD; "
            "use --format base64 to see them exactly"
        )


def _warn_past_end(
    topic: str, ends: list[int], partitions: list[int] | None, first: int, follow: bool
) -> None:
    """--from N beyond a partition's end reads nothing there (yet): say so."""
    chosen = partitions or range(len(ends))
    past = [(p, ends[p]) for p in chosen if 0 <= p < len(ends) and first > ends[p]]
    if not past:
        return
    where = ", ".join(f"{topic}/{p} ends at {end}" for p, end in past)
    then = "waiting for it" if follow else "nothing to read there"
    warn(f"--from {first} is past the end ({where}): {then}")


class _Shown:
    """Records as the user sees them: JSON lines, tab-separated lines (piped, or a
    tail), or on a terminal rich tables of up to _TABLE_ROWS records each."""

    def __init__(self, out: Output, rendering: Rendering, *, table: bool) -> None:
        self.out = out
        self.rendering = rendering
        self.table = table and out.rich
        self.rows: list[tuple[int, int, str, str]] = []

    def add(self, record: Record) -> None:
        if self.out.as_json:
            self.out.json(record_dict(record, self.rendering))
            return
        key = self.rendering.show(record.key)
        row = (record.partition, record.offset, "" if key is None else key)
        value = self.rendering.show(record.value) or ""
        if self.table:
            self.rows.append((*row, value))
            if len(self.rows) >= _TABLE_ROWS:
                self.flush()
            return
        self.out.line(f"{row[0]}\t{row[1]}\t{row[2]}\t{value}")

    def flush(self) -> None:
        if self.rows:
            self.out.table("", TEXT_COLUMNS, self.rows)
            self.rows = []
        self.out.flush()


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
