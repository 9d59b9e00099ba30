"""Everything the CLI prints on stdout: JSON lines, rich tables, or plain text.

- `--json`: one JSON object per line, nothing else on stdout.
- otherwise, on a terminal without NO_COLOR: rich tables (rich is imported only then);
- otherwise (piped, or NO_COLOR set): tab-separated lines, no decoration.
Progress bars go to stderr, and only when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import click

JSON_ERRORS_KEY = "fencelog.json_errors"  # set by --json: errors and warnings as JSON


def rich_wanted(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


class Output:
    def __init__(self, as_json: bool, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.rich = not as_json and rich_wanted(self.stream)

    def json(self, obj: dict[str, Any]) -> None:
        self.stream.write(json.dumps(obj, separators=(",", ":"), default=str) + "\n")

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if self.rich:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=title)
            for column in columns:
                table.add_column(column)
            for row in rows:
                table.add_row(*("" if cell is None else str(cell) for cell in row))
            Console(file=self.stream).print(table)
            return
        for row in rows:
            self.line("\t".join("" if cell is None else str(cell) for cell in row))

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; yields `advance(n)`."""
    if not rich_wanted(sys.stderr):
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextlib.contextmanager
def acknowledged(description: str) -> Iterator[Callable[[int], None]]:
    """On a terminal stderr, a live line: records and batches acknowledged so far and
    for how long; yields `batch_acknowledged(records)`."""
    if not rich_wanted(sys.stderr):
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}:"),
        TextColumn("{task.completed} records in {task.fields[batches]} batches acknowledged"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=None, batches=0)
        batches = 0

        def batch_acknowledged(records: int) -> None:
            nonlocal batches
            batches += 1
            bar.update(task, advance=records, batches=batches)

        yield batch_acknowledged


def warn(text: str) -> None:
    """A warning on stderr; with --json, a JSON object ({"warning": ...}), as errors are."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(JSON_ERRORS_KEY):
        sys.stderr.write(json.dumps({"warning": text}) + "\n")
        return
    sys.stderr.write(f"warning: {text}\n")
