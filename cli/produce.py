"""fencelog produce: append records from --value options or stdin lines."""

# Annotations stay objects here (no `from __future__ import annotations`): Typer reads
# this module's signatures as a one-shot command starts, and string ones it evaluates
# twice over.

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import click
import msgspec
import typer

from broker.client.client import Client, columnar_module
from broker.core import records as record_rules
from broker.core.exclusive import parse_access
from broker.core.txn import parse_txn_id
from broker.errors import BrokerError, ErrorCode
from broker.types import Access, AppendResult, Fence, Headers, NewRecord, ProducerFields
from cli.context import state
from cli.formats import Format, decode_input, parse_duration
from cli.lines import line_batches
from cli.options import FenceOption, FormatOption, JsonFlag
from cli.output import Output, acknowledged
from cli.own import fences_from

if TYPE_CHECKING:
    import pyarrow as pa

    from broker.client.producer import Producer


def _access_modes(incomplete: str) -> list[str]:
    """What --access takes, for shell completion."""
    return [mode.value for mode in Access if mode.value.startswith(incomplete)]


def produce(
    topic: Annotated[str, typer.Argument(help="Topic to append to.")],
    values: Annotated[
        list[str] | None,
        typer.Option(
            "--value", "-v", help="A record value (repeatable). Without it: one per stdin line."
        ),
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Key for every record.")] = None,
    null_value: Annotated[
        str | None,
        typer.Option(
            "--null-value",
            help="A value (a --value, or a stdin line's value) that is exactly MARKER is "
            "sent as a null value: Kafka's tombstone, distinct from an empty value.",
            metavar="MARKER",
        ),
    ] = None,
    key_separator: Annotated[
        str | None,
        typer.Option(
            "--key-separator",
            "-K",
            help="Split each stdin line at the first SEP into key and value.",
            metavar="SEP",
        ),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option(
            "--partition",
            "-p",
            help="Partition for every record. Default: crc32(key) mod partitions, "
            "or round robin without a key.",
        ),
    ] = None,
    headers: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            "-H",
            help="A header NAME=VALUE (repeatable); VALUE is read with --format.",
            metavar="NAME=VALUE",
        ),
    ] = None,
    fence: FenceOption = None,
    idempotent: Annotated[
        bool,
        typer.Option(
            "--idempotent",
            help="Lease pids, number records and retry for you: each record lands once.",
        ),
    ] = False,
    pid: Annotated[
        int | None,
        typer.Option("--pid", help="Producer id from lease-pid (needs --generation, --sequence)."),
    ] = None,
    generation: Annotated[
        int | None, typer.Option("--generation", help="The pid's generation.")
    ] = None,
    sequence: Annotated[
        int | None,
        typer.Option("--sequence", help="Sequence of the first record; the next get +1, +2..."),
    ] = None,
    access: Annotated[
        str | None,
        typer.Option(
            "--access",
            help="Attach as a producer: shared, exclusive (refused if another producer is "
            "attached) or wait-exclusive (queue until exclusive). Held while stdin is open.",
            metavar="MODE",
            autocompletion=_access_modes,
        ),
    ] = None,
    wait_timeout: Annotated[
        str,
        typer.Option(
            "--wait-timeout",
            help="With --access wait-exclusive: give up after this long (exit 62).",
            metavar="DURATION",
        ),
    ] = "30s",
    producer_name: Annotated[
        str | None,
        typer.Option("--producer-name", help="Name shown in topic describe (default: host-pid)."),
    ] = None,
    txn: Annotated[
        str | None,
        typer.Option(
            "--txn",
            help="Journal the records into this open transaction (from txn-begin): no "
            "consumer sees them until txn-commit.",
            metavar="TXN_ID",
        ),
    ] = None,
    member: Annotated[
        str | None,
        typer.Option(
            "--member",
            help="With --txn: write as this named member. Running again under the same "
            "name replaces the member's earlier records in the transaction.",
            metavar="NAME",
        ),
    ] = None,
    arrow: Annotated[
        str | None,
        typer.Option(
            "--arrow",
            help="Append the rows of an Arrow IPC file or stream, or a Parquet file (- : an "
            "IPC stream on stdin): a value column, and key and partition columns if it has "
            "them. Needs pyarrow (the spark extra).",
            metavar="FILE",
        ),
    ] = None,
    fmt: FormatOption = Format.text,
    as_json: JsonFlag = False,
) -> None:
    """Append records to a topic and report where each landed.

    Each batch (every --value together, or the stdin lines already available) is appended
    atomically. With --json, one object per record: topic, partition, offset,
    value_sha256 (what `fencelog verify --acks` checks) and, for --idempotent or --pid,
    duplicate.
    With --pid/--generation/--sequence a retry of records already written is answered
    with their original offsets and "duplicate": true (exit 0).
    With --txn the records wait in the transaction's journal: offset is null, and they
    get their offsets when the transaction commits.
    With --arrow the records are the rows of a file, appended column by column, batch
    by batch, each cut into atomic appends as stdin lines are (a null in its value
    column: a null value).
    With --null-value MARKER a value that is exactly MARKER (before --format decodes
    it) is a null value, which `consume --json` prints as null and compaction removes
    with its key; its value_sha256 is null.
    """
    _arrow_options(
        arrow,
        {
            "--value": values or None,
            "--key": key,
            "--key-separator": key_separator,
            "--null-value": null_value,
            "--partition": partition,
            "--header": headers or None,
            "--idempotent": idempotent or None,
            "--pid": pid,
            "--generation": generation,
            "--sequence": sequence,
            "--access": access,
            "--producer-name": producer_name,
            "--wait-timeout": None if wait_timeout == "30s" else wait_timeout,
            "--format": None if fmt is Format.text else fmt,
        },
    )
    record_key = _key(key, key_separator, fmt)
    null_marker = None if null_value is None else null_value.encode("utf-8", "surrogateescape")
    parsed = _headers(headers or [], fmt)
    fences = fences_from(fence or [])
    txn_id = _txn_options(txn, member, idempotent, pid, access)
    client = state().client(create=True)
    out = Output(as_json)
    summary = _Summary(topic, txn_id)

    if arrow is not None:
        _produce_file(client, arrow, out, summary, member, fences)
        return

    def records_of(lines: Iterable[bytes]) -> list[NewRecord]:
        records = []
        for index, line in enumerate(lines):
            try:
                records.append(
                    _record(line, record_key, key_separator, parsed, partition, fmt, null_marker)
                )
            except BrokerError as error:  # numbered as the broker numbers a batch's records
                raise BrokerError(
                    error.code,
                    f"record {index}: {error.message}",
                    **{**error.details, "index": index, "hint": error.hint},
                ) from None
        return records

    if access is not None:
        if pid is not None or fences:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT, "--access does not combine with --pid or --fence"
            )
        attached = _attach(client, topic, access, idempotent, producer_name, wait_timeout)
        send: Send = attached.send
        if not as_json:
            sys.stderr.write(f"attached to {topic} as {access} at epoch {attached.epoch}\n")
    elif txn_id is not None:
        fields = (
            client.txn_join(txn_id, member).producer
            if member is not None
            else ProducerFields(txn_id=txn_id)
        )
        send = partial(client.produce, topic, producer=fields, fences=fences)
    else:
        send = _sender(client, topic, fences, idempotent, (pid, generation, sequence), partition)
    numbered = idempotent or pid is not None  # JSON then says whether each was a duplicate
    if values:
        encoded = [v.encode("utf-8", "surrogateescape") for v in values]
        records = records_of(encoded)
        _emit(out, summary, records, send(records), idempotent=numbered)
        if not as_json:
            out.line(summary.text())
    else:
        _produce_stdin(client, out, summary, records_of, send, numbered)


def _produce_stdin(
    client: Client,
    out: Output,
    summary: "_Summary",
    records_of: Callable[[Iterable[bytes]], list[NewRecord]],
    send: "Send",
    numbered: bool,
) -> None:
    """stdin's lines, a record each, appended batch by batch and reported; a refused
    line names its line number, and the summary says what landed before it."""
    if sys.stdin.isatty():
        sys.stderr.write("reading records from stdin, one per line; Ctrl-D ends\n")
    limits = client.limits
    stop = _Stop()
    batches = line_batches(
        sys.stdin.buffer, limits.append_records_max, limits.append_bytes_max // 2, stop.requested
    )
    lines_before = 0
    try:
        with _stopped_by_signals(stop), acknowledged(f"producing to {summary.topic}") as advance:
            for batch in batches:
                try:
                    with stop.sending_batch():
                        results = send(records := records_of(batch))
                except BrokerError as error:
                    raise _at_line(error, lines_before) from None
                _emit(out, summary, records, results, idempotent=numbered)
                lines_before += len(batch)
                advance(len(batch))
    finally:  # also when a later line is refused: what landed before it
        if not out.as_json and (summary.count or sys.exc_info()[0] is None):
            out.line(summary.text())


def _at_line(error: BrokerError, lines_before: int) -> BrokerError:
    """A refused record of stdin's batch named by its input line, not its index in
    the batch (`record 0: ...` -> `line 101: ...`)."""
    index = error.details.get("index")
    prefix = f"record {index}: "
    if not isinstance(index, int) or not error.message.startswith(prefix):
        return error
    line = lines_before + index + 1
    message = f"line {line}: {error.message.removeprefix(prefix)}"
    return BrokerError(error.code, message, **{**error.details, "line": line})


def _key(key: str | None, separator: str | None, fmt: Format) -> bytes | None:
    """--key, decoded with --format; checked against --key-separator."""
    if key is not None and separator is not None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, "--key and --key-separator exclude each other"
        )
    if separator == "":
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--key-separator must not be empty")
    return (
        None if key is None else decode_input(key.encode("utf-8", "surrogateescape"), fmt, "--key")
    )


def _arrow_options(arrow: str | None, options: dict[str, object]) -> None:
    """--arrow takes each record's key and partition from the file: the options that
    make records, or number or attach them, are refused beside it."""
    given = [name for name, value in options.items() if value is not None]
    if arrow is not None and given:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--arrow does not combine with {', '.join(given)}",
            hint="the file's key and partition columns give each record's",
        )


def _arrow_batches(path: str) -> Iterator["pa.RecordBatch"]:
    """The record batches of an Arrow IPC file or stream, or of a Parquet file ("-": an
    IPC stream on stdin); what cannot be read is INVALID_ARGUMENT, saying why."""
    columnar_module("--arrow")  # a clear error where pyarrow is missing
    import pyarrow as pa
    import pyarrow.ipc as pa_ipc
    import pyarrow.parquet as pq

    if path == "-" and sys.stdin.isatty():
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "--arrow - reads an Arrow IPC stream from stdin, and stdin is a terminal",
            hint="pipe a stream in, or name a file",
        )
    try:
        if path == "-":
            yield from pa_ipc.open_stream(sys.stdin.buffer)
            return
        with open(path, "rb") as file:
            magic = file.read(6)
        if magic[:4] == b"PAR1":
            yield from pq.ParquetFile(path).iter_batches()
        elif magic == b"ARROW1":
            with pa.memory_map(path) as source:
                reader = pa_ipc.open_file(source)
                for index in range(reader.num_record_batches):
                    yield reader.get_batch(index)
        else:
            with pa.OSFile(path) as source:
                yield from pa_ipc.open_stream(source)
    except OSError as exc:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"cannot read {path}: {exc}") from exc
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"cannot read {path} as Parquet, an Arrow IPC file or an IPC stream: {exc}",
        ) from exc


def _produce_file(
    client: Client,
    path: str,
    out: Output,
    summary: "_Summary",
    member: str | None,
    fences: Sequence[Fence],
) -> None:
    """--arrow: each batch of the file as columns (broker.types.RecordColumns), cut
    into atomic appends as stdin's lines are, each reported as _emit reports lines
    (into summary.txn_id, if any). The first batch's columns are checked before
    anything is sent or a member joined (joining again discards the member's earlier
    records); a later batch refused ends it, what landed before it said."""
    columnar = columnar_module("--arrow")
    limits = msgspec.structs.replace(
        client.limits, append_bytes_max=client.limits.append_bytes_max // 2
    )
    batches = _arrow_batches(path)
    first = next(batches, None)
    records = None if first is None else columnar.record_columns(first)
    fields = ProducerFields(txn_id=summary.txn_id)
    if records is not None and summary.txn_id is not None and member is not None:
        fields = client.txn_join(summary.txn_id, member).producer
    stop = _Stop()
    try:
        with _stopped_by_signals(stop), acknowledged(f"producing to {summary.topic}") as advance:
            while records is not None and not stop.requested.is_set():
                for piece in record_rules.split_batches(records, limits):
                    if stop.requested.is_set():
                        break
                    with stop.sending_batch():
                        results = client.produce(
                            summary.topic, piece, producer=fields, fences=fences
                        )
                    _emit(out, summary, piece, results, idempotent=False)
                    advance(len(piece))
                batch = next(batches, None)
                records = None if batch is None else columnar.record_columns(batch)
    finally:  # also when a later batch is refused: what landed before it
        if not out.as_json and (summary.count or sys.exc_info()[0] is None):
            out.line(summary.text())


class _Stop:
    """Ctrl-C or SIGTERM, as produce takes them: the first stops reading (the batch being
    sent, if one is, is still acknowledged), a second abandons what is in flight."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.sending = threading.Event()  # a batch is on its way, not yet acknowledged

    @contextlib.contextmanager
    def sending_batch(self) -> Iterator[None]:
        self.sending.set()
        try:
            yield
        finally:
            self.sending.clear()

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        name = signal.Signals(signum).name
        if self.sending.is_set():
            sys.stderr.write(f"{name}: finishing the batch in flight (again to abandon it)\n")
        else:
            sys.stderr.write(f"{name}: stopping; no batch was in flight\n")


@contextlib.contextmanager
def _stopped_by_signals(stop: _Stop) -> Iterator[None]:
    """Ctrl-C or SIGTERM stops reading stdin: the batch being sent is still acknowledged,
    then the summary is printed and produce exits 0. A second one abandons it."""
    previous = {s: signal.signal(s, stop.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


Send = Callable[[list[NewRecord]], Sequence[AppendResult]]


def _attach(
    client: Client,
    topic: str,
    access: str,
    idempotent: bool,
    name: str | None,
    wait_timeout: str,
) -> "Producer":
    """A producer attached with an access mode, detached when the command ends."""
    parse_access(access)  # a clear error before anything else
    wait_s = parse_duration(wait_timeout)
    if wait_s < 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--wait-timeout must be >= 0")
    attached = client.producer(
        topic, idempotent=idempotent, access=access, name=name, wait_timeout_s=wait_s
    )
    click.get_current_context().call_on_close(attached.close)
    return attached


def _txn_options(
    txn: str | None, member: str | None, idempotent: bool, pid: int | None, access: str | None
) -> int | None:
    if txn is None:
        if member is not None:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--member goes with --txn")
        return None
    if idempotent or pid is not None or access is not None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "--txn does not combine with --idempotent, --pid or --access",
            hint="a transaction is all or nothing already; retry it as a whole",
        )
    return parse_txn_id(txn)


def _sender(
    client: Client,
    topic: str,
    fences: Sequence[Fence],
    idempotent: bool,
    explicit: tuple[int | None, int | None, int | None],
    partition: int | None,
) -> Send:
    """How this invocation appends: plainly, as an idempotent producer, or with the
    producer fields given on the command line."""
    if all(value is None for value in explicit):
        if idempotent:  # its fences (given, or an enclosing `own`'s) go with every batch
            return client.producer(topic, fences=fences).send
        return lambda records: client.produce(topic, records, fences=fences)
    pid, generation, first = explicit
    if pid is None or generation is None or first is None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, "--pid, --generation and --sequence go together"
        )
    if idempotent or partition is None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "--pid needs --partition (sequences are per partition) and excludes --idempotent",
        )
    next_sequence = [first]

    def send(records: list[NewRecord]) -> Sequence[AppendResult]:
        fields = ProducerFields(pid, generation, next_sequence[0])
        results = client.produce(topic, records, producer=fields, fences=fences)
        next_sequence[0] += len(records)
        return results

    return send


def _record(
    line: bytes,
    key: bytes | None,
    separator: str | None,
    headers: Headers,
    partition: int | None,
    fmt: Format,
    null_marker: bytes | None = None,
) -> NewRecord:
    """A line's record; a value that is exactly null_marker (before --format decodes
    it) is a null value."""
    if separator is not None:
        raw_key, found, raw_value = line.partition(separator.encode("utf-8"))
        if not found:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"no key separator {separator!r} in {line[:40]!r}",
            )
        key = decode_input(raw_key, fmt, "key")
        line = raw_value
    value = None if line == null_marker else decode_input(line, fmt, "value")
    return NewRecord(value, key, headers, partition)


def _headers(pairs: Sequence[str], fmt: Format) -> Headers:
    """NAME=VALUE pairs; VALUE is decoded with --format, as consume encodes it."""
    parsed = []
    for pair in pairs:
        name, found, value = pair.partition("=")
        if not found or not name:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"header {pair!r} is not NAME=VALUE",
                hint="e.g. --header trace=abc",
            )
        raw = value.encode("utf-8", "surrogateescape")
        parsed.append((name, decode_input(raw, fmt, f"header {name}")))
    return tuple(parsed)


class _Summary:
    def __init__(self, topic: str, txn_id: int | None = None) -> None:
        self.topic = topic
        self.txn_id = txn_id
        self.ranges: dict[int, tuple[int, int]] = {}
        self.count = 0
        self.duplicates = 0  # answered as a retry's duplicates: there already
        self.partitions: set[int] = set()

    def add(self, result: AppendResult) -> None:
        self.count += 1
        self.duplicates += result.duplicate
        self.partitions.add(result.partition)
        if result.offset < 0:  # journaled (offsets come at commit), or retention deleted it
            return
        low, high = self.ranges.get(result.partition, (result.offset, result.offset))
        self.ranges[result.partition] = (min(low, result.offset), max(high, result.offset))

    def text(self) -> str:
        plural = "record" if self.count == 1 else "records"
        if self.txn_id is not None and not self.count:
            return f"journaled nothing to {self.topic}: there was no record to send"
        if self.txn_id is not None:
            partitions = ", ".join(map(str, sorted(self.partitions)))
            which = "partition" if len(self.partitions) == 1 else "partitions"
            return (
                f"journaled {self.count} {plural} to {self.topic} ({which} {partitions}) "
                f"in transaction {self.txn_id}; consumers see them after txn-commit"
            )
        where = ", ".join(
            f"partition {p} offsets {lo}-{hi}" if lo != hi else f"partition {p} offset {lo}"
            for p, (lo, hi) in sorted(self.ranges.items())
        )
        at = f": {where}" if where else ""
        if not self.count:
            return f"produced nothing to {self.topic}: there was no record to send"
        if self.duplicates == self.count:
            return (
                f"nothing new in {self.topic}: the {plural} {'was' if self.count == 1 else 'were'} "
                f"there already (a retry's {'duplicate' if self.count == 1 else 'duplicates'}, "
                f"not appended again){at}"
            )
        again = (
            f" ({self.duplicates} of them there already: a retry's duplicates, not appended again)"
            if self.duplicates
            else ""
        )
        return f"produced {self.count} {plural} to {self.topic}{at}{again}"


def _emit(
    out: Output,
    summary: _Summary,
    records: Sequence[NewRecord],
    results: Sequence[AppendResult],
    *,
    idempotent: bool,
) -> None:
    if out.as_json:
        from broker.core.verify import value_sha256  # --json only: a plain produce skips it
    for record, result in zip(records, results, strict=True):
        summary.add(result)
        if out.as_json:
            fields: dict[str, object] = {
                "topic": result.topic,
                "partition": result.partition,
                "offset": result.offset if result.offset >= 0 else None,
                "value_sha256": value_sha256(record.value),  # what `fencelog verify --acks` checks
            }
            if summary.txn_id is not None:
                fields["txn_id"] = summary.txn_id
            if idempotent:
                fields["duplicate"] = result.duplicate
            out.json(fields)
    out.flush()
