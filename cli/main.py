"""The `fencelog` command: global options and the command table."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Final

import click
import typer

from broker import __version__
from broker.client.client import DEFAULT_BROKER
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.types import DURABILITIES, check_durability
from cli import (
    check,
    consume,
    group,
    own,
    produce,
    producers,
    serve,
    snapshot,
    status,
    top,
    topic,
    txn,
    verify,
    wait_ready,
)
from cli.context import State
from cli.errors import FencelogGroup, exit_status_table
from cli.formats import parse_duration

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
            "or the address of a `fencelog serve`: HOST:PORT, tcp://HOST:PORT or "
            "unix://PATH. A directory that does not exist is created only by a command "
            "that writes (or when it is the default, ./.fencelog).",
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
            click_type=click.Choice(DURABILITIES),
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
    request_timeout: Annotated[
        str,
        typer.Option(
            "--request-timeout",
            envvar="FENCELOG_REQUEST_TIMEOUT",
            help="With a served broker: how long a request may wait for its reply (a long "
            "poll's own wait added) before the connection is taken for lost (exit 80).",
            metavar="DURATION",
        ),
    ] = f"{DEFAULT_LIMITS.request_timeout_ms // 1000}s",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """fencelog: a local message broker on SQLite for exactly-once work."""
    token = serve.read_token(auth_token_file) if auth_token_file else None
    request_timeout_s = parse_duration(request_timeout)
    if request_timeout_s <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--request-timeout must be positive")
    source = ctx.get_parameter_source
    ctx.obj = State(
        broker=broker,
        durability=check_durability(durability),
        token=token,
        explicit_broker=source("broker") is not click.core.ParameterSource.DEFAULT,
        explicit_durability=source("durability") is click.core.ParameterSource.COMMANDLINE,
        request_timeout_s=request_timeout_s,
    )


app.add_typer(topic.app, name="topic")
app.add_typer(own.app, name="own")
app.add_typer(producers.app, name="producers")
app.add_typer(snapshot.app, name="snapshot")
app.add_typer(txn.app, name="txn")
app.add_typer(group.app, name="group")
app.command("lease-pid")(producers.lease_pid)
app.command("produce")(produce.produce)
app.command("consume")(consume.consume)
app.command("txn-begin")(txn.txn_begin)
app.command("txn-commit")(txn.txn_commit)
app.command("txn-abort")(txn.txn_abort)
app.command("status")(status.status)
app.command("top")(top.top)
app.command("serve")(serve.serve)
app.command("check")(check.check)
app.command("verify")(verify.verify)
app.command("wait-ready")(wait_ready.wait_ready)


# The root's options that take a value: what to skip on the way to a subcommand's name.
ROOT_VALUE_OPTIONS: Final = frozenset(
    {"--broker", "-b", "--durability", "--auth-token-file", "--request-timeout"}
)


def command(args: Sequence[str] | None = None) -> typer.core.TyperGroup:
    """The `fencelog` command. Given the arguments it is about to parse, only the
    subcommand they name is built: Typer turns every command's signature into click
    parameters up front, which is a tenth of a one-shot command's start."""
    only = invoked(args) if args is not None else None
    chosen = app
    if only is not None:
        chosen = copy.copy(app)  # the same callback and settings, one subcommand
        chosen.registered_commands = [c for c in app.registered_commands if c.name == only]
        chosen.registered_groups = [g for g in app.registered_groups if g.name == only]
    group = typer.main.get_command(chosen)
    assert isinstance(group, FencelogGroup)
    return group


def invoked(args: Sequence[str]) -> str | None:
    """The subcommand that args name; None when the whole tree must answer: help,
    --version, shell completion, an unknown option or command."""
    if "_FENCELOG_COMPLETE" in os.environ:
        return None
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    rest = iter(args)
    for arg in rest:
        if arg in ROOT_VALUE_OPTIONS:
            next(rest, None)
        elif arg.split("=", 1)[0] in ROOT_VALUE_OPTIONS or (arg[:2] == "-b" and len(arg) > 2):
            continue  # --broker=PATH, -bPATH
        else:
            return arg if arg in names else None
    return None


def run() -> None:
    command(sys.argv[1:])(prog_name="fencelog")
