"""The one place where a BrokerError becomes a message and an exit status.

Exit statuses:
    0    success (also: `consume --follow` stopped by Ctrl-C or SIGTERM)
    1    INTERNAL: an unexpected failure inside fencelog, here or in the server (a bug:
         please report it)
    2    wrong command-line usage (unknown option, bad value for an option)
    10+  a BrokerError: the status is the error code's number (broker/errors.py), so each
         error class has its own status, listed in `fencelog --help` and fencelog(1).
    126  `own ... -- CMD`: CMD cannot be executed; 127: CMD was not found (as a shell)
    130  interrupted (Ctrl-C), with one line on stderr, whenever it comes
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import MutableMapping
from typing import Any, Final

import click
from typer.core import TyperGroup

from broker.errors import BrokerError, ErrorCode
from cli.output import JSON_ERRORS_KEY

INTERRUPTED_STATUS: Final = 130  # 128 + SIGINT, as a shell reports it


def exit_status(code: ErrorCode) -> int:
    return 1 if code is ErrorCode.INTERNAL else int(code)


def report(error: BrokerError, as_json: bool) -> None:
    """One line on stderr: what failed and what to do."""
    if as_json:
        sys.stderr.write(json.dumps(error.to_dict(), default=str) + "\n")
        return
    line = f"error: {error.message}"
    if error.hint:
        line += f" ({error.hint})"
    sys.stderr.write(f"{line} [{error.code.name}]\n")


def exit_status_table() -> list[tuple[int, str]]:
    rows = [(0, "success"), (1, "INTERNAL: a failure inside fencelog (a bug)"), (2, "usage error")]
    rows += [(exit_status(code), code.name) for code in ErrorCode if code is not ErrorCode.INTERNAL]
    rows += [(126, "`own ... -- CMD`: CMD is not executable")]
    rows += [(127, "`own ... -- CMD`: CMD was not found")]
    rows += [(INTERRUPTED_STATUS, "interrupted (Ctrl-C)")]
    return rows


# Typer's own "Did you mean" for a mistyped command: click 8.4+ (NoSuchCommand) says it
# already, and both would print it.
SUGGEST_COMMANDS: Final = not hasattr(click.exceptions, "NoSuchCommand")


def _failed(ctx: click.Context) -> None:
    """Let the command's state undo what a failed command created (a data directory)."""
    from cli.context import State

    state = ctx.find_object(State)
    if state is not None:
        state.failed()


class FencelogGroup(TyperGroup):
    """The root command: turns a BrokerError from any subcommand into its exit status,
    and answers shell completion with click's standard protocol."""

    def _main_shell_completion(
        self,
        ctx_args: MutableMapping[str, Any],
        prog_name: str,
        complete_var: str | None = None,
    ) -> None:
        # click's own completion protocol (_FENCELOG_COMPLETE=bash_complete ...), which the
        # scripts in completions/ are generated for; Typer's variant needs private setup.
        click.Command._main_shell_completion(self, ctx_args, prog_name, complete_var)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            if error.option_name != "--json":
                raise
            raise click.UsageError(
                "--json is an option of each command, not of fencelog itself: give it "
                "after the command (fencelog COMMAND ... --json)",
                ctx=ctx,
            ) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokerError as error:
            _failed(ctx)
            report(error, bool(ctx.meta.get(JSON_ERRORS_KEY)))
            ctx.exit(exit_status(error.code))
        except click.exceptions.Exit as stop:
            if stop.exit_code != 0:
                _failed(ctx)
            raise
        except click.NoSuchOption as error:
            _failed(ctx)
            if not any(error.option_name in param.opts for param in self.params):
                raise
            command = error.ctx.command_path.partition(" ")[2] if error.ctx else "COMMAND"
            raise click.UsageError(
                f"{error.option_name} is an option of fencelog itself, not of the command: "
                f"give it before the command (fencelog {error.option_name} ... {command} ...)",
                ctx=error.ctx,
            ) from None
        except KeyboardInterrupt:
            # Ctrl-C in a command that does not take it as its end (consume --follow and
            # own do): one line and 130, as when it comes during the imports (cli.start)
            _failed(ctx)
            sys.stderr.write("fencelog: interrupted\n")
            ctx.exit(INTERRUPTED_STATUS)
        except BrokenPipeError:
            # The reader went away (`fencelog consume t | head -1`): the output ends, which
            # is not a failure. Point stdout at /dev/null so the exit flush stays quiet.
            # (Before `except Exception`, which it is one of: it never ran after it.)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except OSError as error:
            if error.errno not in _OUTPUT_FULL:
                _failed(ctx)
                raise
            # the output could not be written (`> /dev/full`, a full disk): one line
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            _failed(ctx)
            failed = BrokerError(
                ErrorCode.STORAGE_FAILED, f"cannot write the output: {error.strerror}"
            )
            report(failed, bool(ctx.meta.get(JSON_ERRORS_KEY)))
            ctx.exit(exit_status(failed.code))
        except Exception:
            _failed(ctx)
            raise


_OUTPUT_FULL: Final = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


def json_option_callback(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """--json also makes errors JSON objects."""
    if value:
        ctx.meta[JSON_ERRORS_KEY] = True
    return value
