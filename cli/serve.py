"""fencelog serve: own a data directory and serve it over TCP and a unix socket."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.errors import BrokerError, ErrorCode
from broker.limits import BUSY_POLL_US_DEFAULT, BUSY_POLL_US_MAX
from cli.context import state
from cli.formats import parse_duration

_GC_YOUNG_OBJECTS = 50_000  # Python's default is 700
# glibc's mallopt parameters and the values the server sets (keep_freed_memory)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_FROM_BYTES = 16 << 20
_TRIM_FROM_BYTES = 64 << 20

if TYPE_CHECKING:
    from broker.server.server import Server


def serve(
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            "-l",
            help="HOST:PORT to listen on (port 0: any free port).",
            metavar="HOST:PORT",
        ),
    ] = "127.0.0.1:7420",
    ready_file: Annotated[
        Path | None,
        typer.Option(
            "--ready-file",
            help="Once listening, write {pid, tcp, unix, url} as JSON here (for scripts "
            "and CI; url is what --broker takes).",
        ),
    ] = None,
    auth_token_file: Annotated[
        Path | None,
        typer.Option(
            "--auth-token-file",
            help="Require this file's token from every client (needed to listen beyond 127.0.0.1).",
        ),
    ] = None,
    session_timeout: Annotated[
        str,
        typer.Option(
            "--session-timeout",
            help="Close a session after this long without a frame from it.",
            metavar="DURATION",
        ),
    ] = "15s",
    no_unix: Annotated[
        bool, typer.Option("--no-unix", help="Do not listen on DATA_DIR/fencelog.sock.")
    ] = False,
    drop_acks: Annotated[
        float,
        typer.Option(
            "--drop-acks",
            help="Fault injection: after appending, drop this fraction (0 to 1) of produce "
            "acknowledgements by closing the connection, to test retry logic.",
            metavar="RATE",
        ),
    ] = 0.0,
    busy_poll: Annotated[
        str,
        typer.Option(
            "--busy-poll",
            help="After a request, keep polling the sockets this long before sleeping: "
            "the next request is read at once, at the cost of CPU (0: off).",
            metavar="DURATION",
        ),
    ] = f"{BUSY_POLL_US_DEFAULT}us",
    kafka_listen: Annotated[
        str | None,
        typer.Option(
            "--kafka-listen",
            help="Also speak Kafka's wire protocol on HOST:PORT, for unchanged Kafka clients "
            "(port 0: any free port; the ready file's `kafka` says which).",
            metavar="HOST:PORT",
        ),
    ] = None,
    kafka_partitions: Annotated[
        int,
        typer.Option(
            "--kafka-partitions",
            help="Partitions of a topic a Kafka client creates without naming how many.",
            min=1,
        ),
    ] = 1,
    kafka_auto_create: Annotated[
        bool,
        typer.Option(
            "--kafka-auto-create/--no-kafka-auto-create",
            help="Create a topic when a Kafka client's metadata request names it "
            "(Kafka's auto.create.topics.enable).",
        ),
    ] = True,
    kafka_idle_timeout: Annotated[
        str,
        typer.Option(
            "--kafka-idle-timeout",
            help="Close a Kafka client's connection after this long with no request "
            "(Kafka's connections.max.idle.ms; a frame left unfinished counts as none).",
            metavar="DURATION",
        ),
    ] = "10m",
    kafka_advertised_host: Annotated[
        str | None,
        typer.Option(
            "--kafka-advertised-host",
            help="The host Kafka clients are told to connect to (default: the listened one).",
            metavar="HOST",
        ),
    ] = None,
    http_listen: Annotated[
        str | None,
        typer.Option(
            "--http-listen",
            help="Also answer HTTP on HOST:PORT: /healthz, /readyz and /metrics "
            "(Prometheus); the ready file's `http` says where.",
            metavar="HOST:PORT",
        ),
    ] = None,
    clean_interval: Annotated[
        str,
        typer.Option(
            "--clean-interval",
            help="Apply topics' retention and compaction this often, in short steps.",
            metavar="DURATION",
        ),
    ] = "30s",
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            help="text (for people) or json (one object per line, for collectors: INFO and up).",
            metavar="FORMAT",
        ),
    ] = "text",
    verbose: Annotated[bool, typer.Option("--verbose", help="Log sessions to stderr.")] = False,
) -> None:
    """Serve the data directory (--broker) until SIGTERM or Ctrl-C, then stop cleanly.

    While it runs, other fencelog commands and clients given the same data directory go
    through this server. Prints the addresses it listens on.
    """
    current = state()
    if current.address() is not None:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "serve needs a data directory, not a broker address",
            hint="fencelog --broker PATH serve",
        )
    host, port = _host_port(listen)
    if ready_file is not None and (ready_file.is_dir() or not ready_file.parent.is_dir()):
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--ready-file {ready_file}: "
            + ("is a directory" if ready_file.is_dir() else "its directory does not exist"),
            hint="name a file in an existing directory",
        )
    kafka = None
    if kafka_listen is not None:
        from broker.kafka.options import KafkaListen

        kafka_host, kafka_port = _host_port(kafka_listen, "--kafka-listen")
        kafka = KafkaListen(
            kafka_host, kafka_port, kafka_auto_create, kafka_partitions, kafka_advertised_host
        )
    token = read_token(auth_token_file) if auth_token_file else None
    timeout_ms = int(parse_duration(session_timeout) * 1000)
    if timeout_ms <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--session-timeout must be positive")
    busy_poll_us = round(parse_duration(busy_poll) * 1e6)
    if busy_poll_us > BUSY_POLL_US_MAX:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--busy-poll {busy_poll} is longer than {BUSY_POLL_US_MAX // 1000}ms",
            hint="a few hundred microseconds covers a client's turn; 0 turns it off",
        )
    from cli import logs  # only a server logs

    if log_format not in logs.FORMATS:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--log-format {log_format!r} is not one of {', '.join(logs.FORMATS)}",
        )
    http = _host_port(http_listen, "--http-listen") if http_listen is not None else None
    logs.configure(log_format, verbose)
    import asyncio

    from msgspec.structs import replace

    from broker.limits import DEFAULT_LIMITS
    from broker.server.server import Server  # asyncio and the server: only for serve

    clean_ms = int(parse_duration(clean_interval) * 1000)
    if clean_ms <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--clean-interval must be positive")
    kafka_idle_ms = int(parse_duration(kafka_idle_timeout) * 1000)
    if kafka_idle_ms <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--kafka-idle-timeout must be positive")
    limits = replace(
        DEFAULT_LIMITS,
        session_timeout_ms=timeout_ms,
        clean_interval_ms=clean_ms,
        kafka_idle_ms=kafka_idle_ms,
    )
    current.creating()
    server = Server(
        Path(current.broker),
        durability=current.durability,
        limits=limits,
        auth_token=token,
        drop_acks=drop_acks,
        busy_poll_us=busy_poll_us,
        kafka=kafka,
        http=http,
    )
    from broker.event_loop import new_event_loop

    # The server makes and drops many small tuples per record (rows, frames) and keeps
    # few: collecting the youngest generation every 700 allocations cost about a sixth
    # of its CPU under load. Collect less often, and never rescan what start-up loaded.
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
    keep_freed_memory()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(_run(server, host, port, not no_unix, ready_file))


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep memory the server frees for its next request (True if
    it could be told). An answer or a request of a megabyte is a fresh buffer each
    time, and by default malloc hands a freed megabyte back to the kernel (an mmap, or
    a trim of its heap's top), so the next one is made of new pages, each a fault the
    first time it is written: half a millisecond a megabyte here, a third of a kcat
    read's server time. Kept, up to _TRIM_FROM_BYTES of an arena's free top, they are
    written at memory speed. Other C libraries are left as they are."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_FROM_BYTES)
    )


async def _run(server: Server, host: str, port: int, unix: bool, ready_file: Path | None) -> None:
    """Serve until stopped. The ready file is written once the server listens, and
    removed after it stops; one naming a process that is gone (a server killed) is
    removed as this one starts. One naming a live server is left to it: this serve is
    refused (DATA_DIR_IN_USE) if that server owns the directory."""
    if ready_file is not None and not _names_a_live_process(ready_file):
        ready_file.unlink(missing_ok=True)
    try:
        await _serve(server, host, port, unix, ready_file)
    finally:
        if ready_file is not None:
            _remove_own(ready_file)


def _names_a_live_process(ready_file: Path) -> bool:
    try:
        pid = json.loads(ready_file.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _remove_own(ready_file: Path) -> None:
    """Remove the ready file if it still names this process (a later server may have
    written its own there meanwhile)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(ready_file.read_text()).get("pid") == os.getpid():
            ready_file.unlink()


async def _serve(server: Server, host: str, port: int, unix: bool, ready_file: Path | None) -> None:
    import asyncio

    await server.start(host, port, unix=unix)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: asyncio.ensure_future(server.stop()))
    info = server.info
    assert info is not None
    # url: the TCP address as --broker and connect() take it
    addresses = {"pid": info.pid, "tcp": info.tcp, "unix": info.unix, "url": f"tcp://{info.tcp}"}
    if info.kafka is not None:
        addresses["kafka"] = info.kafka
    if info.http is not None:
        addresses["http"] = info.http
    if ready_file is not None:
        temporary = ready_file.with_name(ready_file.name + ".tmp")
        temporary.write_text(json.dumps(addresses))
        temporary.replace(ready_file)
    where = f"tcp://{info.tcp}" + (f" and unix://{info.unix}" if info.unix else "")
    if info.kafka is not None:
        where += f", Kafka clients on {info.kafka}"
    if info.http is not None:
        where += f", HTTP on {info.http}"
    sys.stdout.write(f"fencelog serving {server.data_dir} on {where} (pid {os.getpid()})\n")
    sys.stdout.flush()
    await server.wait_stopped()


def _host_port(listen: str, option: str = "--listen") -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{option} {listen!r} is not HOST:PORT",
            hint=f"e.g. {option} 127.0.0.1:7420 or 127.0.0.1:0",
        )
    return host.strip("[]"), int(port)


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, f"cannot read the auth token file {path}: {exc.strerror}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"the auth token file {path} is not UTF-8 text (byte {exc.start})",
            hint="a token is text, e.g. from `openssl rand -hex 32`",
        ) from exc
    if len(token) < 16:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"the auth token in {path} is shorter than 16 characters",
            hint="use a long random token, e.g. from `openssl rand -hex 32`",
        )
    return token
