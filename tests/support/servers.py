"""Servers for the served-mode tests, always stopped by the test that started them.

- `ServerThread`: a broker.server.Server on 127.0.0.1 (port 0 unless told) in a thread
  with its own event loop, so a test can talk to it from plain sync code or from its own
  asyncio.run(). `served(...)` is the same as a context manager.
- `ServeProcess`: a real `fencelog --broker DIR serve --ready-file F` process; `serving(...)`
  waits for its ready file with a deadline and stops it (SIGTERM, then SIGKILL) on exit.
- `RawClient`: a blocking socket that speaks frames through FrameConnection, for sending
  exactly the bytes a test wants (garbage, a lone length header, no HELLO) and reading
  back exactly what the server answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from broker.kafka.options import KafkaListen
from broker.limits import DEFAULT_LIMITS, Limits
from broker.protocol.frames import CLOSED, NEED_DATA, FrameConnection, Sentinel
from broker.protocol.messages import Message, Op, Reply, Request
from broker.server.server import Server
from broker.types import Durability
from support.helpers import Process, fencelog_script
from support.waiting import wait_until

T = TypeVar("T")
HOST = "127.0.0.1"
STEP_TIMEOUT_S = 15.0


class ServerThread:
    """A Server running in a thread with its own event loop."""

    def __init__(
        self,
        data_dir: Path,
        *,
        limits: Limits = DEFAULT_LIMITS,
        auth_token: str | None = None,
        durability: Durability = "normal",
        port: int = 0,
        unix: bool = False,
        busy_poll_us: int = 0,
        kafka: bool = False,  # also a Kafka listener on 127.0.0.1:0 (.kafka)
    ) -> None:
        self.data_dir = data_dir
        self.server = Server(
            data_dir,
            durability=durability,
            limits=limits,
            auth_token=auth_token,
            busy_poll_us=busy_poll_us,
            kafka=KafkaListen(HOST, 0) if kafka else None,
        )
        self._requested_port = port
        self._unix = unix
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="test-server", daemon=True)
        self._stopped = False
        self.port = 0

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            self.call(lambda: self.server.start(HOST, self._requested_port, unix=self._unix))
        except BaseException:
            self._stopped = True
            self._end_loop()
            raise
        assert self.server.info is not None and self.server.info.tcp is not None
        self.port = int(self.server.info.tcp.rpartition(":")[2])
        return self

    @property
    def address(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    @property
    def kafka(self) -> str:
        """The Kafka listener's HOST:PORT (kafka=True)."""
        assert self.server.info is not None and self.server.info.kafka is not None
        return self.server.info.kafka

    def call(
        self, work: Callable[[], Coroutine[Any, Any, T]], timeout_s: float = STEP_TIMEOUT_S
    ) -> T:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(work(), self._loop).result(timeout_s)

    def session_ids(self) -> set[str]:
        async def ids() -> set[str]:
            return set(self.server.sessions)

        return self.call(ids)

    def wait_sessions(self, count: int, timeout_s: float = STEP_TIMEOUT_S) -> set[str]:
        """The open sessions, once there are exactly `count` of them."""

        seen: list[set[str]] = [set()]

        def counted() -> bool:
            seen[0] = self.session_ids()
            return len(seen[0]) == count

        wait_until(counted, timeout_s, message=lambda: f"{count} sessions; now {seen[0]}")
        return seen[0]

    def wait_fetch_parked(self, topic: str, timeout_s: float = STEP_TIMEOUT_S) -> None:
        """Until a fetch of topic waits inside the server for new records (a long poll
        parked on the topic), not just sent or started."""
        wait_until(
            lambda: topic in self.server._topic_events,
            timeout_s,
            interval_s=0.005,
            message=f"a fetch of {topic} waiting inside the server",
        )

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.call(self.server.stop, timeout_s=30)
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the server thread did not end"

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def served(
    data_dir: Path,
    *,
    limits: Limits = DEFAULT_LIMITS,
    auth_token: str | None = None,
    durability: Durability = "normal",
    port: int = 0,
    unix: bool = False,
    busy_poll_us: int = 0,
    kafka: bool = False,
) -> Iterator[ServerThread]:
    thread = ServerThread(
        data_dir,
        limits=limits,
        auth_token=auth_token,
        durability=durability,
        port=port,
        unix=unix,
        busy_poll_us=busy_poll_us,
        kafka=kafka,
    )
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


# a real `fencelog serve` process ------------------------------------------------------


class ServeProcess:
    """`fencelog [GLOBAL_ARGS] --broker DIR serve --listen L --ready-file F [SERVE_ARGS]`."""

    def __init__(
        self,
        data_dir: Path,
        ready_file: Path,
        *,
        serve_args: Sequence[str] = (),
        global_args: Sequence[str] = (),
        listen: str = f"{HOST}:0",
    ) -> None:
        self.data_dir = data_dir
        self.ready_file = ready_file
        ready_file.unlink(missing_ok=True)
        self.process = Process(
            [
                fencelog_script(),
                "--broker",
                str(data_dir),
                *global_args,
                "serve",
                "--listen",
                listen,
                "--ready-file",
                str(ready_file),
                *serve_args,
            ]
        )
        self.info: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        def ready() -> bool:
            if self.process.popen.poll() is not None:
                raise AssertionError(
                    f"fencelog serve exited with {self.process.popen.returncode} before it "
                    f"was ready; stderr: {self.process.stderr_text()!r}"
                )
            return self.ready_file.exists()

        wait_until(
            ready,
            timeout_s,
            message=lambda: f"fencelog serve ready; stderr: {self.process.stderr_text()!r}",
        )
        self.info = json.loads(self.ready_file.read_text())
        return self.info

    @property
    def pid(self) -> int:
        return self.process.popen.pid

    @property
    def tcp(self) -> str:
        return str(self.info["tcp"])

    @property
    def port(self) -> int:
        return int(self.tcp.rpartition(":")[2])

    @property
    def address(self) -> str:
        return f"tcp://{self.tcp}"

    @property
    def kafka(self) -> str:
        """The Kafka listener's HOST:PORT (serve_args with --kafka-listen)."""
        return str(self.info["kafka"])

    def stderr_text(self) -> str:
        return self.process.stderr_text()

    def stop(self, signum: signal.Signals = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        """Send signum and return the exit status (the process is killed after timeout_s)."""
        if self.process.popen.poll() is None:
            self.process.signal(signum)
        return self.process.wait(timeout_s)

    def kill9(self) -> None:
        self.process.popen.kill()
        self.process.popen.wait(timeout=30)

    def close(self) -> None:
        """SIGTERM, SIGKILL if that did not end it within 10 s; then close the pipes."""
        if self.process.popen.poll() is None:
            self.process.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.popen.wait(timeout=10)
        self.process.close()


@contextlib.contextmanager
def serving(
    data_dir: Path,
    ready_file: Path,
    *,
    serve_args: Sequence[str] = (),
    global_args: Sequence[str] = (),
    listen: str = f"{HOST}:0",
) -> Iterator[ServeProcess]:
    process = ServeProcess(
        data_dir, ready_file, serve_args=serve_args, global_args=global_args, listen=listen
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


# raw frames over a socket --------------------------------------------------------------


class RawClient:
    """A blocking TCP socket that sends and receives frames, every read with a deadline."""

    def __init__(self, port: int, *, frame_bytes_max: int = DEFAULT_LIMITS.frame_bytes_max) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=STEP_TIMEOUT_S)
        self.frames = FrameConnection(frame_bytes_max)
        self._ids = iter(range(1, 1 << 62))

    def next_id(self) -> int:
        return next(self._ids)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: Message) -> None:
        self.sock.sendall(self.frames.send(message))

    def request(self, op: Op, args: dict[str, Any] | None = None) -> int:
        """Send one request; its id."""
        request_id = self.next_id()
        self.send(Request(request_id, op, args or {}))
        return request_id

    def hello(self, token: str | None = None) -> Reply:
        request_id = self.request(Op.HELLO, {"client": "raw test client", "token": token})
        reply = self.receive()
        assert isinstance(reply, Reply) and reply.request_id == request_id, reply
        return reply

    def receive(self, timeout_s: float = STEP_TIMEOUT_S) -> Message | Sentinel:
        """The next message, or CLOSED once the server closed the connection cleanly."""
        deadline = time.monotonic() + timeout_s
        while True:
            message = self.frames.next_message()
            if message is not NEED_DATA:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"nothing from the server within {timeout_s}s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"nothing from the server within {timeout_s}s") from None
            self.frames.receive_data(data)

    def receive_all(self, timeout_s: float = STEP_TIMEOUT_S) -> list[Message]:
        """Every message until the server closes the connection (which it must, in time)."""
        deadline = time.monotonic() + timeout_s
        messages: list[Message] = []
        while (message := self.receive(max(deadline - time.monotonic(), 0.001))) is not CLOSED:
            assert not isinstance(message, Sentinel)
            messages.append(message)
        return messages

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
