"""fencelog consume: read records from a topic, or tail it with --follow.

With --group G it starts at G's committed offsets (--from for partitions without one)
and commits as it goes: after each fetched batch has been printed and stdout flushed, so
a record is committed only once it was written out (at-least-once for a pipeline: a
reader that dies before handling what was written sees it again). With --txn ID the
offsets are committed into that open transaction instead and take effect at its commit:
a consume-transform-produce loop that produces into the same transaction is exactly once.
"""

# Annotations stay objects here (no `from __future__ import annotations`): Typer reads
# this module's signatures as a one-shot command starts, and string ones it evaluates
# twice over.

import signal
from collections.abc import Sequence
from types import FrameType
from typing import Annotated, Any, Final

import click
import typer

from broker.client.client import Client
from broker.core.txn import parse_txn_id
from broker.errors import BrokerError, ErrorCode
from broker.types import Record
from cli.context import state
from cli.formats import Format, Rendering, parse_duration
from cli.options import FenceOption, JsonFlag
from cli.output import Output, progress, warn
from cli.own import fences_from
from cli.positions import Where, offsets_for, parse_where
from cli.template import Template, TemplateError, is_template

# The columns of consume's text output (tab-separated when piped; a stable contract).
TEXT_COLUMNS: Final = ("partition", "offset", "key", "value")
_TABLE_ROWS: Final = 1000
NULL_SHOWN: Final = "(null)"  # a null value (Kafka's tombstone) in text output; --json: null


def _check_formats(values: list[str] | None) -> list[str] | None:
    """--format: at most one encoding (text, base64, hex) and one template (usage errors)."""
    encodings = [v for v in values or [] if not is_template(v)]
    templates = [v for v in values or [] if is_template(v)]
    for value in encodings:
        if value.lower() not in Format.__members__:
            raise click.BadParameter(
                f"{value!r} is not text, base64, hex or a template with %-tokens"
            )
    if len(encodings) > 1 or len(templates) > 1:
        raise click.BadParameter("give at most one encoding and one template")
    for value in templates:
        try:
            Template(value)
        except TemplateError as exc:
            raise click.BadParameter(str(exc)) from exc
    return values


def _formats(values: list[str] | None) -> tuple[Format, Template | None]:
    encoding = next((v.lower() for v in values or [] if not is_template(v)), "text")
    template = next((Template(v) for v in values or [] if is_template(v)), None)
    return Format(encoding), template


FormatsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--format",
        help="How keys and values are written: text (UTF-8), base64 or hex (binary-safe); "
        "or a template as kcat -f: %t topic, %p partition, %o offset, %T timestamp, "
        "%k key, %s value, %K/%S their lengths, %h headers, %%, \\n \\t. Give both to "
        "combine: --format hex --format '%k %s\\n'.",
        metavar="FORMAT",
        callback=_check_formats,
    ),
]


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
            help="Where to start: beginning, end, an offset, -N (the last N of each "
            "partition), or @TIME: the first record at or after an ISO 8601 time "
            "(@2026-11-24T10:00:00Z) or a duration ago (@-1h). With --group: for "
            "partitions the group has not committed.",
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
            help="Keep waiting for new records, as tail -f (Ctrl-C stops, exit 0); "
            "without --partition, partitions added meanwhile are read from their beginning.",
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
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-G",
            help="Consumer group: start at its committed offsets and commit each batch "
            "once printed and flushed (at-least-once).",
        ),
    ] = None,
    txn: Annotated[
        str | None,
        typer.Option(
            "--txn",
            help="With --group: commit the offsets into this open transaction (from "
            "txn-begin), taking effect at its commit: exactly once with produce --txn.",
        ),
    ] = None,
    fence: FenceOption = None,
    formats: FormatsOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Print a topic's records: up to the end offsets, or (--follow) as they arrive.

    With --json, one object per record: topic, partition, offset, timestamp_ms, key, value,
    headers, epoch (the exclusive-producer epoch it was written under); a null value
    (Kafka's tombstone) is "value": null there, and (null) in text output. Text values
    that are not valid UTF-8 are shown with U+FFFD; use --format base64 to see their
    exact bytes. --compacted prints the newest record of every key (the compacted view).
    --group G resumes from G's committed offsets and commits as it goes, after the
    records are written out; with --txn ID into that transaction.
    """
    timeout_s = parse_duration(timeout) if timeout is not None else None
    fmt, template = _formats(formats)
    where = parse_where(start, "--from")
    txn_id = _txn_option(txn, group, template, as_json, compacted)
    client = state().client()
    if compacted:
        if follow or start != "beginning" or fence:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                "--compacted reads a snapshot of every key: no --follow, --from or --fence",
            )
        _consume_compacted(client, topic, partitions, max_records, fmt, as_json)
        return
    _check_open(client, txn_id)
    starts = _starts(client, topic, partitions, where, group)
    if where.kind == "offset":
        ends = client.end_offsets(topic)
        _warn_past_end(topic, ends, partitions, where.value, follow)
    batches = client.consume_batches(
        topic,
        partition=partitions or None,
        start=starts,
        max_records=max_records,
        follow=follow,
        timeout_s=timeout_s,
        fences=fences_from(fence or []),
    )
    out = Output(as_json)
    shown = _Shown(out, Rendering(fmt), table=not follow, template=template)
    committer = None if group is None else _Committer(client, group, topic, txn_id)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    total = None if follow else _bounded_total(client.end_offsets(topic), starts)
    try:
        with progress(f"consuming {topic}", total) as advance:
            for batch in batches:
                for record in batch:
                    shown.add(record)
                    advance(1)
                    if follow:  # a tail reaches a pipe record by record
                        out.flush()
                if committer is not None:
                    shown.flush()
                    committer.commit(shown.positions)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        shown.flush()
        if committer is not None:  # what was printed and flushed before a stop
            committer.commit(shown.positions)
    _warn_lossy(shown.rendering)


def _txn_option(
    txn: str | None, group: str | None, template: Template | None, as_json: bool, compacted: bool
) -> int | None:
    if template is not None and as_json:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--json and a --format template conflict")
    if group is not None and compacted:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--compacted does not commit: no --group")
    if txn is None:
        return None
    if group is None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "--txn commits a group's offsets: it goes with --group",
            hint="e.g. consume in --group copier --txn $TXN",
        )
    return parse_txn_id(txn)


def _check_open(client: Client, txn_id: int | None) -> None:
    """--txn names a transaction still open (else its error, before reading anything)."""
    if txn_id is None:
        return
    info = client.txn_show(txn_id, records_max=0).info
    if info.state != "open":
        raise BrokerError(
            # as producing into it says: aborted is 71, committed (or committing) 72
            ErrorCode.TXN_ABORTED if info.state == "aborted" else ErrorCode.TXN_NOT_OPEN,
            f"transaction {txn_id} is {info.state}: offsets go into an open one",
            hint="begin another with fencelog txn-begin",
        )


def _consume_compacted(
    client: Client,
    topic: str,
    partitions: list[int] | None,
    max_records: int | None,
    fmt: Format,
    as_json: bool,
) -> None:
    compact = _Shown(Output(as_json), Rendering(fmt), table=True)
    chosen: list[int | None] = list(partitions) if partitions else [None]
    latest = [r for p in chosen for r in client.read_compacted(topic, p)]
    for record in latest[:max_records] if max_records is not None else latest:
        compact.add(record)
    compact.flush()


def _starts(
    client: Client, topic: str, partitions: list[int] | None, where: Where, group: str | None
) -> dict[int, int]:
    """Each partition's first offset: the group's committed one, else --from's."""
    committed = client.committed_offsets(group, topic)[0] if group is not None else {}
    chosen = client.positions(topic, partitions or None, "beginning")
    missing = [p for p in chosen if p not in committed]
    fallback = offsets_for(client, topic, missing, where) if missing else {}
    return {p: committed[p] if p in committed else fallback[p] for p in chosen}


class _Committer:
    """Commits the group's next offsets of what was shown, only those that moved."""

    def __init__(self, client: Client, group: str, topic: str, txn_id: int | None) -> None:
        self.client, self.group, self.topic, self.txn_id = client, group, topic, txn_id
        self.committed: dict[int, int] = {}

    def commit(self, positions: dict[int, int]) -> None:
        moved = {p: o for p, o in positions.items() if self.committed.get(p) != o}
        if not moved:
            return
        if self.txn_id is None:
            self.client.commit_offsets(self.group, self.topic, moved)
        else:
            self.client.txn_commit_offsets(self.txn_id, self.group, self.topic, moved)
        self.committed.update(moved)


_ONE_LINE: Final = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _warn_lossy(rendering: Rendering) -> None:
    if rendering.escaped:
        escaped = rendering.escaped
        warn(
            f"{escaped} {'field' if escaped == 1 else 'fields'} held tabs or line breaks, "
            "shown as \\t \\n \\r to keep one record a line; "
            "use --format base64 or --json to see them exactly"
        )
    if rendering.lossy:
        lossy = rendering.lossy
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
    """Records as the user sees them: JSON lines, a template's text, tab-separated lines
    (piped, or a tail), or on a terminal rich tables of up to _TABLE_ROWS records each.
    positions: the next offset of each partition after what was shown."""

    def __init__(
        self,
        out: Output,
        rendering: Rendering,
        *,
        table: bool,
        template: Template | None = None,
    ) -> None:
        self.out = out
        self.rendering = rendering
        self.template = template
        self.table = table and out.rich and template is None
        self.rows: list[tuple[int, int, str, str]] = []
        self.positions: dict[int, int] = {}

    def add(self, record: Record) -> None:
        self._show(record)
        self.positions[record.partition] = record.offset + 1

    def _show(self, record: Record) -> None:
        if self.out.as_json:
            self.out.json(record_dict(record, self.rendering))
            return
        if self.template is not None:
            self.out.stream.write(self.template.render(record, self.rendering))
            return
        key = self.rendering.show(record.key)
        row = (record.partition, record.offset, "" if key is None else key)
        value = NULL_SHOWN if record.value is None else self.rendering.show(record.value) or ""
        if self.table:
            self.rows.append((*row, value))
            if len(self.rows) >= _TABLE_ROWS:
                self.flush()
            return
        key_text, value = self._one_line(row[2]), self._one_line(value)
        self.out.line(f"{row[0]}\t{row[1]}\t{key_text}\t{value}")

    def _one_line(self, text: str) -> str:
        """A field of a tab-separated line: its tabs and line breaks as \\t, \\n, \\r,
        so a record stays one line of four fields (counted, and warned of once)."""
        if "\t" not in text and "\n" not in text and "\r" not in text:
            return text
        self.rendering.escaped += 1
        return text.translate(_ONE_LINE)

    def flush(self) -> None:
        if self.rows:
            self.out.table("", TEXT_COLUMNS, self.rows)
            self.rows = []
        self.out.flush()


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _bounded_total(ends: Sequence[int], starts: dict[int, int]) -> int:
    return sum(max(0, ends[p] - offset) for p, offset in starts.items() if p < len(ends))


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
