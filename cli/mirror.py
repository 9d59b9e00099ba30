"""fencelog mirror: copy topics to (--to) or from (--from) a Kafka cluster, exactly once.

The work is broker/mirror/ (through the client and confluent-kafka); this module reads
the options, shows progress on a terminal, prints the outcome (or --json lines, one per
step), and takes Ctrl-C or SIGTERM as the end of a follow: the batch in flight is
committed or not, and the next run resumes from the last commit.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.errors import BrokerError, ErrorCode
from broker.mirror.api import BATCH_RECORDS_MAX
from broker.mirror.api import mirror as run_mirror
from broker.mirror.plan import config_file_lines, kafka_settings
from cli.context import state
from cli.formats import parse_duration
from cli.options import JsonFlag
from cli.output import Output, acknowledged, warn


def mirror(
    topics: Annotated[
        list[str],
        typer.Option(
            "--topic",
            "-t",
            help="A topic of the source, or a regular expression matched against whole "
            "topic names (repeatable).",
            metavar="NAME_OR_REGEX",
        ),
    ],
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Copy the --broker's topics into this Kafka cluster.",
            metavar="kafka://HOST:PORT[,HOST:PORT]",
        ),
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Copy this Kafka cluster's topics into the --broker.",
            metavar="kafka://HOST:PORT[,HOST:PORT]",
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="Copy up to the source's end offsets as they are at the start, then exit "
            "(otherwise follow until Ctrl-C or SIGTERM).",
        ),
    ] = False,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Where the mirror keeps its position on the target (a Kafka group and "
            "transactional id, or a fencelog group); the same group resumes. Default: "
            "derived from the --topic values.",
            metavar="GROUP",
        ),
    ] = None,
    groups: Annotated[
        list[str] | None,
        typer.Option(
            "--groups",
            help="Consumer groups of the source whose committed offsets are translated to "
            "the target's offsets of the same records once the copy ends (repeatable, or "
            "comma-separated). A group with live members is refused.",
            metavar="GROUP[,GROUP]",
        ),
    ] = None,
    kafka_config: Annotated[
        list[str] | None,
        typer.Option(
            "--kafka-config",
            help="A librdkafka setting for the Kafka side, KEY=VALUE (repeatable): "
            "security.protocol, sasl.*, ssl.* ... Values are never printed.",
            metavar="KEY=VALUE",
        ),
    ] = None,
    kafka_config_file: Annotated[
        Path | None,
        typer.Option(
            "--kafka-config-file",
            help="librdkafka settings, one KEY=VALUE per line (# comments).",
            metavar="FILE",
        ),
    ] = None,
    kafka_timeout: Annotated[
        str,
        typer.Option(
            "--kafka-timeout",
            help="How long each request to the Kafka cluster may take before the mirror "
            "gives up (exit 80).",
            metavar="DURATION",
        ),
    ] = "10s",
    batch_records: Annotated[
        int,
        typer.Option(
            "--batch-records",
            help="Records per transaction, at most.",
            min=1,
            max=BATCH_RECORDS_MAX,
        ),
    ] = 1000,
    as_json: JsonFlag = False,
) -> None:
    """Copy topics to or from a Kafka cluster, exactly once and resumable.

    Each batch is written in one transaction of the target together with the mirror's
    position, so a mirror killed at any moment and started again copies nothing twice
    and loses nothing; a second --once over the same data copies nothing. Keys, values,
    headers, timestamps and partition numbers are kept; a missing target topic is created
    with the source's partitions, cleanup policy and retention, and one with fewer
    partitions is refused. Exit 0 when done or stopped by Ctrl-C/SIGTERM in a follow.
    """
    cluster, into_kafka = _direction(to, from_)
    settings = _settings(kafka_config or [], kafka_config_file)
    timeout_s = parse_duration(kafka_timeout)
    client = state().client(create=not into_kafka)
    out = Output(as_json)
    with _stop_flag(enabled=not once) as stopped, acknowledged("mirror") as advance:
        summary = run_mirror(
            client,
            cluster,
            topics,
            into_kafka=into_kafka,
            group=group,
            once=once,
            groups=[g.strip() for text in groups or [] for g in text.split(",") if g.strip()],
            kafka_config=settings,
            timeout_s=timeout_s,
            batch_records=batch_records,
            should_stop=stopped,
            on_event=lambda event: _event(out, event, cluster, advance),
        )
    done = {"event": "done", "records": summary.records, "topics": summary.per_topic}
    if as_json:
        out.json(done | {"stopped": summary.stopped})
    else:
        copied = ", ".join(f"{t} {n}" for t, n in summary.per_topic.items())
        where = f"into {cluster}" if into_kafka else f"from {cluster}"
        noun = "record" if summary.records == 1 else "records"
        out.line(f"copied {summary.records} {noun} {where} ({copied})")
    out.flush()


def _direction(to: str | None, from_: str | None) -> tuple[str, bool]:
    if (to is None) == (from_ is None):
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "give one of --to or --from",
            hint="--to kafka://HOST:PORT copies into Kafka, --from kafka://HOST:PORT out of it",
        )
    return (to, True) if to is not None else (str(from_), False)


def _settings(pairs: list[str], path: Path | None) -> dict[str, str]:
    lines = []
    if path is not None:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"cannot read --kafka-config-file {str(path)!r}: {getattr(exc, 'strerror', exc)}",
            ) from None
        lines += config_file_lines(text, str(path))
    lines += [(f"value {number}", pair) for number, pair in enumerate(pairs, start=1)]
    return kafka_settings(lines)


def _event(
    out: Output, event: dict[str, Any], cluster: str, advance: Callable[[int], None]
) -> None:
    if event["event"] == "warning":
        warn(event["message"])  # on stderr, a JSON object with --json
        return
    if out.as_json:
        out.json(event)
        out.flush()
        return
    kind = event["event"]
    if kind == "copied":
        advance(event["records"])
    elif kind == "created":
        out.line(f"created {event['topic']} ({event['partitions']} partitions)")
    elif kind == "group":
        moved = ", ".join(
            f"{event['topic']}/{p} {o['source']} -> {o['target']}"
            for p, o in event["offsets"].items()
        )
        out.line(f"group {event['group']}: {moved}")
        for partition in event["ahead"]:
            out.line(
                f"group {event['group']}: {event['topic']}/{partition} is past what was "
                "copied; left as it is (run the mirror again, then translate)"
            )


@contextlib.contextmanager
def _stop_flag(*, enabled: bool) -> Iterator[Callable[[], bool]]:
    """A follow ends at Ctrl-C or SIGTERM, between batches; --once is interrupted as
    any command is (130)."""
    if not enabled:
        yield lambda: False
        return
    stop = False

    def handler(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
