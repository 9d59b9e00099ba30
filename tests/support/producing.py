"""What the idempotent-producer tests share: a clock a test moves by hand, the producer
state a log's records imply, a checker of exactly-once delivery, and a TCP proxy on
127.0.0.1 that cuts a connection at a chosen frame.

- `FakeClock`: the injectable clock (Engine.open(..., clock=...), connect(path, clock=...)).
- `open_engine`: an engine on a data directory with that clock, remembered in the list of
  the `opened` fixture (tests/conftest.py), which closes it at teardown.
- `states_from_records`: what the producer table must hold, recomputed from nothing but
  the records' producer fields (pid, generation, sequence), their offsets and timestamps.
- `delivery_faults`: counts lost, duplicated and out-of-order values; a test asserts 0.
- `FrameProxy`: forwards frames both ways and lets a test's rule decide, frame by frame,
  to forward, swallow, or cut the connection. Every socket and thread it starts is closed
  and joined by close().
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from broker.client.producer import Producer
from broker.engine.engine import Engine
from broker.limits import DEFAULT_LIMITS, Limits
from broker.protocol.frames import decode_body
from broker.protocol.messages import Message
from broker.types import AppendResult, NewRecord, ProducerEntry, Record

HOST = "127.0.0.1"
START_MS = 1_000_000
SEND_TIMEOUT_S = 10.0


class FakeClock:
    """Milliseconds that move only when the test says so."""

    def __init__(self, start_ms: int = START_MS) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def open_engine(
    opened: list[Engine], data_dir: Path, clock: FakeClock, limits: Limits = DEFAULT_LIMITS
) -> Engine:
    engine = Engine.open(data_dir, durability="normal", clock=clock, limits=limits)
    opened.append(engine)
    return engine


def send_within(
    producer: Producer,
    values: Sequence[bytes | str | NewRecord],
    *,
    partition: int,
    timeout_s: float = SEND_TIMEOUT_S,
) -> Sequence[AppendResult]:
    """Producer.send with a deadline: the results, or AssertionError saying why not."""
    future = producer.send_async(values, partition=partition)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        queued = producer._queues.get(partition)
        pump = producer._pumps.get(partition)
        stranded = bool(queued) and pump is not None and pump.done()
        raise AssertionError(
            f"producer.send({values!r}) not answered within {timeout_s}s"
            + ("; the batch sits in the producer's queue and no pump runs" if stranded else "")
        ) from None


# the log's own account of producer state ------------------------------------------------

StateRow = tuple[int, int, int, int, int, int]  # partition, pid, generation, seq, first, last


def state_rows(entries: Iterable[tuple[int, ProducerEntry]]) -> list[StateRow]:
    """producer_states() as plain sorted tuples, easy to compare and to print."""
    return sorted(
        (
            partition,
            e.producer_id,
            e.generation,
            e.high_water_sequence,
            e.first_record_ms,
            e.last_offset,
        )
        for partition, e in entries
    )


def states_from_records(records: Iterable[Record]) -> list[StateRow]:
    """The state of every (partition, pid) as the records say: the newest generation and
    sequence, the offset of the pid's last record and the time of its first (records
    written without a timestamp of their own carry the broker's append time)."""
    found: dict[tuple[int, int], list[int]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if not record.producer_id:
            continue
        key = (record.partition, record.producer_id)
        first_ms = found[key][3] if key in found else record.timestamp_ms
        found[key] = [record.generation, record.sequence, record.offset, first_ms]
    return sorted(
        (partition, pid, generation, sequence, first_ms, last_offset)
        for (partition, pid), (generation, sequence, last_offset, first_ms) in found.items()
    )


@dataclass(frozen=True)
class DeliveryFaults:
    lost: list[bytes]
    duplicated: list[bytes]
    out_of_order: list[tuple[bytes, bytes]]
    unexpected: list[bytes]

    @property
    def total(self) -> int:
        return len(self.lost) + len(self.duplicated) + len(self.out_of_order) + len(self.unexpected)


def delivery_faults(sent: Sequence[bytes], stored: Sequence[bytes]) -> DeliveryFaults:
    """What went wrong between the values one producer sent, in order, and the values
    of it that one partition holds, in offset order: must be nothing."""
    wanted = set(sent)
    seen: dict[bytes, int] = {}
    for value in stored:
        seen[value] = seen.get(value, 0) + 1
    position = {value: index for index, value in enumerate(sent)}
    kept = [value for value in stored if value in position]
    return DeliveryFaults(
        lost=[value for value in sent if value not in seen],
        duplicated=[value for value, count in seen.items() if count > 1],
        out_of_order=[(a, b) for a, b in itertools.pairwise(kept) if position[a] > position[b]],
        unexpected=[value for value in stored if value not in wanted],
    )


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (for a server restarted on it)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


# a proxy that cuts connections at chosen frames -------------------------------------------

Direction = Literal["to_server", "to_client"]
# cut_mid: forward the first half of the frame, then close (a reply cut short);
# flip: forward it with one bit of its last byte flipped (damaged in transit)
Action = Literal["forward", "swallow", "cut", "cut_mid", "flip"]
Rule = Callable[[int, Direction, Message], Action]  # (connection number, direction, frame)


@dataclass
class _Link:
    number: int
    client: socket.socket
    server: socket.socket
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FrameProxy:
    """127.0.0.1:port -> upstream port; `rule` sees every frame and may cut the link."""

    def __init__(self, upstream_port: int, rule: Rule) -> None:
        self.upstream_port = upstream_port
        self.rule = rule
        self.seen: list[tuple[int, Direction, Message]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._stopping = threading.Event()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"tcp://{HOST}:{self.port}"

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
            server = socket.create_connection((HOST, self.upstream_port), timeout=10)
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
                        name=f"proxy-{number}-{direction}",
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
                for frame, message in _frames(buffer):
                    buffer = buffer[len(frame) :]
                    with self._lock:
                        self.seen.append((link.number, direction, message))
                    action = self.rule(link.number, direction, message)
                    if action == "cut_mid":
                        target.sendall(frame[: len(frame) // 2])
                    if action in ("cut", "cut_mid"):
                        link.close()
                        return
                    if action == "forward":
                        target.sendall(frame)
                    if action == "flip":
                        target.sendall(frame[:-1] + bytes([frame[-1] ^ 0x01]))
        except OSError:
            pass
        link.close()

    def messages(self, direction: Direction) -> list[tuple[int, Message]]:
        with self._lock:
            return [(n, m) for n, d, m in self.seen if d == direction]

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

    def __enter__(self) -> FrameProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _frames(buffer: bytes) -> Iterator[tuple[bytes, Message]]:
    """The complete frames at the start of buffer, each with its decoded message (a
    length word with its top bit set: a CRC-32 follows it, before the body)."""
    start = 0
    while len(buffer) - start >= 4:
        (word,) = struct.unpack_from(">I", buffer, start)
        header = 8 if word & 0x8000_0000 else 4
        end = start + header + (word & 0x7FFF_FFFF)
        if len(buffer) < end:
            return
        yield buffer[start:end], decode_body(buffer[start + header : end])
        start = end
