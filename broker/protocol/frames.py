"""Framing, sans-I/O: `FrameConnection` turns received bytes into messages and messages
into bytes to send, and never touches a socket.

    conn = FrameConnection(frame_bytes_max=...)
    conn.receive_data(data)            # b"" means the peer closed its side
    while (message := conn.next_message()) is not NEED_DATA:
        ...                            # CLOSED once the peer closed cleanly

Rules:
- The length prefix is checked against frame_bytes_max as soon as its 4 bytes are in,
  before any buffer grows for the body.
- A length word with its top bit set is followed by a CRC-32 of the body, which the
  receiver checks: a frame damaged in transit is DamagedFrame, never decoded. A side
  sends such frames once it knows the peer reads them (`checksummed`): a client once
  the server's HELLO announced CHECKSUM_FEATURE, a server once the client sent one.
  Frames without the bit are read as they always were, so either side may be older.
- Anything malformed (an oversized or empty frame, a body that is not msgpack, a wrong
  shape, an unknown kind or op, a frame cut off by the peer closing) raises
  ProtocolError. The connection is unusable afterwards: the caller sends an error frame
  and closes it. Nothing else is affected.
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import Any, Final

import msgpack

from broker.errors import BrokerError, ErrorCode
from broker.protocol.messages import ErrorReply, Kind, Message, Op, Push, Reply, Request
from broker.types import collector_paused

_LENGTH = struct.Struct(">I")
_CHECKED_HEADER = struct.Struct(">II")  # the length word with _CHECKED set, the CRC-32
_CHECKED: Final = 0x8000_0000  # far above any frame_bytes_max: the length is the rest
# A body this large is decoded with the cycle collector paused (types.collector_paused)
_BULK_BODY_BYTES: Final = 1 << 16
HEADER_BYTES: Final = _LENGTH.size


class Sentinel(enum.Enum):
    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"


NEED_DATA: Final = Sentinel.NEED_DATA
CLOSED: Final = Sentinel.CLOSED


class ProtocolError(BrokerError):
    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(ErrorCode.PROTOCOL_ERROR, message, **details)


class TruncatedFrame(ProtocolError):
    """The peer closed in the middle of a frame. A server answers that client with an
    error; a client has lost its connection, and the requests in flight have an
    unknown outcome, as after any other loss (see broker/client/served.py)."""


class DamagedFrame(TruncatedFrame):
    """A frame whose CRC-32 does not match its body: damaged in transit, and not
    decoded. Like a frame cut short, it ends the connection, and what was in flight has
    an unknown outcome; nothing of the damaged frame itself is done."""


def encode(
    message: Message, packer: msgpack.Packer | None = None, *, checked: bool = False
) -> bytes:
    """The frame for one message (packed by `packer` when given: a Packer kept for a
    connection saves building one per frame), with a CRC-32 when `checked`."""
    # the usual two first: a dispatch by type, not a match
    if type(message) is Reply:
        body: tuple[Any, ...] = (Kind.REPLY, message.request_id, Op.NONE, message.result)
    elif type(message) is Request:
        body = (Kind.REQUEST, message.request_id, message.op, message.args)
    else:
        match message:
            case ErrorReply(request_id, code, text, details):
                payload = {"code": code, "message": text, "details": details}
                body = (Kind.ERROR, request_id, Op.NONE, payload)
            case Push(event, data):
                body = (Kind.PUSH, 0, Op.NONE, {"event": event, "data": data})
            case _:
                raise TypeError(f"not a message: {message!r}")
    packed = msgpack.packb(body, use_bin_type=True) if packer is None else packer.pack(body)
    return _framed(packed, checked)


def _framed(packed: bytes, checked: bool = False) -> bytes:
    if checked:
        return _CHECKED_HEADER.pack(len(packed) | _CHECKED, zlib.crc32(packed)) + packed
    return _LENGTH.pack(len(packed)) + packed


def decode_body(body: bytes) -> Message:
    """One frame's body (without its length prefix) as a message."""
    try:
        if len(body) < _BULK_BODY_BYTES:
            decoded = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
        else:  # a batch of records or results: thousands of tuples
            with collector_paused():
                decoded = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"frame body is not msgpack: {exc}") from exc
    if not (isinstance(decoded, tuple) and len(decoded) == 4):
        raise ProtocolError("frame body is not [kind, request_id, op, payload]")
    kind, request_id, op, payload = decoded
    if type(request_id) is not int or request_id < 0:  # a bool is not a request id
        raise ProtocolError(f"bad request id {request_id!r}")
    if type(payload) is not dict:
        raise ProtocolError("frame payload is not a map")
    try:
        known_kind, known_op = _KINDS.get(kind), _OPS.get(op)
    except TypeError:  # an unhashable kind or op (a map) is no kind or op
        known_kind = known_op = None
    if known_kind is None or known_op is None:
        raise ProtocolError(f"unknown kind or op: {kind!r}, {op!r}")
    return _message(known_kind, request_id, known_op, payload)


# by value, for a dict lookup instead of an enum call; keys are exact ints (not bools)
_KINDS: Final[dict[object, Kind]] = {int(kind): kind for kind in Kind}
_OPS: Final[dict[object, Op]] = {int(op): op for op in Op}


def _message(kind: Kind, request_id: int, op: Op, payload: dict[str, Any]) -> Message:
    match kind:
        case Kind.REQUEST:
            if op is Op.NONE:
                raise ProtocolError("a request must name an op")
            return Request(request_id, op, payload)
        case Kind.REPLY:
            return Reply(request_id, payload)
        case Kind.ERROR:
            code, text, details = (
                payload.get("code"),
                payload.get("message"),
                payload.get("details"),
            )
            if not (isinstance(code, int) and isinstance(text, str) and isinstance(details, dict)):
                raise ProtocolError("error frame without code, message and details")
            return ErrorReply(request_id, code, text, details)
        case Kind.PUSH:
            event, data = payload.get("event"), payload.get("data")
            if not (isinstance(event, str) and isinstance(data, dict)):
                raise ProtocolError("push frame without event and data")
            return Push(event, data)


class FrameConnection:
    """One side of one connection's byte stream."""

    def __init__(self, frame_bytes_max: int) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._start = 0  # bytes of _buffer already decoded; compacted lazily
        self._closed = False
        self._packer = msgpack.Packer(use_bin_type=True)  # this connection's frames only
        # frames sent carry a CRC-32: once the peer is known to read them (see above)
        self.checksummed = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    def receive_data(self, data: bytes) -> None:
        if self._closed:
            if data:
                raise ProtocolError("data after the peer closed")
            return
        if not data:
            self._closed = True
            return
        if self._start and self._start * 2 >= len(self._buffer):
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_message(self) -> Message | Sentinel:
        start = self._start
        if len(self._buffer) - start < HEADER_BYTES:
            return self._end_or_need()
        (word,) = _LENGTH.unpack_from(self._buffer, start)
        length, checked = word & ~_CHECKED, word & _CHECKED
        if length == 0:
            raise ProtocolError("empty frame")
        if length > self.frame_bytes_max:
            raise ProtocolError(
                f"frame of {length} bytes is over the limit of {self.frame_bytes_max}",
                frame_bytes=length,
                frame_bytes_max=self.frame_bytes_max,
            )
        header = _CHECKED_HEADER.size if checked else HEADER_BYTES
        end = start + header + length
        if len(self._buffer) < end:
            return self._end_or_need()
        body = bytes(memoryview(self._buffer)[start + header : end])
        self._start = end
        if checked:
            (crc,) = _LENGTH.unpack_from(self._buffer, start + HEADER_BYTES)
            if zlib.crc32(body) != crc:
                raise DamagedFrame(
                    f"a frame of {length} bytes was damaged in transit: its CRC-32 does not match"
                )
            self.checksummed = True  # the peer reads them too
        return decode_body(body)

    def _end_or_need(self) -> Sentinel:
        if not self._closed:
            return NEED_DATA
        if self.buffered_bytes:
            raise TruncatedFrame(f"connection closed mid-frame ({self.buffered_bytes} bytes)")
        return CLOSED

    def send(self, message: Message) -> bytes:
        return encode(message, self._packer, checked=self.checksummed)

    def send_request(self, request_id: int, op: Op, args: dict[str, Any]) -> bytes:
        """The frame of Request(request_id, op, args), with no Request built."""
        return _framed(self._packer.pack((_REQUEST, request_id, op, args)), self.checksummed)

    def send_reply(self, request_id: int, result: dict[str, Any]) -> bytes:
        """The frame of Reply(request_id, result), with no Reply built."""
        return _framed(self._packer.pack((_REPLY, request_id, _NO_OP, result)), self.checksummed)


# plain ints: msgpack packs them a little faster than IntEnum members
_REQUEST: Final = int(Kind.REQUEST)
_REPLY: Final = int(Kind.REPLY)
_NO_OP: Final = int(Op.NONE)
