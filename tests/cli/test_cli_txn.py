"""fencelog txn-begin, txn-commit, txn-abort, txn list, txn show and produce --txn/--member,
as a shell script uses them: the transaction lives in the broker, so one transaction is
spread over several commands. Each test checks exit statuses, the JSON objects on stdout,
the one-line errors on stderr, and what `consume` shows afterwards.

Most tests run twice: on the data directory (embedded) and through a broker serving it
(the CLI finds the server that owns the directory). The served broker reads time from a
FakeClock, so a transaction times out when the test moves the clock, never by sleeping.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from broker.discovery import DB_FILE
from broker.errors import ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits
from broker.server.server import Server
from support.helpers import Invoke, Processes, expect, json_error, json_lines
from support.producing import FakeClock
from support.servers import ServerThread
from support.waiting import wait_until

TIMEOUT_MS = DEFAULT_LIMITS.txn_timeout_ms
ABORTED = int(ErrorCode.TXN_ABORTED)
NOT_OPEN = int(ErrorCode.TXN_NOT_OPEN)
UNKNOWN = int(ErrorCode.UNKNOWN_TXN)
INVALID = int(ErrorCode.INVALID_ARGUMENT)


class ClockedServerThread(ServerThread):
    """A ServerThread whose broker reads time from the test's clock."""

    def __init__(self, data_dir: Path, clock: FakeClock, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(data_dir, limits=limits)
        self.server = Server(data_dir, durability="normal", limits=limits, clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["embedded", "served"])
def broker_kind(
    request: pytest.FixtureRequest, data_dir: Path, clock: FakeClock
) -> Iterator[ServerThread | None]:
    """None: the CLI opens the data directory; else the server that owns it."""
    with contextlib.ExitStack() as stack:
        if request.param == "served":
            yield stack.enter_context(ClockedServerThread(data_dir, clock).start())
        else:
            yield None


@pytest.fixture
def topics(invoke: Invoke) -> Invoke:
    """The CLI with topics invoices (1 partition) and ledger (4 partitions)."""
    expect(invoke("topic", "create", "invoices"), 0)
    expect(invoke("topic", "create", "ledger", "--partitions", "4"), 0)
    return invoke


@pytest.fixture
def cli(broker_kind: ServerThread | None, topics: Invoke) -> Invoke:
    """`topics`, embedded and served."""
    return topics


@pytest.fixture
def served(data_dir: Path, clock: FakeClock) -> Iterator[ServerThread]:
    """Served only (the fake clock reaches the broker only through a server)."""
    with ClockedServerThread(data_dir, clock).start() as server:
        yield server


def one(result: Result) -> dict[str, Any]:
    [obj] = json_lines(expect(result, 0).stdout)
    return obj


def begin(cli: Invoke, *args: str) -> int:
    info = one(cli("txn-begin", "--group", "billing", "--json", *args))
    assert info["state"] == "open"
    txn_id = info["txn_id"]
    assert isinstance(txn_id, int)
    return txn_id


def consumed(cli: Invoke, topic: str) -> list[dict[str, Any]]:
    return json_lines(expect(cli("consume", topic, "--json"), 0).stdout)


def values(cli: Invoke, topic: str) -> list[str]:
    return [r["value"] for r in consumed(cli, topic)]


def failed(result: Result, code: ErrorCode) -> str:
    """The one stderr line of a command that failed with code (plain, not --json)."""
    expect(result, int(code))
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert lines[0].endswith(f"[{code.name}]")
    return lines[0]


# the shell script of the issue ----------------------------------------------------------------


def test_a_transaction_spread_over_several_commands(cli: Invoke) -> None:
    expect(cli("produce", "invoices", "--value", "plain-0"), 0)
    txn = begin(cli)
    landed = one(cli("produce", "invoices", "--txn", str(txn), "--value", "inv-1", "--json"))
    assert landed == {
        "topic": "invoices",
        "partition": 0,
        "offset": None,
        "value_sha256": hashlib.sha256(b"inv-1").hexdigest(),
        "txn_id": txn,
    }
    journaled = expect(
        cli("produce", "ledger", "--txn", str(txn), "--partition", "3", "--value", "debit-1"), 0
    )
    assert journaled.stdout == (
        f"journaled 1 record to ledger (partition 3) in transaction {txn}; "
        "consumers see them after txn-commit\n"
    )
    assert values(cli, "invoices") == ["plain-0"]
    assert values(cli, "ledger") == []

    committed = one(cli("txn-commit", str(txn), "--json"))
    assert (committed["state"], committed["records"], committed["group"]) == (
        "committed",
        2,
        "billing",
    )
    assert committed["partitions"] == [
        {"topic": "invoices", "partition": 0, "records": 1, "base_offset": 1},
        {"topic": "ledger", "partition": 3, "records": 1, "base_offset": 0},
    ]
    invoices = consumed(cli, "invoices")
    assert [(r["offset"], r["value"]) for r in invoices] == [(0, "plain-0"), (1, "inv-1")]
    assert "txn_id" not in invoices[0], "a plain record names no transaction"
    assert invoices[1]["txn_id"] == txn
    [debit] = consumed(cli, "ledger")
    assert (debit["partition"], debit["offset"], debit["value"], debit["txn_id"]) == (
        3,
        0,
        "debit-1",
        txn,
    )


def test_stdin_lines_go_into_the_transaction(cli: Invoke) -> None:
    txn = begin(cli)
    landed = json_lines(
        expect(
            cli("produce", "ledger", "--txn", str(txn), "-p", "2", "--json", input="a\nb\nc\n"), 0
        ).stdout
    )
    assert [(r["partition"], r["offset"], r["txn_id"]) for r in landed] == [(2, None, txn)] * 3
    expect(cli("txn-commit", str(txn)), 0)
    assert [(r["partition"], r["offset"], r["value"]) for r in consumed(cli, "ledger")] == [
        (2, 0, "a"),
        (2, 1, "b"),
        (2, 2, "c"),
    ]


def test_a_second_commit_answers_committed_again(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("produce", "invoices", "--txn", str(txn), "-v", "inv-1"), 0)
    expect(cli("produce", "ledger", "--txn", str(txn), "-p", "3", "-v", "debit-1"), 0)
    first = expect(cli("txn-commit", str(txn)), 0)
    again = expect(cli("txn-commit", str(txn)), 0)
    # piped, the reply is one tab-separated row: id, group, state, records, partitions
    assert (
        first.stdout == again.stdout == f"{txn}\tbilling\tcommitted\t2\tinvoices/0@0, ledger/3@0\n"
    )
    assert one(cli("txn-commit", str(txn), "--group", "billing", "--json"))["state"] == "committed"
    assert values(cli, "invoices") == ["inv-1"]


def test_offsets_stay_contiguous_between_plain_and_transactional_writes(cli: Invoke) -> None:
    early, late = begin(cli), begin(cli)
    expect(cli("produce", "invoices", "-v", "p0"), 0)
    expect(cli("produce", "invoices", "--txn", str(early), "-v", "early-a", "-v", "early-b"), 0)
    expect(cli("produce", "invoices", "--txn", str(late), "-v", "late"), 0)
    expect(cli("produce", "invoices", "-v", "p1"), 0)
    expect(cli("txn-commit", str(late)), 0)
    expect(cli("produce", "invoices", "-v", "p2"), 0)
    expect(cli("txn-commit", str(early)), 0)
    expect(cli("produce", "invoices", "-v", "p3"), 0)
    found = consumed(cli, "invoices")
    assert [r["offset"] for r in found] == list(range(7))
    assert [r["value"] for r in found] == ["p0", "p1", "late", "p2", "early-a", "early-b", "p3"]


# abort and refusals --------------------------------------------------------------------------


def test_abort_discards_and_a_later_commit_is_txn_aborted(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("produce", "invoices", "--txn", str(txn), "-v", "doomed"), 0)
    aborted = one(cli("txn-abort", str(txn), "--json"))
    assert (aborted["state"], aborted["reason"], aborted["records"]) == ("aborted", "by request", 0)
    line = failed(cli("txn-commit", str(txn)), ErrorCode.TXN_ABORTED)
    assert f"transaction {txn} was aborted (by request)" in line
    # offsets into it too: 71 as for its records (it was TXN_NOT_OPEN, 72)
    failed(cli("consume", "invoices", "-G", "g", "--txn", str(txn)), ErrorCode.TXN_ABORTED)
    error = json_error(expect(cli("txn-commit", str(txn), "--json"), ABORTED))
    assert {k: error[k] for k in ("error", "code", "txn_id", "reason")} == {
        "error": "TXN_ABORTED",
        "code": 71,
        "txn_id": txn,
        "reason": "by request",
    }
    again = one(cli("txn-abort", str(txn), "--json"))
    assert (again["state"], again["reason"]) == ("aborted", "by request")
    assert values(cli, "invoices") == []


def test_a_committed_transaction_cannot_be_aborted_or_written(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("txn-commit", str(txn)), 0)
    line = failed(cli("txn-abort", str(txn)), ErrorCode.TXN_NOT_OPEN)
    assert "committed" in line
    failed(cli("produce", "invoices", "--txn", str(txn), "-v", "late"), ErrorCode.TXN_NOT_OPEN)
    assert values(cli, "invoices") == []


def test_keepalive_lets_a_long_script_commit_past_its_first_timeout(
    served: ServerThread, invoke: Invoke, clock: FakeClock
) -> None:
    cli = invoke
    expect(cli("topic", "create", "invoices"), 0)
    txn = begin(cli, "--timeout", "10s")
    expect(cli("produce", "invoices", "--txn", str(txn), "-v", "slow"), 0)
    clock.advance(8_000)
    kept = one(cli("txn", "keepalive", str(txn), "--timeout", "10s", "--json"))
    assert (kept["state"], kept["deadline_ms"]) == ("open", clock.now_ms + 10_000)
    clock.advance(8_000)  # 16 s after the begin: past the first deadline
    expect(cli("txn-commit", str(txn)), 0)
    assert values(cli, "invoices") == ["slow"]
    line = failed(cli("txn", "keepalive", str(txn), "--timeout", "10s"), ErrorCode.TXN_NOT_OPEN)
    assert "it has no deadline left to move" in line
    failed(cli("txn", "keepalive", str(txn), "--timeout", "0s"), ErrorCode.INVALID_ARGUMENT)


def test_an_aborted_transaction_refuses_records(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("txn-abort", str(txn)), 0)
    failed(cli("produce", "invoices", "--txn", str(txn), "-v", "late"), ErrorCode.TXN_ABORTED)
    failed(
        cli("produce", "invoices", "--txn", str(txn), "--member", "task-1", "-v", "late"),
        ErrorCode.TXN_ABORTED,
    )
    assert values(cli, "invoices") == []


TXN_COMMANDS = [
    ("txn-commit", "{id}"),
    ("txn-abort", "{id}"),
    ("txn", "show", "{id}"),
    ("produce", "invoices", "--txn", "{id}", "-v", "x"),
    ("produce", "invoices", "--txn", "{id}", "--member", "task-1", "-v", "x"),
]


def test_an_unknown_transaction_exits_70(cli: Invoke) -> None:
    begin(cli)
    for command in TXN_COMMANDS:
        args = [arg.format(id="987654") for arg in command]
        line = failed(cli(*args), ErrorCode.UNKNOWN_TXN)
        assert "there is no transaction 987654" in line
        error = json_error(expect(cli(*args, "--json"), UNKNOWN))
        assert (error["error"], error["txn_id"]) == ("UNKNOWN_TXN", 987654)
    assert values(cli, "invoices") == []


def test_a_malformed_transaction_id_exits_10(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "invoices"), 0)
    for command in TXN_COMMANDS:
        for bad in ["abc", "0", "1.5", "", "99999999999999999999"]:
            args = [arg.format(id=bad) for arg in command]
            line = failed(invoke(*args), ErrorCode.INVALID_ARGUMENT)
            assert "a transaction id is a positive integer" in line, args
        error = json_error(
            expect(invoke(*[a.format(id="abc") for a in command], "--json"), INVALID)
        )
        assert error["error"] == "INVALID_ARGUMENT"
    assert values(invoke, "invoices") == []


def test_a_negative_transaction_id_exits_10(topics: Invoke) -> None:
    failed(topics("txn-commit", "--", "-1"), ErrorCode.INVALID_ARGUMENT)
    failed(topics("txn-abort", "--", "-1"), ErrorCode.INVALID_ARGUMENT)
    failed(topics("produce", "invoices", "--txn", "-1", "-v", "x"), ErrorCode.INVALID_ARGUMENT)


def test_a_malformed_failure_point_is_refused_before_anything_runs(invoke: Invoke) -> None:
    line = failed(
        invoke("topic", "create", "t", env={"FENCELOG_FAILPOINT": "prepare:x"}),
        ErrorCode.INVALID_ARGUMENT,
    )
    assert "FENCELOG_FAILPOINT='prepare:x' is not STEP[:N]" in line
    assert "begin, data, prepare, apply, complete, ack" in line
    assert json_lines(expect(invoke("topic", "list", "--json"), 0).stdout) == []


def test_a_superscript_transaction_id_exits_10(invoke: Invoke) -> None:
    failed(invoke("txn-commit", "\u00b2"), ErrorCode.INVALID_ARGUMENT)


def test_a_commit_naming_another_group_exits_73(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("produce", "invoices", "--txn", str(txn), "-v", "inv-1"), 0)
    line = failed(cli("txn-commit", str(txn), "--group", "payroll"), ErrorCode.TXN_WRONG_GROUP)
    assert "belongs to group billing, not payroll" in line
    error = json_error(expect(cli("txn-abort", str(txn), "-g", "payroll", "--json"), 73))
    assert (error["group"], error["requested"]) == ("billing", "payroll")
    assert values(cli, "invoices") == []
    expect(cli("txn-commit", str(txn), "--group", "billing"), 0)
    assert values(cli, "invoices") == ["inv-1"]


def test_a_missing_topic_exits_20_and_the_transaction_goes_on(cli: Invoke) -> None:
    txn = begin(cli)
    expect(cli("produce", "invoices", "--txn", str(txn), "-v", "inv-1"), 0)
    line = failed(cli("produce", "nowhere", "--txn", str(txn), "-v", "x"), ErrorCode.UNKNOWN_TOPIC)
    assert "topic nowhere does not exist" in line
    failed(
        cli("produce", "ledger", "--txn", str(txn), "-p", "9", "-v", "x"),
        ErrorCode.UNKNOWN_PARTITION,
    )
    committed = one(cli("txn-commit", str(txn), "--json"))
    assert [(p["topic"], p["records"]) for p in committed["partitions"]] == [("invoices", 1)]
    assert values(cli, "invoices") == ["inv-1"]
    assert values(cli, "ledger") == []


@pytest.mark.parametrize(
    "extra",
    [
        ("--idempotent",),
        ("--pid", "1", "--generation", "1", "--sequence", "1"),
        ("--access", "shared"),
    ],
    ids=["idempotent", "pid", "access"],
)
def test_txn_does_not_combine_with_other_producer_modes(
    topics: Invoke, extra: tuple[str, ...]
) -> None:
    txn = begin(topics)
    line = failed(
        topics("produce", "invoices", "--partition", "0", "--txn", str(txn), *extra, "-v", "x"),
        ErrorCode.INVALID_ARGUMENT,
    )
    assert "--txn does not combine with --idempotent, --pid or --access" in line
    assert (
        json.loads(expect(topics("txn", "show", str(txn), "--json"), 0).stdout)["journaled"] == []
    )


def test_member_needs_txn(topics: Invoke) -> None:
    line = failed(
        topics("produce", "invoices", "--member", "task-1", "-v", "x"), ErrorCode.INVALID_ARGUMENT
    )
    assert "--member goes with --txn" in line
    assert values(topics, "invoices") == []


# members ---------------------------------------------------------------------------------------


def test_a_rerun_member_replaces_its_earlier_records(cli: Invoke) -> None:
    txn = begin(cli)
    first = cli(
        "produce", "invoices", "--txn", str(txn), "--member", "task-1", "--json", input="a1\na2\n"
    )
    assert [r["txn_id"] for r in json_lines(expect(first, 0).stdout)] == [txn, txn]
    expect(
        cli("produce", "ledger", "--txn", str(txn), "--member", "task-2", "-p", "1", "-v", "b1"), 0
    )
    expect(cli("produce", "invoices", "--txn", str(txn), "--member", "task-1", "-v", "a1-retry"), 0)
    shown = json.loads(expect(cli("txn", "show", str(txn), "--json"), 0).stdout)
    assert sorted(r["value"] for r in shown["journaled"]) == ["a1-retry", "b1"]
    expect(cli("txn-commit", str(txn)), 0)
    assert values(cli, "invoices") == ["a1-retry"]
    assert values(cli, "ledger") == ["b1"]


# timeouts and keys ---------------------------------------------------------------------------


def test_a_timeout_is_taken_from_the_command_line(cli: Invoke) -> None:
    info = one(cli("txn-begin", "-g", "billing", "--timeout", "5s", "--json"))
    assert info["deadline_ms"] - info["began_ms"] == 5_000
    info = one(cli("txn-begin", "-g", "billing", "--timeout", "250ms", "--json"))
    assert info["deadline_ms"] - info["began_ms"] == 250
    info = one(cli("txn-begin", "-g", "billing", "--json"))
    assert info["deadline_ms"] - info["began_ms"] == TIMEOUT_MS


@pytest.mark.parametrize(
    ("timeout", "says"),
    [
        ("abc", "is not a duration"),
        ("-5s", "is not a duration"),
        ("0s", "a transaction timeout is 1..86400000 ms, not 0"),
        ("0.1ms", "not 0"),
        ("25h", "not 90000000"),
    ],
)
def test_a_bad_timeout_exits_10(topics: Invoke, timeout: str, says: str) -> None:
    line = failed(
        topics("txn-begin", "-g", "billing", "--timeout", timeout), ErrorCode.INVALID_ARGUMENT
    )
    assert says in line
    assert json_lines(expect(topics("txn", "list", "--all", "--json"), 0).stdout) == []


def test_a_timed_out_transaction_is_gone_and_its_commit_exits_71(
    served: ServerThread, invoke: Invoke, clock: FakeClock
) -> None:
    expect(invoke("topic", "create", "invoices"), 0)
    txn = begin(invoke, "--timeout", "5s")
    kept = begin(invoke)
    expect(invoke("produce", "invoices", "--txn", str(txn), "-v", "inv-1"), 0)
    clock.advance(5_000)
    line = failed(invoke("txn-commit", str(txn)), ErrorCode.TXN_ABORTED)
    assert f"transaction {txn} was aborted (timed out)" in line
    assert [t["txn_id"] for t in json_lines(expect(invoke("txn", "list", "--json"), 0).stdout)] == [
        kept
    ]
    listed = json_lines(expect(invoke("txn", "list", "--all", "--json"), 0).stdout)
    ended = {t["txn_id"]: t for t in listed}[txn]
    assert (ended["state"], ended["reason"], ended["ended_ms"]) == (
        "aborted",
        "timed out",
        ended["began_ms"] + 5_000,
    )
    aborted = one(invoke("txn-abort", str(txn), "--json"))
    assert (aborted["state"], aborted["reason"]) == ("aborted", "timed out")
    assert values(invoke, "invoices") == []


def test_the_broker_sweeps_out_abandoned_transactions(
    served: ServerThread, invoke: Invoke, clock: FakeClock, data_dir: Path
) -> None:
    """The server aborts a transaction past its deadline on its own, with nobody asking:
    read straight from SQLite, since txn list and show would abort it themselves."""
    txn = begin(invoke, "--timeout", "1s")
    clock.advance(1_000)
    uri = f"file:{data_dir / DB_FILE}?mode=ro"

    def ended() -> tuple[Any, ...] | None:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            row = conn.execute("SELECT state, reason FROM txns WHERE txn_id = ?", (txn,)).fetchone()
        return None if tuple(row) == ("open", None) else tuple(row)

    # the sweep runs about once a second
    row = wait_until(ended, 10, interval_s=0.05, message="the expiry sweep aborted it")
    assert row == ("aborted", "timed out")


def test_a_keyed_begin_finds_its_transaction_again(cli: Invoke) -> None:
    first = one(cli("txn-begin", "-g", "billing", "--key", "batch-7", "--json"))
    again = one(cli("txn-begin", "-g", "billing", "--key", "batch-7", "--json"))
    assert (again["txn_id"], again["existing"], first["existing"]) == (first["txn_id"], True, False)
    assert again["key"] == "batch-7"
    expect(cli("txn-commit", str(first["txn_id"])), 0)
    replayed = one(cli("txn-begin", "-g", "billing", "--key", "batch-7", "--json"))
    assert (replayed["txn_id"], replayed["state"], replayed["existing"]) == (
        first["txn_id"],
        "committed",
        True,
    )
    other = one(cli("txn-begin", "-g", "payroll", "--key", "batch-7", "--json"))
    assert other["txn_id"] != first["txn_id"]


# list and show --------------------------------------------------------------------------------


def test_list_shows_open_transactions_as_json_and_as_plain_rows(cli: Invoke) -> None:
    one_id = begin(cli)
    two = one(cli("txn-begin", "-g", "payroll", "--key", "run-1", "--json"))["txn_id"]
    expect(cli("produce", "ledger", "--txn", str(one_id), "-p", "2", "-v", "a", "-v", "b"), 0)
    expect(cli("produce", "invoices", "--txn", str(one_id), "-v", "c"), 0)
    listed = {t["txn_id"]: t for t in json_lines(expect(cli("txn", "list", "--json"), 0).stdout)}
    assert set(listed) == {one_id, two}
    assert listed[one_id]["records"] == 3
    assert listed[one_id]["partitions"] == [
        {"topic": "invoices", "partition": 0, "records": 1, "base_offset": None},
        {"topic": "ledger", "partition": 2, "records": 2, "base_offset": None},
    ]
    assert (listed[two]["group"], listed[two]["key"], listed[two]["state"]) == (
        "payroll",
        "run-1",
        "open",
    )

    rows = [line.split("\t") for line in expect(cli("txn", "list"), 0).stdout.splitlines()]
    # txn_id, group, key, state, age_ms, partitions, records
    assert [(r[0], r[1], r[2], r[3], r[5], r[6]) for r in rows] == [
        (str(one_id), "billing", "", "open", "2", "3"),
        (str(two), "payroll", "run-1", "open", "0", "0"),
    ]
    assert all(r[4].isdigit() for r in rows)

    expect(cli("txn-commit", str(one_id)), 0)
    expect(cli("txn-abort", str(two)), 0)
    assert expect(cli("txn", "list"), 0).stdout == ""
    ended = json_lines(expect(cli("txn", "list", "--all", "--json"), 0).stdout)
    assert {(t["txn_id"], t["state"], t["reason"]) for t in ended} == {
        (one_id, "committed", None),
        (two, "aborted", "by request"),
    }
    assert (
        len(json_lines(expect(cli("txn", "list", "--all", "--limit", "1", "--json"), 0).stdout))
        == 1
    )
    expect(cli("txn", "list", "--limit", "-1"), 2)


def test_show_gives_the_journal_and_the_journaled_records(cli: Invoke) -> None:
    txn = begin(cli)
    expect(
        cli(
            "produce",
            "ledger",
            "--txn",
            str(txn),
            "-p",
            "1",
            "-k",
            "acct",
            "-v",
            "debit",
            "-v",
            "more",
        ),
        0,
    )
    expect(cli("produce", "invoices", "--txn", str(txn), "-H", "trace=t1", "-v", "inv"), 0)
    shown = json.loads(expect(cli("txn", "show", str(txn), "--json"), 0).stdout)
    assert (shown["txn_id"], shown["state"]) == (txn, "open")
    assert sum(p["records"] for p in shown["partitions"]) == 3
    assert [e["kind"] for e in shown["entries"]] == ["BEGIN"]
    assert shown["journal"] == shown["entries"][0]["journal"]  # its number, as txn list says
    assert [
        (r["topic"], r["partition"], r["position"], r["key"], r["value"], r["headers"], r["txn_id"])
        for r in shown["journaled"]
    ] == [
        ("invoices", 0, 0, None, "inv", [["trace", "t1"]], txn),
        ("ledger", 1, 0, "acct", "debit", [], txn),
        ("ledger", 1, 1, "acct", "more", [], txn),
    ]
    assert all("offset" not in r for r in shown["journaled"]), "no offset before the commit"

    limited = json.loads(
        expect(
            cli("txn", "show", str(txn), "--records", "1", "--format", "hex", "--json"), 0
        ).stdout
    )
    assert [(r["value"], r["headers"]) for r in limited["journaled"]] == [
        (b"inv".hex(), [["trace", b"t1".hex()]])
    ]
    none = json.loads(expect(cli("txn", "show", str(txn), "--records", "0", "--json"), 0).stdout)
    assert none["journaled"] == []
    assert none["records"] == 3 and none["partitions"] == shown["partitions"]

    plain = expect(cli("txn", "show", str(txn)), 0).stdout.splitlines()
    assert plain[0] == f"{txn}\tbilling\topen\t3\tinvoices/0, ledger/1"
    assert plain[1].split("\t")[2] == "BEGIN"
    assert plain[2:] == [
        "invoices\t0\t0\t\tinv",
        "ledger\t1\t0\tacct\tdebit",
        "ledger\t1\t1\tacct\tmore",
    ]

    expect(cli("txn-commit", str(txn)), 0)
    done = json.loads(expect(cli("txn", "show", str(txn), "--json"), 0).stdout)
    assert [e["kind"] for e in done["entries"]] == ["BEGIN", "PREPARE_COMMIT", "COMPLETE"]
    assert done["journaled"] == []
    assert [(p["topic"], p["base_offset"]) for p in done["partitions"]] == [
        ("invoices", 0),
        ("ledger", 0),
    ]


# served: a following consumer wakes at the commit ------------------------------------------------


def test_consume_follow_prints_the_records_when_the_commit_lands(
    served: ServerThread, invoke: Invoke, processes: Processes
) -> None:
    expect(invoke("topic", "create", "ledger", "--partitions", "2"), 0)
    txn = begin(invoke)
    expect(invoke("produce", "ledger", "--txn", str(txn), "-p", "1", "-v", "d1", "-v", "d2"), 0)
    follower = processes.fencelog(
        "--broker",
        served.address,
        "consume",
        "ledger",
        "--follow",
        "--json",
        "--max",
        "2",
        "--timeout",
        "30s",
    )

    def waiting() -> bool:
        assert follower.popen.poll() is None, follower.stderr_text()
        return "ledger" in served.server._topic_events  # its fetch is parked on the topic

    wait_until(waiting, 15, interval_s=0.01, message="the follower started waiting")
    expect(invoke("txn-commit", str(txn)), 0)
    first = json.loads(follower.line(15))
    second = json.loads(follower.line(15))
    assert [(r["partition"], r["offset"], r["value"], r["txn_id"]) for r in (first, second)] == [
        (1, 0, "d1", txn),
        (1, 1, "d2", txn),
    ]
    assert follower.wait(15) == 0
