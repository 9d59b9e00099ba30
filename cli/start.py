"""The `fencelog` console script's entry point: cli.main's run, imported with the cyclic
garbage collector paused.

A command's start is mostly imports (Typer, click, the client and what they bring):
tens of thousands of objects that live until the process exits, none of them garbage.
They are made with the collector paused and then frozen (gc.freeze), so that its later
passes, while the command imports and does the rest, leave them out: together about
3 ms of a one-shot command's 75 (bench/RESULTS.md, "CLI start").

Ctrl-C at any moment, the imports included, ends the command with one line on stderr
and exit status 130 (128 + SIGINT), as a shell reports a command it interrupted.
"""

from __future__ import annotations

import gc
import sys

INTERRUPTED_STATUS = 130  # 128 + SIGINT


def run() -> None:
    try:
        gc.disable()
        try:
            from cli.main import run as main
        finally:
            gc.freeze()
            gc.enable()
        main()
    except KeyboardInterrupt:
        interrupted()


def interrupted() -> None:
    """Ctrl-C: one line, status 130 (cli.errors says the same for a command under way)."""
    sys.stderr.write("fencelog: interrupted\n")
    sys.exit(INTERRUPTED_STATUS)
