"""The `fencelog` command: global options and the command table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from broker import __version__
from broker.client import DEFAULT_BROKER
from broker.storage.database import Durability
from cli import consume, own, produce, producers, serve, snapshot, status, topic, txn
from cli.context import State
from cli.errors import FencelogGroup, exit_status_table

_EXIT_STATUSES = "\n".join(f"  {status_:>3}  {name}" for status_, name in exit_status_table())

app = typer.Typer(
    cls=FencelogGroup,
    name="fencelog",
    help="fencelog: a local message broker on SQLite for exactly-once work.",
    epilog=f"Exit statuses (one per error class; see fencelog(1)):\n\n\b\n{_EXIT_STATUSES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fencelog {__version__}")
        raise typer.Exit


@app.callback()
def main(
    ctx: typer.Context,
    broker: Annotated[
        str,
        typer.Option(
            "--broker",
            "-b",
            envvar="FENCELOG_BROKER",
            help="A data directory (embedded, or through the server that owns it), "
            "or tcp://HOST:PORT / unix://PATH of a `fencelog serve`.",
            metavar="PATH",
        ),
    ] = DEFAULT_BROKER,
    durability: Annotated[
        str,
        typer.Option(
            "--durability",
            envvar="FENCELOG_DURABILITY",
            help="full: an acknowledged write survives power loss (fsync on every commit). "
            "normal: it survives a crash of the process, not of the machine.",
            click_type=click.Choice(["full", "normal"]),
        ),
    ] = "full",
    auth_token_file: Annotated[
        Path | None,
        typer.Option(
            "--auth-token-file",
            envvar="FENCELOG_AUTH_TOKEN_FILE",
            help="Token for a server started with --auth-token-file.",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """fencelog: a local message broker on SQLite for exactly-once work."""
    chosen: Durability = "full" if durability == "full" else "normal"
    token = serve.read_token(auth_token_file) if auth_token_file else None
    ctx.obj = State(broker=broker, durability=chosen, token=token)


app.add_typer(topic.app, name="topic")
app.add_typer(own.app, name="own")
app.add_typer(producers.app, name="producers")
app.add_typer(snapshot.app, name="snapshot")
app.add_typer(txn.app, name="txn")
app.command("lease-pid")(producers.lease_pid)
app.command("produce")(produce.produce)
app.command("consume")(consume.consume)
app.command("txn-begin")(txn.txn_begin)
app.command("txn-commit")(txn.txn_commit)
app.command("txn-abort")(txn.txn_abort)
app.command("status")(status.status)
app.command("serve")(serve.serve)


def command() -> typer.core.TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, FencelogGroup)
    return group


def run() -> None:
    command()(prog_name="fencelog")
