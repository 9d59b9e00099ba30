"""fencelog status, the data directory checks every command goes through, and how output
looks piped, with NO_COLOR, and on a terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
import sqlite_utils
from click.testing import CliRunner

import broker
from broker.discovery import DB_FILE
from broker.errors import ErrorCode
from broker.storage.database import SCHEMA_VERSION
from broker.types import NewRecord
from cli.main import command
from support.helpers import Invoke, expect, fencelog_script, json_error, json_lines, user_env


@pytest.fixture
def filled(data_dir: Path) -> Path:
    with broker.open(data_dir) as engine:
        engine.create_topic("orders", partitions=4)
        engine.create_topic("audit")
        engine.produce("orders", [NewRecord(b"abc", partition=1)] * 3)
        engine.produce("orders", [NewRecord(b"d", partition=3)])
    return data_dir


def test_status_json(invoke: Invoke, filled: Path) -> None:
    [status] = json_lines(expect(invoke("status", "--json"), 0).stdout)
    assert status["data_dir"] == str(filled.resolve())
    assert status["schema_version"] == SCHEMA_VERSION
    assert status["durability"] == "full"
    assert status["database_bytes"] > 0
    assert [t["topic"] for t in status["topics"]] == ["audit", "orders"]
    orders = status["topics"][1]
    assert orders["partitions"] == 4
    assert orders["records"] == 4
    assert [(p["partition"], p["end_offset"]) for p in orders["partition_details"]] == [
        (0, 0),
        (1, 3),
        (2, 0),
        (3, 1),
    ]
    assert [p["end_offset"] for p in status["topics"][0]["partition_details"]] == [0]


def test_status_follows_produce(invoke: Invoke, filled: Path) -> None:
    expect(invoke("produce", "orders", "-p", "2", "-v", "x", "-v", "y"), 0)
    [status] = json_lines(expect(invoke("status", "--json"), 0).stdout)
    orders = status["topics"][1]
    assert [p["end_offset"] for p in orders["partition_details"]] == [0, 3, 2, 1]


def test_status_reports_chosen_durability(invoke: Invoke, filled: Path) -> None:
    [status] = json_lines(expect(invoke("--durability", "normal", "status", "--json"), 0).stdout)
    assert status["durability"] == "normal"


def test_status_of_a_new_directory_has_no_topics(invoke: Invoke, data_dir: Path) -> None:
    [status] = json_lines(expect(invoke("status", "--json"), 0).stdout)
    assert status["topics"] == []
    assert status["data_dir"] == str(data_dir.resolve())


def test_status_plain_when_piped(invoke: Invoke, filled: Path) -> None:
    result = expect(invoke("status"), 0)
    lines = result.stdout.splitlines()
    assert f"data directory\t{filled.resolve()}" in lines
    assert f"schema version\t{SCHEMA_VERSION}" in lines
    assert "durability\tfull" in lines
    assert "orders\t1\t3\t3\t9" in lines
    assert "audit\t0\t0\t0\t0" in lines
    assert "\x1b" not in result.stdout
    assert not any(c in result.stdout for c in "\u2500\u2502\u2503\u2501")  # no table borders


def test_broker_from_environment(runner: CliRunner, filled: Path) -> None:
    result = runner.invoke(command(), ["status", "--json"], env={"FENCELOG_BROKER": str(filled)})
    [status] = json_lines(expect(result, 0).stdout)
    assert status["data_dir"] == str(filled.resolve())


def test_version(invoke: Invoke) -> None:
    assert expect(invoke("--version"), 0).stdout == f"fencelog {broker.__version__}\n"


# data directories that are refused ----------------------------------------------------

COMMANDS = [
    ["status"],
    ["topic", "list"],
    ["topic", "create", "orders"],
    ["produce", "orders", "-v", "x"],
    ["consume", "orders"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_foreign_data_dir_exits_31(invoke: Invoke, data_dir: Path, args: list[str]) -> None:
    data_dir.mkdir(exist_ok=True)
    (data_dir / "notes.txt").write_text("mine\n")
    result = expect(invoke(*args), ErrorCode.FOREIGN_DATA_DIR)
    assert result.stdout == ""
    assert "holds no fencelog data" in result.stderr
    assert "[FOREIGN_DATA_DIR]" in result.stderr
    assert json_error(invoke(*args, "--json"))["error"] == "FOREIGN_DATA_DIR"
    assert sorted(p.name for p in data_dir.iterdir()) == ["notes.txt"]


def test_someone_elses_sqlite_file_exits_31(invoke: Invoke, data_dir: Path) -> None:
    data_dir.mkdir(exist_ok=True)
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        db.table("invoices").insert({"id": 1})
    before = (data_dir / DB_FILE).read_bytes()
    result = expect(invoke("topic", "create", "orders"), 31)
    assert "not fencelog's" in result.stderr
    assert (data_dir / DB_FILE).read_bytes() == before


def test_garbage_database_file_exits_31(invoke: Invoke, data_dir: Path) -> None:
    data_dir.mkdir(exist_ok=True)
    (data_dir / DB_FILE).write_bytes(b"garbage " * 200)
    error = json_error(expect(invoke("status", "--json"), 31))
    assert error["error"] == "FOREIGN_DATA_DIR"
    assert (data_dir / DB_FILE).read_bytes() == b"garbage " * 200


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a[:2]))
def test_newer_schema_exits_32(invoke: Invoke, filled: Path, args: list[str]) -> None:
    with contextlib.closing(sqlite_utils.Database(filled / DB_FILE)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    before = (filled / DB_FILE).read_bytes()
    result = expect(invoke(*args), ErrorCode.SCHEMA_TOO_NEW)
    assert result.stdout == ""
    assert f"schema version {SCHEMA_VERSION + 5}" in result.stderr
    assert "upgrade fencelog" in result.stderr
    error = json_error(invoke(*args, "--json"))
    assert (error["error"], error["found"]) == ("SCHEMA_TOO_NEW", SCHEMA_VERSION + 5)
    assert (filled / DB_FILE).read_bytes() == before


def test_regular_file_as_broker_exits_30(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("not a directory\n")
    result = runner.invoke(command(), ["--broker", str(path), "status"])
    expect(result, ErrorCode.DATA_DIR_UNREADABLE)
    assert "is not a directory" in result.stderr
    assert path.read_text() == "not a directory\n"


# on a terminal ------------------------------------------------------------------------


def run_on_terminal(args: list[str], env: dict[str, str], timeout_s: float = 15.0) -> str:
    """Run fencelog with stdout on a pseudo-terminal; what the terminal shows."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(fencelog_script()), *args],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.1)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=max(0.1, deadline - time.monotonic())) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(controller)
    return shown.decode("utf-8", "replace").replace("\r\n", "\n")


def test_terminal_gets_a_table(filled: Path) -> None:
    shown = run_on_terminal(
        ["--broker", str(filled), "topic", "list"], user_env(TERM="xterm-256color")
    )
    assert "orders" in shown
    assert "\u2503" in shown or "\u2502" in shown  # rich draws a table
    assert "orders\t4" not in shown


def test_no_color_on_a_terminal_stays_plain(filled: Path) -> None:
    shown = run_on_terminal(
        ["--broker", str(filled), "topic", "list"], user_env(TERM="xterm-256color", NO_COLOR="1")
    )
    assert shown == "audit\t1\t0\t0\t\norders\t4\t4\t10\t\n"
