"""The `fencelog` command: global options and the command table."""

# Annotations stay objects here (no `from __future__ import annotations`): Typer reads
# this module's signatures as a one-shot command starts, and string ones it evaluates
# twice over.

import gc
import importlib
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Final

import click
import typer

from broker import __version__
from broker.client.client import DEFAULT_BROKER
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS
from broker.types import DURABILITIES, check_durability
from cli.context import State
from cli.errors import SUGGEST_COMMANDS, FencelogGroup, exit_status_table
from cli.formats import parse_duration

# A refused connection is retried this long (a server starting), then exit 80: a CLI
# command against a port nobody listens on says so at once; `wait-ready` waits for a start.
CONNECT_TIMEOUT: Final = "500ms"
_EXIT_STATUSES = "\n".join(f"  {status_:>3}  {name}" for status_, name in exit_status_table())

# Every subcommand, in the order of `fencelog --help`: (name, module, attribute), where
# the attribute is a command function, or "app" for a group of subcommands. A module is
# imported only when its subcommand is built: a one-shot command loads its own alone.
SUBCOMMANDS: Final = (
    ("topic", "cli.topic", "app"),
    ("own", "cli.own", "app"),
    ("producers", "cli.producers", "app"),
    ("snapshot", "cli.snapshot", "app"),
    ("txn", "cli.txn", "app"),
    ("group", "cli.group", "app"),
    ("lease-pid", "cli.producers", "lease_pid"),
    ("produce", "cli.produce", "produce"),
    ("consume", "cli.consume", "consume"),
    ("txn-begin", "cli.txn", "txn_begin"),
    ("txn-commit", "cli.txn", "txn_commit"),
    ("txn-abort", "cli.txn", "txn_abort"),
    ("status", "cli.status", "status"),
    ("top", "cli.top", "top"),
    ("serve", "cli.serve", "serve"),
    ("check", "cli.check", "check"),
    ("verify", "cli.verify", "verify"),
    ("mirror", "cli.mirror", "mirror"),
    ("wait-ready", "cli.wait_ready", "wait_ready"),
)
SETTINGS: Final = dict(
    cls=FencelogGroup,
    name="fencelog",
    help="fencelog: a local message broker on SQLite for exactly-once work.",
    epilog=f"Exit statuses (one per error class; see fencelog(1)):\n\n\b\n{_EXIT_STATUSES}",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fencelog {__version__}")
        raise typer.Exit


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
    connect_timeout: Annotated[
        str,
        typer.Option(
            "--connect-timeout",
            envvar="FENCELOG_CONNECT_TIMEOUT",
            help="With a served broker: how long to retry a refused connection (a server "
            "starting) before exit 80. To wait for a server to start, use wait-ready.",
            metavar="DURATION",
        ),
    ] = CONNECT_TIMEOUT,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """fencelog: a local message broker on SQLite for exactly-once work."""
    if auth_token_file:
        from cli.serve import read_token

        token = read_token(auth_token_file)
    else:
        token = None
    request_timeout_s = parse_duration(request_timeout)
    if request_timeout_s <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--request-timeout must be positive")
    connect_timeout_s = parse_duration(connect_timeout)
    source = ctx.get_parameter_source
    if not broker.strip() and source("broker") is click.core.ParameterSource.COMMANDLINE:
        raise BrokerError(  # `--broker "$BROKER"` with the variable unset
            ErrorCode.INVALID_ARGUMENT,
            "--broker is empty",
            hint="give a data directory or HOST:PORT, or leave --broker out for ./.fencelog",
        )
    ctx.obj = State(
        broker=broker,
        durability=check_durability(durability),
        token=token,
        explicit_broker=source("broker") is not click.core.ParameterSource.DEFAULT,
        explicit_durability=source("durability") is click.core.ParameterSource.COMMANDLINE,
        request_timeout_s=request_timeout_s,
        connect_timeout_s=connect_timeout_s,
    )


# The root's options that take a value: what to skip on the way to a subcommand's name.
ROOT_VALUE_OPTIONS: Final = frozenset(
    {
        "--broker",
        "-b",
        "--durability",
        "--auth-token-file",
        "--request-timeout",
        "--connect-timeout",
    }
)


def command(args: Sequence[str] | None = None) -> typer.core.TyperGroup:
    """The `fencelog` command. Given the arguments it is about to parse, only the
    subcommand they name is imported and built: Typer turns every command's signature
    into click parameters up front, and each module brings imports of its own, which
    together are most of a one-shot command's start."""
    only = invoked(args) if args is not None else None
    group = typer.main.get_command(tree(None if only is None else {only}))
    assert isinstance(group, FencelogGroup)
    return group


def tree(names: Collection[str] | None = None) -> typer.Typer:
    """The root command with the subcommands named (None: all of them)."""
    root = typer.Typer(**SETTINGS)  # type: ignore[arg-type]
    root.callback()(main)
    for name, module_name, attribute in SUBCOMMANDS:
        if names is not None and name not in names:
            continue
        found = getattr(importlib.import_module(module_name), attribute)
        if attribute == "app":
            root.add_typer(found, name=name)
        else:
            root.command(name)(found)
    return root


def invoked(args: Sequence[str]) -> str | None:
    """The subcommand that args name; None when the whole tree must answer: help,
    --version, shell completion, an unknown option or command."""
    if "_FENCELOG_COMPLETE" in os.environ:
        return None
    names = {name for name, _, _ in SUBCOMMANDS}
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
    try:
        command(sys.argv[1:])(prog_name="fencelog")
    finally:
        # The process ends here, and what is alive now lives until it does. Frozen, those
        # objects are left out of the collector's passes at interpreter shutdown, which
        # otherwise walk every imported module's objects: about 12 ms of a one-shot
        # command's 90 (bench/RESULTS.md, "CLI start").
        gc.freeze()
