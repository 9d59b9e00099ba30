"""The servers a benchmark talks to, as real processes it starts and always stops.

Rules:
- `fencelog serve` is the installed console script, run as a user runs it:
  `fencelog --broker DIR --durability D serve --listen 127.0.0.1:0 --ready-file F`.
  It is ready when the ready file appears; the TCP address comes from that file.
- `nats-server` is Debian's binary with JetStream on, its store in the run's temporary
  directory, listening on 127.0.0.1 on a port the kernel picks (`-p -1`); it is ready
  when its ports file appears.
- Nothing listens beyond 127.0.0.1. Every wait has a deadline; a server that does not
  come up in time, or exits early, fails the run with its log.
- Stopping is SIGTERM, then SIGKILL after a grace period, by the process's own id.
- Each process's CPU time (user + system, from /proc) can be read while it runs, so a
  benchmark can say which side of a connection was busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final, cast

from bench.cli_produce import fencelog_script
from broker.types import Durability

HOST: Final = "127.0.0.1"
READY_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 20.0
_POLL_S: Final = 0.02
DEBIAN_NATS_SERVER: Final = Path("/usr/sbin/nats-server")


class ServerProcess:
    """A started server process with its log file; `stop()` ends it."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, chars: int = 2000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def wait_for(self, path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until `path` exists; fail if the process exits or time runs out first."""
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout_s} s:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def cpu_s(self) -> float:
        """User + system CPU seconds this process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        """SIGTERM, SIGKILL after STOP_TIMEOUT_S; the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()
        return self.popen.returncode


class FencelogServer(ServerProcess):
    def __init__(self, work_dir: Path, name: str, durability: Durability) -> None:
        self.data_dir = work_dir / name
        ready_file = work_dir / f"{name}.ready.json"
        argv = [
            str(fencelog_script()),
            "--broker",
            str(self.data_dir),
            "--durability",
            durability,
            "serve",
            "--listen",
            f"{HOST}:0",
            "--ready-file",
            str(ready_file),
        ]
        super().__init__(f"fencelog serve ({name})", argv, work_dir / f"{name}.log")
        self.durability = durability
        try:
            self.wait_for(ready_file)
            tcp = json.loads(ready_file.read_text())["tcp"]
        except BaseException:
            self.stop()
            raise
        self.address = f"tcp://{tcp}"


class NatsServer(ServerProcess):
    def __init__(self, work_dir: Path, name: str = "nats") -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed")
        self.store_dir = work_dir / f"{name}-store"
        ports_dir = work_dir / f"{name}-ports"
        ports_dir.mkdir()
        argv = [
            binary,
            "--jetstream",
            "--addr",
            HOST,
            "--port",
            "-1",
            "--store_dir",
            str(self.store_dir),
            "--ports_file_dir",
            str(ports_dir),
        ]
        super().__init__("nats-server", argv, work_dir / f"{name}.log")
        ports_file = ports_dir / f"{Path(binary).name}_{self.pid}.ports"
        try:
            self.wait_for(ports_file)
            self.address = str(_read_ports(ports_file)["nats"][0])
        except BaseException:
            self.stop()
            raise


def _read_ports(path: Path, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """nats-server's ports file, once written: it can exist, still empty, for a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return cast(dict[str, Any], json.loads(path.read_text()))
        except json.JSONDecodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(_POLL_S)


def nats_server_binary() -> str | None:
    """nats-server on PATH, or where Debian's package puts it (/usr/sbin, often not on
    a non-root user's PATH)."""
    found = shutil.which("nats-server")
    if found is None and DEBIAN_NATS_SERVER.exists():
        found = str(DEBIAN_NATS_SERVER)
    return found


def nats_server_version() -> str:
    binary = nats_server_binary()
    if binary is None:
        return "not installed"
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    said = done.stdout.strip() or done.stderr.strip() or "unknown version"
    return "nats-server " + said.removeprefix("nats-server:").strip()


@contextlib.contextmanager
def fencelog_server(work_dir: Path, name: str, durability: Durability) -> Iterator[FencelogServer]:
    server = FencelogServer(work_dir, name, durability)
    try:
        yield server
    except BaseException:
        _report_stop(server)
        raise
    status = server.stop()
    if status != 0:
        raise RuntimeError(f"{server.name} exited with {status}:\n{server.log_tail()}")


@contextlib.contextmanager
def nats_server(work_dir: Path) -> Iterator[NatsServer]:
    server = NatsServer(work_dir)
    try:
        yield server
    except BaseException:
        _report_stop(server)
        raise
    server.stop()


def _report_stop(server: ServerProcess) -> None:
    """Stop a server while a run is failing, and say how it ended, with its log."""
    running = server.popen.poll() is None
    status = server.stop()
    how = "was stopped" if running else f"had already exited with status {status}"
    sys.stderr.write(f"bench: {server.name} (pid {server.pid}) {how}; its log ends:\n")
    sys.stderr.write(server.log_tail() + "\n")
