"""What the ownership tests share: a real `fencelog serve` to test against, a view of
who owns what, and a raw socket that shows exactly what a severed connection
receives.

Served brokers here are real processes (`fencelog --broker DIR serve`) on 127.0.0.1 port 0,
always stopped by the test that started them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.client.client import Client
from broker.limits import DEFAULT_LIMITS
from broker.protocol.frames import CLOSED, NEED_DATA, FrameConnection, Sentinel
from broker.protocol.messages import Message, Op, Reply, Request
from support import servers
from support.helpers import Process, fencelog_script, user_env

HOST = "127.0.0.1"
STEP_TIMEOUT_S = 15.0
# One row of `ownership()`: (group, resource, generation, holder, live).
OwnershipRow = tuple[str, str, int, str | None, bool]


def ownership_rows(client: Client, group: str | None = None) -> list[OwnershipRow]:
    """What `own list` shows, without claimed_ms: the part a claim may change."""
    return sorted(
        (r.group, r.resource, r.generation, r.holder, r.holder_live)
        for r in client.ownership(group)
    )


def tool_env(**extra: str) -> dict[str, str]:
    """A user's environment with this venv's `fencelog` first on PATH (for `-- CMD`)."""
    env = user_env(**extra)
    env["PATH"] = f"{fencelog_script().parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@contextlib.contextmanager
def serving(data_dir: Path, *, session_timeout: str = "15s") -> Iterator[str]:
    """A served broker on data_dir for the body of a with-block; yields its tcp:// URL.

    The shared launcher of tests/support/servers.py, with no unix socket and the given timeout.
    """
    ready_file = data_dir.parent / f"{data_dir.name}.ready.json"
    serve_args = ["--no-unix", "--session-timeout", session_timeout]
    with servers.serving(data_dir, ready_file, serve_args=serve_args) as server:
        yield server.address


@contextlib.contextmanager
def broker_target(kind: str, data_dir: Path) -> Iterator[str]:
    """What to pass to connect() or --broker: the data directory itself (embedded), or
    the tcp:// URL of a `fencelog serve` that owns it (served)."""
    if kind == "embedded":
        yield str(data_dir)
        return
    assert kind == "served", kind
    with serving(data_dir) as url:
        yield url


@contextlib.contextmanager
def resumed_and_killed(process: Process) -> Iterator[Process]:
    """On the way out, whatever happened: SIGCONT (it may be paused), SIGKILL, reap."""
    try:
        yield process
    finally:
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.popen.send_signal(signal.SIGCONT)
        process.close()


def python_process(code: str, *args: str, env: dict[str, str] | None = None) -> Process:
    """`python -c code args...` with its stdout lines readable with deadlines."""
    return Process([sys.executable, "-c", code, *args], env=env if env is not None else user_env())


class RawSession:
    """A blocking socket to a served broker, speaking frames: what goes over the wire."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("tcp://").rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=STEP_TIMEOUT_S)
        self.frames = FrameConnection(DEFAULT_LIMITS.frame_bytes_max)
        self._ids = iter(range(1, 1 << 62))

    def request(self, op: Op, args: dict[str, Any]) -> Message:
        """Send one request and return the reply to it."""
        request_id = next(self._ids)
        self.sock.sendall(self.frames.send(Request(request_id, op, args)))
        reply = self.receive()
        assert not isinstance(reply, Sentinel), f"connection closed instead of a reply to {op}"
        return reply

    def hello(self) -> str:
        reply = self.request(Op.HELLO, {"client": "ownership test", "token": None})
        assert isinstance(reply, Reply), reply
        return str(reply.result["session_id"])

    def receive(self, timeout_s: float = STEP_TIMEOUT_S) -> Message | Sentinel:
        """The next message, or CLOSED once the broker closed the connection."""
        deadline = time.monotonic() + timeout_s
        while (message := self.frames.next_message()) is NEED_DATA:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"nothing from the broker within {timeout_s}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"nothing from the broker within {timeout_s}s") from None
            except ConnectionResetError:
                data = b""
            self.frames.receive_data(data)
        return message

    def until_closed(self, timeout_s: float = STEP_TIMEOUT_S) -> list[Message]:
        """Every message until the broker closes the connection (it must, in time)."""
        deadline = time.monotonic() + timeout_s
        messages: list[Message] = []
        while (message := self.receive(max(deadline - time.monotonic(), 0.001))) is not CLOSED:
            assert not isinstance(message, Sentinel)
            messages.append(message)
        return messages

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
