"""What makes a topic name, a partition number and a record acceptable, and which
partition a record goes to.

Rules:
- Topic names are 1..topic_name_chars_max characters of [A-Za-z0-9._-], and not "." or
  "..", as in Kafka, so a name is safe in a path, a URL and a shell word.
- A record's key, value and headers each have a size bound; a batch has a count bound
  and a bytes bound. A Kafka producer's batch has only its bytes bound (and a count
  only as large as Kafka's clients make), as Kafka bounds it: Kafka has no per-record
  bounds.
- A record with an explicit partition goes there. One with a key goes to
  crc32(key) mod partitions, so equal keys always share a partition. One with neither goes
  round robin from a starting point the caller passes (the CLI starts at a random
  partition so that one-record invocations spread over the topic).
"""

from __future__ import annotations

import operator
import re
import zlib
from array import array
from collections.abc import Sequence
from typing import cast

from broker.core.values import check_integer, check_string
from broker.errors import BrokerError, ErrorCode
from broker.limits import INT64_MAX, INT64_MIN, Limits
from broker.types import (
    CLEANUP_POLICIES,
    NewRecord,
    TopicConfig,
    is_columns,
    sizes_of,
    value_size,
)

_VALUE, _KEY, _HEADERS = (operator.itemgetter(i) for i in range(3))
_TIMESTAMP = operator.itemgetter(4)


_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def check_topic_name(name: str, limits: Limits) -> None:
    check_string("topic name", name)
    if not name:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_NAME,
            "topic name is empty",
            hint="use 1 to 249 characters from A-Z a-z 0-9 . _ -",
        )
    if len(name) > limits.topic_name_chars_max:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic name is {len(name)} characters; the limit is {limits.topic_name_chars_max}",
            topic=name[:40] + "...",
        )
    if not _TOPIC_NAME.fullmatch(name) or name in {".", ".."}:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic name {name!r} has characters other than A-Z a-z 0-9 . _ -",
            topic=name,
        )


def check_partition_count(partitions: int, limits: Limits) -> None:
    check_integer("a topic's partition count", partitions)
    if not 1 <= partitions <= limits.topic_partitions_max:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"a topic has 1 to {limits.topic_partitions_max} partitions, not {partitions}",
            partitions=partitions,
        )


def check_topic_config(config: TopicConfig) -> None:
    """Retention and cleanup a topic may have: positive limits, a known policy."""
    limits = (("retention", config.retention_ms), ("retention bytes", config.retention_bytes))
    for what, value in limits:
        if value is not None and value <= 0:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a topic's {what} is positive (or none), not {value}",
                hint="leave it out for no limit",
            )
    if config.cleanup not in CLEANUP_POLICIES:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"cleanup is one of {', '.join(CLEANUP_POLICIES)}, not {config.cleanup!r}",
        )


def check_more_partitions(topic: str, current: int, wanted: int) -> None:
    """A topic's partitions may grow, never shrink (records and offsets would be lost)."""
    if wanted < current:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"topic {topic} has {current} partitions; partitions are never removed "
            f"(asked for {wanted})",
            topic=topic,
            partitions=current,
        )


def check_keyed(topic: str, records: Sequence[NewRecord]) -> None:
    """A compacted topic keeps the newest record of each key: every record needs one.
    The refusal names the keyless records by their index in the batch (record_indexes)."""
    if None in map(_KEY, records):
        keyless = [index for index, key in enumerate(map(_KEY, records)) if key is None]
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"topic {topic} is compacted (cleanup compact): every record needs a key",
            topic=topic,
            record_indexes=keyless,
            hint="give each record a key: produce --key, or KEY<separator>VALUE lines",
        )


def check_partition(topic: str, partition: int, partitions: int) -> None:
    check_integer("partition", partition)
    if not 0 <= partition < partitions:
        raise BrokerError(
            ErrorCode.UNKNOWN_PARTITION,
            f"topic {topic} has partitions 0..{partitions - 1}; there is no partition {partition}",
            topic=topic,
            partition=partition,
            partitions=partitions,
        )


def check_records(records: Sequence[NewRecord], limits: Limits, *, kafka: bool = False) -> None:
    """A batch within its bounds: append_records_max records and append_bytes_max
    bytes, each record within the record bounds. kafka: a Kafka producer's record batch,
    bounded as Kafka bounds it, by its bytes alone (up to kafka_batch_records_max
    records; no record bounds of its own, which Kafka does not have)."""
    if not records:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "nothing to append: the batch is empty")
    most = limits.kafka_batch_records_max if kafka else limits.append_records_max
    if len(records) > most:
        raise BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a batch holds at most {most} records, not {len(records)}",
            hint="split the batch",
        )
    values = sizes_of(records) if len(records) > 1 else None
    if kafka:
        total = _kafka_bytes(records, values)
    elif values is None:  # one record: the usual test below, unrolled
        value, key, headers = records[0][:3]
        size = value_size(value)
        if not key and not headers and size <= limits.record_value_bytes_max:
            total = size
        else:
            total = _check_record(0, records[0], limits)
    elif _values_only(records) and max(values) <= limits.record_value_bytes_max:
        total = sum(values)  # the usual batch: values only, all within their bound
    elif (
        (keyed := _key_lengths(records)) is not None
        and max(values) <= limits.record_value_bytes_max
        and max(keyed) <= limits.record_key_bytes_max
    ):
        total = sum(values) + sum(keyed)  # keyed columns, all within their bounds
    else:
        total = sum(_check_record(index, record, limits) for index, record in enumerate(records))
    if total > limits.append_bytes_max:
        raise BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a batch holds at most {limits.append_bytes_max} bytes, not {total}",
            hint="split the batch",
        )
    _check_timestamps(records)


def _check_timestamps(records: Sequence[NewRecord]) -> None:
    """The timestamps records give, a column's as it is."""
    if is_columns(records):
        stamps = records.timestamps
        if stamps is not None and not (isinstance(stamps, array) and stamps.typecode == "q"):
            _check_stamps(stamps)  # (an array of 64-bit numbers holds nothing else)
    elif any(map(_TIMESTAMP, records)):
        _check_stamps(list(map(_TIMESTAMP, records)))


def _check_stamps(stamps: Sequence[int | None]) -> None:
    """Each timestamp given an integer of ms that SQLite stores (64 bits): a float or a
    number past that failed the write itself, and with it its group commit."""
    given = cast(Sequence[int], stamps)
    if None in stamps:
        given = [stamp for stamp in stamps if stamp is not None]
    if set(map(type, given)) == {int} and min(given) >= INT64_MIN and max(given) <= INT64_MAX:
        return  # the usual batch, checked in C; else find the record to name
    for index, stamp in enumerate(stamps):
        if stamp is not None and (type(stamp) is not int or not INT64_MIN <= stamp <= INT64_MAX):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"record {index}: timestamp_ms is {stamp!r}; it is an integer of milliseconds "
                "since the epoch (64 bits)",
                index=index,
                hint="e.g. int(time.time() * 1000)",
            )


def check_offset_metadata(metadata: str | None, limits: Limits) -> None:
    """An offset commit's metadata: at most offset_metadata_chars_max characters
    (Kafka's offset.metadata.max.bytes)."""
    if metadata is not None and len(metadata) > limits.offset_metadata_chars_max:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"an offset's metadata is at most {limits.offset_metadata_chars_max} characters, "
            f"not {len(metadata)}",
        )


def check_offset(offset: int) -> None:
    """An offset asked for: 0 or more, and within what SQLite stores (64 bits)."""
    check_integer("offset", offset)
    if not 0 <= offset <= INT64_MAX:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"offsets are 0 to {INT64_MAX}, not {offset}",
            offset=offset,
        )


def _check_record(index: int, record: NewRecord, limits: Limits) -> int:
    def too_large(what: str, size: int, limit: int) -> BrokerError:
        return BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"record {index}: {what} is {size} bytes; the limit is {limit}",
            index=index,
            size=size,
            limit=limit,
        )

    size = value_size(record.value)
    if size > limits.record_value_bytes_max:
        raise too_large("value", size, limits.record_value_bytes_max)
    if record.key is None and not record.headers:
        return size
    key_size = len(record.key) if record.key is not None else 0
    if key_size > limits.record_key_bytes_max:
        raise too_large("key", key_size, limits.record_key_bytes_max)
    if len(record.headers) > limits.record_headers_max:
        raise BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"record {index}: {len(record.headers)} headers; the limit is "
            f"{limits.record_headers_max}",
        )
    size += key_size
    for name, value in record.headers:
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray | None):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"record {index}: a header is (name: str, value: bytes or None), not "
                f"({type(name).__name__}, {type(value).__name__})",
                hint="encode a text header value, e.g. value.encode()",
            )
        if not name or len(name) > limits.header_key_chars_max:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"record {index}: header names are 1 to {limits.header_key_chars_max} characters",
            )
        if not name.isascii():
            try:
                name.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BrokerError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"record {index}: header name {name!r} is not valid Unicode ({exc.reason})",
                ) from None
        if value is not None and len(value) > limits.header_value_bytes_max:
            raise too_large(f"header {name!r}", len(value), limits.header_value_bytes_max)
        size += _header_bytes(name, value)
    return size


def _header_bytes(name: str, value: bytes | None) -> int:
    """A header's bytes as a batch counts them: its name's UTF-8 too (a batch of many
    long names is as large on the wire as its values); a null value has none."""
    size = len(value) if value is not None else 0
    return size + (len(name) if name.isascii() else len(name.encode("utf-8", "replace")))


def split_batches(records: Sequence[NewRecord], limits: Limits) -> list[Sequence[NewRecord]]:
    """Consecutive batches within append_records_max records and append_bytes_max bytes
    (as check_records counts them); a record too large on its own is its own batch, for
    check_records to refuse."""
    if _values_only(records):
        sizes = sizes_of(records)  # the usual batch
    elif (keyed := _key_lengths(records)) is not None:
        sizes = list(map(operator.add, sizes_of(records), keyed))
    else:
        sizes = list(map(_stored_size, records))
    if 0 < len(records) <= limits.append_records_max and sum(sizes) <= limits.append_bytes_max:
        return [records]
    batches: list[Sequence[NewRecord]] = []
    start, size = 0, 0
    for index, record_size in enumerate(sizes):
        full = index - start >= limits.append_records_max
        if index > start and (full or size + record_size > limits.append_bytes_max):
            batches.append(records[start:index])
            start, size = index, 0
        size += record_size
    if start < len(records):
        batches.append(records[start:])
    return batches


def _values_only(records: Sequence[NewRecord]) -> bool:
    """No key (an empty one is within any bound) and no headers: the usual batch."""
    if is_columns(records):
        return records.keys is None or not any(records.keys)
    return not any(map(_KEY, records)) and not any(map(_HEADERS, records))


def _key_lengths(records: Sequence[NewRecord]) -> list[int] | None:
    """A RecordColumns' key sizes (0: no key), column by column; None for any other
    batch (its records may have headers)."""
    if not is_columns(records) or records.keys is None:
        return None
    return [0 if key is None else len(key) for key in records.keys]


def _kafka_bytes(records: Sequence[NewRecord], values: list[int] | None) -> int:
    """A Kafka batch's bytes: its values' alone where no record has a key or headers
    (what a Kafka client mostly sends), else every record's stored size."""
    if values is not None and _values_only(records):
        return sum(values)
    return sum(map(_stored_size, records))


def _stored_size(record: NewRecord) -> int:
    size = value_size(record.value) + (len(record.key) if record.key is not None else 0)
    return size + sum(_header_bytes(name, value) for name, value in record.headers)


def choose_partition(key: bytes | None, partitions: int, round_robin: int) -> int:
    """The partition for a record that names none (see the module rules)."""
    if key is not None:
        return zlib.crc32(key) % partitions
    return round_robin % partitions
