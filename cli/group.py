"""fencelog group list, describe and reset: consumer groups, their offsets and lag.

A consumer group is its committed offsets (consume --group, the Python client's
commit_offsets, Kafka clients' OffsetCommit, transactions' offsets). Lag is a partition's
end offset minus the group's committed offset. fencelog's own consumers do not join a
group, so members are not known: `members` is null. A reset is a plain commit and is not
refused while consumers run (fencelog cannot see them): a running `consume --group`, or an
open transaction holding the group's offsets, overwrites it with its next commit, so stop
them first, as Kafka's reset requires.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

import typer

from broker.client.client import Client
from broker.core.ownership import check_name
from broker.errors import BrokerError, ErrorCode
from broker.rows import GroupOffsetRow
from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.options import JsonFlag
from cli.output import Output
from cli.positions import offsets_for, parse_where

app = typer.Typer(
    help="Consumer groups: committed offsets, lag, reset.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)

COLUMNS = ("group", "topic", "partition", "committed offset", "end offset", "lag")
GroupArgument = Annotated[str, typer.Argument(help="The consumer group.")]


def group_lags(client: Client, rows: list[GroupOffsetRow]) -> list[dict[str, Any]]:
    """One dict per group: its committed offsets, end offsets and lag per partition."""
    ends: dict[str, list[int]] = {}
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.topic not in ends:
            ends[row.topic] = client.end_offsets(row.topic)
        end = ends[row.topic][row.partition]
        groups[row.group].append(
            {
                "topic": row.topic,
                "partition": row.partition,
                "committed_offset": row.next_offset,
                "end_offset": end,
                "lag": max(0, end - row.next_offset),
                "committed_ms": row.committed_ms,
            }
        )
    return [
        {"group": g, "members": None, "lag": sum(o["lag"] for o in offsets), "offsets": offsets}
        for g, offsets in sorted(groups.items())
    ]


def _print(out: Output, groups: list[dict[str, Any]]) -> None:
    if out.as_json:
        for group in groups:
            out.json(group)
        return
    rows = [
        (g["group"], o["topic"], o["partition"], o["committed_offset"], o["end_offset"], o["lag"])
        for g in groups
        for o in g["offsets"]
    ]
    out.table("consumer groups", COLUMNS, rows)


@app.command("list")
def group_list(as_json: JsonFlag = False) -> None:
    """Every consumer group: committed offsets, end offsets and lag per partition.

    With --json, one object per group: group, members (null: fencelog's consumers do not
    join a group), lag (the sum), offsets (topic, partition, committed_offset,
    end_offset, lag, committed_ms).
    """
    client = state().client()
    _print(Output(as_json), group_lags(client, client.consumer_groups()))


@app.command("describe")
def group_describe(group: GroupArgument, as_json: JsonFlag = False) -> None:
    """One consumer group, as group list shows it; UNKNOWN_GROUP (43) if it never committed."""
    check_name("consumer group", group)
    client = state().client()
    found = group_lags(client, [r for r in client.consumer_groups() if r.group == group])
    if not found:
        raise BrokerError(
            ErrorCode.UNKNOWN_GROUP,
            f"consumer group {group!r} has no committed offsets",
            hint="fencelog group list shows the groups",
        )
    _print(Output(as_json), found)


@app.command("reset")
def group_reset(
    group: GroupArgument,
    topic: Annotated[str, typer.Argument(help="The topic whose offsets move.")],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="earliest, latest, an offset (kept within each partition's start and end), "
            "-N (N before the end) or @TIME (the first record at or after it).",
            metavar="WHERE",
        ),
    ],
    partitions: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", help="Partition to reset (repeatable). Default: all."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Move a group's committed offsets on a topic; print each partition's old and new.

    Stop the group's consumers first: a running `consume --group` commits over a reset.
    """
    check_name("consumer group", group)
    where = parse_where(to, "--to")
    client = state().client()
    details = {p.partition: p for p in client.describe_topic(topic).partition_details}
    before = client.committed_offsets(group, topic)[0]
    offsets = {
        p: min(max(offset, details[p].start_offset), details[p].end_offset)
        for p, offset in offsets_for(client, topic, partitions, where).items()
    }
    client.commit_offsets(group, topic, offsets)
    out = Output(as_json)
    rows = [
        {"group": group, "topic": topic, "partition": p, "from": before.get(p), "to": offset}
        for p, offset in sorted(offsets.items())
    ]
    if as_json:
        for row in rows:
            out.json(row)
        return
    out.table(
        "reset", ("group", "topic", "partition", "from", "to"), [tuple(r.values()) for r in rows]
    )
