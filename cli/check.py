"""fencelog check: SQLite's integrity check of a data directory and a decode of its
transactions' journaled batches, and what to do."""

from __future__ import annotations

from pathlib import Path

import typer

from broker.client.embedded import check_data_dir
from broker.errors import BrokerError, ErrorCode
from cli.context import state
from cli.errors import exit_status
from cli.options import JsonFlag
from cli.output import Output

_WHAT_TO_DO = (
    "restore the newest snapshot (`fencelog --broker DIR snapshot restore FILE --force`), "
    "or keep a copy of the directory and start a new one"
)


def check(as_json: JsonFlag = False) -> None:
    """Check the data directory's database for damage.

    SQLite's integrity check, then every batch journaled into a transaction decoded
    (SQLite cannot see inside them) and every large batch's kept shape compared with
    its records (pages are read from it). Reads the file only (a running server may keep
    using it). Exit 0 when it passes, 37 (DATA_CORRUPT) with what was found and what
    to do when it does not.
    """
    current = state()
    if current.address() is not None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "check reads a data directory's file, not a broker address",
            hint="fencelog --broker PATH check (the server may keep running)",
        )
    found = check_data_dir(Path(current.broker))
    out = Output(as_json)
    if as_json:
        out.json(
            {
                "database": str(found.db_path),
                "bytes": found.bytes,
                "schema_version": found.schema_version,
                "ok": found.ok,
                "problems": list(found.problems),
                **({} if found.ok else {"hint": _WHAT_TO_DO}),
            }
        )
    elif found.ok:
        out.line(
            f"ok: {found.db_path} passed SQLite's integrity check and the checks of "
            f"its journaled batches and batch shapes (schema {found.schema_version}, "
            f"{found.bytes} bytes)"
        )
    else:
        out.line(f"damaged: {found.db_path} ({found.bytes} bytes) failed its check:")
        for problem in found.problems:
            out.line(f"  {problem}")
        out.line(f"what to do: {_WHAT_TO_DO}")
    out.flush()
    if not found.ok:
        raise typer.Exit(exit_status(ErrorCode.DATA_CORRUPT))
