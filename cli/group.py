"""fencelog group list, describe and reset: consumer groups, their offsets and lag.

A consumer group is its committed offsets (consume --group, the Python client's
commit_offsets, Kafka clients' OffsetCommit, transactions' offsets). Lag is a partition's
end offset minus the group's committed offset. A Kafka consumer group on the server's
Kafka listener also has a state and live members, each with its client id and assigned
partitions (soft state of the listener, asked of the server); fencelog's own consumers
do not join a group, so their groups' members are not known: `members` is null.
A reset of a Kafka consumer group with live members on the server's Kafka listener is
refused (GROUP_NOT_EMPTY), as Kafka's reset is. Otherwise it is a plain commit, not
refused while fencelog's own consumers run (fencelog cannot see them): a running
`consume --group`, or an open transaction holding the group's offsets, overwrites it
with its next commit, so stop them first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from broker.client.client import Client
from broker.core.ownership import check_name
from broker.errors import BrokerError, ErrorCode
from broker.rows import GroupOffsetRow
from broker.types import KafkaGroup
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
MEMBER_COLUMNS = ("group", "state", "member", "client id", "assigned")
GroupArgument = Annotated[str, typer.Argument(help="The consumer group.")]


def group_lags(
    client: Client, rows: list[GroupOffsetRow], kafka: Sequence[KafkaGroup] | None = None
) -> list[dict[str, Any]]:
    """One dict per group: its committed offsets, end offsets and lag per partition, and
    for a Kafka group (kafka: the live ones), its state and members."""
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
    live = {group.group: group for group in kafka or ()}
    return [
        {
            "group": g,
            "state": live[g].state if g in live else None,
            "members": _members(live[g]) if g in live else None,
            "lag": sum(o["lag"] for o in groups[g]),
            "offsets": groups[g],
        }
        for g in sorted(set(groups) | set(live))
    ]


def _members(group: KafkaGroup) -> list[dict[str, Any]]:
    return [
        {
            "member_id": m.member_id,
            "group_instance_id": m.group_instance_id,
            "client_id": m.client_id,
            "assignment": [{"topic": t, "partitions": list(ps)} for t, ps in m.assignment],
        }
        for m in group.members
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
    members = [
        (g["group"], g["state"], m["member_id"], m["client_id"], _assigned(m["assignment"]))
        for g in groups
        for m in g["members"] or ()
    ]
    if members:
        out.table("Kafka group members", MEMBER_COLUMNS, members)


def _assigned(assignment: list[dict[str, Any]]) -> str:
    return " ".join(f"{a['topic']}/{','.join(map(str, a['partitions']))}" for a in assignment)


@app.command("list")
def group_list(as_json: JsonFlag = False) -> None:
    """Every consumer group: committed offsets, end offsets and lag per partition, and
    the Kafka groups' members.

    With --json, one object per group: group, state (a Kafka group's: Stable,
    PreparingRebalance, Reconciling...; null for fencelog's own groups), members (a Kafka group's
    live members: member_id, group_instance_id, client_id, assignment [{topic,
    partitions}]; null for fencelog's own, whose consumers do not join a group), lag
    (the sum), offsets (topic, partition, committed_offset, end_offset, lag,
    committed_ms).
    """
    client = state().client()
    found = group_lags(client, client.consumer_groups(), client.kafka_groups())
    _print(Output(as_json), found)


@app.command("describe")
def group_describe(group: GroupArgument, as_json: JsonFlag = False) -> None:
    """One consumer group, as group list shows it; UNKNOWN_GROUP (43) if it never
    committed and no Kafka consumer is in it."""
    check_name("consumer group", group)
    client = state().client()
    rows = [r for r in client.consumer_groups() if r.group == group]
    live = [g for g in client.kafka_groups() or () if g.group == group]
    found = group_lags(client, rows, live)
    if not found:
        raise BrokerError(
            ErrorCode.UNKNOWN_GROUP,
            f"consumer group {group!r} has no committed offsets and no Kafka members",
            hint="fencelog group list shows the groups",
        )
    _print(Output(as_json), found)


def _refuse_live_kafka_members(client: Client, group: str) -> None:
    """Kafka refuses to reset a group that is not empty: its members would commit over
    the reset. fencelog knows its Kafka listener's members (not its own consumers')."""
    for found in client.kafka_groups() or ():
        if found.group == group and found.members:
            raise BrokerError(
                ErrorCode.GROUP_NOT_EMPTY,
                f"consumer group {group} has {len(found.members)} live Kafka "
                f"member{'s' if len(found.members) > 1 else ''} ({found.state})",
                group=group,
                hint="stop its consumers first; a group's offsets can be reset once it is empty",
            )


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
    _refuse_live_kafka_members(client, group)
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
