"""fencelog snapshot create | list | restore."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from broker import threads
from broker.client.embedded import restore_snapshot
from broker.errors import BrokerError, ErrorCode
from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.options import JsonFlag
from cli.output import Output, progress

app = typer.Typer(
    help="Producer-state snapshots, and one-file copies of the whole broker.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)


@app.command("create")
def create(
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write a consistent one-file copy of the whole broker here (taken online).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Take a producer-state snapshot, or with --out a one-file copy of everything.

    The one-file copy holds logs, producer state, ownership generations and offsets; it
    is written with SQLite's online backup, as of one moment, while producers keep
    writing, and never overwrites a file.
    """
    client = state().client()
    out = Output(as_json)
    if out_file is None:
        snapshot_id = client.snapshot_producers()
        if as_json:
            out.json({"snapshot_id": snapshot_id})
        else:
            out.line(f"producer snapshot {snapshot_id}")
        return
    target = out_file.resolve()
    if str(out_file) in ("", ".") or target.is_dir():  # --out '' is Path("."): a directory
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--out names a directory ({target}), not a new file",
            hint="e.g. --out fixture.db",
        )
    sizes = client.status()
    total = sizes.database_bytes + sizes.wal_bytes
    size = _with_growth_bar(lambda: client.backup(target), target, total)
    if as_json:
        out.json({"file": str(target), "bytes": size})
    else:
        out.line(f"wrote {target} ({size} bytes)")


def _with_growth_bar(work: Callable[[], int], target: Path, total: int) -> int:
    """Run work while a progress bar follows the output file's size."""
    done = threading.Event()
    with progress(f"writing {target.name}", total or None) as advance:
        seen = 0

        def watch() -> None:
            nonlocal seen
            while not done.wait(0.1):
                size = target.stat().st_size if target.exists() else 0
                advance(max(0, size - seen))
                seen = max(seen, size)

        watcher = threads.start(threading.Thread(target=watch, daemon=True))
        try:
            return work()
        finally:
            done.set()
            watcher.join()


@app.command("list")
def list_snapshots(as_json: JsonFlag = False) -> None:
    """Producer-state snapshots, newest first (the newest few are kept)."""
    rows = state().client().producer_snapshots()
    out = Output(as_json)
    if as_json:
        for row in rows:
            out.json(
                {
                    "snapshot_id": row.snapshot_id,
                    "created_ms": row.created_ms,
                    "producers": row.producers,
                    "evictions": row.evictions,
                    "bytes": row.bytes,
                }
            )
        return
    table = [(r.snapshot_id, r.created_ms, r.producers, r.evictions, r.bytes) for r in rows]
    columns = ["snapshot", "created_ms", "producers", "evictions", "bytes"]
    out.table("producer snapshots", columns, table)


@app.command("restore")
def restore(
    snapshot_file: Annotated[Path, typer.Argument(help="A file from `snapshot create --out`.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace the broker already in the data directory.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Make the data directory (--broker PATH) hold exactly this one-file snapshot.

    Refuses a directory that already holds a broker unless --force, and one that a
    running server owns.
    """
    current = state()
    target = current.broker
    if current.address() is not None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "restore writes a data directory, not a served broker",
            hint="fencelog --broker PATH snapshot restore FILE (with its server stopped)",
        )
    current.creating()
    total = snapshot_file.stat().st_size if snapshot_file.is_file() else None
    with progress(f"restoring {snapshot_file.name}", total) as advance:
        last = [0]

        def moved(done: int, _total: int) -> None:
            advance(done - last[0])
            last[0] = done

        size = restore_snapshot(snapshot_file, Path(target), force=force, progress=moved)
    out = Output(as_json)
    if as_json:
        out.json({"data_dir": str(Path(target).resolve()), "bytes": size})
    else:
        out.line(f"restored {snapshot_file} into {target} ({size} bytes)")
