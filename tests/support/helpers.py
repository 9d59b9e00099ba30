"""What several test files share: running the CLI, reading JSON lines, looking at the
stored rows directly, and real subprocesses that are always stopped.

Subprocesses run with the environment a user's shell would have: PYTHONUNBUFFERED (set by
some harnesses) and the FENCELOG_* / NO_COLOR variables are removed, so a test sees the
buffering and the output choices a user gets when piping fencelog into another program.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import sqlite_utils
from click.testing import Result

from broker.discovery import DB_FILE
from support.stored import stored_records

_STRIPPED_ENV = ("PYTHONUNBUFFERED", "NO_COLOR", "FENCELOG_BROKER", "FENCELOG_DURABILITY")


class Invoke(Protocol):
    """`invoke(*args, input=None)`: the CLI run through CliRunner on the test's broker."""

    def __call__(
        self,
        *args: str,
        input: str | bytes | None = None,
        env: Mapping[str, str | None] | None = None,
    ) -> Result: ...


def expect(result: Result, status: int) -> Result:
    """Assert the exit status, showing what the user saw (and any traceback) if not."""
    if result.exit_code != status:
        detail = ""
        unexpected = result.exception is not None and not isinstance(result.exception, SystemExit)
        if unexpected and result.exc_info is not None:
            import traceback

            detail = "".join(traceback.format_exception(*result.exc_info))
        raise AssertionError(
            f"exit status {result.exit_code}, expected {status}\n"
            f"stdout: {result.stdout!r}\nstderr: {result.stderr!r}\n{detail}"
        )
    return result


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every stdout line parsed as one JSON object (and nothing else on stdout)."""
    parsed = []
    for line in text.splitlines():
        obj = json.loads(line)
        assert isinstance(obj, dict), f"not a JSON object: {line!r}"
        parsed.append(obj)
    return parsed


def json_error(result: Result) -> dict[str, Any]:
    """The one JSON object a failing --json command writes on stderr."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one error line on stderr, got {result.stderr!r}"
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def stored_rows(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Everything the data directory holds, read straight from SQLite (sqlite-utils)."""
    with contextlib.closing(sqlite_utils.Database(data_dir / DB_FILE)) as db:
        return {
            "topics": list(
                db.query("SELECT name, partitions, created_ms FROM topics ORDER BY name")
            ),
            "partitions": list(
                db.query(
                    "SELECT t.name, p.partition, p.next_offset, p.bytes "
                    "FROM partitions AS p JOIN topics AS t USING (topic_id) "
                    "ORDER BY t.name, p.partition"
                )
            ),
            "records": [
                {field: record[field] for field in _DUMPED}
                for record in stored_records(data_dir / DB_FILE)
            ],
        }


_DUMPED = ("name", "partition", "offset", "timestamp_ms", "key", "value", "headers")


def fencelog_script() -> Path:
    """The installed `fencelog` console script of the interpreter running the tests."""
    beside = Path(sys.executable).parent / "fencelog"
    if beside.exists():
        return beside
    found = shutil.which("fencelog")
    assert found is not None, "the fencelog console script is not installed"
    return Path(found)


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED_ENV}
    return env | extra


@contextlib.contextmanager
def ctrl_c_as_at_a_terminal() -> Iterator[None]:
    """Children started inside get SIGINT at its default, as a command a shell runs in
    the foreground does: for tests that send one a Ctrl-C. The suite may itself run with
    SIGINT ignored (a shell without job control starts a background job so: `make test
    &` in a script), and an ignored SIGINT is inherited and stays ignored, in fencelog
    and pytest as in any program; a handled one is reset to its default by exec."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Process:
    """A real subprocess whose stdout lines arrive in a queue, read with deadlines."""

    def __init__(
        self,
        args: Sequence[str | Path],
        *,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.args = [str(a) for a in args]
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else user_env(),
            cwd=cwd,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, self._lines.put)),
            threading.Thread(target=self._pump, args=(self.popen.stderr, self._stderr.append)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    @staticmethod
    def _pump(stream: IO[bytes], put: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(stream.readline, b""):
                put(line)

    @property
    def stdin(self) -> IO[bytes]:
        assert self.popen.stdin is not None
        return self.popen.stdin

    def stderr_text(self) -> str:
        """What the process wrote to stderr so far; all of it once the process has ended."""
        if self.popen.poll() is not None:
            # its reader thread may not have taken the last lines yet; a child of the
            # process still holding the pipe open bounds this wait
            self._readers[1].join(timeout=5)
        return b"".join(self._stderr).decode("utf-8", "replace")

    def line(self, timeout_s: float) -> str:
        """The next complete stdout line, or AssertionError after timeout_s."""
        try:
            raw = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"no stdout line within {timeout_s}s from {self.args[1:]}; "
                f"running={self.popen.poll() is None}; stderr: {self.stderr_text()!r}"
            ) from None
        return raw.decode("utf-8")

    def lines_now(self) -> list[str]:
        """Every stdout line read so far and not taken yet, without waiting."""
        found: list[str] = []
        while True:
            try:
                found.append(self._lines.get_nowait().decode("utf-8"))
            except queue.Empty:
                return found

    def wait(self, timeout_s: float) -> int:
        """The exit status; the process is killed and the test fails after timeout_s."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.args[1:]} still running after {timeout_s}s; stderr: {self.stderr_text()!r}"
            ) from None

    def remaining_lines(self) -> list[str]:
        """After the process ended: every stdout line not read yet (complete lines only)."""
        assert self.popen.poll() is not None
        self._readers[0].join(timeout=10)
        return [line for line in self.lines_now() if line.endswith("\n")]

    def signal(self, signum: signal.Signals) -> None:
        self.popen.send_signal(signum)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)

    def close(self) -> None:
        """Kill if still running, reap, and close every pipe."""
        self.kill()
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


class Processes:
    """Starts processes for one test and stops every one of them at teardown."""

    def __init__(self) -> None:
        self._started: list[Process] = []

    def start(
        self,
        args: Sequence[str | Path],
        *,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        cwd: Path | None = None,
    ) -> Process:
        process = Process(args, env=env, stdin=stdin, cwd=cwd)
        self._started.append(process)
        return process

    def python(self, code: str, *args: str | Path, stdin: bool = False) -> Process:
        return self.start([sys.executable, "-c", code, *args], stdin=stdin)

    def fencelog(self, *args: str | Path, stdin: bool = False) -> Process:
        return self.start([fencelog_script(), *args], stdin=stdin)

    def close(self) -> None:
        for process in self._started:
            process.close()


def run_bounded(
    args: Sequence[str | Path], *, cwd: Path, env: Mapping[str, str], timeout_s: float
) -> tuple[int, str, str]:
    """(status, stdout, stderr) of a process run in a session of its own: past
    timeout_s it goes with every process it started, and the test fails saying so."""
    run = subprocess.Popen(
        [str(a) for a in args],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = run.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        raise AssertionError(
            f"{args[-1]!s} still running after {timeout_s}s\nstdout: {stdout}\nstderr: {stderr}"
        ) from None
    except BaseException:  # the test's own timeout or ^C: the process goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        raise
    return run.returncode, stdout, stderr
