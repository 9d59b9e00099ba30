"""The Python client's arguments, checked where a caller hands them over: a wrong type
is INVALID_ARGUMENT naming the argument, alike embedded and served, instead of a
TypeError from deep inside (embedded) or a PROTOCOL_ERROR from the server.

The checks cost nothing per record on the usual path: a batch's records are looked at
one by one only once building or sizing them failed (`bad_record`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from broker.errors import BrokerError, ErrorCode
from broker.types import Fence, Headers, NewRecord, RecordColumns

_BYTES: Final = (bytes, bytearray)


def refused(message: str, hint: str | None = None) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_ARGUMENT, message, hint=hint)


def is_int(value: object) -> bool:
    """An int (an IntEnum too), not a bool, not a float that happens to be whole."""
    return isinstance(value, int) and not isinstance(value, bool)


def integer(name: str, value: object, *, optional: bool = False) -> None:
    if (value is None and optional) or is_int(value):
        return
    raise refused(f"{name} is an integer, not {value!r} ({type(value).__name__})")


def count(name: str, value: object, *, optional: bool = False) -> None:
    """An integer >= 0 (None too, when optional)."""
    integer(name, value, optional=optional)
    if value is not None and value < 0:  # type: ignore[operator]
        raise refused(f"{name} must be >= 0, not {value}")


def as_bytes(value: object, what: str) -> bytes:
    """bytes as they are, text as UTF-8; anything else is refused."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise refused(f"{what} is not valid Unicode text ({exc.reason})") from None
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise refused(f"{what} is bytes or str, not {type(value).__name__}")


def values_iterable(values: object) -> Iterable[Any]:
    """produce()'s values: an iterable of values, never one value on its own."""
    if isinstance(values, bytes | str | bytearray | NewRecord) or values is None:
        raise refused(
            "values is a list of values (bytes, str, None or NewRecord), "
            f"not {type(values).__name__}",
            hint="to send one value, give a list of one: [value]",
        )
    if not isinstance(values, Iterable):
        raise refused(f"values is a list of values, not {type(values).__name__}")
    return values


def new_records(
    values: object, key: bytes | None, headers: Headers, partition: int | None
) -> Sequence[NewRecord]:
    """produce()'s values as a batch: `key`, `headers` and `partition` apply to every value
    given as bytes, str or None (a null value); a NewRecord is taken as it is. Values that
    are all bytes, text or null, with no headers, become columns (RecordColumns) with no
    Python object per record: the usual batch."""
    listed = list(values_iterable(values))
    kinds = {*map(type, listed)}
    if not headers and kinds <= _PLAIN_VALUES:
        if str in kinds:
            listed = [
                value if type(value) is not str else as_bytes(value, "a value") for value in listed
            ]
        count = len(listed)
        return RecordColumns(
            listed,
            None if key is None else [key] * count,
            None if partition is None else [partition] * count,
        )
    return [
        value
        if isinstance(value, NewRecord)
        else NewRecord(
            None if value is None else as_bytes(value, "a value"), key, headers, partition
        )
        for value in listed
    ]


_PLAIN_VALUES: Final = frozenset({bytes, str, type(None)})


def headers_of(headers: object) -> Headers:
    """(name: str, value: bytes or None) pairs, as a tuple (None: a null value, as
    Kafka's, kept distinct from empty)."""
    if isinstance(headers, Mapping) or not isinstance(headers, Iterable):
        raise refused(
            f"headers are (name, value) pairs, not a {type(headers).__name__}",
            hint='e.g. headers=(("trace", b"1"),)',
        )
    pairs = tuple(headers)
    for pair in pairs:
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise refused(f"a header is a (name, value) pair, not {pair!r}")
        name, value = pair
        if not isinstance(name, str) or not (value is None or isinstance(value, _BYTES)):
            raise refused(
                f"a header is (name: str, value: bytes or None), not "
                f"({type(name).__name__}, {type(value).__name__})",
                hint="encode a text header value, e.g. value.encode()",
            )
    return tuple((name, None if value is None else bytes(value)) for name, value in pairs)


def fences_of(fences: object) -> tuple[Fence, ...]:
    if isinstance(fences, str | bytes) or not isinstance(fences, Iterable):
        raise refused(f"fences is a list of Fence (claimed.fence), not {type(fences).__name__}")
    found = tuple(fences)
    for fence in found:
        if not isinstance(fence, Fence):
            raise refused(
                f"a fence is a Fence, such as claimed.fence, not {fence!r}",
                hint="GROUP:RESOURCE:GENERATION text: broker.core.ownership.parse_fence(text)",
            )
    return found


def positions_of(positions: object) -> dict[int, int]:
    """{partition: offset}, both integers."""
    if not isinstance(positions, Mapping):
        raise refused(
            f"positions map partitions to offsets ({{0: 42}}), not {type(positions).__name__}"
        )
    for partition, offset in positions.items():
        if not (is_int(partition) and is_int(offset)):
            raise refused(
                f"positions map partitions to offsets, both integers, not {partition!r}: {offset!r}"
            )
    return dict(positions)


def bad_record(records: Sequence[NewRecord]) -> BrokerError | None:
    """The first record of a batch whose fields are of the wrong type, as an error; None
    when they all are right (so a failure had another cause)."""
    for index, record in enumerate(records):
        if not isinstance(record, NewRecord):
            return refused(f"record {index} is a {type(record).__name__}, not a NewRecord")
        value, key, headers, partition, timestamp = record
        problem = None
        if value is not None and not isinstance(value, _BYTES):
            problem = f"value is bytes or None, not {type(value).__name__}"
        elif key is not None and not isinstance(key, _BYTES):
            problem = f"key is bytes or None, not {type(key).__name__}"
        elif partition is not None and not is_int(partition):
            problem = f"partition is an integer or None, not {partition!r}"
        elif timestamp is not None and not is_int(timestamp):
            problem = f"timestamp_ms is an integer of ms or None, not {timestamp!r}"
        else:
            try:
                headers_of(headers)
            except BrokerError as error:
                problem = error.message
        if problem is not None:
            return refused(f"record {index}: {problem}", hint="NewRecord(value: bytes, ...)")
    return None
