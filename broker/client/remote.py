"""What both ways of reaching a served broker share, and the simpler of them.

- `Address`: tcp://HOST:PORT or unix://PATH.
- The handshake (`hello_args`, `hello_of`), the errors a connection raises, and the
  payloads of the requests both clients build themselves (produce, fetch, fetch_arrow).
- `BlockingConnection`: one TCP or unix socket, used in the caller's thread. HELLO on
  open, requests written in order and their replies read in the same order, error
  frames turned back into the BrokerError the embedded engine would have raised.

served.py's ServedTransport answers a sync Client over a BlockingConnection;
async_client.py's AsyncClient is the event loop's connection.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from msgspec import Struct

from broker import __version__
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS, Limits, limits_from_server
from broker.protocol import codec
from broker.protocol.frames import NEED_DATA, FrameConnection, Sentinel, TruncatedFrame
from broker.protocol.messages import (
    CHECKSUM_FEATURE,
    PROTOCOL_VERSION,
    ErrorReply,
    Op,
    Push,
    Reply,
)
from broker.protocol.ops import OPERATIONS
from broker.types import (
    Fence,
    NewRecord,
    ProducerFields,
    Record,
)

if TYPE_CHECKING:
    import pyarrow as pa


T = TypeVar("T")
BACKOFF_FIRST_S: Final = 0.02
BACKOFF_MAX_S: Final = 1.0
# Requests sent once more on a new connection when the connection ended under them: the
# table's retry-safe operations (broker/protocol/ops.py), and these of their own.
RETRY_SAFE: Final = frozenset(
    {Op.HEARTBEAT, Op.FETCH, Op.FETCH_ARROW, Op.OWN, Op.OWNERSHIP, Op.OWN_HISTORY}
    | {entry.op for entry in OPERATIONS if entry.retry_safe}
)
ENDED: Final = frozenset({ErrorCode.CONNECTION_FAILED, ErrorCode.SEVERED})
_READ_BYTES: Final = 256 * 1024


class Address(Struct, frozen=True):
    """tcp://HOST:PORT or unix://PATH."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, url: str) -> Address:
        scheme, _, rest = url.partition("://")
        if scheme == "unix" and rest:
            return cls("unix", path=rest)
        if scheme == "tcp":
            host, _, port = rest.rpartition(":")
            if host and port.isascii() and port.isdigit() and 0 < int(port) < 65536:
                return cls("tcp", host=host.strip("[]"), port=int(port))
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{url!r} is not a broker address",
            hint="use tcp://HOST:PORT, unix://PATH, or a data directory path",
        )

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        return f"tcp://{host}:{self.port}"


# What both connections share: the handshake, the errors, and the requests' payloads. ---


class Hello(Struct, frozen=True):
    """What the server told a new connection."""

    session_id: str
    limits: Limits
    features: frozenset[str]


def checked_request_timeout(request_timeout_s: float) -> float:
    """A request's deadline in seconds, refused unless positive."""
    if not request_timeout_s > 0:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"the request timeout must be positive, not {request_timeout_s}",
        )
    return request_timeout_s


def hello_args(token: str | None) -> dict[str, Any]:
    return {"client": f"fencelog-py {__version__}", "token": token}


def hello_of(reply: dict[str, Any], address: Address) -> Hello:
    """HELLO's reply, checked: a server of another protocol version is refused."""
    if reply.get("protocol") != PROTOCOL_VERSION:
        raise BrokerError(
            ErrorCode.PROTOCOL_ERROR,
            f"the broker at {address} speaks protocol {reply.get('protocol')!r}; "
            f"this client speaks {PROTOCOL_VERSION}",
            hint="run the same fencelog version on both sides",
        )
    features = reply.get("features", ())
    return Hello(
        str(reply.get("session_id", "")),
        limits_from_server(dict(reply.get("limits", {}))),
        frozenset(f for f in features if isinstance(f, str))
        if isinstance(features, list | tuple)
        else frozenset(),
    )


def cannot_connect(address: Address, exc: BaseException) -> BrokerError:
    """A connection that could not be made; `waiting_helps` is False where a retry soon
    cannot succeed (an unknown host, a socket we may not open), unlike a refused port or
    a socket file not there yet, which a starting server is about to listen on."""
    return BrokerError(
        ErrorCode.CONNECTION_FAILED,
        f"cannot connect to {address}: {exc}",
        hint="is `fencelog serve` running there?",
        waiting_helps=not isinstance(exc, socket.gaierror | PermissionError),
    )


def worth_retrying(error: BrokerError, remaining_s: float, delay_s: float) -> bool:
    """A connection attempt that failed and may succeed after delay_s, within the time
    left for connecting."""
    return (
        error.code is ErrorCode.CONNECTION_FAILED
        and error.details.get("waiting_helps", True) is not False
        and remaining_s > delay_s
    )


def lost(exc: BaseException) -> BrokerError:
    return BrokerError(ErrorCode.CONNECTION_FAILED, f"the connection to the broker was lost: {exc}")


def cut_short(cut: TruncatedFrame) -> BrokerError:
    # A reply cut short is a lost connection, not a malformed frame: what was in flight
    # may or may not have been done, and is retried as such.
    return BrokerError(
        ErrorCode.CONNECTION_FAILED,
        f"the connection to the broker was lost in the middle of a reply ({cut})",
        hint="the outcome of the requests in flight is unknown; retry them",
    )


def no_reply(op: Op, request_timeout_s: float) -> BrokerError:
    return BrokerError(
        ErrorCode.CONNECTION_FAILED,
        f"no reply from the broker to {op.name} within its deadline "
        f"({request_timeout_s:g} s): the connection is closed",
        hint="the outcome of the requests in flight is unknown; is the broker "
        "stopped or the network down? (--request-timeout sets the deadline)",
    )


def request_frame(frames: FrameConnection, request_id: int, op: Op, args: dict[str, Any]) -> bytes:
    """A request's frame; arguments msgpack cannot encode fail that request alone."""
    try:
        return frames.send_request(request_id, op, args)
    except (OverflowError, TypeError, ValueError) as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, f"{op.name} request cannot be encoded: {exc}"
        ) from exc


def error_of(message: ErrorReply) -> BrokerError:
    """The broker's error as the engine raised it: its details' arrays as lists."""
    try:
        code = ErrorCode(message.code)
    except ValueError:
        code = ErrorCode.INTERNAL
    details = {key: codec.arrays_as_lists(value) for key, value in message.details.items()}
    return BrokerError(code, message.message, **details)


def severed(push: Push) -> BrokerError:
    reason = str(push.data.get("reason", "the broker closed this session"))
    return BrokerError(ErrorCode.SEVERED, f"session {reason}")


def wait_s_of(args: dict[str, Any]) -> float:
    """A long poll's own wait, which its reply's deadline adds to the request timeout."""
    wait_ms = args.get("wait_ms", 0)
    return wait_ms / 1000 if isinstance(wait_ms, int) else 0


def produce_args(
    topic: str,
    records: Sequence[NewRecord],
    producer: ProducerFields,
    fences: Sequence[Fence],
    attachment: int | None,
    features: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """PRODUCE's arguments; the records as columns where the server takes them
    (features: what its HELLO announced) and the batch allows."""
    args = {
        "topic": topic,
        "records": codec.new_records_to_wire(records),
        "producer": codec.producer_to_wire(producer),
        "fences": codec.fences_to_wire(fences),
        "attachment": attachment,
        "result_columns": True,  # results as columns (codec.results_reply)
    }
    return codec.with_columns(args, features)


def fetch_args(
    topic: str,
    positions: dict[int, int],
    max_records: int,
    wait_ms: int,
    fences: Sequence[Fence],
    pages: bool = False,
) -> dict[str, Any]:
    return {
        "topic": topic,
        "positions": codec.positions_to_wire(positions),
        "max_records": max_records,
        "wait_ms": wait_ms,
        "fences": codec.fences_to_wire(fences),
        "pages": pages,  # a page per partition, not a row per record (pages.py)
        "runs": pages,  # page columns may come as runs (rows.Runs)
        "nulls": True,  # a null value may come as a null (-1 in a page's value lengths)
    }


def fetched_records(topic: str, reply: dict[str, Any]) -> list[Record]:
    if "pages" in reply:
        return codec.records_from_chunks(topic, reply["pages"])
    return codec.rows_from_wire(topic, reply.get("rows"))  # a server before pages


def fetched_arrow(topic: str, reply: dict[str, Any]) -> pa.RecordBatch:
    """A FETCH reply of one partition as one Arrow batch, built here from its page (or
    its rows): the server sends the page's few values rather than twelve columns, and
    each reader builds its own batches (bench/RESULTS.md, "PySpark connector against
    Parquet")."""
    from broker import columnar  # pyarrow: only for columnar readers

    if "pages" in reply:
        chunks = codec.chunks_from_wire(reply["pages"])
    else:  # a server before pages
        chunks = [codec.rows_of_reply(reply)]
    try:
        return columnar.chunks_to_arrow(topic, chunks)
    except (TypeError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise BrokerError(ErrorCode.PROTOCOL_ERROR, f"a fetched page is malformed: {exc}") from exc


def connect_with_backoff(open_once: Callable[[float], T], connect_timeout_s: float) -> T:
    """open_once(timeout_s), again with exponential backoff while the broker cannot be
    reached (it may be starting), until connect_timeout_s has passed."""
    deadline = time.monotonic() + connect_timeout_s
    delay = BACKOFF_FIRST_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return open_once(max(remaining, 0.05))
        except BrokerError as error:
            if not worth_retrying(error, remaining, delay):
                raise
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


# One blocking connection ----------------------------------------------------------------


class BlockingConnection:
    """One connection read and written in the caller's thread. Requests may be written
    ahead of reading their replies (`send`, then `reply`): replies come in request
    order, and one read for a later request keeps the earlier ones for theirs."""

    def __init__(self, sock: socket.socket, address: Address, request_timeout_s: float) -> None:
        self.address = address
        self._sock = sock
        self._frames = FrameConnection(DEFAULT_LIMITS.frame_bytes_max)
        self._request_timeout_s = request_timeout_s
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Op, float]] = {}  # request id -> op, deadline
        self._replies: dict[int, dict[str, Any] | BrokerError] = {}  # read, not yet taken
        self._closed: BrokerError | None = None
        self.last_sent = time.monotonic()
        self.hello = Hello("", DEFAULT_LIMITS, frozenset())

    @classmethod
    def open(
        cls,
        address: Address,
        *,
        token: str | None,
        timeout_s: float,
        request_timeout_s: float,
    ) -> BlockingConnection:
        try:
            if address.scheme == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout_s)
                    sock.connect(address.path)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((address.host, address.port), timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise cannot_connect(address, exc) from exc
        connection = cls(sock, address, request_timeout_s)
        try:
            connection.hello = hello_of(connection.request(Op.HELLO, hello_args(token)), address)
        except BaseException:
            connection.close()
            raise
        connection._frames.checksummed = CHECKSUM_FEATURE in connection.hello.features
        return connection

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def request(self, op: Op, args: dict[str, Any]) -> dict[str, Any]:
        return self.reply(self.send(op, args))

    def send(self, op: Op, args: dict[str, Any]) -> int:
        """Write one request; its id, for `reply`."""
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        frame = request_frame(self._frames, request_id, op, args)
        now = time.monotonic()
        self._pending[request_id] = (op, now + self._request_timeout_s + wait_s_of(args))
        try:
            self._sock.settimeout(self._request_timeout_s)
            self._sock.sendall(frame)
        except OSError as exc:
            error = lost(exc)
            self._fail(error)
            raise error from exc
        except BaseException:  # interrupted mid-frame: what follows cannot be read
            self._fail(_interrupted())
            raise
        self.last_sent = now
        return request_id

    def reply(self, request_id: int) -> dict[str, Any]:
        """The reply to a request sent on this connection, read when not yet read."""
        while request_id not in self._replies:
            if self._closed is not None:
                raise self._closed
            try:
                self._read(request_id)
            except BrokerError as error:
                self._fail(error)
                raise
            except BaseException:  # interrupted mid-reply: its rest cannot be told apart
                self._fail(_interrupted())
                raise
        reply = self._replies.pop(request_id)
        if isinstance(reply, BrokerError):
            raise reply
        return reply

    def _read(self, request_id: int) -> None:
        op, deadline = self._pending[min(self._pending)]  # replies come in order
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise no_reply(op, self._request_timeout_s)
        self._sock.settimeout(remaining)
        try:
            data = self._sock.recv(_READ_BYTES)
        except TimeoutError:
            raise no_reply(op, self._request_timeout_s) from None
        except OSError as exc:
            raise lost(exc) from exc
        self._frames.receive_data(data)
        try:
            while not isinstance(message := self._frames.next_message(), Sentinel):
                self._deliver(message)
        except TruncatedFrame as cut:
            raise cut_short(cut) from cut
        if message is not NEED_DATA:
            raise BrokerError(ErrorCode.CONNECTION_FAILED, "the broker closed the connection")

    def _deliver(self, message: object) -> None:
        if isinstance(message, Push):
            if message.event == "session_closed":  # nothing more will be answered
                raise severed(message)
            return  # no other push concerns a connection that holds nothing
        if isinstance(message, ErrorReply) and message.request_id == 0:
            raise error_of(message)  # connection-level: fails everything in flight
        if not isinstance(message, Reply | ErrorReply) or not self._pending:
            raise BrokerError(ErrorCode.PROTOCOL_ERROR, "the broker sent an unexpected frame")
        first = min(self._pending)
        if message.request_id != first:
            raise BrokerError(ErrorCode.PROTOCOL_ERROR, "the broker answered out of order")
        del self._pending[first]
        self._replies[first] = (
            error_of(message) if isinstance(message, ErrorReply) else message.result
        )

    def ended_by_peer(self) -> bool:
        """True when the server has closed this connection or said something unasked
        (it closes an idle session with a push): then it is not to be written to."""
        if self._closed is not None:
            return True
        if self._pending:
            return False
        self._sock.settimeout(0)  # a look, not a wait
        try:
            self._sock.recv(1, socket.MSG_PEEK)  # b"": closed; a byte: a push unasked for
        except BlockingIOError:
            return False
        except OSError:
            return True
        return True

    def _fail(self, error: BrokerError) -> None:
        if self._closed is None:
            self._closed = error
        for request_id in self._pending:
            self._replies.setdefault(request_id, error)
        self._pending.clear()
        with contextlib.suppress(OSError):
            self._sock.close()

    def abort(self) -> None:
        """End the connection under whoever is reading it (another thread)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._closed is None and not self._pending:
            # A polite goodbye only when nothing is in flight
            with contextlib.suppress(BrokerError, OSError):
                self._sock.settimeout(1.0)
                self._sock.sendall(self._frames.send_request(next(self._ids), Op.GOODBYE, {}))
        self._fail(BrokerError(ErrorCode.CONNECTION_FAILED, "the connection is closed"))


def _interrupted() -> BrokerError:
    return BrokerError(
        ErrorCode.CONNECTION_FAILED, "the connection was abandoned in the middle of a request"
    )
