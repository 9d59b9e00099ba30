"""Idempotent producers (issue 5): what the producer fields cost per append, and how
long a restart takes with a long log behind the newest producer snapshot.

Rules:
- Overhead: the same 100-byte records appended with producer fields (a pid from
  lease_pid, its generation and sequences) and without (pid 0), in the same run, each
  side into its own fresh one-partition topic of the same data directory or server.
  Embedded, the two sides take turns request by request and a rate is records over the
  sum of that side's request times (as bench/append.py). Served, they take turns round
  by round. The overhead is the idempotent side's time over the plain side's, less 1.
- Durability normal throughout: it adds the same fsync to both sides, which would only
  hide the producer fields' own cost.
- Restart: a data directory holding `restart_records` idempotent records, its newest
  producer snapshot `restart_tail` records behind the end of the log (those written as
  one-record batches: the most batches to replay). Each round opens it afresh:
  `Engine.open`, then the first call that needs the partition's producer state. The
  OS page cache is warm (the files were just written).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec.structs

from bench import served
from bench.append import timed_steps
from bench.measures import interleaved, median
from bench.processes import fencelog_server
from bench.sections import Row, Section, rate, series, verdict
from broker.client.async_client import AsyncClient
from broker.client.client import Client, connect
from broker.engine.engine import Engine
from broker.event_loop import new_event_loop
from broker.limits import DEFAULT_LIMITS
from broker.protocol import ops
from broker.types import NewRecord, ProducerFields

TITLE: Final = "Idempotent producers (issue 5)"
VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 1000
WINDOW: Final = 32
IN_FLIGHT: Final = 4
OVERHEAD_MAX: Final = 0.10
RESTART_S_MAX: Final = 1.0
RESTART_TOPIC: Final = "restart"
RESTART_PRODUCERS: Final = 8
PARTITION: Final = 0


@dataclass(frozen=True, slots=True)
class IdempotenceSizes:
    rounds: int
    embedded_batch_records: int  # per side per round, in batches of 1000
    embedded_single_records: int  # per side per round, one per request
    served_batch_records: int
    served_single_records: int
    restart_records: int
    restart_tail: int
    restart_rounds: int
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} rounds per comparison of {self.embedded_batch_records:,} "
            f"(embedded) and {self.served_batch_records:,} (served) records in batches of "
            f"1000 and {self.embedded_single_records:,} (embedded) and "
            f"{self.served_single_records:,} (served) one-record requests per side; "
            f"{self.restart_rounds} restarts of a {self.restart_records:,}-record log "
            f"{self.restart_tail:,} records past its newest producer snapshot"
            + (" (--quick)" if self.quick else "")
        )


@dataclass(frozen=True, slots=True)
class Overhead:
    """Records/s per round with producer fields and without, same run."""

    name: str
    idempotent: tuple[float, ...]
    plain: tuple[float, ...]

    @property
    def overhead(self) -> float:
        return median(self.plain) / median(self.idempotent) - 1

    @property
    def round_overheads(self) -> tuple[float, ...]:
        pairs = zip(self.plain, self.idempotent, strict=True)
        return tuple(plain / idempotent - 1 for plain, idempotent in pairs)

    @property
    def passed(self) -> bool:
        return self.overhead <= OVERHEAD_MAX


@dataclass(frozen=True, slots=True)
class Restart:
    records: int  # in the log when the rounds began
    behind: int  # records past the newest snapshot when the rounds began
    tail_batches: int  # batches past the snapshot
    open_s: tuple[float, ...]  # Engine.open alone
    states_s: tuple[float, ...]  # Engine.open + producer_states
    produce_s: tuple[float, ...]  # Engine.open + the first idempotent produce
    fill_s: float


@dataclass(frozen=True, slots=True)
class IdempotenceResults:
    sizes: IdempotenceSizes
    overheads: tuple[Overhead, ...]
    restart: Restart


# overhead -------------------------------------------------------------------------------


def _records(count: int, seed: int) -> list[NewRecord]:
    rng = random.Random(seed)
    return [NewRecord(rng.randbytes(VALUE_BYTES), None, (), PARTITION) for _ in range(count)]


def _batches(records: Sequence[NewRecord], size: int) -> list[Sequence[NewRecord]]:
    return [records[start : start + size] for start in range(0, len(records), size)]


class _EmbeddedSide:
    """Appends through an embedded client into a fresh topic, with fields or without."""

    def __init__(self, client: Client, topic: str, idempotent: bool) -> None:
        client.create_topic(topic, 1)
        self.client = client
        self.topic = topic
        self.numbering = served.Numbering()
        if idempotent:
            lease = client.lease_pid(topic, PARTITION)
            self.numbering = served.Numbering(lease.producer_id, lease.generation, lease.sequence)

    def append(self, batch: Sequence[NewRecord]) -> None:
        self.client.produce(self.topic, batch, producer=self.numbering.take(len(batch)))


def _embedded(
    work_dir: Path, rounds: int, records: int, batch_records: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(idempotent, plain) records/s per round, request by request in turns."""
    batches = _batches(_records(records, seed=51), batch_records)
    topics = (f"t{number}" for number in itertools.count(1))
    idempotent_rates, plain_rates = [], []
    with connect(work_dir / f"idem-embedded-{batch_records}", durability="normal") as client:
        warm = _EmbeddedSide(client, next(topics), True), _EmbeddedSide(client, next(topics), False)
        for side in warm:  # unmeasured
            for batch in batches[: max(1, len(batches) // 10)]:
                side.append(batch)
        for number in range(rounds):
            # The topic created second appends at the right edge of the records' b-tree
            # (its topic_id sorts last); the other inserts in the middle. Sides take
            # turns at being second, so neither is favoured.
            order = (True, False) if number % 2 else (False, True)
            made = {idem: _EmbeddedSide(client, next(topics), idem) for idem in order}
            sides = [made[True], made[False]]
            steps = [timed_steps(batches, side.append) for side in sides]
            idempotent_s, plain_s = interleaved(len(batches), *steps)
            idempotent_rates.append(records / sum(idempotent_s))
            plain_rates.append(records / sum(plain_s))
            for side in sides:
                assert client.end_offsets(side.topic) == [records], "lost or added records"
    return tuple(idempotent_rates), tuple(plain_rates)


def _served(work_dir: Path, sizes: IdempotenceSizes) -> tuple[Overhead, Overhead]:
    """Batches of 1000 (IN_FLIGHT outstanding) and one-record requests (WINDOW in flight)
    over TCP, with fields and without, round by round in turns."""
    batches = _batches(_records(sizes.served_batch_records, seed=53), BATCH_RECORDS)
    singles = [
        r.value for r in _records(sizes.served_single_records, seed=59) if r.value is not None
    ]
    topics = (f"t{number}" for number in itertools.count(1))
    with (
        fencelog_server(work_dir, "idem-serve", "normal") as server,
        asyncio.Runner(loop_factory=new_event_loop) as runner,
    ):
        client: AsyncClient = served.async_client(server.address)

        def fresh_topic() -> str:
            topic = next(topics)
            runner.run(client.call(ops.CREATE_TOPIC, topic, 1))
            return topic

        def batches_round(idempotent: bool) -> float:
            topic = fresh_topic()
            seconds = runner.run(
                served.batches_pipelined(client, topic, batches, IN_FLIGHT, idempotent=idempotent)
            )
            return sizes.served_batch_records / seconds

        def singles_round(idempotent: bool) -> float:
            topic = fresh_topic()
            seconds = runner.run(
                served.one_record_requests(client, topic, singles, WINDOW, idempotent=idempotent)
            )
            return sizes.served_single_records / seconds

        try:
            for round_of in (batches_round, singles_round):  # unmeasured
                round_of(True)
                round_of(False)
            batch_rates = interleaved(
                sizes.rounds, lambda: batches_round(True), lambda: batches_round(False)
            )
            single_rates = interleaved(
                sizes.rounds, lambda: singles_round(True), lambda: singles_round(False)
            )
        finally:
            runner.run(client.close())
    return (
        Overhead(f"served, batches of 1000, {IN_FLIGHT} in flight", *batch_rates),
        Overhead(f"served, one-record requests, {WINDOW} in flight", *single_rates),
    )


# restart --------------------------------------------------------------------------------


@dataclass
class _Pid:
    producer_id: int
    generation: int
    next_sequence: int

    def take(self, count: int) -> ProducerFields:
        fields = ProducerFields(self.producer_id, self.generation, self.next_sequence)
        self.next_sequence += count
        return fields


def _fill(data_dir: Path, records: int, tail: int) -> tuple[list[_Pid], int]:
    """The log: records - tail in batches of 1000, a producer snapshot, then tail
    one-record batches; every batch from one of RESTART_PRODUCERS pids in turn. The pids
    and the number of batches written after the snapshot."""
    no_automatic_snapshots = msgspec.structs.replace(
        DEFAULT_LIMITS, producer_snapshot_every_records=records * 10
    )
    rng = random.Random(61)
    values = [rng.randbytes(VALUE_BYTES) for _ in range(BATCH_RECORDS)]
    batch = [NewRecord(value, None, (), PARTITION) for value in values]
    with Engine.open(data_dir, durability="normal", limits=no_automatic_snapshots) as engine:
        engine.create_topic(RESTART_TOPIC, 1)
        pids = []
        for _ in range(RESTART_PRODUCERS):
            lease = engine.lease_pid(RESTART_TOPIC, PARTITION)
            pids.append(_Pid(lease.producer_id, lease.generation, lease.sequence + 1))
        turns = itertools.cycle(pids)
        for start in range(0, records - tail, BATCH_RECORDS):
            chunk = batch[: min(BATCH_RECORDS, records - tail - start)]
            engine.produce(RESTART_TOPIC, chunk, producer=next(turns).take(len(chunk)))
        engine.snapshot_producers()
        for index in range(tail):
            one = [batch[index % BATCH_RECORDS]]
            engine.produce(RESTART_TOPIC, one, producer=next(turns).take(1))
        assert engine.end_offsets(RESTART_TOPIC) == [records]
    return pids, tail


def _restart(work_dir: Path, sizes: IdempotenceSizes) -> Restart:
    data_dir = work_dir / "restart"
    started = time.perf_counter()
    pids, tail_batches = _fill(data_dir, sizes.restart_records, sizes.restart_tail)
    fill_s = time.perf_counter() - started
    expected = {pid.producer_id: pid.next_sequence - 1 for pid in pids}
    first = pids[0]
    value = random.Random(67).randbytes(VALUE_BYTES)

    def open_only() -> float:
        start = time.perf_counter()
        engine = Engine.open(data_dir)
        elapsed_s = time.perf_counter() - start
        engine.close()
        return elapsed_s

    def open_and_states() -> float:
        start = time.perf_counter()
        with Engine.open(data_dir) as engine:
            states = engine.producer_states(RESTART_TOPIC)
            elapsed_s = time.perf_counter() - start
        found = {entry.producer_id: entry.high_water_sequence for _, entry in states}
        assert found == expected, "the restarted producer state differs from what was written"
        return elapsed_s

    def open_and_produce() -> float:
        record = [NewRecord(value, None, (), PARTITION)]
        start = time.perf_counter()
        with Engine.open(data_dir) as engine:
            engine.produce(RESTART_TOPIC, record, producer=first.take(1))
            elapsed_s = time.perf_counter() - start
        expected[first.producer_id] = first.next_sequence - 1
        return elapsed_s

    open_s, states_s, produce_s = interleaved(
        sizes.restart_rounds, open_only, open_and_states, open_and_produce
    )
    return Restart(
        sizes.restart_records,
        sizes.restart_tail,
        tail_batches,
        open_s,
        states_s,
        produce_s,
        fill_s,
    )


def measure(work_dir: Path, sizes: IdempotenceSizes) -> IdempotenceResults:
    embedded_batches = _embedded(
        work_dir, sizes.rounds, sizes.embedded_batch_records, BATCH_RECORDS
    )
    embedded_singles = _embedded(work_dir, sizes.rounds, sizes.embedded_single_records, 1)
    served_batches, served_singles = _served(work_dir, sizes)
    overheads = (
        Overhead("embedded, batches of 1000", *embedded_batches),
        Overhead("embedded, one-record requests", *embedded_singles),
        served_batches,
        served_singles,
    )
    return IdempotenceResults(sizes, overheads, _restart(work_dir, sizes))


# the section ----------------------------------------------------------------------------


def _rows(results: IdempotenceResults) -> list[Row]:
    rows = [
        Row(
            f"idempotent vs plain produce, {overhead.name}",
            rate(median(overhead.idempotent)),
            f"plain {rate(median(overhead.plain))}",
            f"{median(overhead.idempotent) / median(overhead.plain):.2f}",
            f"overhead <= {OVERHEAD_MAX:.0%}",
            f"{verdict(overhead.passed)} ({overhead.overhead:+.0%})",
        )
        for overhead in results.overheads
    ]
    restart = results.restart
    where = (
        f"{restart.records:,} records, snapshot {restart.behind:,} records "
        f"({restart.tail_batches:,} batches) behind"
    )
    rows += [
        Row(
            f"restart: Engine.open + producer_states, {where}",
            f"median {median(restart.states_s) * 1000:,.0f} ms, "
            f"max {max(restart.states_s) * 1000:,.0f} ms",
            f"Engine.open alone: median {median(restart.open_s) * 1000:,.1f} ms",
            "-",
            f"< {RESTART_S_MAX:.0f} s",
            verdict(median(restart.states_s) < RESTART_S_MAX),
        ),
        Row(
            "restart: Engine.open + the first idempotent produce, the same log",
            f"median {median(restart.produce_s) * 1000:,.0f} ms, "
            f"max {max(restart.produce_s) * 1000:,.0f} ms",
            "",
            "-",
            f"< {RESTART_S_MAX:.0f} s",
            verdict(median(restart.produce_s) < RESTART_S_MAX),
        ),
    ]
    return rows


def _method(results: IdempotenceResults) -> list[str]:
    restart = results.restart
    return [
        "How it is measured (bench/idempotence.py, bench/served.py):",
        "",
        "- Idempotent: the records carry (pid from `lease_pid`, its generation, the next",
        "  sequences); plain: pid 0. 100-byte values, records built before any clock,",
        "  durability normal (an fsync would land on both sides alike and hide the cost),",
        "  each side into its own fresh one-partition topic.",
        "- Embedded: `broker.client.connect(dir).produce(topic, batch, producer=...)`; the",
        "  two sides take turns request by request (A B, B A, ...) and a rate is records",
        "  over the sum of that side's request times. Each round makes a fresh topic per",
        "  side, both in one database; the topic made second appends at the right edge of",
        "  the records' b-tree, the other in its middle, so the sides take turns at that.",
        "- Served: one `fencelog serve` process and one `AsyncClient` connection; batches",
        f"  of 1000 with {IN_FLIGHT} requests in flight, one-record requests with {WINDOW} in",
        "  flight (as in the Server section); the sides take turns round by round.",
        "- Overhead: the plain side's median rate over the idempotent side's, less 1 (the",
        "  extra time per record); the ratio column is idempotent over plain.",
        f"- Restart: one partition filled with {restart.records - restart.behind:,} records",
        f"  in batches of 1000 from {RESTART_PRODUCERS} pids in turn (no automatic",
        f"  snapshots), then `snapshot_producers()`, then {restart.behind:,} one-record batches",
        "  (the most batches a snapshot that far behind can leave to replay). Each",
        "  round times, in a fresh engine, `Engine.open(dir)` and then",
        "  `producer_states(topic)` (checked against the sequences written), or",
        "  `Engine.open(dir)` and one idempotent `produce` continuing a pid's sequence (which",
        "  adds one record per such round), or `Engine.open` alone. Warm page cache:",
        f"  the files were just written (filling took {restart.fill_s:.1f} s).",
    ]


def _findings(results: IdempotenceResults) -> list[str]:
    lines = ["What the figures say:", ""]
    for overhead in results.overheads:
        extra_us = (1 / median(overhead.idempotent) - 1 / median(overhead.plain)) * 1e6
        lines.append(
            f"- {overhead.name}: producer fields add {extra_us:.1f} us per record "
            f"({overhead.overhead:+.0%})."
        )
    return lines


def _raw(results: IdempotenceResults) -> list[str]:
    lines = []
    for overhead in results.overheads:
        lines += [
            f"{overhead.name}: records/s per round",
            series("idempotent", overhead.idempotent),
            series("plain", overhead.plain),
            series("overhead per round, %", [o * 100 for o in overhead.round_overheads], 1),
        ]
    restart = results.restart
    lines += [
        "restart: seconds per round",
        series("Engine.open", restart.open_s, 4),
        series("Engine.open + producer_states", restart.states_s, 4),
        series("Engine.open + first idempotent produce", restart.produce_s, 4),
    ]
    return lines


def section(results: IdempotenceResults) -> Section:
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=tuple(_rows(results)),
        method=tuple(_method(results)),
        findings=tuple(_findings(results)),
        raw=tuple(_raw(results)),
    )
