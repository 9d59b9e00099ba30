"""A TCP proxy on 127.0.0.1 in front of a Kafka listener, cutting connections where a
test's rule says: the Kafka twin of support.producing.FrameProxy.

- Frames are Kafka's: INT32 length, then a request header (api_key INT16, api_version
  INT16, correlation_id INT32, ...) or an answer's (correlation_id INT32, ...). The proxy
  reads each request's header and remembers, per connection, which API each correlation
  id asked, so the rule sees every frame, either way, as a `KafkaFrame` naming its API.
- The rule answers, frame by frame: "forward"; "cut" (close both sides, the frame not
  sent); "cut_mid" (send the first half of the frame, then close: a request or an answer
  cut short mid-frame).
- Metadata and FindCoordinator answers name the broker as host:port; the proxy writes
  its own port over the listener's there, so every connection a client opens after the
  bootstrap one goes through the proxy too.

Every socket and thread it starts is closed and joined by close().
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

HOST: Final = "127.0.0.1"
METADATA_KEY: Final = 3
FIND_COORDINATOR_KEY: Final = 10
_NAMING_BROKERS: Final = frozenset({METADATA_KEY, FIND_COORDINATOR_KEY})
_REQUEST_HEADER: Final = struct.Struct(">hhi")
_INT32: Final = struct.Struct(">i")
_UNKNOWN_API: Final = -1

Direction = Literal["to_server", "to_client"]
Action = Literal["forward", "cut", "cut_mid"]


@dataclass(frozen=True)
class KafkaFrame:
    """One frame on its way: which connection, which way, which API (-1: not known)."""

    connection: int
    direction: Direction
    api_key: int
    api_version: int
    correlation_id: int
    size: int  # the frame's bytes, its length prefix included


Rule = Callable[[KafkaFrame], Action]


@dataclass
class _Link:
    number: int
    client: socket.socket
    server: socket.socket
    asked: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (key, version)
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class KafkaProxy:
    """127.0.0.1:port -> the Kafka listener at 127.0.0.1:upstream_port."""

    def __init__(self, upstream_port: int, rule: Rule) -> None:
        self.upstream_port = upstream_port
        self.rule = rule
        self.seen: list[tuple[KafkaFrame, Action]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._upstream_name = HOST.encode() + _INT32.pack(upstream_port)
        self._own_name = HOST.encode() + _INT32.pack(self.port)
        self._stopping = threading.Event()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="kproxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def bootstrap(self) -> str:
        """HOST:PORT, as bootstrap.servers takes it."""
        return f"{HOST}:{self.port}"

    def cuts(self) -> list[KafkaFrame]:
        """The frames at which the proxy cut a connection."""
        with self._lock:
            return [frame for frame, action in self.seen if action != "forward"]

    def frames(self, direction: Direction, api_key: int) -> list[KafkaFrame]:
        with self._lock:
            return [
                frame
                for frame, _ in self.seen
                if frame.direction == direction and frame.api_key == api_key
            ]

    def _accept(self) -> None:
        number = 0
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            number += 1
            try:
                server = socket.create_connection((HOST, self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(None)
            link = _Link(number, client, server)
            with self._lock:
                self._links.append(link)
                for source, target, direction in (
                    (client, server, "to_server"),
                    (server, client, "to_client"),
                ):
                    thread = threading.Thread(
                        target=self._pump,
                        args=(link, source, target, direction),
                        name=f"kproxy-{number}-{direction}",
                        daemon=True,
                    )
                    self._threads.append(thread)
                    thread.start()

    def _pump(
        self, link: _Link, source: socket.socket, target: socket.socket, direction: Direction
    ) -> None:
        buffer = b""
        try:
            while not link.closed.is_set():
                data = source.recv(65536)
                if not data:
                    break
                buffer += data
                for frame in _frames(buffer):
                    buffer = buffer[len(frame) :]
                    if not self._pass(link, direction, frame, target):
                        link.close()
                        return
        except OSError:
            pass
        link.close()

    def _pass(self, link: _Link, direction: Direction, frame: bytes, target: socket.socket) -> bool:
        """Forward frame as the rule says; False once the link is to be cut."""
        described = self._describe(link, direction, frame)
        with self._lock:
            action = self.rule(described)
            self.seen.append((described, action))
        if direction == "to_client" and described.api_key in _NAMING_BROKERS:
            frame = frame.replace(self._upstream_name, self._own_name)
        if action == "cut_mid":
            target.sendall(frame[: len(frame) // 2])
        if action != "forward":
            return False
        target.sendall(frame)
        return True

    def _describe(self, link: _Link, direction: Direction, frame: bytes) -> KafkaFrame:
        if direction == "to_server":
            if len(frame) < 4 + _REQUEST_HEADER.size:
                return KafkaFrame(link.number, direction, _UNKNOWN_API, -1, -1, len(frame))
            key, version, correlation_id = _REQUEST_HEADER.unpack_from(frame, 4)
            link.asked[correlation_id] = (key, version)
            return KafkaFrame(link.number, direction, key, version, correlation_id, len(frame))
        if len(frame) < 8:
            return KafkaFrame(link.number, direction, _UNKNOWN_API, -1, -1, len(frame))
        (correlation_id,) = _INT32.unpack_from(frame, 4)
        key, version = link.asked.pop(correlation_id, (_UNKNOWN_API, -1))
        return KafkaFrame(link.number, direction, key, version, correlation_id, len(frame))

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._acceptor.join(timeout=10)
        with self._lock:
            links, threads = list(self._links), list(self._threads)
        for link in links:
            link.close()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(t.is_alive() for t in [self._acceptor, *threads]), "proxy threads live"

    def __enter__(self) -> KafkaProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _frames(buffer: bytes) -> Iterator[bytes]:
    """The complete frames at the start of buffer, each with its length prefix."""
    start = 0
    while len(buffer) - start >= 4:
        (length,) = _INT32.unpack_from(buffer, start)
        end = start + 4 + max(length, 0)
        if len(buffer) < end:
            return
        yield buffer[start:end]
        start = end
