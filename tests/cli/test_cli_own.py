"""fencelog own (claim, --once, list, release, history, `-- CMD`) and --fence on produce
and consume, as a user sees them: stdout lines, JSON objects, stderr and exit statuses.

CliRunner for everything that ends by itself; real processes for the holding forms:
`own ... -- CMD` hands CMD the fence in FENCELOG_OWNER_*, releases when CMD exits and
exits with its status, and when severed stops CMD (SIGTERM, SIGKILL after --grace) and
exits 42.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode
from cli.main import command
from support.helpers import Invoke, Process, expect, fencelog_script, json_error, json_lines
from support.owning import broker_target, resumed_and_killed, serving, tool_env
from support.waiting import wait_until

GRACE = "0.5s"
ENDS_WITHIN_S = 20.0


@pytest.fixture
def holder(data_dir: Path) -> Iterator[Client]:
    """A live session of this process: claims made through it stay held."""
    with connect(data_dir, durability="normal") as client:
        yield client


@pytest.fixture
def journal(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "journal", "--partitions", "2", "--owner-group", "samza"), 0)


def listed(invoke: Invoke) -> list[dict[str, Any]]:
    return json_lines(expect(invoke("own", "list", "--json"), 0).stdout)


def history(invoke: Invoke, *args: str) -> list[dict[str, Any]]:
    return json_lines(expect(invoke("own", "history", "--json", *args), 0).stdout)


def records(invoke: Invoke, topic: str = "journal") -> list[tuple[int, str]]:
    consumed = json_lines(expect(invoke("consume", topic, "--json"), 0).stdout)
    return [(r["partition"], r["value"]) for r in consumed]


def everything(invoke: Invoke) -> tuple[object, ...]:
    """What any command could change: holdings, the audit log, the records."""
    return (listed(invoke), history(invoke), records(invoke))


def test_each_ownership_error_has_its_documented_exit_status(invoke: Invoke) -> None:
    documented = {
        "INVALID_ARGUMENT": 10,
        "INVALID_NAME": 13,
        "INVALID_FENCE": 15,
        "OWNED_BY_HIGHER_GENERATION": 40,
        "FENCED": 41,
        "SEVERED": 42,
        "UNKNOWN_GROUP": 43,
        "NOT_HELD": 44,
    }
    assert {name: int(ErrorCode[name]) for name in documented} == documented
    listed_in_help = expect(invoke("--help"), 0).stdout.split()
    for name, status in documented.items():
        assert listed_in_help[listed_in_help.index(name) - 1] == str(status)


# claim --once, list, history --------------------------------------------------------------


def test_own_once_claims_prints_json_and_ends_the_claim(invoke: Invoke) -> None:
    result = expect(
        invoke("own", "workers", "orders/0", "orders/1", "--generation", "3", "--once", "--json"),
        0,
    )
    assert json_lines(result.stdout) == [
        {"group": "workers", "resource": "orders/0", "generation": 3},
        {"group": "workers", "resource": "orders/1", "generation": 3},
    ]
    rows = listed(invoke)
    assert [(r["resource"], r["generation"], r["holder"], r["live"]) for r in rows] == [
        ("orders/0", 3, None, False),
        ("orders/1", 3, None, False),
    ]
    again = expect(invoke("own", "workers", "orders/0", "--once"), 0)
    assert again.stdout == "claimed workers:orders/0 at generation 4\n"


def test_own_once_with_a_command_is_refused_before_claiming(invoke: Invoke, tmp_path: Path) -> None:
    # --once used to claim, print and exit without a word of the command it was given
    ran = tmp_path / "ran"
    result = expect(invoke("own", "workers", "orders/0", "--once", "--", "touch", str(ran)), 10)
    assert "--once claims and exits: it runs no command" in result.stderr
    assert not ran.exists()
    assert listed(invoke) == []


def test_own_list_shows_live_holders(invoke: Invoke, holder: Client) -> None:
    holder.own("workers", ["orders/0"], generation=2)
    [row] = listed(invoke)
    assert row["group"] == "workers" and row["resource"] == "orders/0"
    assert (row["generation"], row["holder"], row["live"]) == (2, holder.session_id, True)
    assert isinstance(row["claimed_ms"], int)
    plain = expect(invoke("own", "list"), 0).stdout
    assert plain.split("\t") == ["workers", "orders/0", "2", holder.session_id, "yes\n"]
    assert listed_group(invoke, "nosuch") == []


def listed_group(invoke: Invoke, group: str) -> list[dict[str, Any]]:
    return json_lines(expect(invoke("own", "list", "--group", group, "--json"), 0).stdout)


def test_own_history_shows_claims_refusals_severings_resets_and_releases(
    invoke: Invoke, holder: Client
) -> None:
    holder.own("workers", ["orders/0"], generation=5)
    expect(invoke("own", "workers", "orders/0", "--generation", "2", "--once"), 40)
    expect(invoke("own", "workers", "orders/0", "--generation", "0", "--once"), 0)
    expect(invoke("own", "other", "x", "--once"), 0)
    rows = history(invoke, "--group", "workers")
    assert [(r["event"], r["generation"], r["requested"]) for r in reversed(rows)] == [
        ("claimed", 5, 5),
        ("refused", 5, 2),
        ("severed", 5, None),
        ("reset", 1, 0),
        ("released", 1, None),
    ]
    severed = next(r for r in rows if r["event"] == "severed")
    assert severed["session"] == holder.session_id
    reset = next(r for r in rows if r["event"] == "reset")
    assert reset["other"] == holder.session_id
    assert set(rows[0]) == {
        "at_ms",
        "group",
        "resource",
        "event",
        "session",
        "generation",
        "requested",
        "other",
    }
    assert [r["group"] for r in history(invoke, "-n", "2")] == ["other", "other"]
    plain = expect(invoke("own", "history", "-n", "1"), 0).stdout.rstrip("\n").split("\t")
    assert plain[1:5] == ["other", "x", "released", "1"]


def test_own_release_severs_the_live_holder_and_keeps_the_generation(
    invoke: Invoke, holder: Client
) -> None:
    holder.own("workers", ["orders/0", "orders/1"], generation=4)
    result = expect(invoke("own", "release", "workers", "orders/0"), 0)
    assert result.stdout == "released workers:orders/0\n"
    # Severing the holder released everything it held.
    assert [(r["resource"], r["generation"], r["live"]) for r in listed(invoke)] == [
        ("orders/0", 4, False),
        ("orders/1", 4, False),
    ]
    again = json_lines(expect(invoke("own", "workers", "orders/0", "--once", "--json"), 0).stdout)
    assert again[0]["generation"] == 5


def test_own_release_of_a_whole_group(invoke: Invoke, holder: Client) -> None:
    holder.own("workers", ["orders/0", "orders/1"])
    result = expect(invoke("own", "release", "workers", "--json"), 0)
    assert json_lines(result.stdout) == [
        {"group": "workers", "resource": "orders/0", "released": True},
        {"group": "workers", "resource": "orders/1", "released": True},
    ]
    assert not any(r["live"] for r in listed(invoke))


# fences on produce and consume --------------------------------------------------------------


def test_produce_with_the_current_fence_of_a_live_holder(
    invoke: Invoke, journal: None, holder: Client
) -> None:
    holder.own("samza", ["journal/0"], generation=5)
    args = ("produce", "journal", "--partition", "0", "--fence", "samza:journal/0:5")
    result = expect(invoke(*args, "--value", "x", "--json"), 0)
    digest = hashlib.sha256(b"x").hexdigest()
    assert json_lines(result.stdout) == [
        {"topic": "journal", "partition": 0, "offset": 0, "value_sha256": digest}
    ]
    expect(invoke("consume", "journal", "--fence", "samza:journal/0:5"), 0)
    assert records(invoke) == [(0, "x")]


def test_the_topic_records_its_owner_group(invoke: Invoke, journal: None) -> None:
    [described] = json_lines(expect(invoke("topic", "describe", "journal", "--json"), 0).stdout)
    assert described["owner_group"] == "samza"


# bad input: each a clear error with its own exit status, and nothing changed ------------------


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (("own", "", "orders/0", "--once"), ErrorCode.INVALID_NAME),
        (("own", "workers", "", "--once"), ErrorCode.INVALID_NAME),
        (("own", "w" * 256, "orders/0", "--once"), ErrorCode.INVALID_NAME),
        (("own", "workers", "r" * 256, "--once"), ErrorCode.INVALID_NAME),
        (("own", "workers", "orders/\n0", "--once"), ErrorCode.INVALID_NAME),
        (
            ("own", "workers", "orders/0", "--generation", "-1", "--once"),
            ErrorCode.INVALID_ARGUMENT,
        ),
        (("own", "workers", "orders/0", "--generation=-5", "--once"), ErrorCode.INVALID_ARGUMENT),
        (("own", "workers", "orders/0", "orders/0", "--once"), ErrorCode.INVALID_ARGUMENT),
        (("own", "release", "nosuch"), ErrorCode.UNKNOWN_GROUP),
        (("own", "release", "nosuch", "orders/0"), ErrorCode.UNKNOWN_GROUP),
        (("own", "release", "workers", "orders/9"), ErrorCode.NOT_HELD),
        (("own", "release", "workers"), ErrorCode.NOT_HELD),
        (("topic", "create", "other", "--owner-group", ""), ErrorCode.INVALID_NAME),
    ],
)
def test_bad_own_input_exits_with_its_status_and_changes_nothing(
    invoke: Invoke, journal: None, args: tuple[str, ...], status: ErrorCode
) -> None:
    expect(invoke("own", "workers", "orders/0", "--generation", "3", "--once"), 0)
    before = everything(invoke)
    result = expect(invoke(*args), int(status))
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and f"[{status.name}]" in result.stderr
    assert everything(invoke) == before
    assert [t["topic"] for t in json_lines(invoke("topic", "list", "--json").stdout)] == ["journal"]


@pytest.mark.parametrize(
    "fence",
    [
        "samza:journal/0",
        "samza:journal/0:",
        ":journal/0:5",
        "samza::5",
        "samza:journal/0:-5",
        "samza:journal/0:five",
        "samza:journal/0:5 ",
        "",
    ],
)
@pytest.mark.parametrize("verb", ["produce", "consume"])
def test_a_malformed_fence_exits_15_and_changes_nothing(
    invoke: Invoke, journal: None, holder: Client, fence: str, verb: str
) -> None:
    holder.own("samza", ["journal/0"], generation=5)
    expect(invoke("produce", "journal", "-p", "0", "--fence", "samza:journal/0:5", "-v", "a"), 0)
    before = everything(invoke)
    extra = ("--partition", "0", "--value", "x") if verb == "produce" else ()
    result = expect(invoke(verb, "journal", "--fence", fence, *extra), int(ErrorCode.INVALID_FENCE))
    assert result.stdout == ""
    assert "GROUP:RESOURCE:GENERATION" in result.stderr and "[INVALID_FENCE]" in result.stderr
    assert everything(invoke) == before


def test_a_claim_below_a_live_higher_generation_exits_40_and_changes_no_holding(
    invoke: Invoke, holder: Client
) -> None:
    holder.own("workers", ["orders/0"], generation=5)
    before, audit = listed(invoke), history(invoke)
    result = expect(
        invoke("own", "workers", "orders/0", "orders/1", "--generation", "4", "--once", "--json"),
        int(ErrorCode.OWNED_BY_HIGHER_GENERATION),
    )
    assert result.stdout == ""
    error = json_error(result)
    assert (error["error"], error["code"]) == ("OWNED_BY_HIGHER_GENERATION", 40)
    assert (error["resource"], error["generation"]) == ("orders/0", 5)
    assert listed(invoke) == before  # orders/1 was not granted either: all or none
    after = history(invoke)
    [refusal] = after[: len(after) - len(audit)]
    assert (refusal["event"], refusal["resource"], refusal["requested"]) == (
        "refused",
        "orders/0",
        4,
    )


def test_a_stale_or_missing_fence_exits_41_and_appends_nothing(
    invoke: Invoke, journal: None, holder: Client
) -> None:
    expect(invoke("own", "samza", "journal/0", "--generation", "4", "--once"), 0)
    holder.own("samza", ["journal/0"], generation=5)
    expect(invoke("produce", "journal", "-p", "0", "--fence", "samza:journal/0:5", "-v", "a"), 0)
    before = everything(invoke)
    for fences in (
        ("--fence", "samza:journal/0:4"),  # the generation before
        ("--fence", "samza:journal/0:6"),  # a generation never granted
        ("--fence", "samza:journal/1:5"),  # another partition's resource
        ("--fence", "other:journal/0:5"),  # another group
        (),  # none at all
    ):
        result = invoke("produce", "journal", "--partition", "0", *fences, "--value", "late")
        expect(result, int(ErrorCode.FENCED))
        assert "[FENCED]" in result.stderr
    as_json = invoke(
        "produce", "journal", "-p", "0", "--fence", "samza:journal/0:4", "-v", "x", "--json"
    )
    assert json_error(expect(as_json, 41))["error"] == "FENCED"
    stale_read = invoke("consume", "journal", "--fence", "samza:journal/0:4")
    assert expect(stale_read, int(ErrorCode.FENCED)).stdout == ""
    assert everything(invoke) == before


def test_consume_with_a_stale_fence_exits_41_even_when_there_is_nothing_to_read(
    invoke: Invoke, journal: None, holder: Client
) -> None:
    expect(invoke("own", "samza", "journal/0", "--generation", "4", "--once"), 0)
    holder.own("samza", ["journal/0"], generation=5)
    expect(invoke("consume", "journal", "--fence", "samza:journal/0:4"), int(ErrorCode.FENCED))


def test_a_generation_too_large_to_store_exits_10_and_changes_nothing(invoke: Invoke) -> None:
    expect(invoke("own", "workers", "orders/0", "--generation", "3", "--once"), 0)
    before = (listed(invoke), history(invoke))
    result = invoke("own", "workers", "orders/0", "--generation", str(2**63), "--once")
    assert (listed(invoke), history(invoke)) == before
    expect(result, int(ErrorCode.INVALID_ARGUMENT))


# holding: real processes ---------------------------------------------------------------------

ENV_REPORT = """
import json, os
names = ["FENCELOG_OWNER_GROUP", "FENCELOG_OWNER_RESOURCES", "FENCELOG_OWNER_GENERATION",
         "FENCELOG_BROKER"]
print(json.dumps({name: os.environ.get(name) for name in names}), flush=True)
"""


def own_process(target: str, *args: str) -> Process:
    return Process([fencelog_script(), "--broker", target, "own", *args], env=tool_env())


def cli(target: str, *args: str) -> Result:
    """The CLI through CliRunner against any broker target (a directory or tcp://)."""
    return CliRunner().invoke(command(), ["--broker", target, *args], env=tool_env())


def test_own_command_gets_the_owner_env(data_dir: Path, invoke: Invoke) -> None:
    expect(invoke("own", "workers", "orders/0", "--generation", "5", "--once"), 0)
    own = own_process(
        str(data_dir), "workers", "orders/0", "orders/1", "--generation", "3",
        "--json", "--", sys.executable, "-c", ENV_REPORT,
    )  # fmt: skip
    with resumed_and_killed(own):
        assert own.wait(ENDS_WITHIN_S) == 0, own.stderr_text()
        lines = [json.loads(line) for line in own.remaining_lines()]
    assert lines == [
        {"group": "workers", "resource": "orders/0", "generation": 6},
        {"group": "workers", "resource": "orders/1", "generation": 3},
        {
            "FENCELOG_OWNER_GROUP": "workers",
            "FENCELOG_OWNER_RESOURCES": "orders/0,orders/1",
            "FENCELOG_OWNER_GENERATION": "6,3",
            "FENCELOG_BROKER": str(data_dir),
        },
    ]


def test_own_command_env_has_one_generation_when_all_agree(data_dir: Path) -> None:
    own = own_process(
        str(data_dir), "workers", "orders/0", "orders/1", "--generation", "3",
        "--", sys.executable, "-c", ENV_REPORT,
    )  # fmt: skip
    with resumed_and_killed(own):
        assert own.wait(ENDS_WITHIN_S) == 0, own.stderr_text()
        env = json.loads(own.remaining_lines()[-1])
    assert env["FENCELOG_OWNER_RESOURCES"] == "orders/0,orders/1"
    assert env["FENCELOG_OWNER_GENERATION"] == "3"


@pytest.mark.parametrize("kind", ["embedded", "served"])
def test_produce_inside_own_picks_up_the_fence(data_dir: Path, tmp_path: Path, kind: str) -> None:
    writer = tmp_path / "run-writer.sh"
    writer.write_text(
        "#!/bin/sh\nexec fencelog produce journal --partition 0 --value inside --json\n"
    )
    writer.chmod(0o755)
    with broker_target(kind, data_dir) as target:
        expect(cli(target, "topic", "create", "journal", "-p", "2", "--owner-group", "samza"), 0)
        own = own_process(target, "samza", "journal/0", "--generation", "4", "--", str(writer))
        with resumed_and_killed(own):
            assert own.wait(ENDS_WITHIN_S) == 0, own.stderr_text()
            lines = own.remaining_lines()
        assert lines[0] == "claimed samza:journal/0 at generation 4\n"
        digest = hashlib.sha256(b"inside").hexdigest()
        assert json.loads(lines[1]) == {
            "topic": "journal",
            "partition": 0,
            "offset": 0,
            "value_sha256": digest,
        }
        consumed = json_lines(expect(cli(target, "consume", "journal", "--json"), 0).stdout)
        assert [(r["partition"], r["value"]) for r in consumed] == [(0, "inside")]

        # own released when CMD ended (served: as soon as its connection ends), and the
        # fence no longer writes.
        def released() -> bool:
            rows = json_lines(expect(cli(target, "own", "list", "--json"), 0).stdout)
            return [(r["generation"], r["holder"], r["live"]) for r in rows] == [(4, None, False)]

        wait_until(released, 10, message="own's claim is released once it exits")
        late = cli(
            target, "produce", "journal", "-p", "0", "--fence", "samza:journal/0:4", "-v", "x"
        )
        expect(late, int(ErrorCode.FENCED))


def test_own_exits_with_the_commands_status(data_dir: Path, invoke: Invoke, journal: None) -> None:
    # CMD writes to a partition own does not hold: its fencelog produce fails with FENCED,
    # and own passes that status on.
    script = "fencelog produce journal --partition 1 --value elsewhere"
    own = own_process(str(data_dir), "samza", "journal/0", "--", "sh", "-c", script)
    with resumed_and_killed(own):
        assert own.wait(ENDS_WITHIN_S) == int(ErrorCode.FENCED), own.stderr_text()
        assert "[FENCED]" in own.stderr_text()
    exit7 = own_process(str(data_dir), "workers", "w/0", "--", sys.executable, "-c", "exit(7)")
    with resumed_and_killed(exit7):
        assert exit7.wait(ENDS_WITHIN_S) == 7
    # killed by a signal: 128 + N, as a shell says (it was 256 - N, 247 for SIGKILL)
    killed = own_process(str(data_dir), "workers", "w/1", "--", "sh", "-c", "kill -9 $$")
    with resumed_and_killed(killed):
        assert killed.wait(ENDS_WITHIN_S) == 128 + signal.SIGKILL
    assert records(invoke) == []
    assert not any(r["live"] for r in listed(invoke))


def test_a_refused_own_never_runs_the_command(
    data_dir: Path, invoke: Invoke, holder: Client, tmp_path: Path
) -> None:
    holder.own("workers", ["orders/0"], generation=5)
    marker = tmp_path / "ran"
    touch = f"open({str(marker)!r}, 'w').close()"
    own = own_process(str(data_dir), "workers", "orders/0", "--", sys.executable, "-c", touch)
    with resumed_and_killed(own):
        assert own.wait(ENDS_WITHIN_S) == int(ErrorCode.OWNED_BY_HIGHER_GENERATION)
    assert not marker.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_own_holds_until_interrupted_then_releases(
    data_dir: Path, invoke: Invoke, signum: signal.Signals
) -> None:
    own = own_process(
        str(data_dir), "workers", "orders/0", "orders/1", "--generation", "3", "--json"
    )
    with resumed_and_killed(own):
        claimed = [json.loads(own.line(ENDS_WITHIN_S)) for _ in range(2)]
        assert claimed == [
            {"group": "workers", "resource": "orders/0", "generation": 3},
            {"group": "workers", "resource": "orders/1", "generation": 3},
        ]
        assert [(r["generation"], r["live"]) for r in listed(invoke)] == [(3, True), (3, True)]
        expect(invoke("own", "workers", "orders/1", "--generation", "2", "--once"), 40)
        own.signal(signum)
        assert own.wait(ENDS_WITHIN_S) == 0, own.stderr_text()
    rows = listed(invoke)
    assert [(r["generation"], r["holder"], r["live"]) for r in rows] == [(3, None, False)] * 2


CHILD = """
import os, signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    def stop(signum, frame):
        print("child got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
print("child", os.getpid(), flush=True)
while True:  # idles until a signal ends it: that ending is what the tests look at
    time.sleep(0.05)
"""


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("kind", "sigterm"),
    [("embedded", "handle"), ("served", "handle"), ("embedded", "ignore")],
)
def test_a_severed_own_stops_its_command_and_exits_42(
    data_dir: Path, kind: str, sigterm: str
) -> None:
    with broker_target(kind, data_dir) as target:
        own = own_process(
            target, "workers", "orders/0", "--generation", "4", "--grace", GRACE,
            "--", sys.executable, "-c", CHILD, sigterm,
        )  # fmt: skip
        child_pid = 0
        with resumed_and_killed(own):
            try:
                assert own.line(ENDS_WITHIN_S) == "claimed workers:orders/0 at generation 4\n"
                child_pid = int(own.line(ENDS_WITHIN_S).split()[1])
                newer = cli(target, "own", "workers", "orders/0", "--generation", "5", "--once")
                assert expect(newer, 0).stdout == "claimed workers:orders/0 at generation 5\n"
                assert own.wait(ENDS_WITHIN_S) == int(ErrorCode.SEVERED)
                wait_until(
                    lambda: not pid_exists(child_pid), 10, message="CMD is gone when own exits"
                )
                rest = own.remaining_lines()
                assert "[SEVERED]" in own.stderr_text()
            finally:  # CMD must not outlive the test, even when own failed to stop it
                if child_pid and pid_exists(child_pid):
                    os.kill(child_pid, signal.SIGKILL)
        if sigterm == "handle":
            assert rest == ["child got SIGTERM\n"]
        else:
            assert rest == []  # it ignored SIGTERM; SIGKILL after the grace ended it


# idempotence under ownership, commands that cannot run, a server that goes away -------------


@pytest.mark.parametrize("kind", ["embedded", "served"])
def test_an_idempotent_produce_inside_own_writes_with_the_owners_fence(
    data_dir: Path, tmp_path: Path, kind: str
) -> None:
    writer = tmp_path / "run-writer.sh"
    writer.write_text(
        "#!/bin/sh\nexec fencelog produce journal --partition 0 --idempotent --value a --json\n"
    )
    writer.chmod(0o755)
    with broker_target(kind, data_dir) as target:
        expect(cli(target, "topic", "create", "journal", "-p", "2", "--owner-group", "samza"), 0)
        own = own_process(target, "samza", "journal/0", "--", str(writer))
        with resumed_and_killed(own):
            assert own.wait(ENDS_WITHIN_S) == 0, own.stderr_text()
        consumed = json_lines(expect(cli(target, "consume", "journal", "--json"), 0).stdout)
    assert [(r["partition"], r["value"]) for r in consumed] == [(0, "a")]


def test_an_idempotent_producer_with_a_stale_fence_is_fenced(
    data_dir: Path, invoke: Invoke, journal: None
) -> None:
    with connect(data_dir) as first, connect(data_dir) as second:
        [claimed] = first.own("samza", ["journal/0"], generation=3)
        producer = first.producer("journal", fences=[claimed.fence])
        assert [r.offset for r in producer.send([b"mine"], partition=0)] == [0]
        second.own("samza", ["journal/0"], generation=4)  # a newer owner: first is severed
        with pytest.raises(BrokerError) as raised:
            producer.send([b"zombie"], partition=0)
    assert raised.value.code is ErrorCode.FENCED
    assert records(invoke) == [(0, "mine")]


@pytest.mark.parametrize(
    ("make", "status"), [("missing", 127), ("not-executable", 126)], ids=["127", "126"]
)
def test_a_command_that_cannot_run_exits_as_a_shell_would_and_releases(
    data_dir: Path, invoke: Invoke, tmp_path: Path, make: str, status: int
) -> None:
    program = tmp_path / "program"
    if make == "not-executable":
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o644)
    own = own_process(str(data_dir), "workers", "w/0", "--", str(program))
    with resumed_and_killed(own):
        assert own.wait(ENDS_WITHIN_S) == status
    stderr = own.stderr_text()
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1 and stderr.startswith(f"error: cannot run {program}"), stderr
    assert [(r["resource"], r["live"]) for r in listed(invoke)] == [("w/0", False)]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_served_holder_whose_server_goes_away_is_severed(
    data_dir: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    from support.servers import ServeProcess

    child_pid = tmp_path / "child.pid"
    script = f"echo $$ > {child_pid}; exec sleep 120"
    server = ServeProcess(data_dir, tmp_path / "ready.json", serve_args=["--no-unix"])
    try:
        server.wait_ready()
        own = own_process(f"tcp://{server.tcp}", "workers", "w/0", "--", "sh", "-c", script)
        with resumed_and_killed(own):
            wait_until(child_pid.exists, ENDS_WITHIN_S, message="CMD started")
            wait_until(lambda: child_pid.read_text().strip() != "", ENDS_WITHIN_S)
            server.process.signal(stop)
            assert own.wait(ENDS_WITHIN_S) == int(ErrorCode.SEVERED), own.stderr_text()
        assert "[SEVERED]" in own.stderr_text()
        pid = int(child_pid.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # CMD was stopped with it
    finally:
        server.close()


def test_refusals_say_what_is_the_case(invoke: Invoke, journal: None) -> None:
    never = expect(
        invoke("produce", "journal", "-p", "0", "--fence", "samza:journal/0:1", "-v", "x"),
        ErrorCode.FENCED,
    )
    assert "nobody has ever claimed samza:journal/0" in never.stderr
    assert "newer owner" not in never.stderr
    expect(invoke("own", "samza", "journal/0", "--generation", "3", "--once"), 0)
    gone = expect(
        invoke("produce", "journal", "-p", "0", "--fence", "samza:journal/0:3", "-v", "x"),
        ErrorCode.FENCED,
    )
    assert "its holder is gone" in gone.stderr and "newer owner" not in gone.stderr
    unheld = expect(invoke("own", "release", "samza", "journal/0"), ErrorCode.NOT_HELD)
    assert "samza:journal/0 is not held by anyone: nothing to release" in unheld.stderr
    unknown = expect(invoke("own", "release", "nobody"), ErrorCode.UNKNOWN_GROUP)
    assert "no resource of group nobody was ever claimed" in unknown.stderr


def fencelog_in(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """One fencelog command as a user's shell runs it, in cwd (bounded by a timeout)."""
    command_line = [str(fencelog_script()), *args]
    return subprocess.run(
        command_line,
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=ENDS_WITHIN_S,
    )


@pytest.mark.parametrize("kind", ["embedded", "served"])
def test_a_released_claim_keeps_its_generation_embedded_as_served(
    tmp_path: Path, kind: str
) -> None:
    """Issue 37 item 2, as filed: `own g r --generation 4 -- CMD`, `own release g r`, `own
    list`, `own g r --once`; embedded in the default ./.fencelog, served through
    FENCELOG_BROKER. Both keep generation 4 when the holder is gone, the next claim gets
    5, and only an explicit generation 0 goes back (to 1). A holder killed before it
    released holds nothing, embedded as served."""
    work = tmp_path / "work"
    work.mkdir()
    with contextlib.ExitStack() as stack:
        env = tool_env()
        if kind == "served":
            env["FENCELOG_BROKER"] = stack.enter_context(serving(tmp_path / "served"))

        def run(*args: str, status: int = 0) -> str:
            done = fencelog_in(work, env, *args)
            assert done.returncode == status, (args, done.stdout, done.stderr)
            return done.stdout + done.stderr

        def holders() -> list[str]:
            return [line for line in run("own", "list").splitlines() if line]

        assert run("own", "g", "r", "--generation", "4", "--", "true") == (
            "claimed g:r at generation 4\n"
        )
        # served, the session of own's connection ends just after own exits
        wait_until(lambda: holders() == ["g\tr\t4\t\tno"], ENDS_WITHIN_S, message="not live")
        refused = run("own", "release", "g", "r", status=int(ErrorCode.NOT_HELD))
        assert "g:r is not held by anyone: nothing to release" in refused
        assert "the generation stays recorded" in refused
        assert holders() == ["g\tr\t4\t\tno"]
        assert run("own", "g", "r", "--once") == "claimed g:r at generation 5\n"

        # released while CMD holds it: CMD's own is severed, the generation stays
        own = Process(
            [fencelog_script(), "own", "g", "r", "--generation", "7", "--", "sleep", "60"],
            env=env,
            cwd=work,
        )
        with resumed_and_killed(own):
            wait_until(lambda: holders()[0].endswith("\tyes"), ENDS_WITHIN_S, message="held")
            assert holders()[0].startswith("g\tr\t7\t")
            assert run("own", "release", "g", "r") == "released g:r\n"
            assert own.wait(ENDS_WITHIN_S) == int(ErrorCode.SEVERED), own.stderr_text()
        assert holders() == ["g\tr\t7\t\tno"]
        assert run("own", "g", "r", "--once") == "claimed g:r at generation 8\n"
        assert run("own", "g", "r", "--generation", "0", "--once") == (
            "claimed g:r at generation 1\n"
        )

        # its holder killed, never releasing: nobody holds it (embedded listed the dead
        # process, and `own release` severed it and exited 0)
        killed = fencelog_in(work, env, "own", "g", "r", "--", "sh", "-c", "kill -9 $PPID")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        wait_until(lambda: holders() == ["g\tr\t2\t\tno"], ENDS_WITHIN_S, message="released")
        refused = run("own", "release", "g", "r", status=int(ErrorCode.NOT_HELD))
        assert "g:r is not held by anyone: nothing to release" in refused
        assert run("own", "g", "r", "--once") == "claimed g:r at generation 3\n"
    if kind == "embedded":
        assert (work / ".fencelog").is_dir()
