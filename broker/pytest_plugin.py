"""fencelog's pytest plugin (entry point pytest11, loaded wherever fencelog is installed):
fixtures that give a test a broker of its own.

- `fencelog_broker`: a fresh embedded data directory per test (`_module`, `_session`:
  one per module, per session). `.path`, `.url` (what connect() and --broker take),
  `.client()`.
- `fencelog_server`: a real `fencelog serve` process on 127.0.0.1:0 with a Kafka
  listener, ready before the test (`_module`, `_session` likewise). `.url` (tcp://),
  `.kafka_url` (HOST:PORT), `.data_dir`, `.client()`, `.log()`.
- Both have the helpers of broker/testing.py as methods: wait_for_records,
  produce_and_collect, assert_exactly_once.

Options: the marker `@pytest.mark.fencelog(durability=, topics=, auth_token=, restore=)`
(a test's, class's and module's markers for function-scoped fixtures, the closest
one's keyword winning; the module's for module-scoped ones), over `--fencelog-NAME` on
the command line, over the `fencelog_NAME` ini option. Session-scoped fixtures take
the command line and ini only.

Rules it keeps:
- 127.0.0.1 only. Every wait is bounded (`fencelog_start_timeout`), and a server that
  exits before it is ready fails the fixture with its log.
- Teardown closes the clients handed out, stops the server (SIGTERM, then SIGKILL past
  `fencelog_stop_timeout`) and removes the directory (unless `--fencelog-keep`), also
  when the run is interrupted (pytest tears fixtures down on Ctrl-C). A served broker
  runs in its own session, so a Ctrl-C reaches pytest alone, and on Linux it gets
  SIGTERM should pytest itself die without tearing down.
- A failing test's report carries the log that its servers wrote during it.
- Importing it costs pytest runs that use no fixture nothing: the client, the engine
  and the helpers are imported when a fixture is first set up.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pytest
from msgspec import Struct, field

if TYPE_CHECKING:
    from broker.client.client import Client, Value
    from broker.core.verify import By, Report
    from broker.testing import AckLike
    from broker.types import Durability, Record

HOST: Final = "127.0.0.1"
START_TIMEOUT_S: Final = 30.0  # fencelog_start_timeout's default: a loaded CI runner is slow
STOP_TIMEOUT_S: Final = 10.0  # fencelog_stop_timeout's: SIGTERM, then SIGKILL
READY_POLL_S: Final = 0.002  # between two looks for the ready file
KILLED_WAIT_S: Final = 10.0  # for a SIGKILLed process to be reaped
LOG_SECTION_BYTES_MAX: Final = 64 * 1024  # the tail of a log shown in a report
MARKER_KEYWORDS: Final = ("durability", "topics", "auth_token", "restore")
STRIPPED_ENV: Final = (
    "FENCELOG_BROKER",
    "FENCELOG_DURABILITY",
    "FENCELOG_AUTH_TOKEN_FILE",
    "FENCELOG_REQUEST_TIMEOUT",
)
_LOG_OFFSETS: Final = pytest.StashKey[dict[int, int]]()


# options ----------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencelog", "fencelog fixtures (fencelog_broker, fencelog_server)")
    choices = {
        "durability": "full or normal (default normal: a test's broker need not survive "
        "power loss)",
        "topics": "topics to create, NAME or NAME:PARTITIONS, space-separated",
        "auth_token": "the token a served broker requires (clients from .client() send it)",
        "restore": "a `fencelog snapshot create --out` file each broker starts from",
    }
    for name, help_text in choices.items():
        option = "--fencelog-" + name.replace("_", "-")
        group.addoption(option, dest="fencelog_" + name, default=None, help=help_text)
        parser.addini("fencelog_" + name, help_text)
    group.addoption(
        "--fencelog-keep",
        action="store_true",
        default=False,
        help="keep the fixtures' data directories and logs (under pytest's basetemp)",
    )
    parser.addini("fencelog_start_timeout", f"seconds (default {START_TIMEOUT_S:g})")
    parser.addini("fencelog_stop_timeout", f"seconds (default {STOP_TIMEOUT_S:g})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fencelog(durability=, topics=, auth_token=, restore=): the broker of the "
        "fencelog_broker and fencelog_server fixtures",
    )


class Options(Struct, frozen=True):
    """What a fixture's broker is made with."""

    durability: Durability = "normal"
    topics: Mapping[str, int] = field(default_factory=dict)
    auth_token: str | None = None
    restore: Path | None = None


def resolve_options(request: pytest.FixtureRequest) -> Options:
    """The options of the fixture being set up: marker over command line over ini."""
    from broker.errors import BrokerError
    from broker.types import check_durability

    config = request.config
    given: dict[str, Any] = {}
    for name in MARKER_KEYWORDS:
        ini = config.getini("fencelog_" + name)
        if ini:
            given[name] = _relative(ini, config.rootpath) if name == "restore" else ini
        option = config.getoption("fencelog_" + name)
        if option is not None:
            given[name] = (
                _relative(option, config.invocation_params.dir) if name == "restore" else option
            )
    markers = [] if request.scope == "session" else list(request.node.iter_markers("fencelog"))
    for marker in reversed(markers):  # the closest (the test's) last, so that it wins
        unknown = set(marker.kwargs) - set(MARKER_KEYWORDS) or marker.args
        if unknown:
            pytest.fail(
                f"@pytest.mark.fencelog takes the keywords {', '.join(MARKER_KEYWORDS)}; "
                f"not {sorted(map(str, unknown))}",
                pytrace=False,
            )
        given |= marker.kwargs
        if isinstance(marker.kwargs.get("restore"), str | os.PathLike):
            given["restore"] = _relative(marker.kwargs["restore"], request.node.path.parent)
    try:
        return Options(
            durability=check_durability(given.get("durability", "normal")),
            topics=_topics(given.get("topics", {})),
            auth_token=_token(given.get("auth_token")),
            restore=given.get("restore"),
        )
    except (BrokerError, ValueError, TypeError) as error:
        reason = str(error)
    pytest.fail(f"fencelog options: {reason}", pytrace=False)  # outside: no exception chain


def _relative(path: str | os.PathLike[str], base: Path) -> Path:
    return base / Path(path)


def _topics(given: object) -> dict[str, int]:
    """{name: partitions} from a dict, a list of NAME or NAME:N, or a string of them."""
    if isinstance(given, Mapping):
        return {str(name): int(partitions) for name, partitions in given.items()}
    items = given.split() if isinstance(given, str) else list(given)  # type: ignore[call-overload]
    topics = {}
    for item in items:
        name, _, partitions = str(item).partition(":")
        if partitions and not partitions.isdigit():
            raise ValueError(f"topic {item!r}: write NAME or NAME:PARTITIONS")
        topics[name] = int(partitions or 1)
    return topics


def _token(given: object) -> str | None:
    if given is None or given is False or given == "":
        return None
    if given is True:
        return secrets.token_urlsafe(24)
    if not isinstance(given, str):
        raise ValueError(f"auth_token must be a string or True, not {given!r}")
    return given


def _seconds(config: pytest.Config, name: str, default: float) -> float:
    value = config.getini(name)
    return float(value) if value else default


# what a fixture hands out ---------------------------------------------------------------


class _Broker:
    """A broker a fixture owns: clients it hands out (closed at teardown) and the helpers
    of broker/testing.py on a client of its own."""

    url: str
    options: Options

    def __init__(self) -> None:
        self._clients: list[Client] = []
        self._own: Client | None = None

    def client(self, **connect_args: Any) -> Client:
        """A new client of this broker (closed at teardown); connect()'s arguments."""
        from broker.client.client import connect

        client = connect(self.url, **(self._connect_args() | connect_args))
        self._clients.append(client)
        return client

    def _connect_args(self) -> dict[str, Any]:
        return {}

    @property
    def _helper_client(self) -> Client:
        if self._own is None:
            self._own = self.client()
        return self._own

    def wait_for_records(
        self, topic: str, count: int, *, timeout_s: float | None = None
    ) -> list[Record]:
        """The topic's records once it holds at least `count` (broker.testing)."""
        __tracebackhide__ = True
        from broker import testing

        bound = testing.WAIT_S if timeout_s is None else timeout_s
        return testing.wait_for_records(self._helper_client, topic, count, timeout_s=bound)

    def produce_and_collect(
        self,
        topic: str,
        values: Iterable[Value],
        *,
        key: bytes | str | None = None,
        collect_from: str | None = None,
        count: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Record]:
        """Produce to topic, collect what arrives in collect_from (broker.testing)."""
        __tracebackhide__ = True
        from broker import testing

        return testing.produce_and_collect(
            self._helper_client,
            topic,
            values,
            key=key,
            collect_from=collect_from,
            count=count,
            timeout_s=testing.WAIT_S if timeout_s is None else timeout_s,
        )

    def assert_exactly_once(
        self,
        topic: str,
        *,
        expected: Sequence[Value] | None = None,
        acks: Iterable[AckLike] = (),
        by: By = "value",
    ) -> Report:
        """`fencelog verify` of topic as an assertion (broker.testing)."""
        __tracebackhide__ = True
        from broker import testing

        client = self._helper_client
        return testing.assert_exactly_once(client, topic, expected=expected, acks=acks, by=by)

    def _close_clients(self) -> None:
        for client in reversed(self._clients):
            with contextlib.suppress(Exception):  # a client of a stopped server
                client.close()
        self._clients.clear()
        self._own = None

    def _prepare(self, data_dir: Path) -> None:
        """Restore the snapshot into data_dir, before anything opens it."""
        if self.options.restore is None:
            return
        from broker.client.embedded import restore_snapshot

        restore_snapshot(self.options.restore, data_dir, force=False, progress=_ignore)

    def _create_topics(self) -> None:
        """The topics the options name; one that exists already (restored) is kept."""
        if not self.options.topics:
            return
        from broker.errors import BrokerError, ErrorCode

        client = self._helper_client
        for name, partitions in self.options.topics.items():
            try:
                client.create_topic(name, partitions)
            except BrokerError as error:
                if error.code != ErrorCode.TOPIC_EXISTS:
                    raise


def _ignore(_done: int, _total: int) -> None:
    pass


class FencelogBroker(_Broker):
    """An embedded data directory: clients open it in this process."""

    def __init__(self, path: Path, options: Options) -> None:
        super().__init__()
        self.path = path
        self.url = str(path)
        self.options = options

    def _connect_args(self) -> dict[str, Any]:
        return {"durability": self.options.durability}

    def start(self) -> FencelogBroker:
        self.path.mkdir(mode=0o700, exist_ok=True)
        self._prepare(self.path)
        self._create_topics()
        return self

    def close(self) -> None:
        self._close_clients()

    def __repr__(self) -> str:
        return f"<FencelogBroker {self.path}>"


class FencelogServer(_Broker):
    """A `fencelog serve` process of its own data directory, on 127.0.0.1 ports of its
    own (native and Kafka)."""

    def __init__(
        self, root: Path, options: Options, *, start_timeout_s: float, stop_timeout_s: float
    ) -> None:
        super().__init__()
        self.root = root
        self.data_dir = root / "data"
        self.ready_file = root / "ready.json"
        self.log_file = root / "serve.log"
        self.options = options
        self.auth_token = options.auth_token
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.url = ""
        self.kafka_url = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def _connect_args(self) -> dict[str, Any]:
        return {"token": self.auth_token}

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server has not been started"
        return self.process.pid

    def command(self) -> list[str]:
        """`fencelog --broker DIR --durability D serve ...` on 127.0.0.1 port 0, with a
        Kafka listener, sessions logged, and the token file (a serve option: the global
        --auth-token-file is what clients send)."""
        serve = ["serve", "--listen", f"{HOST}:0", "--kafka-listen", f"{HOST}:0"]
        serve += ["--ready-file", str(self.ready_file), "--no-unix", "--verbose"]
        if self.auth_token is not None:
            token_file = self.root / "token"
            token_file.touch(mode=0o600)
            token_file.write_text(self.auth_token)
            serve += ["--auth-token-file", str(token_file)]
        broker = ["--broker", str(self.data_dir), "--durability", self.options.durability]
        return [*_die_with_parent(), *_fencelog_command(), *broker, *serve]

    def start(self) -> FencelogServer:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._prepare(self.data_dir)
        env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches pytest, which stops it
            )
        _LIVE_SERVERS[id(self)] = self
        ready = self._wait_ready()
        self.url, self.kafka_url = str(ready["url"]), str(ready["kafka"])
        self._create_topics()
        return self

    def _wait_ready(self) -> dict[str, Any]:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"fencelog serve exited with status {self.process.returncode} before "
                    f"it was ready; its log:\n{self.log()}"
                )
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"fencelog serve was not ready within {self.start_timeout_s}s "
                    f"(fencelog_start_timeout); its log:\n{self.log()}"
                )
            time.sleep(READY_POLL_S)
        ready: dict[str, Any] = json.loads(self.ready_file.read_text())
        return ready

    def log(self, since: int = 0) -> str:
        """What the server wrote to stdout and stderr (from byte `since`)."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(since)
                return log.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_bytes(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0

    def stop(self) -> int | None:
        """SIGTERM, SIGKILL past stop_timeout_s; the exit status (None: never started)."""
        self._close_clients()
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(KILLED_WAIT_S)
        _LIVE_SERVERS.pop(id(self), None)
        self.returncode = process.returncode
        return self.returncode

    def __repr__(self) -> str:
        return f"<FencelogServer {self.url or 'not ready'} kafka={self.kafka_url or '-'}>"


_LIVE_SERVERS: Final[dict[int, FencelogServer]] = {}


def _fencelog_command() -> list[str]:
    """The `fencelog` console script beside this interpreter, else this interpreter
    running the CLI."""
    script = Path(sys.executable).parent / "fencelog"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from cli.main import run; run()"]


def _die_with_parent() -> list[str]:
    """On Linux, util-linux's setpriv in front of the command: the server gets SIGTERM
    should the pytest process die without tearing down (PR_SET_PDEATHSIG, which survives
    the exec). Nothing where setpriv is missing."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


# fixtures ---------------------------------------------------------------------------------


def _root(request: pytest.FixtureRequest, factory: pytest.TempPathFactory) -> Path:
    name = request.fixturename.removeprefix("fencelog_") if request.fixturename else "broker"
    return factory.mktemp(f"fencelog-{name}")


def _remove(request: pytest.FixtureRequest, root: Path) -> None:
    if not request.config.getoption("fencelog_keep"):
        shutil.rmtree(root, ignore_errors=True)


B = TypeVar("B", FencelogBroker, FencelogServer)


def _started(request: pytest.FixtureRequest, broker: B) -> B:
    """broker.start(), or the fixture's error saying why not (no traceback: the reason
    is the server's log, a snapshot that cannot be restored, a topic refused)."""
    from broker.errors import BrokerError

    try:
        return broker.start()
    except (BrokerError, RuntimeError) as error:
        reason = str(error)
    pytest.fail(f"{request.fixturename}: {reason}", pytrace=False)  # outside: no chain


@contextlib.contextmanager
def _embedded(
    request: pytest.FixtureRequest, factory: pytest.TempPathFactory
) -> Iterator[FencelogBroker]:
    root = _root(request, factory)
    broker = FencelogBroker(root / "data", resolve_options(request))
    try:
        yield _started(request, broker)
    finally:
        broker.close()
        _remove(request, root)


@contextlib.contextmanager
def _served(
    request: pytest.FixtureRequest, factory: pytest.TempPathFactory
) -> Iterator[FencelogServer]:
    root = _root(request, factory)
    server = FencelogServer(
        root,
        resolve_options(request),
        start_timeout_s=_seconds(request.config, "fencelog_start_timeout", START_TIMEOUT_S),
        stop_timeout_s=_seconds(request.config, "fencelog_stop_timeout", STOP_TIMEOUT_S),
    )
    try:
        yield _started(request, server)
    finally:
        server.stop()
        _remove(request, root)


@pytest.fixture
def fencelog_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogBroker]:
    """A fresh embedded data directory for this test."""
    with _embedded(request, tmp_path_factory) as broker:
        yield broker


@pytest.fixture(scope="module")
def fencelog_broker_module(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogBroker]:
    """An embedded data directory shared by the tests of a module."""
    with _embedded(request, tmp_path_factory) as broker:
        yield broker


@pytest.fixture(scope="session")
def fencelog_broker_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogBroker]:
    """An embedded data directory shared by every test of the run."""
    with _embedded(request, tmp_path_factory) as broker:
        yield broker


@pytest.fixture
def fencelog_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogServer]:
    """A `fencelog serve` of a fresh data directory for this test."""
    with _served(request, tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="module")
def fencelog_server_module(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogServer]:
    """A `fencelog serve` shared by the tests of a module."""
    with _served(request, tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def fencelog_server_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FencelogServer]:
    """A `fencelog serve` shared by every test of the run."""
    with _served(request, tmp_path_factory) as server:
        yield server


# a failing test's report: the log its servers wrote ------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    # where each server already running (a module's, the session's) is in its log now
    item.stash[_LOG_OFFSETS] = {key: s.log_bytes() for key, s in _LIVE_SERVERS.items()}
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _LIVE_SERVERS:
        offsets = item.stash.get(_LOG_OFFSETS, {})
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, FencelogServer) and value.process is not None:
                text = value.log(offsets.get(id(value), 0))
                if len(text) > LOG_SECTION_BYTES_MAX:
                    text = "...\n" + text[-LOG_SECTION_BYTES_MAX:]
                report.sections.append((f"fencelog serve log ({name}, {value.url})", text))
    return report


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Servers still running (a teardown that could not run): stopped."""
    for server in list(_LIVE_SERVERS.values()):
        server.stop()
