"""Consumer groups and offsets in the CLI, as a user sees them: consume --group resuming
and committing, --txn committing into a transaction, --from -N and @TIME, templates,
group list/describe/reset with lag, status's lag, and bad input changing nothing."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import broker
from broker.types import NewRecord
from cli.main import command
from support.helpers import Invoke, expect, json_error, json_lines
from support.servers import ServerThread, served

BASE_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z; each record 1 s after the previous


@pytest.fixture
def orders(data_dir: Path) -> Path:
    """orders: 2 partitions of 4 records each, a0..a3 and b0..b3, stamped one second
    apart in produce order (a0 at BASE_MS, b0 at BASE_MS + 4 s)."""
    with broker.open(data_dir) as engine:
        engine.create_topic("orders", partitions=2)
        for index, (partition, name) in enumerate((p, n) for p, n in ((0, "a"), (1, "b"))):
            stamps = [BASE_MS + (index * 4 + i) * 1_000 for i in range(4)]
            engine.produce(
                "orders",
                [
                    NewRecord(f"{name}{i}".encode(), partition=partition, timestamp_ms=at)
                    for i, at in enumerate(stamps)
                ],
            )
    return data_dir


def values(result: Result) -> list[str]:
    return [row["value"] for row in json_lines(result.stdout)]


def committed(invoke: Invoke, group: str) -> dict[int, int]:
    found = json_lines(expect(invoke("group", "describe", group, "--json"), 0).stdout)
    return {o["partition"]: o["committed_offset"] for o in found[0]["offsets"]}


def test_consume_with_a_group_resumes_where_it_stopped(invoke: Invoke, orders: Path) -> None:
    first = expect(invoke("consume", "orders", "--group", "billing", "--max", "3", "--json"), 0)
    assert values(first) == ["a0", "a1", "a2"]
    assert committed(invoke, "billing") == {0: 3}
    rest = expect(invoke("consume", "orders", "--group", "billing", "--json"), 0)
    assert values(rest) == ["a3", "b0", "b1", "b2", "b3"]
    assert committed(invoke, "billing") == {0: 4, 1: 4}
    assert expect(invoke("consume", "orders", "--group", "billing"), 0).stdout == ""


def test_from_applies_to_partitions_the_group_never_committed(invoke: Invoke, orders: Path) -> None:
    expect(invoke("group", "reset", "billing", "orders", "--to", "1", "-p", "0"), 0)
    found = expect(invoke("consume", "orders", "-G", "billing", "--from", "-1", "--json"), 0)
    assert values(found) == ["a1", "a2", "a3", "b3"]


def test_from_minus_n_is_the_last_n_of_each_partition(invoke: Invoke, orders: Path) -> None:
    found = expect(invoke("consume", "orders", "--from", "-2", "--json"), 0)
    assert values(found) == ["a2", "a3", "b2", "b3"]
    assert values(expect(invoke("consume", "orders", "-o", "-9", "--json"), 0)) == [
        "a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3",
    ]  # fmt: skip


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_from_a_time_starts_at_the_first_record_at_or_after_it(
    invoke: Invoke, orders: Path
) -> None:
    at = _iso(BASE_MS + 3_000)  # a3 is stamped exactly then (at or after); b0 at 4 s
    found = expect(invoke("consume", "orders", "--from", f"@{at}", "--json"), 0)
    assert values(found) == ["a3", "b0", "b1", "b2", "b3"]
    naive = at.removesuffix("Z")  # no zone: UTC
    assert values(expect(invoke("consume", "orders", "-o", f"@{naive}", "--json"), 0)) == values(
        found
    )
    by_ms = expect(invoke("consume", "orders", "-o", f"@{BASE_MS + 6_000}", "--json"), 0)
    assert values(by_ms) == ["b2", "b3"]
    # every record is older than an hour ago: each partition starts at its end
    assert expect(invoke("consume", "orders", "--from", "@-1h"), 0).stdout == ""


def test_a_template_prints_each_record_as_kcat_f_does(invoke: Invoke, data_dir: Path) -> None:
    with broker.open(data_dir, clock=lambda: 1_234) as engine:
        engine.create_topic("t")
        engine.produce("t", [NewRecord(b"v\xff", key=b"k1", headers=(("h", b"x"),))])
        engine.produce("t", [NewRecord(b"plain")])
    shown = expect(invoke("consume", "t", "--format", r"%t|%p|%o|%T|%k|%s|%K|%S|%h|100%%\n"), 0)
    assert shown.stdout == "t|0|0|1234|k1|v\ufffd|2|2|h=x|100%\nt|0|1|1234||plain|-1|5||100%\n"
    assert "--format base64" in shown.stderr  # the lossy value is warned about
    both = expect(invoke("consume", "t", "--format", "hex", "--format", r"%k:%s\t"), 0)
    assert both.stdout == "6b31:76ff\t:706c61696e\t"


@pytest.mark.parametrize(
    "template",
    ["%x", "%", "trail\\", "\\q"],
    ids=["unknown-token", "lone-percent", "lone-backslash", "unknown-escape"],
)
def test_a_bad_template_is_a_usage_error(invoke: Invoke, orders: Path, template: str) -> None:
    result = expect(invoke("consume", "orders", "--format", template), 2)
    assert result.stdout == ""


def test_group_list_and_status_show_lag_per_partition(invoke: Invoke, orders: Path) -> None:
    expect(invoke("consume", "orders", "--group", "billing", "--max", "3"), 0)
    expect(invoke("group", "reset", "audit", "orders", "--to", "latest"), 0)
    groups = json_lines(expect(invoke("group", "list", "--json"), 0).stdout)
    assert [(g["group"], g["members"], g["lag"]) for g in groups] == [
        ("audit", None, 0),
        ("billing", None, 1),
    ]
    (billing,) = [g for g in groups if g["group"] == "billing"]
    rows = [(o["partition"], o["committed_offset"], o["end_offset"]) for o in billing["offsets"]]
    assert (rows, billing["offsets"][0]["lag"]) == ([(0, 3, 4)], 1)
    # billing never committed partition 1: its lag there is not known, so not counted
    status = json_lines(expect(invoke("status", "--json"), 0).stdout)[0]
    assert status["consumer_groups"] == groups
    plain = expect(invoke("group", "list"), 0).stdout.splitlines()
    assert "billing\torders\t0\t3\t4\t1" in plain
    assert "billing\torders\t0\t3\t4\t1" in expect(invoke("status"), 0).stdout.splitlines()


def test_group_reset_moves_offsets_to_each_kind_of_place(invoke: Invoke, orders: Path) -> None:
    def reset(*args: str) -> dict[int, int]:
        rows = json_lines(
            expect(invoke("group", "reset", "g", "orders", *args, "--json"), 0).stdout
        )
        return {row["partition"]: row["to"] for row in rows}

    assert reset("--to", "latest") == {0: 4, 1: 4}
    assert reset("--to", "earliest", "-p", "1") == {1: 0}
    assert committed(invoke, "g") == {0: 4, 1: 0}
    assert reset("--to", "2") == {0: 2, 1: 2}
    assert reset("--to", "99") == {0: 4, 1: 4}  # kept within the partition
    assert reset("--to", "-1") == {0: 3, 1: 3}
    assert reset("--to", f"@{_iso(BASE_MS + 5_000)}") == {0: 4, 1: 1}
    found = expect(invoke("consume", "orders", "--group", "g", "--json"), 0)
    assert values(found) == ["b1", "b2", "b3"]


def test_consume_txn_commits_offsets_with_the_transaction(invoke: Invoke, orders: Path) -> None:
    """The exactly-once loop: offsets and output land together, or neither does."""
    expect(invoke("topic", "create", "out"), 0)

    def step(commit: bool) -> None:
        txn = json_lines(expect(invoke("txn-begin", "--group", "copy", "--json"), 0).stdout)[0]
        txn_id = str(txn["txn_id"])
        read = expect(
            invoke("consume", "orders", "-G", "copier", "--txn", txn_id, "--max", "3", "-p", "0"),
            0,
        )
        upper = "".join(line.split("\t")[3].upper() + "\n" for line in read.stdout.splitlines())
        expect(invoke("produce", "out", "--txn", txn_id, input=upper), 0)
        if commit:
            expect(invoke("txn-commit", txn_id), 0)
        else:
            expect(invoke("txn-abort", txn_id), 0)

    step(commit=False)  # a failed run: neither its output nor its offsets land
    assert expect(invoke("group", "describe", "copier"), 43)
    step(commit=True)
    step(commit=True)
    assert values(expect(invoke("consume", "out", "--json"), 0)) == ["A0", "A1", "A2", "A3"]
    assert committed(invoke, "copier") == {0: 4}


def test_bad_input_is_one_line_with_its_status_and_changes_nothing(
    invoke: Invoke, orders: Path
) -> None:
    expect(invoke("consume", "orders", "--group", "billing", "--max", "1"), 0)
    cases = [
        (["consume", "orders", "--group", "bad\x07name"], 13),
        (["group", "reset", "bad\nname", "orders", "--to", "earliest"], 13),
        (["group", "describe", "bad\x1bname"], 13),
        (["consume", "orders", "--group", "billing", "--from", "@2999-01-01T00:00:00Z"], 10),
        (["consume", "orders", "--from", "@not-a-time"], 10),
        (["consume", "orders", "--from", "@-1x"], 10),
        (["group", "reset", "billing", "orders", "--to", "@2999-01-01"], 10),
        (["group", "reset", "billing", "orders", "--to", "soon"], 10),
        (["group", "reset", "billing", "missing", "--to", "earliest"], 20),
        (["group", "reset", "billing", "orders", "--to", "earliest", "-p", "7"], 21),
        (["group", "describe", "nobody"], 43),
        (["consume", "orders", "--txn", "1"], 10),
        (["consume", "orders", "--group", "billing", "--txn", "999"], 70),
    ]
    for args, status in cases:
        result = expect(invoke(*args), status)
        assert result.stdout == "" and result.stderr.count("\n") == 1, args
        assert json_error(invoke(*args, "--json"))["error"], args
    assert committed(invoke, "billing") == {0: 1}
    assert [g["group"] for g in json_lines(invoke("group", "list", "--json").stdout)] == ["billing"]


@pytest.fixture
def server(orders: Path) -> Iterator[ServerThread]:
    with served(orders) as thread:
        yield thread


def test_served_consume_with_a_group_commits_and_group_list_shows_it(
    runner: CliRunner, server: ServerThread
) -> None:
    def run(*args: str) -> Result:
        return runner.invoke(command(), ["--broker", server.address, *args])

    at = _iso(BASE_MS + 1_000)
    found = expect(run("consume", "orders", "-G", "billing", "--from", f"@{at}", "--json"), 0)
    assert values(found) == ["a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    groups = json_lines(expect(run("group", "list", "--json"), 0).stdout)
    assert [(g["group"], g["lag"]) for g in groups] == [("billing", 0)]
    assert expect(run("consume", "orders", "-G", "billing"), 0).stdout == ""
