"""Server (issue 3): `fencelog serve` as a real process, side by side with NATS
JetStream, and served batches and reads next to the embedded engine and raw SQLite.

Rules:
- Three servers run for the whole group: fencelog serve with durability normal, the
  same with durability full, and nats-server with JetStream (skipped, with the reason,
  when it or nats-py is missing). Each listens on 127.0.0.1 only; all are stopped at
  the end, however the group ends.
- Every comparison runs its sides in rounds, rotating which goes first
  (bench.measures.interleaved), after one short unmeasured round per side; a figure is
  the median of its rounds.
- Values are 100 random bytes, built before any clock starts.
- For every served side, the CPU time of the server process and of this (client)
  process is read around each round: it says which side of the connection was busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench import append, jetstream, raw, read, served
from bench.measures import interleaved, median, percentile
from bench.processes import (
    FencelogServer,
    NatsServer,
    ServerProcess,
    fencelog_server,
    nats_server,
    nats_server_version,
)
from bench.sections import SKIPPED, Row, Section, rate, series, verdict
from broker.client.async_client import AsyncClient
from broker.client.client import Client, connect
from broker.engine.engine import Engine
from broker.event_loop import new_event_loop
from broker.protocol import ops
from broker.types import Durability, NewRecord

TITLE: Final = "Server (issue 3)"
VALUE_BYTES: Final = 100
WINDOW: Final = 32
IN_FLIGHT: Final = 4
CLIENT_BUSY_POLL_US: Final = 500  # fencelog's client polls while it awaits a reply (AsyncClient)
NATS: Final = "NATS JetStream"
WINDOW_RATIO_MIN: Final = 1.0  # ahead of NATS
BATCH_RATE_MIN: Final = 150_000.0
CONSUME_RATE_MIN: Final = 300_000.0
WARM_UP_RECORDS: Final = 500
DURABILITIES: Final[tuple[Durability, ...]] = ("normal", "full")  # the judged one first


@dataclass(frozen=True, slots=True)
class ServerSizes:
    rounds: int  # rounds of the one-record comparisons and of the batch comparison
    window_records: int  # one-record requests per side per round, WINDOW in flight
    latency_requests: int  # one-at-a-time requests per side per round
    batch_records: int  # records per side per round, in batches of 1000
    consume_rounds: int
    consume_records: int
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} rounds of {self.window_records:,} one-record requests "
            f"{WINDOW} in flight and of {self.latency_requests:,} one at a time per server, "
            f"{self.rounds} rounds of {self.batch_records:,} records in batches of 1000 "
            f"per durability, {self.consume_rounds} reads of a "
            f"{self.consume_records:,}-record partition" + (" (--quick)" if self.quick else "")
        )


@dataclass(frozen=True, slots=True)
class Busy:
    """CPU use around each round of one served side: wall seconds, CPU seconds of the
    server process, CPU seconds of this (client) process, and the records sent."""

    wall_s: tuple[float, ...]
    server_cpu_s: tuple[float, ...]
    client_cpu_s: tuple[float, ...]
    records: int

    @property
    def server_share(self) -> float:
        """Median CPUs the server kept busy: CPU seconds per wall second."""
        return median([c / w for c, w in zip(self.server_cpu_s, self.wall_s, strict=True)])

    @property
    def client_share(self) -> float:
        return median([c / w for c, w in zip(self.client_cpu_s, self.wall_s, strict=True)])

    @property
    def server_us_per_record(self) -> float:
        return median(self.server_cpu_s) / self.records * 1e6

    @property
    def client_us_per_record(self) -> float:
        return median(self.client_cpu_s) / self.records * 1e6


@dataclass(frozen=True, slots=True)
class Latencies:
    """p50 and p99 of each round, in microseconds."""

    p50_us: tuple[float, ...]
    p99_us: tuple[float, ...]

    @property
    def p50(self) -> float:
        return median(self.p50_us)

    @property
    def p99(self) -> float:
        return median(self.p99_us)


@dataclass(frozen=True, slots=True)
class BatchRates:
    durability: Durability
    served: tuple[float, ...]
    embedded: tuple[float, ...]
    raw: tuple[float, ...]
    busy: Busy


@dataclass(frozen=True, slots=True)
class ServerResults:
    sizes: ServerSizes
    window: dict[str, tuple[float, ...]]  # side -> records/s per round
    window_busy: dict[str, Busy]
    latency: dict[str, Latencies]
    breakdown: dict[str, tuple[float, ...]]  # what one request costs, p50 us per round
    batches: tuple[BatchRates, ...]
    consume_served: tuple[float, ...]
    consume_embedded: tuple[float, ...]
    consume_busy: Busy
    nats_skipped: str | None  # why the NATS sides did not run
    nats_version: str
    nats_py_version: str


def fencelog_side(durability: Durability) -> str:
    return f"fencelog {durability}"


# measuring --------------------------------------------------------------------------------


def _values(count: int, rng: random.Random) -> list[bytes]:
    return [rng.randbytes(VALUE_BYTES) for _ in range(count)]


def _metered(
    server: ServerProcess, busy: list[tuple[float, float, float]], measure: Callable[[], float]
) -> Callable[[], float]:
    """`measure`, with the wall, server CPU and client CPU seconds of each call kept."""

    def run() -> float:
        server_before, client_before = server.cpu_s(), time.process_time()
        start = time.perf_counter()
        value = measure()
        busy.append(
            (
                time.perf_counter() - start,
                server.cpu_s() - server_before,
                time.process_time() - client_before,
            )
        )
        return value

    return run


def _busy(samples: Sequence[tuple[float, float, float]], records: int) -> Busy:
    walls, servers, clients = zip(*samples, strict=True)
    return Busy(tuple(walls), tuple(servers), tuple(clients), records)


class _Topics:
    """Fresh topic names, one per round."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)

    def new(self, loop: asyncio.Runner, client: AsyncClient, prefix: str) -> str:
        name = f"{prefix}-{next(self._numbers)}"
        loop.run(client.call(ops.CREATE_TOPIC, name, 1))
        return name


def measure(work_dir: Path, sizes: ServerSizes) -> ServerResults:
    nats_skipped = jetstream.unavailable()
    with contextlib.ExitStack() as stack:
        servers = {
            durability: stack.enter_context(
                fencelog_server(work_dir, f"serve-{durability}", durability)
            )
            for durability in DURABILITIES
        }
        nats = None if nats_skipped else stack.enter_context(nats_server(work_dir))
        loop = stack.enter_context(asyncio.Runner(loop_factory=new_event_loop))
        clients = {
            d: served.async_client(s.address, CLIENT_BUSY_POLL_US) for d, s in servers.items()
        }
        quiet_client = served.async_client(servers["normal"].address)
        js = None if nats is None else loop.run(jetstream.JetStream.connect(nats.address))
        try:
            window, window_busy = _window(loop, sizes, servers, clients, nats, js)
            latency = _latency(loop, sizes, clients, js)
            breakdown = _breakdown(loop, work_dir, sizes, clients["normal"], quiet_client)
            batches = tuple(
                _batches(loop, work_dir, sizes, d, servers[d], clients[d]) for d in DURABILITIES
            )
            consume_served, consume_embedded, consume_busy = _consume(
                loop, sizes, servers["normal"], clients["normal"]
            )
        finally:
            for client in (*clients.values(), quiet_client):
                loop.run(client.close())
            if js is not None:
                loop.run(js.close())
    return ServerResults(
        sizes,
        window,
        window_busy,
        latency,
        breakdown,
        batches,
        consume_served,
        consume_embedded,
        consume_busy,
        nats_skipped,
        nats_server_version(),
        jetstream.client_version(),
    )


def _window(
    loop: asyncio.Runner,
    sizes: ServerSizes,
    servers: dict[Durability, FencelogServer],
    clients: dict[Durability, AsyncClient],
    nats: NatsServer | None,
    js: jetstream.JetStream | None,
) -> tuple[dict[str, tuple[float, ...]], dict[str, Busy]]:
    """Records/s of de-duplicated one-record requests, WINDOW in flight, per side."""
    rng = random.Random(31)
    values = _values(sizes.window_records, rng)
    topics = _Topics()
    sides: dict[str, Callable[[int], float]] = {}
    processes: dict[str, ServerProcess] = {}
    for durability, client in clients.items():

        def fencelog_round(count: int, client: AsyncClient = client) -> float:
            topic = topics.new(loop, client, "window")
            return loop.run(
                served.one_record_requests(client, topic, values[:count], WINDOW, idempotent=True)
            )

        sides[fencelog_side(durability)] = fencelog_round
        processes[fencelog_side(durability)] = servers[durability]
    if js is not None and nats is not None:
        nats_js = js

        def nats_round(count: int) -> float:
            return loop.run(nats_js.publish_window(values[:count], WINDOW))

        sides[NATS] = nats_round
        processes[NATS] = nats
    for side in sides.values():
        side(WARM_UP_RECORDS)  # unmeasured
    busy: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    records = sizes.window_records

    def rate_of(side: Callable[[int], float]) -> Callable[[], float]:
        return lambda: records / side(records)

    measures = [_metered(processes[n], busy[n], rate_of(side)) for n, side in sides.items()]
    rates = interleaved(sizes.rounds, *measures)
    return (
        dict(zip(sides, rates, strict=True)),
        {name: _busy(samples, records) for name, samples in busy.items()},
    )


def _latency(
    loop: asyncio.Runner,
    sizes: ServerSizes,
    clients: dict[Durability, AsyncClient],
    js: jetstream.JetStream | None,
) -> dict[str, Latencies]:
    """p50/p99 of de-duplicated one-record requests sent one at a time, per side."""
    rng = random.Random(37)
    values = _values(sizes.latency_requests, rng)
    topics = _Topics()
    sides: dict[str, Callable[[int], list[float]]] = {}
    for durability, client in clients.items():

        def fencelog_round(count: int, client: AsyncClient = client) -> list[float]:
            topic = topics.new(loop, client, "latency")
            return loop.run(
                served.one_record_latencies(client, topic, values[:count], idempotent=True)
            )

        sides[fencelog_side(durability)] = fencelog_round
    if js is not None:
        nats_js = js

        def nats_round(count: int) -> list[float]:
            return loop.run(nats_js.publish_latencies(values[:count]))

        sides[NATS] = nats_round
    for side in sides.values():
        side(WARM_UP_RECORDS)  # unmeasured
    p50s: dict[str, list[float]] = {name: [] for name in sides}

    def timed(name: str, side: Callable[[int], list[float]]) -> Callable[[], float]:
        def run() -> float:
            latencies = side(sizes.latency_requests)
            p50s[name].append(percentile(latencies, 0.5) * 1e6)
            return percentile(latencies, 0.99) * 1e6

        return run

    p99s = interleaved(sizes.rounds, *(timed(name, side) for name, side in sides.items()))
    return {name: Latencies(tuple(p50s[name]), p99) for name, p99 in zip(sides, p99s, strict=True)}


BREAKDOWN: Final = (
    "HEARTBEAT over TCP (no engine)",
    "plain produce over TCP",
    "de-duplicated produce over TCP",
    "the same, client not polling (busy_poll_us=0)",
    "de-duplicated Engine.produce, in process",
    "plain Engine.produce, in process",
)


def _breakdown(
    loop: asyncio.Runner,
    work_dir: Path,
    sizes: ServerSizes,
    client: AsyncClient,
    quiet_client: AsyncClient,
) -> dict[str, tuple[float, ...]]:
    """p50 us per round of one request at a time, from a bare round trip through the
    server (durability normal) to the engine alone in this process: where a
    de-duplicated request's latency goes."""
    count = sizes.latency_requests
    values = _values(count, random.Random(47))
    topics = _Topics()
    records = [[NewRecord(value, None, (), 0)] for value in values]

    def p50_us(latencies: Sequence[float]) -> float:
        return percentile(latencies, 0.5) * 1e6

    def heartbeat() -> float:
        return p50_us(loop.run(served.heartbeat_latencies(client, count)))

    def over_tcp(idempotent: bool, client: AsyncClient = client) -> float:
        topic = topics.new(loop, client, "breakdown")
        return p50_us(
            loop.run(served.one_record_latencies(client, topic, values, idempotent=idempotent))
        )

    def in_process(engine: Engine, idempotent: bool) -> float:
        topic = f"breakdown-{next(topics_in_process)}"
        engine.create_topic(topic, 1)
        fields = served.Numbering()
        if idempotent:
            lease = engine.lease_pid(topic, 0)
            fields = served.Numbering(lease.producer_id, lease.generation, lease.sequence)
        latencies = []
        for record in records:
            producer = fields.take(1)
            start = time.perf_counter()
            engine.produce(topic, record, producer=producer)
            latencies.append(time.perf_counter() - start)
        return p50_us(latencies)

    topics_in_process = itertools.count(1)
    with Engine.open(work_dir / "breakdown", durability="normal") as engine:
        measures: tuple[Callable[[], float], ...] = (
            heartbeat,
            lambda: over_tcp(False),
            lambda: over_tcp(True),
            lambda: over_tcp(True, quiet_client),
            lambda: in_process(engine, True),
            lambda: in_process(engine, False),
        )
        for step in measures:
            step()  # unmeasured
        p50s = interleaved(sizes.rounds, *measures)
    return dict(zip(BREAKDOWN, p50s, strict=True))


def _batches(
    loop: asyncio.Runner,
    work_dir: Path,
    sizes: ServerSizes,
    durability: Durability,
    server: FencelogServer,
    client: AsyncClient,
) -> BatchRates:
    """Records/s of batches of 1000: served (IN_FLIGHT outstanding), embedded, raw SQLite."""
    value_batches = append.value_batches(sizes.batch_records, seed=41)
    record_batches = [[NewRecord(v, None, (), 0) for v in batch] for batch in value_batches]
    row_batches = append.raw_row_batches(value_batches)
    records = sizes.batch_records
    topics = _Topics()

    def served_round() -> float:
        topic = topics.new(loop, client, "batches")
        return records / loop.run(
            served.batches_pipelined(client, topic, record_batches, IN_FLIGHT, idempotent=False)
        )

    embedded_dir = work_dir / f"embedded-{durability}"
    raw_rounds = itertools.count(1)

    def embedded_round(embedded: Client) -> float:
        topic = f"batches-{next(raw_rounds)}"
        embedded.create_topic(topic, 1)
        start = time.perf_counter()
        for batch in record_batches:
            embedded.produce(topic, batch)
        elapsed_s = time.perf_counter() - start
        assert embedded.end_offsets(topic) == [records], "embedded lost or added records"
        return records / elapsed_s

    def raw_round() -> float:
        db_path = work_dir / f"raw-{durability}.db"
        with contextlib.closing(raw.connect(db_path, durability)) as conn:
            raw.create_schema(conn)
            start = time.perf_counter()
            for rows in row_batches:
                raw.insert_batch(conn, rows)
            elapsed_s = time.perf_counter() - start
            assert raw.count_records(conn) == records, "raw SQLite lost or added rows"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)
        return records / elapsed_s

    busy: list[tuple[float, float, float]] = []
    with connect(embedded_dir, durability=durability) as embedded:
        for side in (served_round, lambda: embedded_round(embedded), raw_round):
            side()  # unmeasured
        served_rates, embedded_rates, raw_rates = interleaved(
            sizes.rounds,
            _metered(server, busy, served_round),
            lambda: embedded_round(embedded),
            raw_round,
        )
    shutil.rmtree(embedded_dir)
    return BatchRates(durability, served_rates, embedded_rates, raw_rates, _busy(busy, records))


def _consume(
    loop: asyncio.Runner, sizes: ServerSizes, server: FencelogServer, client: AsyncClient
) -> tuple[tuple[float, ...], tuple[float, ...], Busy]:
    """Records/s reading one partition from offset 0: a consumer over TCP
    (`Client.consume`), and Engine.read in this process on the server's own data
    directory."""
    records = sizes.consume_records
    loop.run(client.call(ops.CREATE_TOPIC, read.TOPIC, 1))
    value_batches = append.value_batches(records, seed=43)
    record_batches = [[NewRecord(v, None, (), 0) for v in batch] for batch in value_batches]
    loop.run(served.batches_pipelined(client, read.TOPIC, record_batches, 1, idempotent=False))

    def served_round() -> float:
        start = time.perf_counter()
        count = sum(1 for _ in consumer.consume(read.TOPIC, partition=0))
        elapsed_s = time.perf_counter() - start
        assert count == records, f"consumed {count} of {records}"
        return records / elapsed_s

    busy: list[tuple[float, float, float]] = []
    with (
        connect(server.address) as consumer,
        Engine.open(server.data_dir, durability=server.durability) as engine,
    ):
        served_round()  # unmeasured: warm both caches
        read.fencelog_rate(engine, records)
        served_rates, embedded_rates = interleaved(
            sizes.consume_rounds,
            _metered(server, busy, served_round),
            lambda: read.fencelog_rate(engine, records),
        )
    return served_rates, embedded_rates, _busy(busy, records)


# the section ----------------------------------------------------------------------------


def _window_rows(results: ServerResults) -> list[Row]:
    nats = results.window.get(NATS)
    rows = []
    for durability in DURABILITIES:
        rates = results.window[fencelog_side(durability)]
        name = f"one-record requests, {WINDOW} in flight, de-duplicated, durability {durability}"
        judged = durability == "normal"
        if nats is None:
            rows.append(
                Row(
                    name,
                    rate(median(rates)),
                    f"{NATS}: skipped",
                    target=f"ahead of {NATS}" if judged else "(information)",
                    result=SKIPPED if judged else "-",
                )
            )
            continue
        ratio = median(rates) / median(nats)
        rows.append(
            Row(
                name,
                rate(median(rates)),
                f"{NATS} {rate(median(nats))}",
                f"{ratio:.2f}",
                f"ratio >= {WINDOW_RATIO_MIN:.2f} (ahead of {NATS})" if judged else "(information)",
                verdict(ratio >= WINDOW_RATIO_MIN) if judged else "-",
            )
        )
    return rows


def _latency_rows(results: ServerResults) -> list[Row]:
    nats = results.latency.get(NATS)
    rows = []
    for durability in DURABILITIES:
        latency = results.latency[fencelog_side(durability)]
        judged = durability == "normal"
        baseline = (
            f"{NATS}: skipped"
            if nats is None
            else f"{NATS} p50 {nats.p50:,.0f} us, p99 {nats.p99:,.0f} us"
        )
        passed = None if nats is None else latency.p50 <= nats.p50
        rows.append(
            Row(
                f"one-record requests one at a time, de-duplicated, durability {durability}",
                f"p50 {latency.p50:,.0f} us, p99 {latency.p99:,.0f} us",
                baseline,
                "-" if nats is None else f"{latency.p50 / nats.p50:.2f}",
                f"p50 <= {NATS} p50" if judged else "(information)",
                ("-" if not judged else SKIPPED if passed is None else verdict(passed)),
            )
        )
    return rows


def _batch_rows(results: ServerResults) -> list[Row]:
    rows = []
    for batches in results.batches:
        served_rate = median(batches.served)
        rows.append(
            Row(
                f"batches of 1000, {IN_FLIGHT} in flight over TCP, durability {batches.durability}",
                rate(served_rate),
                f"embedded {rate(median(batches.embedded))}; raw SQLite "
                f"{rate(median(batches.raw))}",
                f"{served_rate / median(batches.embedded):.2f}",
                f">= {rate(BATCH_RATE_MIN)}",
                verdict(served_rate >= BATCH_RATE_MIN),
            )
        )
    return rows


def _consume_row(results: ServerResults) -> Row:
    served_rate = median(results.consume_served)
    return Row(
        "consume over TCP from offset 0",
        rate(served_rate),
        f"embedded Engine.read {rate(median(results.consume_embedded))}",
        f"{served_rate / median(results.consume_embedded):.2f}",
        f">= {rate(CONSUME_RATE_MIN)}",
        verdict(served_rate >= CONSUME_RATE_MIN),
    )


def _method(results: ServerResults) -> list[str]:
    return [
        "How it is measured (bench/serving.py, bench/served.py, bench/jetstream.py,",
        "bench/processes.py):",
        "",
        "- Servers: `fencelog --broker DIR --durability normal|full serve --listen",
        "  127.0.0.1:0 --ready-file F` as real processes (the installed console script), and",
        f"  `nats-server --jetstream` ({results.nats_version}) on 127.0.0.1, file storage in the",
        "  run's temporary directory. All run for the whole group and are stopped at its end.",
        "- Polling: the servers run with `serve`'s default `--busy-poll 500us`; fencelog's",
        f"  client is `AsyncClient(busy_poll_us={CLIENT_BUSY_POLL_US})`, which polls instead of",
        "  sleeping while a reply is awaited, for at most that long after each send (off by",
        "  default; nats-py has no such option). The breakdown below also shows a client",
        "  that does not poll.",
        f"- One-record requests, {WINDOW} in flight: one `AsyncClient` connection per server;",
        "  the round leases a pid (`lease_pid`) on a fresh one-partition topic and",
        f"  {WINDOW} coroutines send one 100-byte record per `produce`, each carrying",
        "  (pid, generation, next sequence), each coroutine waiting for its acknowledgement",
        "  before sending again. NATS: one nats-py connection, a fresh stream per round,",
        f"  {WINDOW} coroutines awaiting `js.publish(subject, value, headers={{Nats-Msg-Id:",
        "  unique id})`. Both sides check afterwards that every record is stored once; a",
        "  repeated Nats-Msg-Id is checked to come back as a duplicate.",
        "- One at a time: the same requests, one coroutine, perf_counter around each",
        "  `produce` / `js.publish`; a round's p50 and p99 (nearest rank), median over rounds.",
        "- Where the latency goes: in rounds of the same size, p50s of a HEARTBEAT request",
        "  (a round trip through the connection and the server's event loop, no engine), of",
        "  one-record produces over TCP with and without producer fields (server durability",
        "  normal), and of the same `Engine.produce` calls in this process (no server).",
        "- Durability: NATS JetStream file storage acknowledges a publish after writing it",
        "  to the file, without fsync (strace -c of nats-server 2.9.10 for 2000 acknowledged",
        "  publishes: 2002 pwrite64, no fsync or fdatasync), as fencelog's durability normal",
        "  does (WAL append, no fsync at COMMIT). So the goals are judged with durability",
        "  normal; full (fsync at every COMMIT) is shown beside it.",
        f"- Batches: 1000 records of 100 bytes per `produce`, {IN_FLIGHT} requests in flight on",
        "  one connection, to a fresh topic per round; against the same `NewRecord` batches",
        "  through the embedded `broker.client.connect(dir).produce` and `executemany` of the",
        "  same rows into a fresh raw SQLite database (bench/raw.py, one row a statement;",
        "  the engine inserts 64 rows a statement), each under the durability's synchronous",
        "  setting. The three take turns round by round.",
        "- Consume: a partition filled through the normal server, then the sync client's",
        "  `Client.consume(topic, partition=0)` over TCP from offset 0 to the end, counting",
        "  records (pages of read_records_max, 10,000; it keeps one fetch ahead, so the",
        "  server reads the next page while this process decodes and iterates the last);",
        "  against `Engine.read` paging in this process on the server's data",
        "  directory (WAL: a second reader does not wait). One unmeasured read each first.",
        "- CPU: user + system seconds of the server process (/proc/PID/stat) and of this",
        "  process (time.process_time) around every served round.",
    ]


def _findings(results: ServerResults) -> list[str]:
    lines = ["Where the time goes (CPU seconds per wall second, median of rounds):", ""]
    for name, busy in results.window_busy.items():
        lines.append(
            f"- {WINDOW} in flight, {name}: server process {busy.server_share:.2f} CPU, "
            f"client {busy.client_share:.2f} CPU; {busy.server_us_per_record:,.0f} us of "
            f"server CPU and {busy.client_us_per_record:,.0f} us of client CPU per record."
        )
    for batches in results.batches:
        busy = batches.busy
        lines.append(
            f"- batches of 1000, fencelog serve, durability {batches.durability}: server process "
            f"{busy.server_share:.2f} CPU, client {busy.client_share:.2f} CPU; "
            f"{busy.server_us_per_record:.1f} us of server CPU and "
            f"{busy.client_us_per_record:.1f} us of client CPU per record."
        )
    busy = results.consume_busy
    lines.append(
        f"- consume over TCP: server process {busy.server_share:.2f} CPU, client "
        f"{busy.client_share:.2f} CPU; {busy.server_us_per_record:.1f} us of server CPU "
        f"and {busy.client_us_per_record:.1f} us of client CPU per record."
    )
    lines += [
        "",
        "Where one request's latency goes, one at a time, durability normal (p50, median "
        "of rounds): "
        + "; ".join(f"{name} {median(p50s):,.0f} us" for name, p50s in results.breakdown.items())
        + ".",
    ]
    if results.nats_skipped:
        lines += ["", f"The {NATS} baseline was skipped: {results.nats_skipped}."]
    return lines


def _busy_lines(name: str, busy: Busy) -> list[str]:
    return [
        series(f"{name}: wall s", busy.wall_s, 3),
        series(f"{name}: server CPU s", busy.server_cpu_s, 3),
        series(f"{name}: client CPU s", busy.client_cpu_s, 3),
    ]


def _raw(results: ServerResults) -> list[str]:
    lines = [f"one-record requests, {WINDOW} in flight, de-duplicated: per round"]
    for name, rates in results.window.items():
        lines += [
            series(f"{name}: records/s", rates),
            *_busy_lines(name, results.window_busy[name]),
        ]
    lines.append("one-record requests one at a time, de-duplicated: us per round")
    for name, latency in results.latency.items():
        lines += [
            series(f"{name}: p50", latency.p50_us),
            series(f"{name}: p99", latency.p99_us),
        ]
    lines.append("one request at a time, durability normal: p50 us per round")
    lines += [series(name, p50s) for name, p50s in results.breakdown.items()]
    for batches in results.batches:
        lines += [
            f"batches of 1000, durability {batches.durability}: per round",
            series(f"served, {IN_FLIGHT} in flight: records/s", batches.served),
            series("embedded: records/s", batches.embedded),
            series("raw SQLite: records/s", batches.raw),
            *_busy_lines("served", batches.busy),
        ]
    lines += [
        "consume from offset 0: per round",
        series("Client.consume over TCP: records/s", results.consume_served),
        series("Engine.read in process: records/s", results.consume_embedded),
        *_busy_lines("Client.consume over TCP", results.consume_busy),
    ]
    return lines


def section(results: ServerResults) -> Section:
    software = (
        f"Baseline: {results.nats_version} (Debian's package), JetStream; nats-py "
        f"{results.nats_py_version}."
        if not results.nats_skipped
        else f"Baseline: {NATS} skipped ({results.nats_skipped})."
    )
    rows = (
        *_window_rows(results),
        *_latency_rows(results),
        *_batch_rows(results),
        _consume_row(results),
    )
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=rows,
        method=tuple(_method(results)),
        findings=tuple(_findings(results)),
        raw=tuple(_raw(results)),
        software=software,
    )
