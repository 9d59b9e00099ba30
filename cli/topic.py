"""fencelog topic create | list | describe | delete."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from msgspec.structs import replace

from broker.errors import BrokerError, ErrorCode
from broker.types import AccessInfo, Attached, TopicConfig, TopicInfo
from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.formats import duration_text, parse_duration, parse_size
from cli.options import JsonFlag
from cli.output import Output, warn

RetentionOption = Annotated[
    str | None,
    typer.Option(
        "--retention",
        help="Delete records older than this (by their timestamp): 7d, 12h... ('none': keep).",
        metavar="DURATION",
    ),
]
RetentionBytesOption = Annotated[
    str | None,
    typer.Option(
        "--retention-bytes",
        help="Delete each partition's oldest records past this size: 1GiB, 500MB... "
        "('none': no limit).",
        metavar="SIZE",
    ),
]
CleanupOption = Annotated[
    str | None,
    typer.Option(
        "--cleanup",
        help="delete (retention only) or compact (keep the newest record of each key; "
        "every record then needs a key).",
        metavar="POLICY",
    ),
]

app = typer.Typer(
    help="Create, alter, clean, list, describe and delete topics.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)


def topic_dict(info: TopicInfo, *, partitions: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "topic": info.name,
        "partitions": info.partitions,
        "records": info.records,
        "bytes": info.bytes,
        "created_ms": info.created_ms,
        "owner_group": info.owner_group,
        "config": {
            "retention_ms": info.config.retention_ms,
            "retention_bytes": info.config.retention_bytes,
            "cleanup": info.config.cleanup,
        },
    }
    if partitions:
        result["partition_details"] = [
            {
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "records": p.records,
                "bytes": p.bytes,
            }
            for p in info.partition_details
        ]
    return result


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Topic name: A-Z a-z 0-9 . _ - (1-249).")],
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", help="Number of partitions.")
    ] = 1,
    owner_group: Annotated[
        str | None,
        typer.Option(
            "--owner-group",
            help="Writes to partition P need the fence of TOPIC/P in this group.",
            metavar="GROUP",
        ),
    ] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="Succeed if the topic already exists.")
    ] = False,
    retention: RetentionOption = None,
    retention_bytes: RetentionBytesOption = None,
    cleanup: CleanupOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a topic with N partitions (and a retention or compaction)."""
    config = _config(TopicConfig(), retention, retention_bytes, cleanup)
    client = state().client(create=True)
    existing = False
    try:
        info = client.create_topic(
            name,
            partitions,
            owner_group=owner_group,
            config=None if config == TopicConfig() else config,
        )
    except BrokerError as error:
        if not (if_not_exists and error.code is ErrorCode.TOPIC_EXISTS):
            raise
        info, existing = client.describe_topic(name), True
    out = Output(as_json)
    if existing and info.partitions != partitions:
        warn(
            f"topic {name} already exists with {info.partitions} partitions, not "
            f"{partitions}: left as it is"
        )
    if as_json:
        out.json(topic_dict(info, partitions=False) | {"existing": existing})
    else:
        plural = "partition" if info.partitions == 1 else "partitions"
        already = " (already there: left as it is)" if existing else ""
        out.line(f"topic {info.name}: {info.partitions} {plural}{already}")


@app.command("alter")
def alter(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            "-p",
            help="More partitions (never fewer): keyed records route by the new count.",
        ),
    ] = None,
    retention: RetentionOption = None,
    retention_bytes: RetentionBytesOption = None,
    cleanup: CleanupOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Change a topic's partitions, retention or cleanup; what is not given stays."""
    if partitions is None and retention is None and retention_bytes is None and cleanup is None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "nothing to alter",
            hint="give --partitions, --retention, --retention-bytes or --cleanup",
        )
    client = state().client()
    current = client.describe_topic(name)
    config = _config(current.config, retention, retention_bytes, cleanup)
    info = client.alter_topic(
        name, partitions=partitions, config=None if config == current.config else config
    )
    out = Output(as_json)
    if as_json:
        out.json(topic_dict(info, partitions=False))
    else:
        count = f"{info.partitions} partition{'' if info.partitions == 1 else 's'}"
        out.line(f"topic {info.name}: {count}, {_config_text(info.config)}")


@app.command("clean")
def clean(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonFlag = False,
) -> None:
    """Apply the topic's retention and compaction now (serve also does, every
    --clean-interval), in short steps; print the records deleted."""
    client = state().client()
    deleted = client.clean_topic(name)
    info = client.describe_topic(name)
    out = Output(as_json)
    if as_json:
        out.json({"topic": name, "deleted": deleted} | topic_dict(info, partitions=True))
    else:
        out.line(f"cleaned {name}: {deleted} record{'' if deleted == 1 else 's'} deleted")


def _config(
    current: TopicConfig,
    retention: str | None,
    retention_bytes: str | None,
    cleanup: str | None,
) -> TopicConfig:
    """current with the options given applied ('none' clears a limit)."""
    config = current
    if retention is not None:
        ms = None if retention == "none" else int(parse_duration(retention) * 1000)
        config = replace(config, retention_ms=ms)
    if retention_bytes is not None:
        size = None if retention_bytes == "none" else parse_size(retention_bytes)
        config = replace(config, retention_bytes=size)
    if cleanup is not None:
        config = replace(config, cleanup=cleanup)
    return config


def _config_text(config: TopicConfig) -> str:
    parts = [f"cleanup {config.cleanup}"]
    if config.retention_ms is not None:
        parts.append(f"retention {duration_text(config.retention_ms)}")
    if config.retention_bytes is not None:
        parts.append(f"at most {config.retention_bytes} bytes per partition")
    return ", ".join(parts)


@app.command("list")
def list_topics(as_json: JsonFlag = False) -> None:
    """List topics with their partitions, records and bytes."""
    topics = state().client().list_topics()
    out = Output(as_json)
    if as_json:
        for info in topics:
            out.json(topic_dict(info, partitions=False))
        return
    rows = [(t.name, t.partitions, t.records, t.bytes, t.owner_group or "") for t in topics]
    out.table("topics", ["topic", "partitions", "records", "bytes", "owner group"], rows)


@app.command("describe")
def describe(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonFlag = False,
) -> None:
    """Show a topic's retention and cleanup, its partitions (log start and end offsets,
    sizes), each consumer group's committed offset and lag, and its producers: access
    mode, epoch, the exclusive producer, shared producers and waiters."""
    client = state().client()
    info = client.describe_topic(name)
    access = client.topic_access(name)
    ends = {p.partition: p.end_offset for p in info.partition_details}
    lags = [
        (row.group, row.partition, row.next_offset, max(0, ends[row.partition] - row.next_offset))
        for row in client.consumer_groups()
        if row.topic == name and row.partition in ends
    ]
    out = Output(as_json)
    if as_json:
        groups = [
            {"group": g, "partition": p, "committed_offset": c, "lag": lag} for g, p, c, lag in lags
        ]
        out.json(
            topic_dict(info, partitions=True) | {"access": access_dict(access), "groups": groups}
        )
        return
    rows = [
        (p.partition, p.start_offset, p.end_offset, p.records, p.bytes)
        for p in info.partition_details
    ]
    columns = ["partition", "start offset", "end offset", "records", "bytes"]
    out.table(f"topic {info.name}: {_config_text(info.config)}", columns, rows)
    if lags:
        out.table("consumer groups", ["group", "partition", "committed offset", "lag"], lags)
    producers = [(a.mode, a.name, a.epoch, a.session_id) for a in _attached(access)]
    out.table(
        f"access: {access.mode}, epoch {access.epoch}",
        ["mode", "producer", "epoch", "session"],
        producers,
    )


def _attached(access: AccessInfo) -> list[Attached]:
    exclusive = [access.exclusive] if access.exclusive is not None else []
    return [*exclusive, *access.shared, *access.waiting]


def access_dict(access: AccessInfo) -> dict[str, Any]:
    def producer(a: Attached) -> dict[str, Any]:
        return {"name": a.name, "epoch": a.epoch, "session": a.session_id, "id": a.attachment_id}

    return {
        "mode": access.mode,
        "epoch": access.epoch,
        "exclusive": None if access.exclusive is None else producer(access.exclusive),
        "shared": [producer(a) for a in access.shared],
        "waiting": [producer(a) for a in access.waiting],
    }


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonFlag = False,
) -> None:
    """Delete a topic and every record in it."""
    state().client().delete_topic(name)
    out = Output(as_json)
    if as_json:
        out.json({"topic": name, "deleted": True})
    else:
        out.line(f"deleted topic {name}")
