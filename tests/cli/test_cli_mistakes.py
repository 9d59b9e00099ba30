"""A newcomer's mistakes get one clear line and a documented exit status, and nothing is
created by accident: an address is never taken for a directory, a reading command does
not create the directory it was pointed at, a failed command leaves no new directory, and
a damaged database is named as such (with `fencelog check` to say what is wrong)."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.discovery import DB_FILE
from broker.errors import ErrorCode
from cli.consume import TEXT_COLUMNS, _Shown
from cli.formats import Format, Rendering
from cli.main import command
from cli.output import Output
from support.helpers import Invoke, Processes, expect, json_error, json_lines
from support.servers import serving
from support.waiting import wait_until


def fencelog(runner: CliRunner, *args: str, cwd: Path | None = None) -> Result:
    if cwd is None:
        return runner.invoke(command(list(args)), list(args))
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(command(list(args)), list(args))
    finally:
        os.chdir(old)


def one_line(result: Result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --broker: an address is an address -----------------------------------------------------


@pytest.mark.parametrize("target", ["127.0.0.1:1", "localhost:1", "[::1]:1"])
def test_host_port_without_a_scheme_is_an_address_not_a_directory(
    runner: CliRunner, tmp_path: Path, target: str
) -> None:
    result = expect(fencelog(runner, "--broker", target, "status", cwd=tmp_path), 80)
    assert f"tcp://{target}" in one_line(result)
    assert list(tmp_path.iterdir()) == [], "no directory named after the address"


def test_host_port_reaches_a_server_as_its_url_does(
    runner: CliRunner, tmp_path: Path, data_dir: Path
) -> None:
    with serving(data_dir, tmp_path / "ready.json") as server:
        expect(fencelog(runner, "--broker", server.tcp, "topic", "create", "t"), 0)
        listed = expect(fencelog(runner, "--broker", f"tcp://{server.tcp}", "topic", "list"), 0)
    assert listed.stdout.split("\t")[0] == "t"


@pytest.mark.parametrize("target", ["http://127.0.0.1:7420", "kafka://host:9092"])
def test_an_unknown_scheme_is_refused(runner: CliRunner, tmp_path: Path, target: str) -> None:
    result = expect(fencelog(runner, "--broker", target, "topic", "list", cwd=tmp_path), 10)
    assert "unknown scheme" in one_line(result)
    assert list(tmp_path.iterdir()) == []


# --broker DIR that does not exist ------------------------------------------------------

READING = [
    ["topic", "list"],
    ["topic", "describe", "t"],
    ["consume", "t"],
    ["status"],
    ["txn", "list"],
    ["producers", "list", "t"],
    ["own", "list"],
    ["snapshot", "list"],
    ["lease-pid", "t", "0"],
    ["check"],
]


@pytest.mark.parametrize("args", READING, ids=lambda a: "-".join(a[:2]))
def test_a_reading_command_refuses_a_missing_directory(
    runner: CliRunner, tmp_path: Path, args: list[str]
) -> None:
    missing = tmp_path / "typo"
    result = expect(fencelog(runner, "--broker", str(missing), *args), ErrorCode.DATA_DIR_MISSING)
    line = one_line(result)
    assert str(missing) in line and "DATA_DIR_MISSING" in line
    assert not missing.exists()


def test_the_missing_directory_error_in_json(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = expect(fencelog(runner, "--broker", str(missing), "status", "--json"), 36)
    assert json_error(result)["path"] == str(missing)


def test_a_writing_command_creates_the_directory(runner: CliRunner, tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    expect(fencelog(runner, "--broker", str(new), "topic", "create", "t"), 0)
    assert (new / DB_FILE).is_file()
    assert expect(fencelog(runner, "--broker", str(new), "topic", "list"), 0).stdout.startswith("t")


def test_txn_begin_writes_and_creates_the_directory(runner: CliRunner, tmp_path: Path) -> None:
    new = tmp_path / "new"
    expect(fencelog(runner, "--broker", str(new), "txn-begin", "--group", "g"), 0)
    assert (new / DB_FILE).is_file()


def test_the_default_directory_is_still_created_by_any_command(
    runner: CliRunner, tmp_path: Path
) -> None:
    expect(fencelog(runner, "topic", "list", cwd=tmp_path), 0)
    assert (tmp_path / ".fencelog" / DB_FILE).is_file()


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "nope", "--value", "x"],
        ["topic", "create", "bad name"],
        ["own", "g", "r", "--generation", "-1"],
        ["own", "g", "", "--once"],  # refused by the broker: after its session began
    ],
    ids=["produce-unknown-topic", "create-bad-name", "own-bad-generation", "own-bad-resource"],
)
def test_a_failed_writing_command_leaves_no_new_directory(
    runner: CliRunner, tmp_path: Path, args: list[str]
) -> None:
    new = tmp_path / "new" / "data"
    result = fencelog(runner, "--broker", str(new), *args)
    assert result.exit_code >= 2, result.stdout
    assert not (tmp_path / "new").exists(), sorted(p.name for p in tmp_path.rglob("*"))


def test_a_failed_command_keeps_a_directory_that_existed(invoke: Invoke, data_dir: Path) -> None:
    expect(invoke("produce", "nope", "--value", "x"), ErrorCode.UNKNOWN_TOPIC)
    assert data_dir.is_dir()


@pytest.mark.parametrize(
    ("name", "shown"),
    [("a b/c", "topic name 'a b/c' has characters other than"), ("", "topic name is empty")],
)
@pytest.mark.parametrize("args", [["produce", "-v", "x"], ["consume"], ["topic", "describe"]])
def test_a_bad_topic_name_is_named_as_such_not_as_a_missing_topic(
    invoke: Invoke, name: str, shown: str, args: list[str]
) -> None:
    """No `create it with: fencelog topic create a b/c` hint that cannot work."""
    command, *rest = args
    argv = ["topic", "describe", name] if command == "topic" else [command, name, *rest]
    result = expect(invoke(*argv), ErrorCode.INVALID_TOPIC_NAME)
    line = one_line(result)
    assert shown in line and "A-Z a-z 0-9 . _ -" in line, line
    assert "create it with" not in line


def test_a_hint_that_shows_a_command_quotes_the_names_in_it(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "t"), 0)
    fence = "my group:row 1:3"
    result = expect(invoke("produce", "t", "-v", "x", "--fence", fence), ErrorCode.FENCED)
    assert "fencelog own 'my group' 'row 1' -- CMD" in one_line(result)


# a damaged database ----------------------------------------------------------------------


@pytest.fixture
def filled(invoke: Invoke, data_dir: Path) -> Path:
    expect(invoke("topic", "create", "t", "--partitions", "2"), 0)
    lines = "".join(f"value-{i:05d}-" + "x" * 200 + "\n" for i in range(3000))
    expect(invoke("produce", "t", input=lines), 0)
    with sqlite3.connect(data_dir / DB_FILE) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return data_dir


def truncate(path: Path) -> None:
    os.truncate(path / DB_FILE, (path / DB_FILE).stat().st_size // 2)


def scribble(path: Path) -> None:
    with (path / DB_FILE).open("r+b") as file:
        file.seek(8192)
        file.write(b"\xa5" * 16384)


@pytest.mark.parametrize("damage", [truncate, scribble])
@pytest.mark.parametrize(
    "args", [["status"], ["consume", "t"], ["produce", "t", "--value", "x"], ["topic", "list"]]
)
def test_a_damaged_database_is_one_line_with_its_own_status(
    invoke: Invoke, filled: Path, damage: object, args: list[str]
) -> None:
    assert callable(damage)
    damage(filled)
    result = expect(invoke(*args), ErrorCode.DATA_CORRUPT)
    line = one_line(result)
    assert str(filled / DB_FILE) in line and "fencelog check" in line


def test_check_passes_a_sound_database(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("check"), 0)
    assert result.stdout.startswith(f"ok: {filled / DB_FILE} passed")
    report = json_lines(expect(invoke("check", "--json"), 0).stdout)
    assert report[0]["ok"] is True and report[0]["problems"] == []


def test_check_refuses_what_the_other_commands_refuse(invoke: Invoke, filled: Path) -> None:
    """`check` said "ok" of another program's SQLite database and of a schema newer than
    this fencelog's, which every other command refuses (31, 32)."""
    with sqlite3.connect(filled / DB_FILE) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    newer = expect(invoke("check"), ErrorCode.SCHEMA_TOO_NEW)
    assert "has schema version 99" in one_line(newer)
    (filled / DB_FILE).unlink()
    for name in ("-wal", "-shm"):
        (filled / (DB_FILE + name)).unlink(missing_ok=True)
    with sqlite3.connect(filled / DB_FILE) as conn:
        conn.execute("CREATE TABLE other (a)")
    conn.close()
    foreign = expect(invoke("check"), ErrorCode.FOREIGN_DATA_DIR)
    assert "is a SQLite database, but not fencelog's" in one_line(foreign)
    (filled / DB_FILE).unlink()
    (filled / DB_FILE).mkdir()  # every other command: DATA_DIR_UNREADABLE (check said 36)
    for args in (("check",), ("topic", "list")):
        unreadable = expect(invoke(*args), ErrorCode.DATA_DIR_UNREADABLE)
        assert f"cannot open {filled / DB_FILE}" in one_line(unreadable)


@pytest.mark.parametrize("damage", [truncate, scribble])
def test_check_names_the_damage_and_what_to_do(
    invoke: Invoke, filled: Path, damage: object
) -> None:
    assert callable(damage)
    damage(filled)
    result = expect(invoke("check"), ErrorCode.DATA_CORRUPT)
    assert result.stdout.startswith(f"damaged: {filled / DB_FILE}")
    assert "what to do: restore the newest snapshot" in result.stdout
    report = json_lines(expect(invoke("check", "--json"), 37).stdout)[0]
    assert report["ok"] is False and report["problems"]


def test_check_finds_a_damaged_transaction_batch(invoke: Invoke, filled: Path) -> None:
    """A journaled batch whose packed records SQLite's own checks cannot see into."""
    txn_id = json_lines(expect(invoke("txn-begin", "--group", "g", "--json"), 0).stdout)[0][
        "txn_id"
    ]
    expect(invoke("produce", "t", "--txn", str(txn_id), "--partition", "1", "--value", "a"), 0)
    damaged = sqlite3.connect(filled / DB_FILE)
    with damaged:
        damaged.execute("UPDATE log SET vals = X'c1c1c1' WHERE topic_id <= 0")  # its values
    damaged.close()
    result = expect(invoke("check"), ErrorCode.DATA_CORRUPT)
    assert result.stdout.startswith(f"damaged: {filled / DB_FILE}")
    said = f"transaction {txn_id}'s journaled batch at topic id 1 partition 1 position 0"
    assert said in result.stdout
    report = json_lines(expect(invoke("check", "--json"), 37).stdout)[0]
    assert report["ok"] is False and len(report["problems"]) == 1


def test_serve_refuses_a_damaged_directory(tmp_path: Path, filled: Path) -> None:
    truncate(filled)
    processes = Processes()
    try:
        serve = processes.fencelog("--broker", filled, "serve", "--listen", "127.0.0.1:0")
        assert serve.wait(30) == ErrorCode.DATA_CORRUPT
        stderr = serve.stderr_text()
    finally:
        processes.close()
    assert stderr.count("\n") == 1 and "DATA_CORRUPT" in stderr, stderr


# what consume and produce say ------------------------------------------------------------


def test_consume_from_past_the_end_says_so(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "t"), 0)
    expect(invoke("produce", "t", "--value", "a"), 0)
    result = expect(invoke("consume", "t", "--from", "5"), 0)
    assert result.stdout == ""
    assert (
        result.stderr
        == "warning: --from 5 is past the end (t/0 ends at 1): nothing to read there\n"
    )
    assert expect(invoke("consume", "t", "--from", "1"), 0).stderr == ""


def test_consume_on_a_terminal_prints_a_table() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    from broker.types import Record

    screen = Terminal()
    shown = _Shown(Output(False, screen), Rendering(Format.text), table=True)
    shown.add(Record("t", 0, 7, 0, b"k", b"hello", (), 0, 0, 0, 0, None))
    shown.flush()
    text = screen.getvalue()
    for column in TEXT_COLUMNS:
        assert column in text
    assert "hello" in text and "\t" not in text


def test_consume_short_options_follow_kcat_and_tail(invoke: Invoke) -> None:
    expect(invoke("topic", "create", "t"), 0)
    expect(invoke("produce", "t", "-v", "a", "-v", "b", "-v", "c"), 0)
    result = expect(invoke("consume", "t", "-o", "1", "-c", "1"), 0)
    assert result.stdout == "0\t1\t\tb\n"
    followed = expect(invoke("consume", "t", "-o", "2", "-f", "--timeout", "100ms"), 0)
    assert followed.stdout == "0\t2\t\tc\n"
    usage = expect(invoke("consume", "t", "-f", "hex"), 2)
    assert "hex" in usage.stderr


def test_durability_against_a_server_is_warned_about(
    runner: CliRunner, tmp_path: Path, data_dir: Path
) -> None:
    with serving(data_dir, tmp_path / "ready.json") as server:
        url = f"tcp://{server.tcp}"
        result = expect(fencelog(runner, "--broker", url, "--durability", "normal", "status"), 0)
        quiet = expect(fencelog(runner, "--broker", url, "status"), 0)
    assert "warning: --durability normal applies to a data directory" in result.stderr
    assert "warning" not in quiet.stderr


def test_produce_stopped_by_sigterm_finishes_and_summarises(
    processes: Processes, data_dir: Path, invoke: Invoke
) -> None:
    expect(invoke("topic", "create", "t"), 0)
    producing = processes.fencelog("--broker", data_dir, "produce", "t", stdin=True)
    producing.stdin.write(b"a\nb\n")
    producing.stdin.flush()

    def landed() -> bool:
        return expect(invoke("consume", "t"), 0).stdout.count("\n") == 2

    wait_until(landed, 30, message="both lines acknowledged")
    producing.signal(signal.SIGTERM)
    assert producing.wait(30) == 0
    assert producing.remaining_lines() == ["produced 2 records to t: partition 0 offsets 0-1\n"]
    # nothing was being sent: the message says so, not "finishing the batch in flight"
    assert "SIGTERM: stopping; no batch was in flight" in producing.stderr_text()


# the exit status table -------------------------------------------------------------------


def test_every_exit_status_is_listed_once(runner: CliRunner) -> None:
    shown = expect(fencelog(runner, "--help"), 0).stdout
    table = shown[shown.index("Exit statuses") :]
    statuses = [line.split()[0] for line in table.splitlines()[1:] if line.strip()[:1].isdigit()]
    assert len(statuses) == len(set(statuses)), statuses
    for status in ("1", "36", "37", "83", "126", "127"):
        assert status in statuses
    assert "119" not in statuses, "INTERNAL exits 1, as any bug does"


# usage mistakes: what to type instead ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("statsu",), "No such command 'statsu'. Did you mean 'status'?"),
        (("topic", "lst"), "No such command 'lst'. Did you mean 'list'?"),
        (
            ("serve", "--broker", "x"),
            "--broker is an option of fencelog itself, not of the command: give it before "
            "the command (fencelog --broker ... serve ...)",
        ),
        (
            ("topic", "create", "t", "-b", "x"),
            "-b is an option of fencelog itself, not of the command: give it before the "
            "command (fencelog -b ... topic create ...)",
        ),
        (
            ("--json", "produce", "t", "--value", "x"),
            "--json is an option of each command, not of fencelog itself: give it after the "
            "command (fencelog COMMAND ... --json)",
        ),
    ],
)
def test_a_usage_mistake_says_what_to_type_once(
    runner: CliRunner, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    """A mistyped command is suggested once (click and Typer would both suggest it), and
    an option given on the wrong side of the command says which side it belongs on;
    nothing is created."""
    result = expect(fencelog(runner, *args, cwd=tmp_path), 2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: {said}"], result.stderr
    assert list(tmp_path.iterdir()) == []
