"""fencelog topic create | list | describe | delete."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from broker.errors import BrokerError, ErrorCode
from broker.types import AccessInfo, Attached, TopicInfo
from cli.context import state
from cli.options import JsonFlag
from cli.output import Output

app = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)


def topic_dict(info: TopicInfo, *, partitions: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "topic": info.name,
        "partitions": info.partitions,
        "records": info.records,
        "bytes": info.bytes,
        "created_ms": info.created_ms,
        "owner_group": info.owner_group,
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
    as_json: JsonFlag = False,
) -> None:
    """Create a topic with N partitions."""
    client = state().client(create=True)
    try:
        info = client.create_topic(name, partitions, owner_group=owner_group)
    except BrokerError as error:
        if not (if_not_exists and error.code is ErrorCode.TOPIC_EXISTS):
            raise
        info = client.describe_topic(name)
    out = Output(as_json)
    if as_json:
        out.json(topic_dict(info, partitions=False))
    else:
        plural = "partition" if info.partitions == 1 else "partitions"
        out.line(f"topic {info.name}: {info.partitions} {plural}")


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
    """Show a topic's partitions (offsets, sizes) and its producers: access mode, epoch,
    the exclusive producer, shared producers and waiters."""
    client = state().client()
    info = client.describe_topic(name)
    access = client.topic_access(name)
    out = Output(as_json)
    if as_json:
        out.json(topic_dict(info, partitions=True) | {"access": access_dict(access)})
        return
    rows = [
        (p.partition, p.start_offset, p.end_offset, p.records, p.bytes)
        for p in info.partition_details
    ]
    columns = ["partition", "start offset", "end offset", "records", "bytes"]
    out.table(f"topic {info.name}", columns, rows)
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
