"""Man pages and shell completion scripts, generated from the CLI itself.

    python -m cli.docs write    # regenerate man/ and completions/
    python -m cli.docs check    # exit 1 and name the stale files if they are not current

The man pages are built from the same click command tree that parses the command line,
so an option's help, default and environment variable cannot drift from the page. The
completion scripts are click's standard ones for bash, zsh and fish; they call
`fencelog` back with _FENCELOG_COMPLETE set, so they complete new commands without being
regenerated, but a test still checks they match.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from broker import __version__
from cli.errors import exit_status_table
from cli.main import command

ROOT = Path(__file__).resolve().parent.parent
COMPLETION_FILES = {"bash": "fencelog.bash", "zsh": "_fencelog", "fish": "fencelog.fish"}

_MAIN_SECTIONS = r"""
.SH ENVIRONMENT
.TP
.B FENCELOG_BROKER
The broker to use when \fB\-\-broker\fR is not given: a data directory path, or a
server's address (\fItcp://HOST:PORT\fR, \fIHOST:PORT\fR, \fIunix://PATH\fR).
Default: \fI./.fencelog\fR.
.TP
.B FENCELOG_DURABILITY
\fBfull\fR or \fBnormal\fR, when \fB\-\-durability\fR is not given.
.TP
.B FENCELOG_AUTH_TOKEN_FILE
The token file for a server started with \fB\-\-auth\-token\-file\fR, when
\fB\-\-auth\-token\-file\fR is not given.
.TP
.B FENCELOG_REQUEST_TIMEOUT
How long a request to a server may wait for its reply, when \fB\-\-request\-timeout\fR
is not given (default 30s).
.TP
.B FENCELOG_CONNECT_TIMEOUT
How long a refused connection to a server is retried, when \fB\-\-connect\-timeout\fR
is not given (default 500ms).
.TP
.B NO_COLOR
When set, output is plain text even on a terminal.
.SH FILES
.TP
.I DATA_DIR/fencelog.db
The SQLite database (WAL mode) holding topics, partitions and their logs;
\fIfencelog.db\-wal\fR and \fIfencelog.db\-shm\fR beside it belong to it.
The directory is created 0700 and the files 0600.
.SH DURABILITY
With \fB\-\-durability full\fR (the default) every acknowledged write has been fsynced
and survives power loss. With \fBnormal\fR an acknowledged write survives the
process being killed (kill \-9) but the last commits may be lost if the machine itself
loses power. Several processes may share one data directory at once.
"""


def _escape(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        ("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def _commands(
    group: click.Group, ctx: click.Context
) -> Iterator[tuple[click.Context, click.Command]]:
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        assert sub is not None
        sub_ctx = click.Context(sub, info_name=name, parent=ctx)
        yield sub_ctx, sub
        if isinstance(sub, click.Group):
            yield from _commands(sub, sub_ctx)


def _page(ctx: click.Context, cmd: click.Command, *, main: bool) -> str:
    path = ctx.command_path
    title = path.replace(" ", "-")
    summary = cmd.get_short_help_str(limit=200).removeprefix(f"{title}: ")
    lines = [
        f'.TH {title.upper()} 1 "" "fencelog {__version__}" "fencelog manual"',
        ".SH NAME",
        f"{_escape(title)} \\- {_escape(summary)}",
        ".SH SYNOPSIS",
        f".B {_escape(path)}",
        _escape(" ".join(cmd.collect_usage_pieces(ctx))),
    ]
    if cmd.help:
        lines += [".SH DESCRIPTION", _escape(cmd.help.replace("\b\n", ""))]
    options = [p.get_help_record(ctx) for p in cmd.get_params(ctx)]
    if any(options):
        lines.append(".SH OPTIONS")
        for record in options:
            if record:
                lines += [".TP", f"\\fB{_escape(record[0])}\\fR", _escape(record[1])]
    if isinstance(cmd, click.Group):
        lines.append(".SH COMMANDS")
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            lines += [".TP", f"\\fB{_escape(name)}\\fR", _escape(sub.get_short_help_str(200))]
    if main:
        lines.append(".SH EXIT STATUS")
        for status, name in exit_status_table():
            lines += [".TP", f".B {status}", _escape(name)]
        lines.append(_MAIN_SECTIONS.strip())
    lines += [".SH SEE ALSO", "\\fBfencelog\\fR(1)" if not main else _see_also(ctx)]
    return "\n".join(lines) + "\n"


def _see_also(ctx: click.Context) -> str:
    group = ctx.command
    assert isinstance(group, click.Group)
    names = [sub_ctx.command_path.replace(" ", "-") for sub_ctx, _ in _commands(group, ctx)]
    return ",\n".join(f"\\fB{_escape(name)}\\fR(1)" for name in names)


def expected_files() -> dict[Path, str]:
    """Every generated file and its content."""
    root_cmd = command()
    ctx = click.Context(root_cmd, info_name="fencelog")
    files = {ROOT / "man" / "fencelog.1": _page(ctx, root_cmd, main=True)}
    for sub_ctx, sub in _commands(root_cmd, ctx):
        name = sub_ctx.command_path.replace(" ", "-")
        files[ROOT / "man" / f"{name}.1"] = _page(sub_ctx, sub, main=False)
    for shell, filename in COMPLETION_FILES.items():
        completion = get_completion_class(shell)
        assert completion is not None
        source = completion(root_cmd, {}, "fencelog", "_FENCELOG_COMPLETE").source()
        files[ROOT / "completions" / filename] = source.rstrip("\n") + "\n"
    return files


def stale_files() -> list[Path]:
    expected = expected_files()
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    for folder in ("man", "completions"):
        stale += [p for p in (ROOT / folder).iterdir() if p not in expected]
    return sorted(stale)


def write() -> None:
    expected = expected_files()
    for folder in ("man", "completions"):
        for path in (ROOT / folder).iterdir():
            if path not in expected:
                path.unlink()
    for path, text in expected.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)


def main(argv: list[str]) -> int:
    if argv == ["write"]:
        write()
        return 0
    if argv == ["check"]:
        stale = stale_files()
        for path in stale:
            sys.stderr.write(f"stale: {path.relative_to(ROOT)} (run: make docs)\n")
        return 1 if stale else 0
    sys.stderr.write("usage: python -m cli.docs write|check\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
