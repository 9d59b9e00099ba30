"""Kafka listener: `fencelog serve --kafka-listen` driven by unchanged Kafka clients, side
by side with the native protocol of the same server command, in one run.

    python -m bench.kafka_listener [--quick] [--profile | --no-profile]
    python -m bench.run --only kafka [--quick]

Rules:
- Every server is `fencelog --broker DIR --durability full serve --listen 127.0.0.1:0
  --kafka-listen 127.0.0.1:0 --ready-file F` (the installed console script), on a fresh
  data directory of its own; both sides of a comparison talk to the same command, so the
  protocol is the only difference. Nothing listens beyond 127.0.0.1; every server is
  stopped (SIGTERM, then SIGKILL) however the run ends, and every wait has a deadline.
- Producer throughput: N distinct 100-byte values (built before any clock) into a fresh
  one-partition topic, a fresh server per side per round. Kafka: confluent-kafka's
  Producer with enable.idempotence=True and librdkafka's default batching, one
  `produce()` per record (a full local queue is drained with `poll`), then `flush()`.
  Native, two ways the README documents, both through `broker.client.connect(url)`:
  the idempotent Producer (`send_async` of batches of 1000, max_in_flight 5, `flush`)
  and plain `client.produce(topic, batch)` per batch of 1000. The target is judged
  against the faster native way. Connections, topic creation and the Kafka producer's
  id are set up before the clock (one record to another topic warms each side).
- Consume throughput: one data directory filled with M records of 100 bytes (embedded,
  durability full), copied once per side, each copy served by its own server for the
  whole comparison. Kafka: `kcat -C -b ADDR -t T -o beginning -e -q -c M`, stdout to
  /dev/null, timed as a whole process (-c: kcat stops at the last record, rather than
  wait the 500 ms fetch.wait.max.ms the broker holds the fetch that finds the end for);
  native: `client.consume(T, partition=0, start="beginning")` over TCP (one fetch kept
  ahead), records counted; for information, `fencelog --broker URL consume T` as a
  whole process, stdout to /dev/null. One untimed kcat read afterwards prints every
  offset, to check kcat read all M records.
- Sides take turns within a round, rotating which goes first; a figure is the median of
  its rounds and a ratio is median over median. Server CPU (from /proc) and client CPU
  (this process, or the child process: kcat, `fencelog consume`) are read around each
  timed part, to show which end was busy.
- Transactional commit latency: a fresh server; confluent-kafka's transactional
  Producer (init_transactions once), then per commit `begin_transaction()`, `produce()`
  of one record, `commit_transaction()`, perf_counter around the three; alternated one
  by one with the native one-record transaction (`client.transaction(group)`, one
  produce, commit). 10 unmeasured commits each first; p50 and p99 by nearest rank.
- Profile (when a target is missed, or --profile): the server run under cProfile, one
  profile per thread (event loop, writer, reader) merged, for one Kafka produce of a
  quarter of N records and one kcat read of a fifth of M; self time (wall clock, so a
  thread's waits count too) ranked by function and by file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pstats
import random
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import confluent_kafka

from bench import report
from bench.cli_produce import fencelog_script
from bench.machine import describe, finished
from bench.measures import interleaved, median, percentile
from bench.processes import HOST, ServerProcess
from bench.sections import INFORMATION, Row, Section, markdown, rate, series, table, verdict
from broker.client.client import connect
from broker.types import Durability

TITLE: Final = "Kafka listener"
TOPIC: Final = "bench"
WARM_TOPIC: Final = "warm"
TXN_TOPIC: Final = "txn"
TXN_GROUP: Final = "bench"
VALUE_BYTES: Final = 100
BATCH_RECORDS: Final = 1000
FILL_BATCH_RECORDS: Final = 10_000
DURABILITY: Final[Durability] = "full"
PRODUCE_RATIO_MIN: Final = 0.70
CONSUME_RATIO_MIN: Final = 0.50
TXN_WARM_UP: Final = 10
KAFKA_TIMEOUT_S: Final = 120.0
PROCESS_TIMEOUT_S: Final = 600.0
PROFILE_TOP: Final = 15
KCAT: Final = "kcat"
RESULTS_FILE: Final = Path(__file__).resolve().parent / "RESULTS.md"
_REPOSITORY: Final = Path(__file__).resolve().parent.parent

KAFKA: Final = "kafka (confluent-kafka)"
NATIVE_PRODUCER: Final = "native Producer (idempotent)"
NATIVE_PRODUCE: Final = "native client.produce"
KCAT_SIDE: Final = "kcat"
NATIVE_CONSUME: Final = "native client.consume"
NATIVE_CLI: Final = "fencelog consume"
PRODUCE_SIDES: Final = (KAFKA, NATIVE_PRODUCER, NATIVE_PRODUCE)
SLUGS: Final = {KAFKA: "kafka", NATIVE_PRODUCER: "native-producer", NATIVE_PRODUCE: "native-plain"}
CONSUME_SIDES: Final = (KCAT_SIDE, NATIVE_CONSUME, NATIVE_CLI)


@dataclass(frozen=True, slots=True)
class KafkaSizes:
    rounds: int  # producer rounds (a fresh server per side per round)
    produce_records: int
    consume_rounds: int
    consume_records: int
    txn_commits: int
    quick: bool

    def text(self) -> str:
        return (
            f"{self.rounds} producer rounds of {self.produce_records:,} records of "
            f"{VALUE_BYTES} bytes per side, {self.consume_rounds} reads of a "
            f"{self.consume_records:,}-record partition per side, {self.txn_commits:,} "
            "one-record transactional commits per side; durability full"
            + (" (--quick)" if self.quick else "")
        )


FULL: Final = KafkaSizes(
    rounds=3,
    produce_records=200_000,
    consume_rounds=3,
    consume_records=1_000_000,
    txn_commits=200,
    quick=False,
)
QUICK: Final = KafkaSizes(
    rounds=2,
    produce_records=20_000,
    consume_rounds=2,
    consume_records=100_000,
    txn_commits=30,
    quick=True,
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed part: wall seconds, server CPU seconds, client CPU seconds."""

    wall_s: float
    server_cpu_s: float
    client_cpu_s: float


@dataclass(frozen=True, slots=True)
class Profiled:
    what: str
    total_s: float  # the profile's total self time
    functions: tuple[tuple[str, float, int], ...]  # (function, self s, calls), by self time
    files: tuple[tuple[str, float], ...]  # (file, self s), by self time


@dataclass(slots=True)
class KafkaResults:
    sizes: KafkaSizes
    produce: dict[str, list[Sample]] = field(default_factory=dict)
    consume: dict[str, list[Sample]] = field(default_factory=dict)
    txn_ms: dict[str, list[float]] = field(default_factory=dict)  # side -> each commit's ms
    kafka_errors: list[str] = field(default_factory=list)
    profiles: list[Profiled] = field(default_factory=list)
    command: str = ""

    def rates(self, side: str) -> tuple[float, ...]:
        samples = self.produce.get(side) or self.consume[side]
        records = self.sizes.produce_records if side in self.produce else self.sizes.consume_records
        return tuple(records / sample.wall_s for sample in samples)

    def rate(self, side: str) -> float:
        return median(self.rates(side))

    @property
    def native_produce_best(self) -> str:
        return max((NATIVE_PRODUCER, NATIVE_PRODUCE), key=self.rate)

    @property
    def produce_ratio(self) -> float:
        return self.rate(KAFKA) / self.rate(self.native_produce_best)

    @property
    def consume_ratio(self) -> float:
        return self.rate(KCAT_SIDE) / self.rate(NATIVE_CONSUME)

    @property
    def passed(self) -> bool:
        return self.produce_ratio >= PRODUCE_RATIO_MIN and self.consume_ratio >= CONSUME_RATIO_MIN


# servers ----------------------------------------------------------------------------------


class KafkaServer(ServerProcess):
    """`fencelog serve` with both listeners; `url` is native, `kafka` is HOST:PORT."""

    def __init__(self, work_dir: Path, name: str, prefix: Sequence[str] = ()) -> None:
        self.data_dir = work_dir / name
        ready_file = work_dir / f"{name}.ready.json"
        command = list(prefix) or [str(fencelog_script())]
        argv = [
            *command,
            "--broker",
            str(self.data_dir),
            "--durability",
            DURABILITY,
            "serve",
            "--listen",
            f"{HOST}:0",
            "--kafka-listen",
            f"{HOST}:0",
            "--ready-file",
            str(ready_file),
        ]
        super().__init__(f"fencelog serve ({name})", argv, work_dir / f"{name}.log")
        try:
            self.wait_for(ready_file)
            addresses = json.loads(ready_file.read_text())
        except BaseException:
            self.stop()
            raise
        self.url = f"tcp://{addresses['tcp']}"
        self.kafka = str(addresses["kafka"])


@contextlib.contextmanager
def kafka_server(work_dir: Path, name: str, prefix: Sequence[str] = ()) -> Iterator[KafkaServer]:
    """A server for the block; stopped at its end, with its log shown if the block failed
    or the server did not exit 0."""
    server = KafkaServer(work_dir, name, prefix)
    try:
        yield server
    except BaseException:
        running = server.popen.poll() is None
        status = server.stop()
        how = "was stopped" if running else f"had already exited with status {status}"
        sys.stderr.write(f"bench: {server.name} (pid {server.pid}) {how}; its log ends:\n")
        sys.stderr.write(server.log_tail() + "\n")
        raise
    status = server.stop()
    if status != 0:
        raise RuntimeError(f"{server.name} exited with {status}:\n{server.log_tail()}")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _metered(server: ServerProcess, run: Callable[[], None], *, child: bool = False) -> Sample:
    """Time `run`, with the server's CPU and this process's (or its children's) CPU."""
    client_cpu = _children_cpu_s if child else time.process_time
    server_before, client_before = server.cpu_s(), client_cpu()
    start = time.perf_counter()
    run()
    wall_s = time.perf_counter() - start
    return Sample(wall_s, server.cpu_s() - server_before, client_cpu() - client_before)


def _values(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(VALUE_BYTES) for _ in range(count)]


def _batches(values: Sequence[bytes], size: int) -> list[Sequence[bytes]]:
    return [values[start : start + size] for start in range(0, len(values), size)]


def _create_topics(url: str, *topics: str) -> None:
    with connect(url) as client:
        for topic in topics:
            client.create_topic(topic, partitions=1)


def _end_offset(url: str, topic: str) -> int:
    with connect(url) as client:
        return client.end_offsets(topic)[0]


# producer throughput ----------------------------------------------------------------------


def _kafka_producer(config: dict[str, object], errors: list[str]) -> confluent_kafka.Producer:
    def on_error(error: confluent_kafka.KafkaError) -> None:
        errors.append(str(error))

    return confluent_kafka.Producer({**config, "error_cb": on_error, "log.connection.close": False})


def _produce_kafka(server: KafkaServer, values: Sequence[bytes], errors: list[str]) -> Sample:
    producer = _kafka_producer(
        {"bootstrap.servers": server.kafka, "enable.idempotence": True}, errors
    )
    producer.produce(WARM_TOPIC, b"warm")  # connects, fetches metadata and the producer id
    if producer.flush(KAFKA_TIMEOUT_S) != 0:
        raise RuntimeError("the Kafka producer's warm-up record was not delivered")

    def run() -> None:
        produce, poll = producer.produce, producer.poll
        for value in values:
            while True:
                try:
                    produce(TOPIC, value)
                    break
                except BufferError:  # the local queue is full: serve delivery reports
                    poll(0.001)
        if producer.flush(KAFKA_TIMEOUT_S) != 0:
            raise RuntimeError("the Kafka producer did not deliver every record in time")

    return _metered(server, run)


def _produce_native_producer(server: KafkaServer, values: Sequence[bytes]) -> Sample:
    batches = _batches(values, BATCH_RECORDS)
    with connect(server.url) as client:
        client.produce(WARM_TOPIC, [b"warm"])
        producer = client.producer(TOPIC)  # idempotent, max_in_flight 5

        def run() -> None:
            futures = [producer.send_async(batch, partition=0) for batch in batches]
            producer.flush()
            for future in futures:
                future.result()

        sample = _metered(server, run)
        producer.close()
    return sample


def _produce_native_plain(server: KafkaServer, values: Sequence[bytes]) -> Sample:
    batches = _batches(values, BATCH_RECORDS)
    with connect(server.url) as client:
        client.produce(WARM_TOPIC, [b"warm"])

        def run() -> None:
            for batch in batches:
                client.produce(TOPIC, batch)

        return _metered(server, run)


def _measure_produce(work_dir: Path, sizes: KafkaSizes, results: KafkaResults) -> None:
    values = _values(sizes.produce_records, seed=11)
    runs = {
        KAFKA: lambda server: _produce_kafka(server, values, results.kafka_errors),
        NATIVE_PRODUCER: lambda server: _produce_native_producer(server, values),
        NATIVE_PRODUCE: lambda server: _produce_native_plain(server, values),
    }
    rounds = iter(range(10**9))

    def side(name: str, run: Callable[[KafkaServer], Sample]) -> Callable[[], float]:
        def one() -> float:
            directory = f"produce-{SLUGS[name]}-{next(rounds)}"
            with kafka_server(work_dir, directory) as server:
                _create_topics(server.url, TOPIC, WARM_TOPIC)
                sample = run(server)
                written = _end_offset(server.url, TOPIC)
            shutil.rmtree(server.data_dir)
            if written != len(values):
                raise RuntimeError(f"{name}: {written} records in the log, not {len(values)}")
            results.produce.setdefault(name, []).append(sample)
            _progress(f"produce, {name}: {len(values) / sample.wall_s:,.0f} records/s")
            return sample.wall_s

        return one

    interleaved(sizes.rounds, *(side(name, run) for name, run in runs.items()))


# consume throughput -----------------------------------------------------------------------


def _fill(data_dir: Path, records: int) -> None:
    rng = random.Random(23)
    with connect(data_dir, durability=DURABILITY) as client:
        client.create_topic(TOPIC, partitions=1)
        for start in range(0, records, FILL_BATCH_RECORDS):
            count = min(FILL_BATCH_RECORDS, records - start)
            client.produce(TOPIC, [rng.randbytes(VALUE_BYTES) for _ in range(count)])
        assert client.end_offsets(TOPIC) == [records]


def kcat_argv(address: str, *extra: str) -> list[str]:
    return [KCAT, "-C", "-b", address, "-t", TOPIC, "-o", "beginning", "-e", "-q", *extra]


def _run_child(argv: Sequence[str], stdout: int | Path = subprocess.DEVNULL) -> None:
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(stdout.open("wb")) if isinstance(stdout, Path) else stdout
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr[-500:]!r}")


def _check_kcat_read_all(work_dir: Path, server: KafkaServer, records: int) -> None:
    """One untimed kcat read printing every offset: all `records` of them, in order."""
    listing = work_dir / "kcat-offsets.txt"
    _run_child(kcat_argv(server.kafka, "-f", "%o\n"), listing)
    with listing.open("rb") as lines:
        count, last = 0, -1
        for line in lines:
            offset = int(line)
            if offset != last + 1:
                raise RuntimeError(f"kcat read offset {offset} after {last}")
            count, last = count + 1, offset
    listing.unlink()
    if count != records:
        raise RuntimeError(f"kcat read {count} records, not {records}")


def _measure_consume(work_dir: Path, sizes: KafkaSizes, results: KafkaResults) -> None:
    records = sizes.consume_records
    source = work_dir / "consume-source"
    _progress(f"filling a partition with {records:,} records")
    _fill(source, records)
    for name in ("consume-kafka", "consume-native"):
        shutil.copytree(source, work_dir / name)
    shutil.rmtree(source)
    with (
        kafka_server(work_dir, "consume-kafka") as kafka_side,
        kafka_server(work_dir, "consume-native") as native_side,
        connect(native_side.url) as client,
    ):

        def kcat() -> None:
            _run_child(kcat_argv(kafka_side.kafka, "-c", str(records)))

        def native() -> None:
            count = sum(1 for _ in client.consume(TOPIC, partition=0, start="beginning"))
            if count != records:
                raise RuntimeError(f"client.consume read {count} records, not {records}")

        def cli() -> None:
            _run_child([str(fencelog_script()), "--broker", native_side.url, "consume", TOPIC])

        runs = {
            KCAT_SIDE: (kafka_side, kcat, True),
            NATIVE_CONSUME: (native_side, native, False),
            NATIVE_CLI: (native_side, cli, True),
        }

        def side(name: str) -> Callable[[], float]:
            server, run, child = runs[name]

            def one() -> float:
                sample = _metered(server, run, child=child)
                results.consume.setdefault(name, []).append(sample)
                _progress(f"consume, {name}: {records / sample.wall_s:,.0f} records/s")
                return sample.wall_s

            return one

        interleaved(sizes.consume_rounds, *(side(name) for name in CONSUME_SIDES))
        _check_kcat_read_all(work_dir, kafka_side, records)


# transactional commit latency -------------------------------------------------------------


def _measure_txn(work_dir: Path, sizes: KafkaSizes, results: KafkaResults) -> None:
    value = random.Random(31).randbytes(VALUE_BYTES)
    with kafka_server(work_dir, "txn") as server, connect(server.url) as client:
        client.create_topic(TXN_TOPIC, partitions=1)
        client.create_topic(f"{TXN_TOPIC}-native", partitions=1)
        producer = _kafka_producer(
            {"bootstrap.servers": server.kafka, "transactional.id": "bench-txn"},
            results.kafka_errors,
        )
        producer.init_transactions(KAFKA_TIMEOUT_S)
        held = [producer]  # emptied at the end, so librdkafka closes while the server runs
        del producer
        laps: dict[str, list[float]] = {KAFKA: [], "native": []}

        def kafka_commit() -> None:
            start = time.perf_counter()
            held[0].begin_transaction()
            held[0].produce(TXN_TOPIC, value)
            held[0].commit_transaction(KAFKA_TIMEOUT_S)
            laps[KAFKA].append((time.perf_counter() - start) * 1000)

        def native_commit() -> None:
            start = time.perf_counter()
            with client.transaction(TXN_GROUP) as txn:
                txn.produce(f"{TXN_TOPIC}-native", [value])
            laps["native"].append((time.perf_counter() - start) * 1000)

        total = TXN_WARM_UP + sizes.txn_commits
        for index in range(total):
            if index == TXN_WARM_UP:  # the warm-up's laps are dropped
                laps[KAFKA].clear()
                laps["native"].clear()
            for commit in (
                (kafka_commit, native_commit) if index % 2 else (native_commit, kafka_commit)
            ):
                commit()
        held.clear()
        for topic in (TXN_TOPIC, f"{TXN_TOPIC}-native"):
            if client.end_offsets(topic) != [total]:
                raise RuntimeError(f"{topic}: {client.end_offsets(topic)} records, not {total}")
    results.txn_ms = laps


# profile ----------------------------------------------------------------------------------


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1].removeprefix("/")
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(_REPOSITORY))
    return path


def _ranked(profile: Path, what: str) -> Profiled:
    stats = pstats.Stats(str(profile))
    functions: list[tuple[str, float, int]] = []
    files: dict[str, float] = {}
    total = 0.0
    for (path, line, name), entry in stats.stats.items():  # type: ignore[attr-defined]
        calls, self_s = int(entry[1]), float(entry[2])
        where = _short(path) if path != "~" else "(built-in)"
        functions.append((f"{where}:{line}({name})", self_s, calls))
        files[where] = files.get(where, 0.0) + self_s
        total += self_s
    functions.sort(key=lambda item: item[1], reverse=True)
    return Profiled(
        what=what,
        total_s=total,
        functions=tuple(functions[:PROFILE_TOP]),
        files=tuple(sorted(files.items(), key=lambda item: item[1], reverse=True)[:PROFILE_TOP]),
    )


# `fencelog serve` with a cProfile per thread: the event loop's, and the writer's and
# reader's pool threads (a plain `python -m cProfile` sees the first only), merged at exit.
_PROFILED_SERVE: Final = """\
import cProfile, pstats, sys, threading
output = sys.argv.pop(1)
profiles = [cProfile.Profile()]
def start_thread_profile(*_: object) -> None:
    profile = cProfile.Profile()
    profiles.append(profile)
    profile.enable()
threading.setprofile(start_thread_profile)
profiles[0].enable()
try:
    from cli.main import run
    sys.argv[0] = "fencelog"
    run()
except SystemExit:
    pass
finally:
    for profile in profiles:
        profile.disable()
    pstats.Stats(*profiles).dump_stats(output)
"""


def _profile(work_dir: Path, sizes: KafkaSizes, results: KafkaResults) -> None:
    """The server under cProfile: one Kafka produce, one kcat read, one profile each."""
    script = work_dir / "serve_profiled.py"
    script.write_text(_PROFILED_SERVE)
    produce_records = max(1, sizes.produce_records // 4)
    consume_records = max(1, sizes.consume_records // 5)
    for what in ("produce", "consume"):
        output = work_dir / f"serve-{what}.prof"
        prefix = [sys.executable, str(script), str(output)]
        if what == "consume":
            _fill(work_dir / f"profile-{what}", consume_records)
        with kafka_server(work_dir, f"profile-{what}", prefix) as server:
            if what == "produce":
                _create_topics(server.url, TOPIC, WARM_TOPIC)
                values = _values(produce_records, seed=41)
                sample = _produce_kafka(server, values, results.kafka_errors)
                label = f"a Kafka produce of {produce_records:,} records"
                records = produce_records
            else:
                sample = _metered(server, lambda: _run_child(kcat_argv(server.kafka)), child=True)
                label = f"a kcat read of {consume_records:,} records"
                records = consume_records
        label += f" ({records / sample.wall_s:,.0f} records/s under the profiler)"
        results.profiles.append(_ranked(output, label))
        _progress(f"profiled {label}")


# the run ----------------------------------------------------------------------------------

_STARTED_S = time.monotonic()


def _progress(text: str) -> None:
    sys.stderr.write(f"[{time.monotonic() - _STARTED_S:6.1f}s] {text}\n")
    sys.stderr.flush()


def measure(work_dir: Path, sizes: KafkaSizes, profile: bool | None = None) -> KafkaResults:
    """Every figure; the profile runs when asked (True), or when None and a target is
    missed."""
    if shutil.which(KCAT) is None:
        raise SystemExit("bench: kcat is not installed (Debian: apt-get install kcat)")
    results = KafkaResults(sizes)
    _progress("producer throughput")
    _measure_produce(work_dir, sizes, results)
    _progress("consume throughput")
    _measure_consume(work_dir, sizes, results)
    _progress("transactional commit latency")
    _measure_txn(work_dir, sizes, results)
    if profile or (profile is None and not results.passed):
        _progress("profiling the server")
        _profile(work_dir, sizes, results)
    return results


# the section ------------------------------------------------------------------------------


def _cpu(samples: Sequence[Sample], records: int) -> str:
    server_us = median([s.server_cpu_s for s in samples]) / records * 1e6
    client_us = median([s.client_cpu_s for s in samples]) / records * 1e6
    server_share = median([s.server_cpu_s / s.wall_s for s in samples])
    client_share = median([s.client_cpu_s / s.wall_s for s in samples])
    return (
        f"server {server_us:.1f} us CPU/record ({server_share:.2f} CPUs busy), "
        f"client {client_us:.1f} us/record ({client_share:.2f} CPUs)"
    )


def _latency(ms: Sequence[float]) -> str:
    return f"p50 {percentile(ms, 0.5):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms"


def _rows(results: KafkaResults) -> list[Row]:
    sizes = results.sizes
    best = results.native_produce_best
    other = NATIVE_PRODUCE if best == NATIVE_PRODUCER else NATIVE_PRODUCER
    txn_ratio = percentile(results.txn_ms[KAFKA], 0.5) / percentile(results.txn_ms["native"], 0.5)
    return [
        Row(
            f"producer, {sizes.produce_records:,} x {VALUE_BYTES} B, confluent-kafka "
            "idempotent vs the faster native way",
            rate(results.rate(KAFKA)),
            f"{best} {rate(results.rate(best))}",
            f"{results.produce_ratio:.2f}",
            f"ratio >= {PRODUCE_RATIO_MIN:.2f}",
            verdict(results.produce_ratio >= PRODUCE_RATIO_MIN),
        ),
        Row(
            "producer, the other native way",
            rate(results.rate(KAFKA)),
            f"{other} {rate(results.rate(other))}",
            f"{results.rate(KAFKA) / results.rate(other):.2f}",
        ),
        Row(
            f"consume {sizes.consume_records:,} records from offset 0, kcat vs native client",
            rate(results.rate(KCAT_SIDE)),
            f"{NATIVE_CONSUME} {rate(results.rate(NATIVE_CONSUME))}",
            f"{results.consume_ratio:.2f}",
            f"ratio >= {CONSUME_RATIO_MIN:.2f}",
            verdict(results.consume_ratio >= CONSUME_RATIO_MIN),
        ),
        Row(
            "consume, kcat vs the fencelog consume command (both processes, to /dev/null)",
            rate(results.rate(KCAT_SIDE)),
            f"{NATIVE_CLI} {rate(results.rate(NATIVE_CLI))}",
            f"{results.rate(KCAT_SIDE) / results.rate(NATIVE_CLI):.2f}",
        ),
        Row(
            "one-record transactional commit, one at a time",
            _latency(results.txn_ms[KAFKA]),
            f"native transaction {_latency(results.txn_ms['native'])}",
            f"{txn_ratio:.2f}",
            "(information)",
            INFORMATION,
        ),
    ]


def _method(results: KafkaResults) -> list[str]:
    doc = (__doc__ or "").split("Rules:\n", 1)[1].strip()
    return [
        f"Command: `{results.command}`.",
        "",
        "How it is measured (bench/kafka_listener.py):",
        "",
        *doc.splitlines(),
    ]


def _findings(results: KafkaResults) -> list[str]:
    sizes = results.sizes
    lines = ["What the figures say:", ""]
    for side in PRODUCE_SIDES:
        lines.append(f"- produce, {side}: {_cpu(results.produce[side], sizes.produce_records)}.")
    for side in CONSUME_SIDES:
        lines.append(f"- consume, {side}: {_cpu(results.consume[side], sizes.consume_records)}.")
    produce_met = results.produce_ratio >= PRODUCE_RATIO_MIN
    consume_met = results.consume_ratio >= CONSUME_RATIO_MIN
    lines += [
        f"- Producer target (Kafka >= {PRODUCE_RATIO_MIN:.0%} of native): "
        + ("met" if produce_met else "NOT met")
        + f", {results.produce_ratio:.0%}.",
        f"- Consume target (kcat >= {CONSUME_RATIO_MIN:.0%} of native): "
        + ("met" if consume_met else "NOT met")
        + f", {results.consume_ratio:.0%}.",
    ]
    if results.kafka_errors:
        lines.append(
            f"- librdkafka reported {len(results.kafka_errors)} errors (error_cb): "
            + "; ".join(sorted(set(results.kafka_errors))[:3])
        )
    for profiled in results.profiles:
        top = ", ".join(
            f"{name} {seconds / profiled.total_s:.0%}" for name, seconds in profiled.files[:6]
        )
        lines.append(f"- Server profile (cProfile) of {profiled.what}: self time by file: {top}.")
    return lines


def _raw(results: KafkaResults) -> list[str]:
    lines: list[str] = []
    for side in (*PRODUCE_SIDES, *CONSUME_SIDES):
        samples = results.produce.get(side) or results.consume[side]
        lines += [
            side,
            series("records/s per round", results.rates(side)),
            series("wall s", [s.wall_s for s in samples], 3),
            series("server CPU s", [s.server_cpu_s for s in samples], 3),
            series("client CPU s", [s.client_cpu_s for s in samples], 3),
        ]
    for side, ms in results.txn_ms.items():
        lines += [
            f"one-record transactional commit, {side} ({len(ms)} commits)",
            f"  p50 {percentile(ms, 0.5):.3f} ms, p90 {percentile(ms, 0.9):.3f} ms, "
            f"p99 {percentile(ms, 0.99):.3f} ms, max {max(ms):.3f} ms",
        ]
    for profiled in results.profiles:
        lines.append(f"server profile: {profiled.what}; {profiled.total_s:.2f} s of self time")
        lines.append("  by function (self s, calls):")
        lines += [f"    {s:7.3f} {calls:>9,}  {name}" for name, s, calls in profiled.functions]
        lines.append("  by file (self s):")
        lines += [f"    {s:7.3f}  {name}" for name, s in profiled.files]
    return lines


def section(results: KafkaResults) -> Section:
    versions = (
        f"confluent-kafka {confluent_kafka.__version__} (librdkafka "
        f"{confluent_kafka.libversion()[0]}); {_kcat_version()}."
    )
    return Section(
        title=TITLE,
        summary=results.sizes.text(),
        rows=tuple(_rows(results)),
        method=tuple(_method(results)),
        findings=tuple(_findings(results)),
        raw=tuple(_raw(results)),
        software=f"Clients: {versions}",
    )


def _kcat_version() -> str:
    done = subprocess.run([KCAT, "-V"], capture_output=True, text=True, check=False, timeout=30)
    for line in done.stdout.splitlines():
        if line.startswith("Version"):
            return "kcat " + line.removeprefix("Version").strip().split(" (", 1)[0]
    return "kcat"


def section_markdown(results: KafkaResults, text: str) -> str:
    """`sections.markdown`'s text, naming the command this run was started with."""
    return text.replace("by `python -m bench.run`", f"by `{results.command}`", 1)


def write_section(path: Path, section_text: str) -> None:
    document = path.read_text(encoding="utf-8") if path.exists() else report.DOCUMENT_HEAD
    updated = report.replace_section(document, section_text)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(updated, encoding="utf-8")
    temporary.replace(path)


def command_line(module: str) -> str:
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def run_group(
    work_dir: Path, sizes: KafkaSizes, profile: bool | None, command: str
) -> tuple[str, str, bool]:
    """(printed table, RESULTS.md section, whether every target was met)."""
    started = describe(work_dir)
    results = measure(work_dir, sizes, profile)
    results.command = command
    text = section_markdown(results, markdown(section(results), finished(started)))
    return table(section(results)), text, results.passed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka_listener",
        description="The Kafka listener beside the native protocol: producer and consume "
        "throughput, transactional commit latency; exit 1 if a target is missed.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes; writes nothing")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="profile the server (default: only when a target is missed)",
    )
    parser.add_argument("--dir", type=Path, help="where to make the temporary directory")
    parser.add_argument("--results", type=Path, help="RESULTS.md to update")
    parser.add_argument("--no-results", action="store_true", help="print only; write nothing")
    arguments = parser.parse_args(argv)
    sizes = QUICK if arguments.quick else FULL
    destination = None if arguments.no_results else arguments.results
    if destination is None and not arguments.quick and not arguments.no_results:
        destination = RESULTS_FILE
    with tempfile.TemporaryDirectory(prefix="fencelog-bench-kafka-", dir=arguments.dir) as d:
        printed, text, passed = run_group(
            Path(d), sizes, arguments.profile, command_line("bench.kafka_listener")
        )
    print(printed + "\n", flush=True)
    if destination is not None:
        write_section(destination, text)
        print(f"wrote section {TITLE!r} of {destination}\n", flush=True)
    _progress(f"done: every target {'met' if passed else 'NOT met'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
