"""fencelog top: `--once --json` against a prepared broker (embedded and served), the
rates between two snapshots, the live view driven in a pseudo-terminal (pexpect) with
its screen read back (pyte), and the errors of bad input."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pyte
import pytest
from click.testing import CliRunner, Result
from msgspec.structs import replace

from broker.client import Client, connect
from broker.client.producer import Producer
from broker.errors import ErrorCode
from broker.rows import GroupOffsetRow
from broker.types import BrokerStatus, PartitionInfo, TopicInfo
from cli import top
from cli.main import command
from support.exclusive import Waiter, wait_for_access
from support.helpers import (
    Processes,
    expect,
    fencelog_script,
    json_error,
    json_lines,
    user_env,
)
from support.servers import ServerThread, served

STEP_S = 15.0  # the bound of every wait for the screen or a process


@dataclass
class Prepared:
    """A broker with topics, a group's offsets, an owner, an exclusive producer with a
    waiter and an open transaction; `target` is what --broker takes."""

    target: str
    client: Client
    txn_id: int


@pytest.fixture(params=["embedded", "served"])
def prepared(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[Prepared]:
    with contextlib.ExitStack() as stack:
        target = str(data_dir)
        if request.param == "served":
            target = stack.enter_context(served(data_dir)).address
        client = stack.enter_context(connect(target))
        client.create_topic("orders", partitions=2)
        client.create_topic("audit")
        client.produce("orders", [b"a", b"b", b"c"], partition=0)
        client.produce("orders", [b"d"], partition=1)
        client.commit_offsets("billing", "orders", {0: 1, 1: 1})
        client.own("workers", {"w1": 3})
        holder: Producer = client.producer("audit", idempotent=False, access="exclusive")
        waiter = Waiter(stack.enter_context(connect(target)), "audit", "standby")
        wait_for_access(client, "audit", lambda v: v.waiting == ("standby",), "standby waits")
        txn = client.txn_begin("copier", key="batch-1")
        yield Prepared(target, client, txn.txn_id)
        holder.close()  # the waiter is promoted, and its thread ends
        waiter.join()
        if waiter.producer is not None:
            waiter.producer.close()


def run(runner: CliRunner, target: str, *args: str) -> Result:
    argv = ["--broker", target, "top", *args]
    return runner.invoke(command(argv), argv)


def test_once_json_is_one_object_with_every_pane(runner: CliRunner, prepared: Prepared) -> None:
    [snap] = json_lines(
        expect(run(runner, prepared.target, "--once", "--json", "-n", "0"), 0).stdout
    )
    assert [t["topic"] for t in snap["topics"]] == ["audit", "orders"]
    orders = snap["topics"][1]
    assert [(p["partition"], p["end_offset"]) for p in orders["partition_details"]] == [
        (0, 3),
        (1, 1),
    ]
    assert orders["produce_per_s"] is None and snap["rate_interval_s"] is None
    lags = [(g["group"], g["topic"], g["partition"], g["lag"]) for g in snap["groups"]]
    assert lags == [("billing", "orders", 0, 2), ("billing", "orders", 1, 0)]
    [owner] = snap["owners"]
    assert (owner["group"], owner["resource"], owner["generation"], owner["live"]) == (
        "workers",
        "w1",
        3,
        True,
    )
    assert owner["holder"] in {s["session"] for s in snap["sessions"] if s["live"]}
    audit = next(p for p in snap["producers"] if p["topic"] == "audit")
    assert audit["mode"] == "exclusive"
    assert [w["name"] for w in audit["waiting"]] == ["standby"]
    [txn] = snap["transactions"]
    assert (txn["txn_id"], txn["group"], txn["key"], txn["state"]) == (
        prepared.txn_id,
        "copier",
        "batch-1",
        "open",
    )
    assert txn["age_ms"] >= 0


def test_once_measures_rates_over_the_interval(runner: CliRunner, prepared: Prepared) -> None:
    [snap] = json_lines(
        expect(run(runner, prepared.target, "--once", "--json", "-n", "50ms"), 0).stdout
    )
    assert snap["rate_interval_s"] == 0.05
    assert all(t["produce_per_s"] >= 0 and t["consume_per_s"] >= 0 for t in snap["topics"])


def test_once_without_json_prints_every_table(runner: CliRunner, prepared: Prepared) -> None:
    lines = expect(run(runner, prepared.target, "--once", "-n", "0"), 0).stdout.splitlines()
    assert "orders\t0\t3\t3\t3" in lines  # topic, partition, end offset, records, bytes
    assert "billing\torders\t0\t1\t3\t2" in lines  # group, topic, partition, committed, end, lag
    assert "workers\tw1\t3\t" in "\n".join(lines)


# rates: pure, from two snapshots ------------------------------------------------------


def snapshot(
    taken_s: float, ends: list[int], committed: list[int], created_ms: int = 1
) -> top.Snapshot:
    parts = tuple(PartitionInfo(i, 0, end, end, end) for i, end in enumerate(ends))
    topic = TopicInfo("orders", len(ends), created_ms, None, parts)
    groups = [GroupOffsetRow("g", "orders", i, o, 0) for i, o in enumerate(committed)]
    status = BrokerStatus("/d", 1, "full", 0, 0, (topic,))
    return top.Snapshot(taken_s, 0, status, groups, [], [], {}, [])


def test_rates_come_from_end_offsets_and_committed_offsets_moving() -> None:
    before = snapshot(10.0, [5, 5], [0, 5])
    now = snapshot(12.0, [9, 7], [4, 5])
    assert top.rates(before, now) == {"orders": top.Rate(3.0, 2.0)}
    assert top.rates(None, now) is None


def test_a_rewind_a_first_commit_or_a_new_topic_counts_as_no_movement() -> None:
    before = snapshot(10.0, [5, 5], [3])
    rewound = snapshot(11.0, [5, 5], [1, 4])  # partition 0 rewound, partition 1 first commit
    assert top.rates(before, rewound) == {"orders": top.Rate(0.0, 0.0)}
    recreated = snapshot(11.0, [1, 0], [], created_ms=2)
    assert top.rates(before, recreated) == {"orders": top.Rate(0.0, 0.0)}


def test_lag_is_end_minus_committed() -> None:
    snap = snapshot(1.0, [9, 2], [4, 2])
    assert [lag for _, _, lag in top.lag_rows(snap)] == [5, 0]
    gone = replace(snap, groups=[GroupOffsetRow("g", "deleted", 0, 1, 0)])
    assert top.lag_rows(gone)[0][1:] == (None, None)


def test_keys_pick_panes_and_quit() -> None:
    assert top.split_keys("2\t\x1b[Zq") == ["2", "\t", "\x1b[Z", "q"]
    assert top.next_pane(0, "3") == 2
    assert top.next_pane(5, "\t") == 0
    assert top.next_pane(0, "\x1b[Z") == 5
    assert top.next_pane(1, "9") == 1  # no such pane: nothing changes
    assert top.next_pane(1, "q") == top.QUIT


# bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "complaint"),
    [
        (["--once", "--interval", "soon"], ErrorCode.INVALID_ARGUMENT, "not a duration"),
        (["--once", "--interval", "-1s"], ErrorCode.INVALID_ARGUMENT, "not a duration"),
        (["--once", "--interval", "2h"], ErrorCode.INVALID_ARGUMENT, "outside"),
        (["--interval", "0"], ErrorCode.INVALID_ARGUMENT, "outside"),
        ([], ErrorCode.INVALID_ARGUMENT, "needs a terminal"),  # CliRunner's stdout is no tty
    ],
    ids=["not a duration", "negative", "too long", "0 live", "live without a terminal"],
)
def test_bad_input_is_one_line_and_its_status(
    runner: CliRunner, data_dir: Path, args: list[str], status: ErrorCode, complaint: str
) -> None:
    result = expect(run(runner, str(data_dir), *args), int(status))
    [line] = result.stderr.splitlines()
    assert complaint in line and line.endswith(f"[{status.name}]")


def test_a_missing_broker_is_data_dir_missing_and_creates_nothing(
    runner: CliRunner, tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    result = expect(run(runner, str(missing), "--once", "--json"), int(ErrorCode.DATA_DIR_MISSING))
    assert json_error(result)["error"] == "DATA_DIR_MISSING"
    assert not missing.exists()


# the live view in a pseudo-terminal ----------------------------------------------------

ROWS, COLUMNS = 40, 140


class Terminal:
    """`fencelog top` on a pseudo-terminal; its output played into a pyte screen."""

    def __init__(self, target: str, *args: str) -> None:
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(
            str(fencelog_script()),
            ["--broker", target, "top", *args],
            dimensions=(ROWS, COLUMNS),
            env=user_env(TERM="xterm-256color"),
        )

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait(self, condition: Callable[[str], bool], what: str) -> str:
        """The screen, once condition(screen) holds (AssertionError past STEP_S)."""
        deadline = time.monotonic() + STEP_S
        while not condition(self.text()):
            if time.monotonic() >= deadline:
                raise AssertionError(f"not within {STEP_S}s: {what}; the screen:\n{self.text()}")
            with contextlib.suppress(pexpect.TIMEOUT):
                self.stream.feed(self.child.read_nonblocking(65536, timeout=0.1))
        return self.text()

    def shows(self, *wanted: str) -> str:
        return self.wait(lambda screen: all(w in screen for w in wanted), f"{wanted} shown")

    def shows_row(self, *cells: str) -> str:
        return self.wait(lambda screen: row_of(screen, *cells), f"a row {cells}")

    def press(self, key: str) -> None:
        self.child.send(key)

    def exit_status(self) -> int | None:
        """Read to the end of its output, then its exit status."""
        deadline = time.monotonic() + STEP_S
        while self.child.isalive() and time.monotonic() < deadline:
            with contextlib.suppress(pexpect.TIMEOUT, pexpect.EOF):
                self.stream.feed(self.child.read_nonblocking(65536, timeout=0.1))
        self.child.close()
        status: int | None = self.child.exitstatus
        return status

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.child.close()


@contextlib.contextmanager
def terminal(target: str, *args: str) -> Iterator[Terminal]:
    opened = Terminal(target, *args)
    try:
        yield opened
    finally:
        opened.close()


def cells_of(line: str) -> list[str]:
    return line.replace("│", " ").replace("┃", " ").split()


def produce_rate_shown(screen: str) -> bool:
    """A topics row of orders (2 partitions, 6 records) with a number for produce/s."""
    for cells in map(cells_of, screen.splitlines()):
        if cells[:4] == ["orders", "2", "6", "6"] and len(cells) == 6:
            return cells[4].replace(".", "", 1).isdigit()
    return False


def row_of(screen: str, *cells: str) -> bool:
    """Whether a line of the screen holds these cells in this order (a table's row)."""
    for line in screen.splitlines():
        words = cells_of(line)
        if any(words[i : i + len(cells)] == list(cells) for i in range(len(words))):
            return True
    return False


def test_live_view_shows_topics_switches_panes_follows_and_quits(prepared: Prepared) -> None:
    with terminal(prepared.target, "--interval", "200ms") as view:
        view.shows("fencelog top", "produce/s", "partitions")
        view.shows_row("orders", "0", "3", "3", "3")  # partition 0: end offset, records, bytes
        prepared.client.produce("orders", [b"e", b"f"], partition=0)
        view.shows_row("orders", "0", "5", "5", "5")  # a later snapshot shows them
        view.wait(produce_rate_shown, "a produce rate of orders")  # once two snapshots are in
        view.press("2")
        view.shows("consumer groups")
        view.shows_row("billing", "orders", "0", "1", "5", "4")  # committed 1, end 5: lag 4
        view.press("\t")
        view.shows("sessions", "last beat")
        view.press("\t")
        view.shows("owners", "generation")
        view.shows_row("workers", "w1", "3")
        view.press("5")
        view.shows("producers", "waiting")
        view.shows_row("audit", "exclusive")
        assert "standby" in view.text()
        view.press("6")
        view.shows_row(str(prepared.txn_id), "copier", "batch-1", "open")
        view.press("q")
        assert view.exit_status() == 0


def test_live_view_ends_with_exit_0_on_sigterm(data_dir: Path) -> None:
    with connect(data_dir) as client:
        client.create_topic("orders")
    with terminal(str(data_dir)) as view:
        view.shows("orders")
        view.child.kill(15)
        assert view.exit_status() == 0


def test_the_server_stopping_under_the_live_view_is_connection_failed(data_dir: Path) -> None:
    server = ServerThread(data_dir).start()
    try:
        with terminal(server.address, "--interval", "100ms") as view:
            view.shows("1 topics")
            server.stop()
            assert view.exit_status() == int(ErrorCode.CONNECTION_FAILED)
            assert "[CONNECTION_FAILED]" in view.text()
    finally:
        server.stop()


def test_json_without_once_is_a_line_per_interval_until_sigterm(
    processes: Processes, data_dir: Path
) -> None:
    with connect(data_dir) as client:
        client.create_topic("orders")
    view = processes.fencelog("--broker", data_dir, "top", "--json", "--interval", "100ms")
    first, second = (json.loads(view.line(STEP_S)) for _ in range(2))
    assert [t["topic"] for t in first["topics"]] == ["orders"]
    assert first["rate_interval_s"] is None  # rates need two snapshots
    assert second["rate_interval_s"] == 0.1 and second["topics"][0]["produce_per_s"] == 0
    view.signal(signal.SIGTERM)
    assert view.wait(STEP_S) == 0
