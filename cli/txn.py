"""fencelog txn-begin, txn-commit, txn-abort, txn keepalive, txn list and txn show.

A transaction lives in the broker, not in this process, so a shell script can spread
one over several commands:

    TXN=$(fencelog txn-begin --group billing --json | jq -r .txn_id)
    fencelog produce invoices --txn "$TXN" --value inv-1
    fencelog txn-commit "$TXN"
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from broker.core.txn import parse_txn_id
from broker.types import TxnInfo
from cli.consume import record_dict
from cli.context import state
from cli.errors import SUGGEST_COMMANDS
from cli.formats import Format, Rendering, parse_duration
from cli.options import FormatOption, JsonFlag
from cli.output import Output

app = typer.Typer(
    help="List and inspect transactions.",
    no_args_is_help=True,
    suggest_commands=SUGGEST_COMMANDS,
)

TxnArgument = Annotated[str, typer.Argument(help="The transaction id txn-begin printed.")]
GroupCheck = Annotated[
    str | None,
    typer.Option("--group", "-g", help="The group the transaction must belong to (else exit 73)."),
]


def txn_begin(
    group: Annotated[
        str,
        typer.Option(
            "--group",
            "-g",
            help="Transactional group: its commits are applied in order, through one journal.",
        ),
    ],
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Name the transaction: a begin with a key already used finds that "
            "transaction again (open or committed) instead of starting another.",
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            help="Abort the transaction if not committed within this long "
            "(default: the broker's txn_timeout_ms, 60s).",
            metavar="DURATION",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Begin a transaction; print its id.

    Produce into it with `fencelog produce TOPIC --txn ID`; nothing it holds is visible
    to consumers until `fencelog txn-commit ID`.
    """
    timeout_ms = None if timeout is None else round(parse_duration(timeout) * 1000)
    info = state().client(create=True).txn_begin(group, key=key, timeout_ms=timeout_ms)
    _print_txn(Output(as_json), info)


def txn_commit(
    txn: TxnArgument,
    group: GroupCheck = None,
    as_json: JsonFlag = False,
) -> None:
    """Commit a transaction: when this returns, its records are in their logs.

    Committing a committed transaction prints it again (exit 0); an aborted or timed-out
    one fails with TXN_ABORTED (71).
    """
    info = state().client().txn_commit(parse_txn_id(txn), group=group)
    _print_txn(Output(as_json), info)


def txn_abort(
    txn: TxnArgument,
    group: GroupCheck = None,
    as_json: JsonFlag = False,
) -> None:
    """Abort an open transaction: its journaled records are discarded.

    Aborting an aborted transaction prints it again; one that is committing or committed
    cannot be aborted (TXN_NOT_OPEN, 72).
    """
    info = state().client().txn_abort(parse_txn_id(txn), group=group)
    _print_txn(Output(as_json), info)


@app.command("keepalive")
def txn_keepalive(
    txn: TxnArgument,
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout",
            help="The new deadline, this long from now (the broker's maximum is 24h).",
            metavar="DURATION",
        ),
    ],
    group: GroupCheck = None,
    as_json: JsonFlag = False,
) -> None:
    """Keep an open transaction alive: its deadline moves to --timeout from now.

    For a job that works longer than the timeout it began with: call it again before
    each deadline. An aborted or timed-out transaction fails with TXN_ABORTED (71), a
    committed one with TXN_NOT_OPEN (72).
    """
    timeout_ms = round(parse_duration(timeout) * 1000)
    info = state().client().txn_keepalive(parse_txn_id(txn), timeout_ms, group=group)
    _print_txn(Output(as_json), info)


@app.command("list")
def txn_list(
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Also the newest committed and aborted ones.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many.", min=0)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """Open and committing transactions: group, state, age, partitions and records."""
    found = state().client().txn_list(include_ended=show_all, limit=limit)
    out = Output(as_json)
    if as_json:
        for info in found:
            out.json(txn_dict(info))
        return
    columns = ["txn_id", "group", "key", "state", "age_ms", "partitions", "records"]
    rows = [
        (i.txn_id, i.group, i.key, i.state, i.age_ms, len(i.partitions), i.records) for i in found
    ]
    out.table("transactions", columns, rows)


@app.command("show")
def txn_show(
    txn: TxnArgument,
    records: Annotated[
        int,
        typer.Option("--records", help="Show up to this many journaled records (0: none).", min=0),
    ] = 20,
    fmt: FormatOption = Format.text,
    as_json: JsonFlag = False,
) -> None:
    """A transaction: its state, journal entries, partitions and journaled records."""
    detail = state().client().txn_show(parse_txn_id(txn), records_max=records)
    rendering = Rendering(fmt)
    out = Output(as_json)
    entries = [
        {"journal": e.journal, "position": e.position, "kind": e.kind, "at_ms": e.at_ms}
        | ({"body": e.body} if e.body else {})
        for e in detail.journal
    ]
    journaled = [
        {k: v for k, v in record_dict(r, rendering).items() if k != "offset"}
        | {"position": r.offset}
        for r in detail.records
    ]
    if as_json:
        # "journal" stays the journal's number, as in `txn list --json`
        out.json(txn_dict(detail.info) | {"entries": entries, "journaled": journaled})
        return
    _print_txn(out, detail.info)
    out.table(
        "journal",
        ["journal", "position", "entry", "at_ms"],
        [(e.journal, e.position, e.kind, e.at_ms) for e in detail.journal],
    )
    if journaled:
        out.table(
            "journaled records",
            ["topic", "partition", "position", "key", "value"],
            [(r["topic"], r["partition"], r["position"], r["key"], r["value"]) for r in journaled],
        )


def txn_dict(info: TxnInfo) -> dict[str, Any]:
    return {
        "txn_id": info.txn_id,
        "group": info.group,
        "key": info.key,
        "state": info.state,
        "journal": info.journal,
        "began_ms": info.began_ms,
        "deadline_ms": info.deadline_ms,
        "ended_ms": info.ended_ms,
        "reason": info.reason,
        "age_ms": info.age_ms,
        "existing": info.existing,
        "records": info.records,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "records": p.records,
                "base_offset": p.base_offset,
            }
            for p in info.partitions
        ],
    }


def _print_txn(out: Output, info: TxnInfo) -> None:
    if out.as_json:
        out.json(txn_dict(info))
        return
    columns = ["txn_id", "group", "state", "records", "partitions"]
    where = ", ".join(
        f"{p.topic or '(deleted)'}/{p.partition}"
        + (f"@{p.base_offset}" if p.base_offset is not None and p.base_offset >= 0 else "")
        for p in info.partitions
    )
    out.table(
        f"transaction {info.txn_id}",
        columns,
        [(info.txn_id, info.group, info.state, info.records, where)],
    )
