"""Fixtures every test file uses: a data directory, the CLI through click's CliRunner, an
open engine, and real subprocesses that are stopped at teardown."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import broker
from cli.main import command
from support.helpers import Invoke, Processes
from support.servers import ServeProcess, serving
from support.waiting import wait_until

# The layers in the order they run: the longest first (Spark, then the fault
# injection), so that `make test`'s two workers start the long tests early instead of
# ending the run on them. A layer not named here runs after these.
LONGEST_FIRST = (
    "spark",
    "chaos",
    "storage",
    "cli",
    "kafka_listener",
    "served",
    "engine",
    "plugin",
    "unit",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in its layer's place in LONGEST_FIRST, in collection order within it."""
    here = Path(__file__).parent

    def place(item: pytest.Item) -> int:
        layer = item.path.relative_to(here).parts[0] if here in item.path.parents else ""
        return LONGEST_FIRST.index(layer) if layer in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=place)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory, as `mkdir` leaves it (reading commands refuse one that
    does not exist; tests of a new directory use a path of their own)."""
    path = tmp_path / "data"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    # What a user's shell would have: no broker or durability chosen by the environment.
    for name in ("FENCELOG_BROKER", "FENCELOG_DURABILITY", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    return CliRunner()


@pytest.fixture
def invoke(runner: CliRunner, data_dir: Path) -> Invoke:
    def run(
        *args: str,
        input: str | bytes | None = None,
        env: Mapping[str, str | None] | None = None,
    ) -> Result:
        argv = ["--broker", str(data_dir), *args]
        # As `fencelog` runs: the tree built for these arguments only (cli.main.command).
        return runner.invoke(command(argv), argv, input=input, env=env)

    return run


@pytest.fixture
def engine(data_dir: Path) -> Iterator[broker.Engine]:
    opened = broker.open(data_dir)
    yield opened
    opened.close()


@pytest.fixture
def opened() -> Iterator[list[broker.Engine]]:
    """Engines a test opened (tests/support/producing.py open_engine); all closed at teardown."""
    engines: list[broker.Engine] = []
    yield engines
    for engine in engines:
        engine.close()


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        started.close()


THREADS_END_WITHIN_S = 5.0


@pytest.fixture
def no_thread_is_left() -> Iterator[None]:
    """Every thread a test starts (servers, clients, heartbeats) ends with it."""
    before = set(threading.enumerate())
    yield
    wait_until(
        lambda: not set(threading.enumerate()) - before,
        THREADS_END_WITHIN_S,
        message="every thread the test started has ended",
    )


# the Kafka listener (tests/kafka_listener) ------------------------------------------------------


@pytest.fixture
def kafka_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """`fencelog serve --kafka-listen 127.0.0.1:0` on a fresh data directory, stopped at
    teardown."""
    serve_args = ("--no-unix", "--kafka-listen", "127.0.0.1:0")
    with serving(tmp_path / "data", tmp_path / "ready.json", serve_args=serve_args) as server:
        yield server


@pytest.fixture
def kafka(kafka_server: ServeProcess) -> str:
    """The Kafka listener's HOST:PORT, as bootstrap.servers takes it."""
    return kafka_server.kafka


@pytest.fixture
def kcat() -> str:
    """Debian's kcat (`make test` installs it); its tests skip, saying so, without it."""
    found = shutil.which("kcat")
    if found is None:
        pytest.skip("kcat is not installed (Debian's kcat package; `make test` installs it)")
    return found
