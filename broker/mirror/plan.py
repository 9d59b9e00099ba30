"""The mirror's decisions, in pure code: values in, a decision or a BrokerError out.

- A cluster is `kafka://HOST:PORT[,HOST:PORT...]`.
- --kafka-config is librdkafka's KEY=VALUE, given on the command line or as lines of a
  file (# comments, blank lines); a value is never echoed in an error, since it may be a
  password.
- --topic is a name or a regular expression matched against the whole name; a plain
  name the source does not have is UNKNOWN_TOPIC, as is a pattern that matches nothing.
- A target topic must have at least the source's partitions: records keep their
  partition numbers, never remapped.
- Translation: the target holds, at its end, the source's records up to the mirror's
  position, in order and one for one. A group's committed source offset O thus names
  the target record that is as many records from the target's end as the source has
  records in [O, position).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple

from broker.errors import BrokerError, ErrorCode

SCHEME: Final = "kafka://"
GROUP_PREFIX: Final = "fencelog-mirror."
GROUP_CHARS_MAX: Final = 200
# librdkafka settings the mirror sets itself: a user's value would break exactly once.
RESERVED_SETTINGS: Final = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "transactional.id",
        "enable.idempotence",
        "enable.auto.commit",
        "isolation.level",
        "enable.partition.eof",
    }
)
_HOST_PORT: Final = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")
_GROUP_SAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


class TopicShape(NamedTuple):
    """What a target topic is created with: the source's partitions and retention."""

    partitions: int
    cleanup: str = "delete"
    retention_ms: int | None = None
    retention_bytes: int | None = None


def cluster_servers(url: str) -> str:
    """kafka://HOST:PORT[,HOST:PORT] -> librdkafka's bootstrap.servers."""
    if not url.startswith(SCHEME):
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{url!r} is not a Kafka cluster's address",
            hint="give kafka://HOST:PORT[,HOST:PORT...]",
        )
    servers = url.removeprefix(SCHEME).split(",")
    for server in servers:
        found = _HOST_PORT.match(server)
        if found is None or not 0 < int(found.group(2)) < 65536:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{server!r} in {url!r} is not HOST:PORT",
                hint="give kafka://HOST:PORT[,HOST:PORT...]",
            )
    return ",".join(servers)


def kafka_settings(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """KEY=VALUE lines (already split from where they came: `where` names each) as
    librdkafka settings. Refuses a line without =, an empty key, and a setting the
    mirror sets itself; the value is never part of the message."""
    settings: dict[str, str] = {}
    for where, line in pairs:
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not key:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"--kafka-config {where} is not KEY=VALUE",
                hint="e.g. --kafka-config security.protocol=SASL_SSL",
            )
        if key in RESERVED_SETTINGS:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"--kafka-config {key} is set by the mirror itself",
                hint="leave it out; --to/--from and --group name the cluster and the group",
            )
        settings[key] = value.strip()
    return settings


def config_file_lines(text: str, path: str) -> list[tuple[str, str]]:
    """A --kafka-config file's settings: (where, KEY=VALUE), comments and blanks left out."""
    return [
        (f"{path} line {number}", line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def select_topics(patterns: Sequence[str], available: Iterable[str], where: str) -> list[str]:
    """The source topics the --topic values name, sorted; each value a name or a regex
    matched against whole names. Kafka's internal topics (__...) are never selected."""
    names = sorted(name for name in available if not name.startswith("__"))
    chosen: set[str] = set()
    for pattern in patterns:
        if re.escape(pattern) == pattern:  # a plain name
            if pattern not in names:
                raise BrokerError(
                    ErrorCode.UNKNOWN_TOPIC,
                    f"topic {pattern} is not on the source ({where})",
                    topic=pattern,
                    hint="check the name; a regular expression such as 'orders.*' selects many",
                )
            chosen.add(pattern)
            continue
        matched = [name for name in names if _full_match(pattern, name)]
        if not matched:
            raise BrokerError(
                ErrorCode.UNKNOWN_TOPIC,
                f"no topic on the source ({where}) matches {pattern!r}",
                hint="the pattern must match whole topic names",
            )
        chosen.update(matched)
    return sorted(chosen)


def _full_match(pattern: str, name: str) -> bool:
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error as exc:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--topic {pattern!r} is no regular expression: {exc}",
            hint="a plain topic name, or a regex such as 'orders.*'",
        ) from None


def check_target(topic: str, source: TopicShape, target_partitions: int | None) -> bool:
    """Whether the target topic must be created (None: it does not exist); refuses one
    with fewer partitions than the source, whose records would have nowhere to go."""
    if target_partitions is None:
        return True
    if target_partitions < source.partitions:
        raise BrokerError(
            ErrorCode.UNKNOWN_PARTITION,
            f"topic {topic} has {target_partitions} partitions on the target and "
            f"{source.partitions} on the source; records keep their partitions, so the "
            "mirror does not copy into fewer",
            topic=topic,
            hint=f"add partitions to the target's {topic} (to {source.partitions}) "
            "or delete it, and run the mirror again",
        )
    return False


def default_group(patterns: Sequence[str]) -> str:
    """The mirror's group when --group is not given: derived from the --topic values, so
    that the same command resumes where it stopped."""
    joined = ",".join(sorted(patterns))
    safe = _GROUP_SAFE.sub("_", joined)[: GROUP_CHARS_MAX - len(GROUP_PREFIX) - 9]
    if safe != joined:
        safe += "." + hashlib.sha256(joined.encode()).hexdigest()[:8]
    return GROUP_PREFIX + safe


def start_positions(
    committed: Mapping[int, int], log_starts: Sequence[int], ends: Sequence[int]
) -> dict[int, int]:
    """Where to read each source partition: the committed position (kept within the
    log: retention may have moved its start past it), else the log start."""
    positions = {}
    for partition, log_start in enumerate(log_starts):
        at = committed.get(partition, log_start)
        positions[partition] = min(max(at, log_start), max(ends[partition], log_start))
    return positions


def translated_offset(tail_offsets: Sequence[int], after: int, target_end: int) -> int:
    """The target offset of a group at `after` source records before the mirror's
    position: target_end when after is 0, else the offset of that record counted from
    the target's end (tail_offsets: the target's last offsets, ascending, at least
    `after` of them)."""
    assert after <= len(tail_offsets), "the caller reads enough of the target's tail"
    if after == 0:
        return target_end
    return tail_offsets[len(tail_offsets) - after]
