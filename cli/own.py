"""fencelog own: claim (group, resource) ownership with generations, and inspect it.

    fencelog own GROUP RESOURCE... [--generation G]            claim and hold until Ctrl-C
    fencelog own GROUP RESOURCE... --generation G -- CMD ARGS  hold while CMD runs
    fencelog own GROUP RESOURCE... --once                      claim, print, exit
    fencelog own list | release | history

A claim belongs to a session: this process (embedded) or its connection (served), so it
lasts as long as this command runs. `-- CMD` runs CMD with FENCELOG_OWNER_GROUP,
FENCELOG_OWNER_RESOURCES and FENCELOG_OWNER_GENERATION set (fencelog commands inside
pick the fence up), releases when CMD exits and exits with CMD's status; if a newer claim
severs this one, CMD gets SIGTERM, then SIGKILL after --grace, and own exits 42 (SEVERED).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from broker.client.client import Client
from broker.core.ownership import parse_fence
from broker.errors import BrokerError, ErrorCode
from broker.types import Claimed, Fence
from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.formats import parse_duration
from cli.options import JsonFlag
from cli.output import Output

COMMAND_KEY = "fencelog.own.command"
ENV_GROUP = "FENCELOG_OWNER_GROUP"
ENV_RESOURCES = "FENCELOG_OWNER_RESOURCES"
ENV_GENERATION = "FENCELOG_OWNER_GENERATION"
_POLL_S = 0.1
EXIT_CANNOT_RUN = 126  # as a shell: found, but not executable
EXIT_NOT_FOUND = 127  # as a shell: no such command


class OwnGroup(TyperGroup):
    """`own ARGS` means `own claim ARGS` unless ARGS start with a subcommand; the words
    after `--` are the command to run, kept out of click's parsing."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[COMMAND_KEY] = args[cut + 1 :]
            args = args[:cut]
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["claim", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=OwnGroup,
    help="Claim ownership of (group, resource) with generations; list, release, history.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)


def claimed_dict(claim: Claimed) -> dict[str, Any]:
    return {"group": claim.group, "resource": claim.resource, "generation": claim.generation}


@app.command("claim")
def claim(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="The group the resources are owned in.")],
    resources: Annotated[
        list[str], typer.Argument(help="Resources to claim, all or none (TOPIC/P by convention).")
    ],
    generation: Annotated[
        int,
        typer.Option(
            "--generation", "-g", help="Claim generation; 0 resets (always granted, audited)."
        ),
    ] = 1,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Claim, print and exit (the claim ends with it); runs no -- CMD."
        ),
    ] = False,
    grace: Annotated[
        str,
        typer.Option("--grace", help="After SIGTERM, wait this long before SIGKILL for CMD."),
    ] = "10s",
    as_json: JsonFlag = False,
) -> None:
    """Claim resources and hold them until interrupted, or while `-- CMD` runs.

    Exits 0 when interrupted (Ctrl-C, SIGTERM), with CMD's status when CMD ends, and 42
    (SEVERED) when a newer claim takes over. Refused claims exit 40.
    """
    if generation < 0:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, f"--generation must be >= 0, not {generation}"
        )
    command: list[str] = ctx.meta.get(COMMAND_KEY, [])
    if once and command:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "--once claims and exits: it runs no command",
            hint="drop --once to hold the claim while the command runs",
        )
    grace_s = parse_duration(grace)
    client = state().client(create=True)
    severed = threading.Event()
    reasons: list[str] = []

    def on_severed(reason: str) -> None:
        reasons.append(reason)
        severed.set()

    client.on_severed(on_severed)
    claimed = client.own(group, resources, generation=generation)
    out = Output(as_json)
    for item in claimed:
        if as_json:
            out.json(claimed_dict(item))
        else:
            out.line(f"claimed {item.group}:{item.resource} at generation {item.generation}")
    out.flush()
    if once:
        return
    status = _hold(client, claimed, command, severed, grace_s)
    if severed.is_set():
        raise BrokerError(
            ErrorCode.SEVERED,
            f"the claim on {group} was {reasons[0] if reasons else 'severed'}",
            group=group,
        )
    raise typer.Exit(status)


def _hold(
    client: Client,
    claimed: Sequence[Claimed],
    command: Sequence[str],
    severed: threading.Event,
    grace_s: float,
) -> int:
    interrupted = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        interrupted.set()

    child = _start(command, claimed) if command else None
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not severed.wait(_POLL_S):
            if child is not None and child.poll() is not None:
                return _shell_status(child.returncode)
            if interrupted.is_set():
                return _stop(child, grace_s) if child is not None else 0
        if child is not None:
            _stop(child, grace_s)
        return int(ErrorCode.SEVERED)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start(command: Sequence[str], claimed: Sequence[Claimed]) -> subprocess.Popen[bytes]:
    """CMD started with the owner's environment; a CMD that cannot run ends `own` with
    a shell's status (127 not found, 126 not executable), its claim released as the
    command's client closes."""
    try:
        return subprocess.Popen(command, env=_child_env(claimed))
    except OSError as exc:
        status = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_RUN
        why = "command not found" if status == EXIT_NOT_FOUND else exc.strerror
        sys.stderr.write(f"error: cannot run {command[0]}: {why}; the claim is released\n")
        raise typer.Exit(status) from None


def _stop(child: subprocess.Popen[bytes], grace_s: float) -> int:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return _shell_status(child.returncode)


def _shell_status(returncode: int) -> int:
    """CMD's status as a shell gives it: 128 + N for a command killed by signal N
    (Popen's -N, passed on as is, became 256 - N)."""
    return 128 - returncode if returncode < 0 else returncode


def _child_env(claimed: Sequence[Claimed]) -> dict[str, str]:
    generations = sorted({c.generation for c in claimed})
    env = dict(os.environ)
    env[ENV_GROUP] = claimed[0].group
    env[ENV_RESOURCES] = ",".join(c.resource for c in claimed)
    env[ENV_GENERATION] = (
        str(generations[0])
        if len(generations) == 1
        else ",".join(str(c.generation) for c in claimed)
    )
    env["FENCELOG_BROKER"] = state().broker
    return env


def fences_from(texts: Sequence[str]) -> list[Fence]:
    """--fence options, plus the fences an enclosing `fencelog own -- CMD` passed down."""
    fences = [parse_fence(text) for text in texts]
    group = os.environ.get(ENV_GROUP)
    resources = os.environ.get(ENV_RESOURCES)
    generation = os.environ.get(ENV_GENERATION)
    if group and resources and generation and not texts:
        names = resources.split(",")
        numbers = generation.split(",")
        numbers = numbers * len(names) if len(numbers) == 1 else numbers
        if len(numbers) != len(names) or not all(n.isascii() and n.isdigit() for n in numbers):
            raise BrokerError(
                ErrorCode.INVALID_FENCE,
                f"{ENV_RESOURCES} and {ENV_GENERATION} do not match",
            )
        fences += [Fence(group, name, int(n)) for name, n in zip(names, numbers, strict=True)]
    return fences


@app.command("list")
def list_ownership(
    group: Annotated[str | None, typer.Option("--group", help="Only this group.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List every claimed (group, resource): generation, holder, whether it is live."""
    rows = state().client().ownership(group)
    out = Output(as_json)
    if as_json:
        for row in rows:
            out.json(
                {
                    "group": row.group,
                    "resource": row.resource,
                    "generation": row.generation,
                    "holder": row.holder,
                    "live": row.holder_live,
                    "claimed_ms": row.claimed_ms,
                }
            )
        return
    table = [
        (r.group, r.resource, r.generation, r.holder or "", "yes" if r.holder_live else "no")
        for r in rows
    ]
    out.table("ownership", ["group", "resource", "generation", "holder", "live"], table)


@app.command("release")
def release(
    group: Annotated[str, typer.Argument(help="Group to release in.")],
    resources: Annotated[
        list[str] | None, typer.Argument(help="Resources to release (default: all held).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Free resources whoever holds them; a live holder is severed, as by a newer claim.

    The generation is kept, so the next claim still fences the old holder out.
    """
    released = state().client().release(group, resources or None, any_holder=True)
    out = Output(as_json)
    for resource in released:
        if as_json:
            out.json({"group": group, "resource": resource, "released": True})
        else:
            out.line(f"released {group}:{resource}")


@app.command("history")
def history(
    group: Annotated[str | None, typer.Option("--group", help="Only this group.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Newest N rows.", min=1)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """The audit log, newest first: claims, refusals, severings, resets, releases."""
    rows = state().client().ownership_history(group, limit)
    out = Output(as_json)
    if as_json:
        for row in rows:
            out.json(
                {
                    "at_ms": row.at_ms,
                    "group": row.group,
                    "resource": row.resource,
                    "event": row.event,
                    "session": row.session_id,
                    "generation": row.generation,
                    "requested": row.requested,
                    "other": row.other,
                }
            )
        return
    table = [
        (r.at_ms, r.group, r.resource, r.event, r.generation, r.session_id or "", r.other or "")
        for r in rows
    ]
    columns = ["at_ms", "group", "resource", "event", "generation", "session", "other"]
    out.table("ownership history", columns, table)
