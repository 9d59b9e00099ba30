"""What the Kafka admin handler modules share: the handler's shape and the Kafka error
codes (org.apache.kafka.common.protocol.Errors) only they answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from broker.kafka.listener import KafkaConnection

# (connection, decoded request, version) -> the response body
Handler = Callable[["KafkaConnection", Any, int], Awaitable[Any]]

INVALID_REPLICA_ASSIGNMENT: Final = 39
NON_EMPTY_GROUP: Final = 68
GROUP_SUBSCRIBED_TO_TOPIC: Final = 86
SECURITY_DISABLED: Final = 54
TRANSACTIONAL_ID_NOT_FOUND: Final = 105
UNKNOWN_TOPIC_ID: Final = 100
