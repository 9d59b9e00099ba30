"""The operations a Kafka broker without an authorizer reports as authorized.

fencelog has no authorizer (broker/kafka/cluster.py): everything is allowed. When a
client asks which operations it may perform on a topic, the cluster or a group
(Metadata v8+, DescribeCluster, DescribeGroups v3+), Kafka without an authorizer answers
every operation the resource type supports, and so does fencelog: a bit field on the
wire, bit N for Kafka's AclOperation N (a set of N in kafka-python's classes). Not asked
for: None (INT32_MIN on the wire).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

# Kafka's AclOperation codes (org.apache.kafka.common.acl.AclOperation)
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12

# what each resource type supports (Kafka's AclEntry.supportedOperations)
TOPIC: Final = (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
CLUSTER: Final = (
    CREATE,
    ALTER,
    DESCRIBE,
    CLUSTER_ACTION,
    DESCRIBE_CONFIGS,
    ALTER_CONFIGS,
    IDEMPOTENT_WRITE,
)
GROUP: Final = (READ, DELETE, DESCRIBE)


def authorized(operations: Iterable[int], asked: object) -> set[int] | None:
    """The operations, if the request asked for them (else None)."""
    return set(operations) if asked else None
