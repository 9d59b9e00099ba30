"""Kafka's topic admin APIs on fencelog's topic operations: DeleteTopics, CreatePartitions,
DeleteRecords.

- DeleteTopics is `fencelog topic delete`: the topic's records, offsets and configs go.
  fencelog has no topic ids: a topic named only by id (v6) is UNKNOWN_TOPIC_ID.
- CreatePartitions is `fencelog topic alter --partitions`: never fewer partitions (a
  count at or below the current one is INVALID_PARTITIONS, as in Kafka); explicit
  assignments name broker 0, one replica each, one per new partition; validate_only
  checks and changes nothing.
- DeleteRecords moves a partition's log start as retention does (Engine.
  delete_records_below): the records below the offset go, in bounded steps; -1 is the
  high watermark; an offset past it is OFFSET_OUT_OF_RANGE. The answer's low watermark is
  the log start after.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Final

from kafka.protocol import admin

from broker.core import records as record_rules
from broker.errors import BrokerError, ErrorCode
from broker.kafka import wire
from broker.kafka.admin_codes import INVALID_REPLICA_ASSIGNMENT, UNKNOWN_TOPIC_ID, Handler

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi
    from broker.kafka.listener import KafkaConnection

NO_TOPIC_ID: Final = uuid.UUID(int=0)
_ERRORS: Final = {
    ErrorCode.UNKNOWN_TOPIC: wire.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_PARTITION: wire.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC_NAME: wire.INVALID_TOPIC_EXCEPTION,
    ErrorCode.INVALID_ARGUMENT: wire.INVALID_PARTITIONS,
    ErrorCode.OFFSET_OUT_OF_RANGE: wire.OFFSET_OUT_OF_RANGE,
}


def kafka_error(error: BrokerError) -> int:
    return _ERRORS.get(error.code, wire.UNKNOWN_SERVER_ERROR)


class TopicsAdmin:
    def __init__(self, api: KafkaApi) -> None:
        self.backend = api.backend

    def handlers(self) -> dict[int, Handler]:
        return {
            admin.DeleteTopicsRequest.API_KEY: self.delete_topics,
            admin.CreatePartitionsRequest.API_KEY: self.create_partitions,
            admin.DeleteRecordsRequest.API_KEY: self.delete_records,
        }

    # DeleteTopics -----------------------------------------------------------------------

    async def delete_topics(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        asked: list[tuple[str | None, Any]] = (
            [(t.name, t.topic_id) for t in body.topics]
            if version >= 6
            else [(name, NO_TOPIC_ID) for name in body.topic_names]
        )
        response = admin.DeleteTopicsResponse
        results = []
        for name, topic_id in asked:
            error, message = await self._delete(name)
            results.append(
                response.DeletableTopicResult(
                    name=name,
                    topic_id=topic_id,
                    error_code=error,
                    error_message=message,
                )
            )
        if any(result.error_code == wire.NONE for result in results):
            self.backend.wake()  # fetches parked on a deleted topic answer now
        return response(version=version, throttle_time_ms=0, responses=results)

    async def _delete(self, name: str | None) -> tuple[int, str | None]:
        if name is None:
            return UNKNOWN_TOPIC_ID, "fencelog names topics: it has no topic ids"
        writer = self.backend.writer
        try:
            await self.backend.write(lambda: writer.delete_topic(name))
        except BrokerError as error:
            return kafka_error(error), error.message
        return wire.NONE, None

    # CreatePartitions -------------------------------------------------------------------

    async def create_partitions(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.CreatePartitionsResponse
        results = []
        for topic in body.topics:
            error, message = await self._grow(topic, bool(body.validate_only))
            results.append(
                response.CreatePartitionsTopicResult(
                    name=topic.name, error_code=error, error_message=message
                )
            )
        return response(version=version, throttle_time_ms=0, results=results)

    async def _grow(self, topic: Any, validate_only: bool) -> tuple[int, str | None]:
        name, count = topic.name, topic.count
        reader, writer = self.backend.reader, self.backend.writer
        try:
            current = (await self.backend.read(lambda: reader.describe_topic(name))).partitions
            record_rules.check_partition_count(count, writer.limits)
            if count <= current:
                return wire.INVALID_PARTITIONS, (
                    f"topic {name} has {current} partitions: the new count must be more"
                )
            refused = _check_assignments(topic.assignments, count - current)
            if refused is not None:
                return INVALID_REPLICA_ASSIGNMENT, refused
            if not validate_only:
                await self.backend.write(lambda: writer.alter_topic(name, partitions=count))
        except BrokerError as error:
            return kafka_error(error), error.message
        return wire.NONE, None

    # DeleteRecords ----------------------------------------------------------------------

    async def delete_records(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DeleteRecordsResponse
        topic_cls = response.DeleteRecordsTopicResult
        topics = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                low, error = await self._cut(topic.name, part.partition_index, part.offset)
                partitions.append(
                    topic_cls.DeleteRecordsPartitionResult(
                        partition_index=part.partition_index, low_watermark=low, error_code=error
                    )
                )
            topics.append(topic_cls(name=topic.name, partitions=partitions))
        return response(version=version, throttle_time_ms=0, topics=topics)

    async def _cut(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        writer = self.backend.writer
        try:
            low = await self.backend.write(
                lambda: writer.delete_records_below(topic, partition, offset)
            )
        except BrokerError as error:
            return -1, kafka_error(error)
        return low, wire.NONE


def _check_assignments(assignments: Any, new_partitions: int) -> str | None:
    """Why CreatePartitions' explicit assignments are not this broker's, or None."""
    if assignments is None:
        return None
    if len(assignments) != new_partitions:
        return f"{len(assignments)} assignments for {new_partitions} new partitions"
    for assignment in assignments:
        if list(assignment.broker_ids) != [0]:
            return f"fencelog is one broker (0): replicas {list(assignment.broker_ids)}"
    return None
