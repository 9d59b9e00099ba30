"""The fault suite's runs: bounded, seeded, loopback only, every process it starts stopped.

Phase 1, served (`fencelog serve` on 127.0.0.1, `--durability normal`), for half the
duration: idempotent producers (`fencelog produce --idempotent --json`, fed a few lines
at a time) and a transactional copier (tests/support/txn_copier.py, killed with SIGKILL
at random and started again) reach the server through a FaultProxy that cuts, delays and
black-holes connections, while the server is killed with SIGKILL and restarted on the
same data directory and port. Then `fencelog verify` checks every producer's acks and
that the copier's output holds each input value exactly once.

Phase 2, embedded: an exclusive producer and an owner (chaos/writer.py), each paused with
SIGSTOP outside and then inside a write transaction while a successor takes over, then
resumed: it must be fenced, and `fencelog verify` must find no record of an older epoch
(or, for an owner, of the older generation) after the successor's first.

Every wait has a deadline: a process still running past its bound is killed and counted
as `hung`. A run prints its operations, the faults injected and the anomalies found, and
fails (exit 1) when there is any anomaly.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from chaos.proxy import HOST, FaultProxy, Odds

REPO = Path(__file__).resolve().parents[1]
COPIER = REPO / "tests" / "support" / "txn_copier.py"
FENCELOG = "import sys; from cli.main import run; sys.argv[0] = 'fencelog'; run()"
COPY_PREFIX = "copied:"
PRODUCERS = 3
PARTITIONS = 4
STEP_S = 30.0  # the bound of one step (a start, a takeover, a verify); run() sets it
SHORT_RUN_S = 120.0  # a run shorter than this (the test's) bounds its steps by 15 s
STOP_S = 3.0  # how long a writer stays stopped: twice the session timeout (chaos/writer.py)


@dataclass
class Tally:
    """What a run did and found."""

    operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def anomaly(self, kind: str, note: str, count: int = 1) -> None:
        self.anomalies[kind] += count
        self.notes.append(f"{kind}: {note}")

    def lines(self) -> list[str]:
        def show(counter: Counter[str]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"

        return [
            f"operations: {show(self.operations)}",
            f"faults injected: {show(self.faults)}",
            f"anomalies: {show(self.anomalies)}",
            *(f"  {note}" for note in self.notes[:50]),
        ]


class Proc:
    """A subprocess whose stdout and stderr go to files, read with deadlines."""

    def __init__(
        self, args: Sequence[str | Path], work: Path, name: str, *, stdin: bool = False
    ) -> None:
        self.name = name
        self.out_path = work / f"{name}.out"
        self.err_path = work / f"{name}.err"
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            )
        }
        for variable in ("FENCELOG_BROKER", "FENCELOG_FAILPOINT", "PYTHONUNBUFFERED"):
            env.pop(variable, None)
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.popen = subprocess.Popen(
                [str(a) for a in args],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=work,
            )
        self.stopped = False

    def lines(self) -> list[str]:
        return self.out_path.read_text(errors="replace").splitlines()

    def error_text(self) -> str:
        return " ".join(self.err_path.read_text(errors="replace").split())[-300:]

    def wait_line(self, predicate: Callable[[str], bool], timeout_s: float) -> str | None:
        """The first stdout line that satisfies predicate, or None by the deadline (or
        once the process ended without one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((line for line in self.lines() if predicate(line)), None)
            if found is not None or time.monotonic() >= deadline:
                return found
            if self.popen.poll() is not None:
                return next((line for line in self.lines() if predicate(line)), None)
            time.sleep(0.02)

    def write(self, text: str) -> None:
        assert self.popen.stdin is not None
        with contextlib.suppress(OSError):
            self.popen.stdin.write(text.encode())
            self.popen.stdin.flush()

    def signal(self, signum: signal.Signals) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)
        self.stopped = signum == signal.SIGSTOP

    def wait(self, timeout_s: float) -> int | None:
        """The exit status, or None if it was still running at the deadline."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.stopped:
            self.signal(signal.SIGCONT)
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=STEP_S)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()


class Processes:
    """Every process a run starts; all of them killed at its end."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: list[Proc] = []
        self._names: Counter[str] = Counter()

    def start(self, args: Sequence[str | Path], name: str, *, stdin: bool = False) -> Proc:
        self._names[name] += 1
        proc = Proc(args, self.work, f"{name}-{self._names[name]}", stdin=stdin)
        self.started.append(proc)
        return proc

    def fencelog(self, *args: str | Path, name: str, stdin: bool = False) -> Proc:
        return self.start([sys.executable, "-c", FENCELOG, *args], name, stdin=stdin)

    def close(self) -> None:
        for proc in self.started:
            proc.kill()


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def status_name(code: int) -> str:
    from broker.errors import ErrorCode

    if code < 0:
        return f"signal {-code}"
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"exit {code}"


# fencelog verify ------------------------------------------------------------------------


def verify(
    processes: Processes, tally: Tally, broker: str, topic: str, *args: str | Path
) -> dict[str, Any]:
    """`fencelog verify --json` of topic; its anomalies are the run's."""
    tally.operations["verify"] += 1
    proc = processes.fencelog("--broker", broker, "verify", topic, "--json", *args, name="verify")
    status = proc.wait(STEP_S * 2)
    if status is None:
        proc.kill()
        tally.anomaly("hung", f"verify {topic} did not end within {STEP_S * 2:.0f}s")
        return {}
    lines = proc.lines()
    if status not in (0, 90) or len(lines) != 1:
        tally.anomaly("verify_failed", f"verify {topic}: {status_name(status)} {proc.error_text()}")
        return {}
    report: dict[str, Any] = json.loads(lines[0])
    for kind, count in report["counts"].items():
        if count:
            examples = [
                example["message"]
                for section in [*report["partitions"], {"examples": report["topic_wide"]}]
                for example in section["examples"].get(kind, [])
            ]
            tally.anomaly(kind, f"{topic}: {count}, e.g. {examples[:3]}", count)
    return report


def complete_lines(path: Path) -> Path:
    """The file without a last line cut short (a producer killed while printing it)."""
    text = path.read_text(errors="replace")
    if text and not text.endswith("\n"):
        path.write_text(text[: text.rfind("\n") + 1])
    return path


# phase 1: served ------------------------------------------------------------------------


class Server:
    """`fencelog serve` on one data directory and port, killed and restarted."""

    def __init__(self, processes: Processes, data_dir: Path, port: int) -> None:
        self.processes = processes
        self.data_dir = data_dir
        self.port = port
        self.proc: Proc | None = None

    @property
    def address(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    def start(self) -> None:
        ready = self.processes.work / "ready.json"
        ready.unlink(missing_ok=True)
        self.proc = self.processes.fencelog(
            "--broker",
            self.data_dir,
            "--durability",
            "normal",
            "serve",
            "--listen",
            f"{HOST}:{self.port}",
            "--ready-file",
            ready,
            "--no-unix",
            name="serve",
        )
        deadline = time.monotonic() + STEP_S
        while not ready.exists():
            if self.proc.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fencelog serve did not start: {self.proc.error_text()}")
            time.sleep(0.02)

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None and self.proc.popen.poll() is None:
            self.proc.signal(signal.SIGTERM)
            if self.proc.wait(STEP_S) is None:
                self.proc.kill()


def _feed(proc: Proc, values: list[str], rng: random.Random, stop: threading.Event) -> None:
    """A few lines at a time, so that the producer sends many small batches."""
    stdin = proc.popen.stdin
    assert stdin is not None
    try:
        at = 0
        while at < len(values) and not stop.is_set() and proc.popen.poll() is None:
            step = rng.randint(1, 5)
            stdin.write("".join(f"{v}\n" for v in values[at : at + step]).encode())
            stdin.flush()
            at += step
            time.sleep(rng.uniform(0, 0.1))  # pacing: about 60 lines a second, many batches
        stdin.close()
    except OSError:
        pass


def served_phase(
    processes: Processes, tally: Tally, rng: random.Random, seed: int, duration_s: float
) -> None:
    data_dir = processes.work / "served"
    server = Server(processes, data_dir, free_port())
    server.start()
    tally.operations["server_start"] += 1
    direct = server.address
    for topic, partitions in (
        ("events", PARTITIONS),
        ("input", PARTITIONS),
        ("output", PARTITIONS),
    ):
        create = processes.fencelog(
            "--broker",
            direct,
            "topic",
            "create",
            topic,
            "--partitions",
            str(partitions),
            name="create",
        )
        if create.wait(STEP_S) != 0:
            raise RuntimeError(f"topic create {topic}: {create.error_text()}")
    inputs = [f"in-{seed}-{i}" for i in range(int(60 * max(duration_s, 5)))]
    load = processes.fencelog("--broker", direct, "produce", "input", name="load", stdin=True)
    assert load.popen.stdin is not None
    load.popen.stdin.write("".join(f"{v}\n" for v in inputs).encode())
    load.popen.stdin.close()
    if load.wait(STEP_S) != 0:
        raise RuntimeError(f"loading input: {load.error_text()}")
    tally.operations["input_records"] += len(inputs)

    proxy = FaultProxy(server.port, seed, Odds())
    stop_feeding = threading.Event()
    try:
        producers, acks, feeders = [], [], []
        count = int(50 * max(duration_s, 5))  # fed over most of the phase
        for number in range(PRODUCERS):
            values = [f"p{number}-{seed}-{i}" for i in range(count)]
            proc = processes.fencelog(
                "--broker",
                proxy.address,
                "produce",
                "events",
                "--idempotent",
                "--json",
                name=f"producer{number}",
                stdin=True,
            )
            feeder = threading.Thread(
                target=_feed,
                args=(proc, values, random.Random(seed * 100 + number), stop_feeding),
                daemon=True,
            )
            feeder.start()
            producers.append(proc)
            acks.append(proc.out_path)
            feeders.append(feeder)
            tally.operations["produce_sent"] += count
        copier_done = _copier_and_kills(
            processes, tally, rng, server, proxy, producers, seed, time.monotonic() + duration_s
        )
        # The faults end here: none new, and a link the last ones black-holed is cut, as
        # a network that comes back resets it. Otherwise a producer's request on such a
        # link waits out its 30 s timeout, and the bound below would count from that.
        proxy.enabled = False
        proxy.cut_all()
        bound = time.monotonic() + STEP_S * 2
        for proc in producers:
            status = proc.wait(max(bound - time.monotonic(), 0.1))
            if status is None:
                proc.kill()
                tally.anomaly(
                    "hung", f"{proc.name} still running {STEP_S * 2:.0f}s after the faults"
                )
            elif status != 0:
                tally.anomaly(
                    "operation_failed",
                    f"{proc.name}: {status_name(status)}: {proc.error_text()}",
                )
            else:
                tally.operations["producer_done"] += 1
        stop_feeding.set()
        for feeder in feeders:
            feeder.join(STEP_S)
        proxy.enabled = False
        proxy.cut_all()
        if not copier_done:
            copier_done = _copier_to_the_end(processes, tally, direct)
        for path in acks:
            tally.operations["produce_acked"] += len(complete_lines(path).read_text().splitlines())
        ack_args = [arg for path in acks for arg in ("--acks", path)]
        verify(processes, tally, direct, "events", *ack_args)
        if copier_done:
            expected = processes.work / "copied.txt"
            expected.write_text("".join(f"{COPY_PREFIX}{v}\n" for v in inputs))
            verify(processes, tally, direct, "output", "--expect", expected)
    finally:
        stop_feeding.set()
        tally.faults.update(proxy.faults)
        proxy.close()
        server.stop()


def _copier(processes: Processes, broker: str, seed: int) -> Proc:
    return processes.start(
        [
            sys.executable,
            COPIER,
            broker,
            "--group",
            "copier",
            "--chunk",
            "25",
            "--pause-ms",
            "20",
            "--seed",
            str(seed),
        ],
        "copier",
    )


def _copier_and_kills(
    processes: Processes,
    tally: Tally,
    rng: random.Random,
    server: Server,
    proxy: FaultProxy,
    producers: list[Proc],
    seed: int,
    deadline: float,
) -> bool:
    """Until the deadline: the copier run again and again (killed at random), the server
    killed and restarted at random. Whether a copier run copied everything."""
    copier: Proc | None = None
    done = False
    next_server_kill = time.monotonic() + rng.uniform(1.0, 4.0)
    while time.monotonic() < deadline:
        if copier is None and not done:
            copier = _copier(processes, proxy.address, rng.randrange(1 << 30))
            tally.operations["copier_start"] += 1
            copier_kill_at = time.monotonic() + rng.uniform(0.3, 3.0)
        if copier is not None:
            status = copier.popen.poll()
            if status is not None:
                if status == 0:
                    done = True
                    tally.operations["copier_done"] += 1
                else:
                    _failed_run(tally, copier, status)
                copier = None
            elif time.monotonic() >= copier_kill_at:
                copier.kill()
                copier = None
                tally.faults["copier_kill9"] += 1
        if time.monotonic() >= next_server_kill:
            server.kill9()
            tally.faults["server_kill9"] += 1
            time.sleep(rng.uniform(0, 0.5))  # the server stays down a little while
            server.start()
            tally.operations["server_start"] += 1
            next_server_kill = time.monotonic() + rng.uniform(2.0, 6.0)
        if done and all(p.popen.poll() is not None for p in producers):
            break
        time.sleep(0.05)
    if copier is not None:
        copier.kill()
        tally.faults["copier_kill9"] += 1
    return done


def _failed_run(tally: Tally, copier: Proc, status: int) -> None:
    """A copier run that ended on an error: a lost connection is what a cut or a killed
    server is (the copier does not retry; it is run again); anything else, such as a cut
    reply taken for a malformed frame (PROTOCOL_ERROR), is an anomaly."""
    name = status_name(status)
    tally.operations[f"copier_exit_{name}"] += 1
    if name != "CONNECTION_FAILED":
        tally.anomaly("operation_failed", f"{copier.name}: {name}: {copier.lines()[-1:]}")


def _copier_to_the_end(processes: Processes, tally: Tally, broker: str) -> bool:
    """Once the faults stopped: a copier must copy the rest and end on its own."""
    copier = _copier(processes, broker, 0)
    tally.operations["copier_start"] += 1
    status = copier.wait(STEP_S * 2)
    if status is None:
        copier.kill()
        tally.anomaly("hung", "the last copier did not finish without faults")
        return False
    if status != 0:
        tally.anomaly(
            "operation_failed", f"the last copier: {status_name(status)}: {copier.lines()[-1:]}"
        )
        return False
    tally.operations["copier_done"] += 1
    return True


# phase 2: embedded, SIGSTOP ----------------------------------------------------------------


def stop_round(
    processes: Processes, tally: Tally, data_dir: Path, role: str, inside: bool, round_: int
) -> None:
    """Writer A (owner or exclusive producer) paused, successor B takes over, A resumed."""
    from chaos.writer import FENCED_EXIT

    topic = f"{role}-{round_}"
    create = processes.fencelog("--broker", data_dir, "topic", "create", topic, name="create")
    if create.wait(STEP_S) != 0:
        raise RuntimeError(f"topic create {topic}: {create.error_text()}")
    where = "inside" if inside else "outside"
    label = f"{role} stopped {where} a write transaction (round {round_})"

    def writer(name: str, generation: int) -> Proc:
        extra = [str(generation)] if role == "owner" else []
        args: list[str | Path] = [sys.executable, "-m", "chaos.writer", data_dir, topic, name]
        args += [role, *extra]
        return processes.start([*args, "0.02", str(STEP_S)], f"{role}-{name}", stdin=True)

    first = writer("a", 1)
    if first.wait_line(lambda line: line.startswith("ack"), STEP_S) is None:
        tally.anomaly("hung", f"{label}: the first writer never wrote: {first.error_text()}")
        return
    successor = writer("b", 2)
    if role == "exclusive":  # B queues behind A before A stops
        time.sleep(0.3)  # pacing: B's wait-exclusive attach reaches the broker
    # A holds a write transaction, then lets it go and stays quiet for a moment (the
    # writer's hold and release): the stop below catches it between two writes of its
    # own. Stopped at a random moment, it could be inside one of its writes, holding the
    # lock, and B would wait behind it: what the inside round tests on purpose.
    first.write("hold\n")
    if first.wait_line(lambda line: line == "holding", STEP_S) is None:
        tally.anomaly("hung", f"{label}: no write transaction opened")
    if inside:
        # Stopped holding the write lock, nobody can write until A runs again; then A
        # releases it and is stopped again, outside, for B to take over.
        first.signal(signal.SIGSTOP)
        tally.faults[f"sigstop_{role}_inside"] += 1
        time.sleep(STOP_S)  # what is tested: the time a stopped process holds the lock
        first.signal(signal.SIGCONT)
    first.write("release\n")
    if first.wait_line(lambda line: line == "released", STEP_S) is None:
        tally.anomaly("hung", f"{label}: A did not release its write transaction")
    first.signal(signal.SIGSTOP)
    tally.faults[f"sigstop_{role}_outside"] += 1
    tally.operations["takeover_attempt"] += 1
    taken = successor.wait_line(lambda line: line.startswith("ack"), STEP_S)
    first.signal(signal.SIGCONT)
    if taken is None:
        tally.anomaly("no_takeover", f"{label}: B never wrote: {successor.lines()[-2:]}")
    else:
        tally.operations["takeover"] += 1
    status = first.wait(STEP_S)
    if status is None:
        tally.anomaly("not_fenced", f"{label}: A still writing after B took over")
        first.kill()
    elif status == FENCED_EXIT:
        tally.operations["zombie_fenced"] += 1
    else:
        tally.anomaly(
            "operation_failed", f"{label}: A ended with {status_name(status)}: {first.lines()[-1:]}"
        )
    successor.signal(signal.SIGTERM)
    successor_status = successor.wait(STEP_S)
    if successor_status is None:
        successor.kill()
    elif "fenced" in successor.lines():
        tally.anomaly("live_session_severed", f"{label}: B, never stopped, was fenced")
    elif any(line.startswith("error") for line in successor.lines()):
        tally.anomaly("operation_failed", f"{label}: B ended with {successor.lines()[-1:]}")
    verify(processes, tally, str(data_dir), topic)
    _zombie_writes(processes, tally, data_dir, topic, label)


def _zombie_writes(
    processes: Processes, tally: Tally, data_dir: Path, topic: str, label: str
) -> None:
    """No record of A after B's first (for an owner, the log's epochs cannot tell)."""
    consume = processes.fencelog("--broker", data_dir, "consume", topic, "--json", name="consume")
    if consume.wait(STEP_S) != 0:
        tally.anomaly("verify_failed", f"consume {topic}: {consume.error_text()}")
        return
    writers = [json.loads(line)["value"].split(":")[0] for line in consume.lines()]
    if "b" in writers:
        late = writers[writers.index("b") :].count("a")
        if late:
            tally.anomaly(
                "fenced_generation", f"{label}: {late} records of A after B's first", late
            )


STOP_KINDS = [(role, inside) for role in ("exclusive", "owner") for inside in (False, True)]


def stopped_phase(processes: Processes, tally: Tally, rng: random.Random, deadline: float) -> None:
    """Every kind of SIGSTOP round once, then rounds of a random kind until the deadline."""
    data_dir = processes.work / "embedded"
    round_ = 0
    while round_ < len(STOP_KINDS) or time.monotonic() < deadline:
        role, inside = STOP_KINDS[round_] if round_ < len(STOP_KINDS) else rng.choice(STOP_KINDS)
        stop_round(processes, tally, data_dir, role, inside, round_)
        round_ += 1


# the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def workspace(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="fencelog-chaos-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(
    seed: int, duration_s: float, *, keep: Path | None = None, out: IO[str] = sys.stdout
) -> Tally:
    """One run: the served phase for half the duration, then SIGSTOP rounds."""
    global STEP_S
    STEP_S = 15.0 if duration_s < SHORT_RUN_S else 30.0
    rng = random.Random(seed)
    tally = Tally()
    started = time.monotonic()
    out.write(f"chaos: seed {seed}, duration {duration_s:.0f}s\n")
    out.flush()
    with workspace(keep) as work:
        processes = Processes(work)
        try:
            served_phase(processes, tally, rng, seed, duration_s / 2)
            out.write(f"chaos: served phase done after {time.monotonic() - started:.0f}s\n")
            out.flush()
            stopped_phase(processes, tally, rng, started + duration_s)
        finally:
            processes.close()
    out.write(f"chaos: seed {seed}, {time.monotonic() - started:.0f}s\n")
    for line in tally.lines():
        out.write(line + "\n")
    out.flush()
    return tally
