"""Kafka's topic ids (Metadata v10+, KIP-848's assignments) from fencelog's.

A Kafka topic id is a UUID, the same for the topic's life and another for a topic
re-created under the same name. fencelog's topic ids are integers that are never reused
(broker/storage/logs.py), so no new state is kept: a topic's UUID is the data
directory's Kafka cluster number (the 63-bit number of its cluster id, made once and
kept) in the high 8 bytes and the fencelog topic id in the low 8. Two data directories
give their topics different ids, a topic's id survives restarts, and an id maps back
to its topic without a table. The high bytes are never 0, so no topic gets Kafka's
"no topic id" (the zero UUID) or its metadata topic's id (0, 1).
"""

from __future__ import annotations

import uuid
from typing import Final

CLUSTER_PREFIX: Final = "fencelog-"


def cluster_number(cluster_id: str) -> int:
    """The number in a cluster id `fencelog-<16 hex digits>` (KafkaProducers.cluster_id)."""
    return int(cluster_id.removeprefix(CLUSTER_PREFIX), 16)


def topic_uuid(cluster: int, topic_id: int) -> uuid.UUID:
    return uuid.UUID(bytes=cluster.to_bytes(8, "big") + topic_id.to_bytes(8, "big"))


def fencelog_topic_id(cluster: int, kafka_id: uuid.UUID) -> int | None:
    """The fencelog topic id a Kafka topic id names, or None when it names none of this
    data directory's (another cluster's, or no id)."""
    raw = kafka_id.bytes
    if int.from_bytes(raw[:8], "big") != cluster:
        return None
    return int.from_bytes(raw[8:], "big")
