"""fencelog lease-pid and fencelog producers list: idempotent producer ids."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.options import JsonFlag
from cli.output import Output

app = typer.Typer(
    help="Inspect idempotent producers.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)


def lease_pid(
    topic: Annotated[str, typer.Argument(help="Topic the pid will write to.")],
    partition: Annotated[int, typer.Argument(help="Partition the pid will write to.")],
    pid: Annotated[
        int | None,
        typer.Option("--pid", help="Resume this pid: print its state on the partition."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Lease a producer id for a partition, or show an existing pid's state there.

    Prints pid, generation (random for a new pid), sequence (the high-water mark: the
    next record carries sequence + 1) and expire_ms. A pid whose lease ended is
    PID_EXPIRED (52); one never leased is UNKNOWN_PID (53).
    """
    lease = state().client().lease_pid(topic, partition, pid)
    out = Output(as_json)
    fields = {
        "pid": lease.producer_id,
        "generation": lease.generation,
        "sequence": lease.sequence,
        "expire_ms": lease.expire_ms,
    }
    if as_json:
        out.json(fields)
    else:
        out.table("lease", list(fields), [list(fields.values())])


@app.command("list")
def list_producers(
    topic: Annotated[str, typer.Argument(help="Topic to show producers of.")],
    as_json: JsonFlag = False,
) -> None:
    """Every producer id on a topic: generation, high-water sequence, lease expiry."""
    client = state().client()
    lease_ms = client.limits.pid_lease_ms
    rows = client.producer_states(topic)
    out = Output(as_json)
    if as_json:
        for partition, entry in rows:
            out.json(
                {
                    "topic": topic,
                    "partition": partition,
                    "pid": entry.producer_id,
                    "generation": entry.generation,
                    "sequence": entry.high_water_sequence,
                    "last_offset": entry.last_offset,
                    "first_record_ms": entry.first_record_ms,
                    "expire_ms": entry.expires_ms(lease_ms),
                }
            )
        return
    table = [
        (
            p,
            e.producer_id,
            e.generation,
            e.high_water_sequence,
            e.last_offset,
            e.expires_ms(lease_ms),
        )
        for p, e in rows
    ]
    columns = ["partition", "pid", "generation", "sequence", "last offset", "expire_ms"]
    out.table(f"producers of {topic}", columns, table)
