"""How keys and values travel through a shell: text, base64 or hex; and durations.

text: produce takes each stdin line's bytes as they are (any bytes but the newline) and
--value/--key as UTF-8. consume prints bytes as UTF-8; bytes that are not valid UTF-8 are
shown as U+FFFD and the command warns once on stderr, pointing at --format base64, which
(like hex) is lossless in both directions.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re

from broker.errors import BrokerError, ErrorCode


class Format(enum.StrEnum):
    text = "text"
    base64 = "base64"
    hex = "hex"


def decode_input(text: bytes, fmt: Format, what: str) -> bytes:
    """Bytes of a key or value given on the command line or a stdin line."""
    try:
        if fmt is Format.base64:
            return base64.b64decode(text, validate=True)
        if fmt is Format.hex:
            return bytes.fromhex(text.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{what} is not valid {fmt.value}: {text[:40]!r}",
            hint=f"pass {fmt.value} data, or --format text",
        ) from exc
    return text


class Rendering:
    """Turns stored bytes into printable text; counts what text mode could not show."""

    def __init__(self, fmt: Format) -> None:
        self.format = fmt
        self.lossy = 0
        self.escaped = 0  # tab-separated fields whose tabs and line breaks were escaped

    def show(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        if self.format is Format.base64:
            return base64.b64encode(data).decode("ascii")
        if self.format is Format.hex:
            return data.hex()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.lossy += 1
            return data.decode("utf-8", errors="replace")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s|m|h|d|w)?$")
_SCALE_S = {
    "us": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    None: 1.0,
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$")
_SCALE_B = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


_STORED_MAX = (1 << 63) - 1  # a 64-bit integer, as SQLite and the wire store them
_DURATION_MAX_S = _STORED_MAX / 1e6  # microseconds of it still fit: about 292,000 years


def parse_size(text: str) -> int:
    """Bytes from '500MB', '1GiB', '64KiB' or a plain number of bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{text!r} is not a size",
            hint="use e.g. 500MB, 1GiB or a number of bytes",
        )
    size = int(float(match.group(1)) * _SCALE_B[match.group(2)])
    if size > _STORED_MAX:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"{text!r} is past the largest size, 8EiB")
    return size


def duration_text(ms: int) -> str:
    """ms as parse_duration reads it back, in the largest unit that divides it:
    86400000 -> '1d', 90000 -> '90s', 1500 -> '1500ms'."""
    for unit in ("w", "d", "h", "m", "s"):
        scale_ms = int(_SCALE_S[unit] * 1000)
        if ms and ms % scale_ms == 0:
            return f"{ms // scale_ms}{unit}"
    return f"{ms}ms"


def parse_duration(text: str) -> float:
    """Seconds from '500us', '250ms', '30s', '2m', '1h', '7d', '2w' or a plain number of
    seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{text!r} is not a duration",
            hint="use e.g. 500ms, 30s, 2m, 1h, 7d or a number of seconds",
        )
    seconds = float(match.group(1)) * _SCALE_S[match.group(2)]
    if seconds > _DURATION_MAX_S:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"{text!r} is past the longest duration")
    return seconds
