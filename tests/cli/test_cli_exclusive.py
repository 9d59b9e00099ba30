"""fencelog produce --access, topic describe's access and consume --compacted, as a user
sees them: a producer holds its access while its stdin is open (`tail -f log | fencelog
produce control --access exclusive`), the others are refused with the documented exit
statuses (PRODUCER_BUSY 60, PRODUCER_FENCED 61, WAIT_TIMEOUT 62, INVALID_ARGUMENT 10,
UNKNOWN_TOPIC 20), and a waiter takes over when the holder's pipe closes.

Holders are real `fencelog produce` processes fed through a pipe; the commands around them
run through CliRunner on the same data directory (embedded). The fenced exit (61) needs a
holder whose session ends while it still runs: a served broker with --session-timeout 1s
and a holder paused with SIGSTOP.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from broker.errors import ErrorCode
from cli.main import command
from support.exclusive import STEP_S
from support.helpers import Invoke, Processes, expect, json_error, json_lines
from support.owning import resumed_and_killed, serving
from support.waiting import wait_until

TOPIC = "control"
FREE = {"mode": "free", "epoch": 0, "exclusive": None, "shared": [], "waiting": []}


@pytest.fixture
def control(invoke: Invoke) -> Invoke:
    expect(invoke("topic", "create", TOPIC), 0)
    return invoke


def access(invoke: Invoke) -> dict[str, Any]:
    """`topic describe control --json`'s access object."""
    [described] = json_lines(expect(invoke("topic", "describe", TOPIC, "--json"), 0).stdout)
    found = described["access"]
    assert isinstance(found, dict)
    return found


def names(found: dict[str, Any], role: str) -> list[str]:
    if role == "exclusive":
        return [] if found["exclusive"] is None else [found["exclusive"]["name"]]
    return [producer["name"] for producer in found[role]]


def wait_for(invoke: Invoke, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        found = access(invoke)
        return found if check(found) else None

    return wait_until(seen, STEP_S, message=what)


def waiting_count(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda found: len(found["waiting"]) == count


def consumed(invoke: Invoke, *args: str) -> list[tuple[str | None, str, int]]:
    """(key, value, epoch) of what consume --json prints."""
    result = expect(invoke("consume", TOPIC, "--json", *args), 0)
    return [(r["key"], r["value"], r["epoch"]) for r in json_lines(result.stdout)]


class Holder:
    """`fencelog produce control --access MODE --json`, fed line by line through a pipe."""

    def __init__(self, processes: Processes, broker: str | Path, mode: str, name: str) -> None:
        self.name = name
        self.process = processes.fencelog(
            "--broker",
            broker,
            "produce",
            TOPIC,
            "--access",
            mode,
            "--producer-name",
            name,
            "--wait-timeout",
            "30s",
            "--json",
            stdin=True,
        )

    def write(self, line: str) -> None:
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def produce(self, line: str) -> int:
        """Write a line and wait for its acknowledgement: the offset it landed at."""
        self.write(line)
        acknowledged = json.loads(self.process.line(STEP_S))
        assert acknowledged["topic"] == TOPIC, acknowledged
        return int(acknowledged["offset"])

    def close_stdin(self) -> int:
        self.process.stdin.close()
        return self.process.wait(STEP_S)


# holding while stdin is open ------------------------------------------------------------


def test_produce_exclusive_writes_at_a_new_epoch_and_gives_it_back_at_exit(
    control: Invoke,
) -> None:
    assert access(control) == FREE
    result = expect(control("produce", TOPIC, "--access", "exclusive", "--value", "a"), 0)
    assert "attached to control as exclusive at epoch 1" in result.stderr
    assert "produced 1 record to control" in result.stdout
    result = expect(
        control(
            "produce", TOPIC, "--access", "exclusive", "--value", "b", "--value", "c", "--json"
        ),
        0,
    )
    assert [r["offset"] for r in json_lines(result.stdout)] == [1, 2]
    assert consumed(control) == [(None, "a", 1), (None, "b", 2), (None, "c", 2)]
    assert access(control) == FREE | {"epoch": 2}


def test_an_exclusive_producer_holds_the_topic_while_its_stdin_is_open(
    control: Invoke, processes: Processes, data_dir: Path
) -> None:
    holder = Holder(processes, data_dir, "exclusive", "tail")
    assert holder.produce("d1") == 0
    found = access(control)
    assert (found["mode"], found["epoch"], names(found, "exclusive")) == ("exclusive", 1, ["tail"])
    assert found["exclusive"]["epoch"] == 1

    shared = control("produce", TOPIC, "--access", "shared", "--value", "y")
    expect(shared, int(ErrorCode.PRODUCER_BUSY))
    assert "tail" in shared.stderr and "PRODUCER_BUSY" in shared.stderr
    expect(control("produce", TOPIC, "--value", "plain"), 60)
    expect(control("produce", TOPIC, "--access", "exclusive", "--value", "x"), 60)
    busy = control("produce", TOPIC, "--access", "shared", "--value", "y", "--json")
    assert json_error(expect(busy, 60))["error"] == "PRODUCER_BUSY"

    assert holder.produce("d2") == 1  # still the holder, after all those refusals
    assert holder.close_stdin() == 0
    assert access(control) == FREE | {"epoch": 1}
    assert consumed(control) == [(None, "d1", 1), (None, "d2", 1)]


def test_exclusive_is_refused_while_a_shared_producer_is_attached(
    control: Invoke, processes: Processes, data_dir: Path
) -> None:
    holder = Holder(processes, data_dir, "shared", "sharer")
    assert holder.produce("s1") == 0
    found = access(control)
    assert (found["mode"], names(found, "shared")) == ("shared", ["sharer"])
    expect(control("produce", TOPIC, "--access", "shared", "--value", "s2"), 0)  # side by side
    refused = control("produce", TOPIC, "--access", "exclusive", "--value", "x", "--json")
    assert json_error(expect(refused, 60))["error"] == "PRODUCER_BUSY"
    assert holder.close_stdin() == 0
    expect(control("produce", TOPIC, "--access", "exclusive", "--value", "x"), 0)
    assert consumed(control) == [(None, "s1", 0), (None, "s2", 0), (None, "x", 1)]


def test_wait_exclusive_times_out_with_62_and_leaves_the_queue(
    control: Invoke, processes: Processes, data_dir: Path
) -> None:
    holder = Holder(processes, data_dir, "exclusive", "holder")
    holder.produce("h1")
    args = ("produce", TOPIC, "--access", "wait-exclusive", "--wait-timeout", "300ms")
    result = expect(control(*args, "--value", "w", "--json"), int(ErrorCode.WAIT_TIMEOUT))
    assert json_error(result)["error"] == "WAIT_TIMEOUT"
    result = expect(control(*args, "--value", "w"), 62)
    assert "WAIT_TIMEOUT" in result.stderr
    found = access(control)
    assert (names(found, "exclusive"), found["waiting"]) == (["holder"], [])
    assert holder.close_stdin() == 0
    assert consumed(control) == [(None, "h1", 1)]


def test_a_waiter_takes_over_when_the_holders_pipe_closes(
    control: Invoke, processes: Processes, data_dir: Path
) -> None:
    holder = Holder(processes, data_dir, "exclusive", "first")
    holder.produce("first:0")
    waiter = Holder(processes, data_dir, "wait-exclusive", "second")
    waiter.write("second:0")  # read only once it is promoted
    found = wait_for(control, lambda a: names(a, "waiting") == ["second"], "second waits")
    assert (names(found, "exclusive"), found["epoch"]) == (["first"], 1)
    holder.produce("first:1")
    assert holder.close_stdin() == 0
    assert json.loads(waiter.process.line(STEP_S))["offset"] == 2
    found = access(control)
    assert (names(found, "exclusive"), found["epoch"], found["waiting"]) == (["second"], 2, [])
    assert waiter.close_stdin() == 0
    assert consumed(control) == [(None, "first:0", 1), (None, "first:1", 1), (None, "second:0", 2)]


def test_a_holder_whose_session_ended_is_fenced_with_61_on_its_next_line(
    tmp_path: Path, processes: Processes, runner: CliRunner
) -> None:
    with serving(tmp_path / "served", session_timeout="1s") as url:

        def served(*args: str) -> Result:
            return runner.invoke(command(), ["--broker", url, *args])

        expect(served("topic", "create", TOPIC), 0)
        old = Holder(processes, url, "exclusive", "old")
        with resumed_and_killed(old.process):
            old.produce("old:0")
            old.process.signal(signal.SIGSTOP)  # its session misses heartbeats and ends
            args = ("produce", TOPIC, "--access", "wait-exclusive", "--producer-name", "new")
            taken = expect(served(*args, "--wait-timeout", "20s", "--value", "new:0"), 0)
            assert "at epoch 2" in taken.stderr
            old.write("old:1")
            old.process.signal(signal.SIGCONT)
            status = old.process.wait(STEP_S)
            said = old.process.stderr_text()
            assert json.loads(said.splitlines()[0])["error"] == "PRODUCER_FENCED", said
            assert status == int(ErrorCode.PRODUCER_FENCED), said
        log = expect(served("consume", TOPIC, "--json"), 0)
        assert [(r["value"], r["epoch"]) for r in json_lines(log.stdout)] == [
            ("old:0", 1),
            ("new:0", 2),
        ]


# describe --------------------------------------------------------------------------------


def test_describe_shows_the_holder_the_shared_producers_and_the_waiters_in_order(
    control: Invoke, processes: Processes, data_dir: Path
) -> None:
    sharers = [Holder(processes, data_dir, "shared", f"s{n}") for n in (1, 2)]
    for sharer in sharers:
        sharer.produce(sharer.name)
    waiters = []
    for number in (1, 2):
        waiters.append(Holder(processes, data_dir, "wait-exclusive", f"w{number}"))
        wait_for(control, waiting_count(number), f"w{number} waits")
    found = access(control)
    assert found["mode"] == "shared" and found["exclusive"] is None
    assert sorted(names(found, "shared")) == ["s1", "s2"]
    assert names(found, "waiting") == ["w1", "w2"]
    assert all(p["session"] and isinstance(p["id"], int) for p in found["shared"])
    plain = expect(control("topic", "describe", TOPIC), 0).stdout.splitlines()
    rows = sorted(line.split("\t")[:3] for line in plain if line.startswith(("shared", "waiting")))
    assert rows == [
        ["shared", "s1", "0"],
        ["shared", "s2", "0"],
        ["waiting", "w1", "0"],
        ["waiting", "w2", "0"],
    ]
    for sharer in sharers:
        assert sharer.close_stdin() == 0
    found = wait_for(control, lambda a: names(a, "exclusive") == ["w1"], "w1 is promoted")
    assert (found["epoch"], names(found, "waiting")) == (1, ["w2"])
    for waiter in waiters:
        assert waiter.close_stdin() == 0
    assert access(control) == FREE | {"epoch": 2}


# the compacted view ---------------------------------------------------------------------


def test_consume_compacted_prints_the_newest_record_of_every_key(control: Invoke) -> None:
    lines = "k1=a\nk2=b\nk1=c\nk3=d\nk2=e\n"
    args = ("produce", TOPIC, "--key-separator", "=", "--access", "exclusive")
    expect(control(*args, input=lines), 0)
    expect(control("produce", TOPIC, "--value", "no key"), 0)
    result = expect(control("consume", TOPIC, "--compacted", "--json"), 0)
    latest = [(r["key"], r["value"], r["offset"], r["epoch"]) for r in json_lines(result.stdout)]
    assert latest == [("k1", "c", 2, 1), ("k3", "d", 3, 1), ("k2", "e", 4, 1)]
    assert len(consumed(control)) == 6  # the log itself keeps everything


@pytest.mark.parametrize("extra", [["--follow"], ["--from", "2"]])
def test_consume_compacted_refuses_what_a_snapshot_cannot_do(
    control: Invoke, extra: list[str]
) -> None:
    result = expect(control("consume", TOPIC, "--compacted", *extra, "--json"), 10)
    assert json_error(result)["error"] == "INVALID_ARGUMENT"


# bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["--access", "owner"], 10, "owner"),
        (["--access", "Exclusive"], 10, "wait-exclusive"),
        (["--access", "wait-exclusive", "--wait-timeout=-1s"], 10, "-1s"),
        (["--access", "wait-exclusive", "--wait-timeout", "soon"], 10, "soon"),
        (["--access", "exclusive", "--pid", "1", "--generation", "1", "--sequence", "1"], 10, ""),
        (["--access", "exclusive", "--producer-name", "a\tb"], 13, ""),
    ],
)
def test_bad_access_options_exit_with_their_code_and_store_nothing(
    control: Invoke, args: list[str], status: int, says: str
) -> None:
    result = expect(control("produce", TOPIC, *args, "--value", "x"), status)
    assert says in result.stderr
    result = expect(control("produce", TOPIC, *args, "--value", "x", "--json"), status)
    assert json_error(result)["code"] == status
    assert consumed(control) == []
    assert access(control) == FREE


@pytest.mark.parametrize("mode", ["shared", "exclusive", "wait-exclusive"])
def test_access_to_a_missing_topic_exits_20(invoke: Invoke, mode: str) -> None:
    result = expect(invoke("produce", "nope", "--access", mode, "--value", "x", "--json"), 20)
    error = json_error(result)
    assert error["error"] == "UNKNOWN_TOPIC" and "nope" in error["message"]
    expect(invoke("topic", "describe", "nope", "--json"), 20)
    expect(invoke("consume", "nope", "--compacted"), 20)
