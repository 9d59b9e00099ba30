"""Ownership (issue 4): claim + release round trips, and how soon a new claim stops the
old holder's writes, served and embedded, under both durabilities.

Rules:
- Four sides: `fencelog serve` processes with durability normal and full, reached over
  TCP, and data directories opened embedded with the same two durabilities. Every side
  uses the sync `broker.client.Client`, as `fencelog own` and applications do.
- Claim + release: one client claims one resource and releases it, over and over; a
  round's figure is pairs per second. Rounds rotate which side goes first.
- Severing: the old holder is its own process (bench/holder.py) that claims a fresh
  resource and writes one record at a time under the claim's fence. This process then
  claims the same resource (which severs the holder) and the figure is the time from
  just before that claim to the holder's first rejected write, both read from
  CLOCK_MONOTONIC. The holder reports the error it got and how many writes it made
  before. Rounds rotate which side goes first.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from bench.measures import interleaved, median
from bench.processes import fencelog_server
from bench.sections import Row, Section, series
from broker.client.client import Client, connect
from broker.types import Durability

TITLE: Final = "Ownership (issue 4)"
GROUP: Final = "bench"
FENCED_TOPIC: Final = "fenced"
DURABILITY_ORDER: Final[tuple[Durability, ...]] = ("normal", "full")
HOLDER_WRITING_S: Final = 0.02  # how long the holder writes before the new claim
LINE_TIMEOUT_S: Final = 90.0  # beyond the holder's own HOLD_TIMEOUT_S
_REPOSITORY: Final = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class OwnershipSizes:
    rounds: int
    pairs: int  # claim + release pairs per side per round
    sever_rounds: int
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} rounds of {self.pairs:,} claim + release pairs and "
            f"{self.sever_rounds} severings per side" + (" (--quick)" if self.quick else "")
        )


@dataclass(frozen=True, slots=True)
class Severing:
    """One new claim against a writing holder."""

    reject_ms: float  # from just before the new claim to the holder's first rejection
    claim_ms: float  # how long the new claim took
    code: str  # the error the holder's write got
    writes: int  # writes the holder made before


@dataclass(frozen=True, slots=True)
class OwnershipResults:
    sizes: OwnershipSizes
    pairs_per_s: dict[str, tuple[float, ...]]  # side -> per round
    severings: dict[str, tuple[Severing, ...]]  # side -> per round


def side_name(served: bool, durability: Durability) -> str:
    return f"{'served' if served else 'embedded'}, durability {durability}"


# the old holder -------------------------------------------------------------------------


class Holder:
    """bench/holder.py as a child process, one line in, one line out."""

    def __init__(self, broker: str, durability: Durability, log: IO[bytes]) -> None:
        argv = [sys.executable, "-m", "bench.holder", broker, durability, GROUP, FENCED_TOPIC]
        self.popen = subprocess.Popen(
            argv,
            cwd=_REPOSITORY,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line.strip())
        self._lines.put("exited")

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def expect(self) -> str:
        try:
            return self._lines.get(timeout=LINE_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError(f"the holder said nothing for {LINE_TIMEOUT_S} s") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send("quit")
        try:
            self.popen.wait(timeout=LINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=LINE_TIMEOUT_S)


def sever_once(client: Client, holder: Holder, resource: str) -> Severing:
    holder.send(f"hold {resource}")
    if (said := holder.expect()) != "ready":
        raise RuntimeError(f"the holder did not claim {resource}: {said}")
    time.sleep(HOLDER_WRITING_S)
    start = time.monotonic()
    client.own(GROUP, [resource])
    claimed = time.monotonic()
    said = holder.expect()
    word, *fields = said.split()
    if word != "rejected":
        raise RuntimeError(f"the holder was not rejected after a newer claim: {said}")
    rejected_at, code, writes = float(fields[0]), fields[1], int(fields[2])
    client.release(GROUP, [resource])
    return Severing((rejected_at - start) * 1000, (claimed - start) * 1000, code, writes)


# measuring ------------------------------------------------------------------------------


@dataclass
class _Side:
    name: str
    broker: str
    durability: Durability
    client: Client
    holder: Holder


@contextlib.contextmanager
def _sides(work_dir: Path) -> Iterator[list[_Side]]:
    with contextlib.ExitStack() as stack:
        log = stack.enter_context((work_dir / "holders.log").open("wb"))
        brokers: list[tuple[str, str, Durability]] = []
        for durability in DURABILITY_ORDER:
            server = stack.enter_context(
                fencelog_server(work_dir, f"own-serve-{durability}", durability)
            )
            brokers.append((side_name(True, durability), server.address, durability))
        for durability in DURABILITY_ORDER:
            path = str(work_dir / f"own-embedded-{durability}")
            brokers.append((side_name(False, durability), path, durability))
        sides = []
        for name, broker, durability in brokers:
            client = stack.enter_context(connect(broker, durability=durability))
            client.create_topic(FENCED_TOPIC, 1)
            holder = Holder(broker, durability, log)
            stack.callback(holder.close)
            sides.append(_Side(name, broker, durability, client, holder))
        yield sides


def measure(work_dir: Path, sizes: OwnershipSizes) -> OwnershipResults:
    resources = (f"r{number}" for number in itertools.count(1))
    with _sides(work_dir) as sides:
        for side in sides:  # unmeasured: sessions registered, caches warm
            _pairs_per_s(side.client, next(resources), sizes.pairs // 10 + 1)
            sever_once(side.client, side.holder, next(resources))
        pair_rates = interleaved(
            sizes.rounds,
            *(_pair_measure(side, next(resources), sizes.pairs) for side in sides),
        )
        severings: dict[str, list[Severing]] = {side.name: [] for side in sides}

        def severing_measure(side: _Side) -> Callable[[], float]:
            def run() -> float:
                severing = sever_once(side.client, side.holder, next(resources))
                severings[side.name].append(severing)
                return severing.reject_ms

            return run

        interleaved(sizes.sever_rounds, *(severing_measure(side) for side in sides))
        names = [side.name for side in sides]
    return OwnershipResults(
        sizes,
        dict(zip(names, pair_rates, strict=True)),
        {name: tuple(found) for name, found in severings.items()},
    )


def _pairs_per_s(client: Client, resource: str, pairs: int) -> float:
    start = time.perf_counter()
    for _ in range(pairs):
        client.own(GROUP, [resource])
        client.release(GROUP, [resource])
    return pairs / (time.perf_counter() - start)


def _pair_measure(side: _Side, resource: str, pairs: int) -> Callable[[], float]:
    return lambda: _pairs_per_s(side.client, resource, pairs)


# the section ----------------------------------------------------------------------------


def _rows(results: OwnershipResults) -> list[Row]:
    rows = []
    for name, rates in results.pairs_per_s.items():
        rows.append(
            Row(
                f"claim + release round trips, {name}",
                f"{median(rates):,.0f} pairs/s ({1000 / median(rates):.2f} ms a pair)",
            )
        )
    for name, severings in results.severings.items():
        reject = [s.reject_ms for s in severings]
        codes = sorted({s.code for s in severings})
        rows.append(
            Row(
                f"new claim to the old holder's first rejected write, {name}",
                f"median {median(reject):.1f} ms, max {max(reject):.1f} ms",
                f"the claim itself: median {median([s.claim_ms for s in severings]):.1f} ms; "
                f"rejected with {', '.join(codes)}",
            )
        )
    return rows


def _method() -> list[str]:
    return [
        "How it is measured (bench/ownership.py, bench/holder.py):",
        "",
        "- Sides: `fencelog serve` processes with durability normal and full reached over",
        "  TCP, and data directories opened embedded with the same durabilities; each side",
        "  uses one sync `broker.client.connect(...)` client.",
        "- Claim + release: `client.own(group, [resource])` then",
        "  `client.release(group, [resource])` on one resource, repeated; pairs per second",
        "  per round, median over rounds, sides rotating which goes first.",
        "- Severing: an old holder in its own process (bench/holder.py) claims a fresh",
        "  resource, then writes one record at a time with the claim's fence",
        f"  (`produce(..., fences=[claimed.fence])`). After {HOLDER_WRITING_S * 1000:.0f} ms of",
        "  writing, this process claims the same resource. The figure is the time from just",
        "  before that claim to the moment the holder's first write fails, both read from",
        "  CLOCK_MONOTONIC (time.monotonic) in the two processes. Served, the claim severs",
        "  the holder's session (the server closes its connection and its request in",
        "  flight fails with SEVERED); embedded, the holder's next write meets the newer",
        "  generation and is refused with FENCED.",
    ]


def _findings(results: OwnershipResults) -> list[str]:
    lines = []
    for name, severings in results.severings.items():
        claim_ms = [s.claim_ms for s in severings]
        after_ms = round(median([s.reject_ms - s.claim_ms for s in severings]), 1) + 0.0
        lines.append(
            f"- {name}: the new claim took a median {median(claim_ms):.1f} ms (max "
            f"{max(claim_ms):.1f} ms) while the old holder kept writing; the holder's first "
            f"rejection came {after_ms:+.1f} ms from the moment the claim returned (median; "
            f"negative: before), after a median {median([s.writes for s in severings]):,.0f} "
            "accepted writes."
        )
    return [
        "What the figures say:",
        "",
        *lines,
        "",
        "Embedded, the new claim is a write transaction that must take SQLite's write lock",
        "from a holder that keeps committing one write after another; SQLite's busy handler",
        "retries after sleeps and queues nobody, so the claim's wait (and with it the time to",
        "fence the old holder) depends on when a retry happens to find the lock free. Served,",
        "the server's one writer thread takes the claim in its turn (its work queue is FIFO),",
        "so a writing holder cannot starve it.",
    ]


def _raw(results: OwnershipResults) -> list[str]:
    lines = ["claim + release pairs/s per round"]
    lines += [series(name, rates) for name, rates in results.pairs_per_s.items()]
    lines.append("severing, per round: ms to the first rejected write / ms of the claim / code")
    for name, severings in results.severings.items():
        lines += [
            series(f"{name}: to rejection ms", [s.reject_ms for s in severings], 1),
            series(f"{name}: claim ms", [s.claim_ms for s in severings], 1),
            f"  {name}: codes " + " ".join(s.code for s in severings),
            series(f"{name}: writes before", [s.writes for s in severings]),
        ]
    return lines


def section(results: OwnershipResults) -> Section:
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=tuple(_rows(results)),
        method=tuple(_method()),
        findings=tuple(_findings(results)),
        raw=tuple(_raw(results)),
    )
