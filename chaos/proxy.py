"""A loopback TCP proxy that hurts connections: it cuts them mid-frame, delays chunks and
black-holes them (stops forwarding, keeps the connection open), at random from a seeded
generator. Byte-level: it knows nothing of frames, so a cut lands anywhere, in the middle
of a length header or of a body.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

HOST = "127.0.0.1"
CHUNK = 4096


@dataclass(frozen=True)
class Odds:
    """The chance of each fault per forwarded chunk."""

    cut: float = 0.01
    delay: float = 0.05
    blackhole: float = 0.002
    delay_max_s: float = 0.2


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy:
    """HOST:port forwards to HOST:upstream_port, hurting connections as `odds` say.
    `faults` counts what it did; `enabled` off forwards faithfully."""

    def __init__(self, upstream_port: int, seed: int, odds: Odds = Odds()) -> None:
        self.upstream_port = upstream_port
        self.odds = odds
        self.enabled = True
        self.faults: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._stopping = threading.Event()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="chaos-proxy", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    def _roll(self) -> str:
        with self._lock:
            if not self.enabled:
                return "forward"
            draw = self._rng.random()
            odds = self.odds
            if draw < odds.cut:
                return "cut"
            if draw < odds.cut + odds.blackhole:
                return "blackhole"
            if draw < odds.cut + odds.blackhole + odds.delay:
                return "delay"
            return "forward"

    def _count(self, fault: str) -> None:
        with self._lock:
            self.faults[fault] += 1

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, self.upstream_port), timeout=2)
            except OSError:  # the server is down (killed, restarting): so is this link
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links = [x for x in self._links if not x.closed.is_set()]
                self._links.append(link)
                self._threads = [t for t in self._threads if t.is_alive()]
                for source, target in ((client, server), (server, client)):
                    thread = threading.Thread(
                        target=self._pump, args=(link, source, target), daemon=True
                    )
                    self._threads.append(thread)
                    thread.start()

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        try:
            while not link.closed.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                action = self._roll()
                if action == "cut":
                    self._count("cut")
                    target.sendall(data[: self._rng.randrange(len(data))])  # mid-frame
                    break
                if action == "blackhole":
                    self._count("blackhole")
                    link.closed.wait()  # nothing more either way until the link ends
                    break
                if action == "delay":
                    self._count("delay")
                    time.sleep(self._rng.uniform(0, self.odds.delay_max_s))
                target.sendall(data)
        except OSError:
            pass
        if not link.closed.is_set():
            link.close()

    def cut_all(self) -> int:
        """End every open link (as a server's death does); how many there were."""
        with self._lock:
            links = [x for x in self._links if not x.closed.is_set()]
        for link in links:
            link.close()
        return len(links)

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._acceptor.join(timeout=10)
        self.cut_all()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
