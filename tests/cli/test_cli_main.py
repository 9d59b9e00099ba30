"""The root command as `fencelog` runs it: only the subcommand named on the command line
is built (cli.main.command), and what a user sees is the same as with the whole tree."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import ROOT_VALUE_OPTIONS, command, invoked


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
