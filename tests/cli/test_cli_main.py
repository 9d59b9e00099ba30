"""The root command as `fencelog` runs it: only the subcommand named on the command line
is built (cli.main.command), and what a user sees is the same as with the whole tree."""

from __future__ import annotations

import importlib.abc
import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli import start
from cli.main import ROOT_VALUE_OPTIONS, command, invoked
from support.helpers import ctrl_c_as_at_a_terminal
from support.waiting import wait_until


def test_the_root_options_skipped_are_the_ones_that_take_a_value() -> None:
    root = command()
    taking_values = {
        opt
        for param in root.params
        if isinstance(param, click.Option) and not param.is_flag
        for opt in (*param.opts, *param.secondary_opts)
    }
    assert taking_values == ROOT_VALUE_OPTIONS


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["--broker", "d", "produce", "orders"], "produce"),
        (["-b", "d", "topic", "list"], "topic"),
        (["--broker=d", "consume", "orders"], "consume"),
        (["-bd", "status"], "status"),
        (["--durability", "normal", "txn-begin", "g"], "txn-begin"),
        (["--broker", "produce", "status"], "status"),  # a directory named produce
        (["--auth-token-file", "t", "serve"], "serve"),
        (["--help"], None),
        (["--version"], None),
        (["-b", "d", "--bogus", "status"], None),
        (["-b", "d", "nope"], None),
        (["-b", "d"], None),
        ([], None),
    ],
)
def test_the_subcommand_named(args: list[str], name: str | None) -> None:
    assert invoked(args) == name


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["produce", "--help"],
        ["topic", "--help"],
        ["topic", "create", "--help"],
        ["produce"],
        ["produce", "orders", "--partition", "x"],
        ["topic", "list", "--bogus"],
        ["nope"],
        ["prodcue", "orders"],
        [],
    ],
)
def test_a_tree_built_for_the_arguments_answers_as_the_whole_tree(
    args: list[str], tmp_path: Path
) -> None:
    argv = ["--broker", str(tmp_path / "data"), *args]
    whole = CliRunner().invoke(command(), argv)
    built = CliRunner().invoke(command(argv), argv)
    assert (built.exit_code, built.output) == (whole.exit_code, whole.output)
    assert whole.output  # help, a version or an error: never silence


def test_a_subcommands_tree_holds_that_command_only() -> None:
    built = command(["--broker", "d", "txn", "list"])
    assert list(built.commands) == ["txn"]
    assert len(command().commands) > 10


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C arriving while `fencelog` imports cli.main (its first ~0.3 s)."""

    def find_spec(self, name: str, *_args: object) -> None:
        if name == "cli.main":
            raise KeyboardInterrupt


def test_ctrl_c_during_the_imports_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "cli.main")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as stopped:
        start.run()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "fencelog: interrupted\n"


def _sleeping(pid: int) -> bool:
    """pid is in a timed sleep (the kernel's wait channel for time.sleep)."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def test_ctrl_c_while_a_command_waits_is_one_line_and_130(tmp_path: Path) -> None:
    """A command retrying a connection, interrupted: no traceback, status 130."""
    fencelog = str(Path(sys.executable).parent / "fencelog")
    args = [fencelog, "--broker", "tcp://127.0.0.1:1", "topic", "list"]
    env = os.environ | {"FENCELOG_CONNECT_TIMEOUT": "30s"}
    with ctrl_c_as_at_a_terminal():
        process = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        # it sleeps between connection attempts: Ctrl-C lands while it waits
        wait_until(lambda: _sleeping(process.pid), 30, message="fencelog retrying")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert (process.returncode, stderr) == (130, "fencelog: interrupted\n")
