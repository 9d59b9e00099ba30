"""What each Kafka API does to fencelog's engine (DESIGN.md section 11).

One engine, no second store: a Kafka request becomes the engine operations a native
request would, on the server's writer or reader (the Backend), and a produce joins the
server's group commit. The mappings users rely on:

- one broker (node 0) leads every partition; leader epochs are 0.
- Produce: a batch of an idempotent producer carries (pid, epoch, sequence) and is judged
  by the seed's rules, Kafka's sequence s being fencelog's s + 1, except that a newer
  epoch starts its sequences again at 0 (Kafka's rule: librdkafka bumps the epoch itself
  after a batch failed for good); a retry is answered with the original offsets. A
  transactional batch goes to its transaction's data journals: its records have no
  offset until the commit, so its answer's base offset is -1.
- Fetch: records are in the log only once committed, so the last stable offset is the
  high watermark and there are never aborted transactions to list, whatever the
  isolation level. No fetch sessions: every fetch is a full one (session id 0).
- Consumer groups: broker/kafka/groups.py; their offsets are fencelog's group offsets
  (what `fencelog consume --group` reads and commits).
- Kafka errors are Kafka's numbers; what fencelog knows more goes to the server's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from kafka.protocol import admin, consumer, metadata, producer, sasl
from msgspec import Struct

from broker.engine.engine import Engine, ProduceOutcome, ProduceRequest
from broker.errors import BrokerError, ErrorCode
from broker.kafka import authorized_ops, produce_errors, refusals, topic_ids, topic_requests, wire
from broker.kafka import offsets as kafka_offsets
from broker.kafka import records as kafka_records
from broker.kafka.cluster import Cluster
from broker.kafka.configs import Configs
from broker.kafka.fetch_budget import FetchBudget
from broker.kafka.groups import Coordinator
from broker.kafka.groups_admin import GroupsAdmin
from broker.kafka.groups_consumer import Heartbeat, TopicsView
from broker.kafka.listener import READ_AHEAD_FAILED, READ_AHEAD_STALE, READ_AHEAD_USED
from broker.kafka.refusals import Refusals
from broker.kafka.topic_requests import topic_config
from broker.kafka.topics_admin import TopicsAdmin
from broker.kafka.txn_admin import TxnAdmin
from broker.limits import Limits
from broker.types import AppendResult, PartitionInfo, ProducerFields, TopicConfig, TopicInfo

if TYPE_CHECKING:
    from broker.kafka.listener import KafkaConnection

log = logging.getLogger("fencelog.kafka")
T = TypeVar("T")
# A fetch's read: per topic (partition, Kafka error, high watermark, batch, log start)
Found = dict[str, list[tuple[int, int, int, bytes | None, int]]]
_AheadRead = tuple[Found, dict[str, int | None]]  # and each topic's creation time then


class ReadAheadKey(Struct, frozen=True):
    """What a fetch asks for, as far as its read goes: its partitions, their offsets
    and byte limits, and the answer's."""

    wanted: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]
    max_bytes: int

    @classmethod
    def of(
        cls, wanted: list[tuple[str, list[tuple[int, int, int]]]], max_bytes: int
    ) -> ReadAheadKey:
        return cls(tuple((topic, tuple(parts)) for topic, parts in wanted), max_bytes)


NODE_ID: Final = 0
OWNERSHIP_GROUP: Final = "kafka"  # the ownership group of consumer group generations
# ListOffsets' timestamps that ask for a place, not a time (Kafka's ListOffsetsRequest)
LATEST: Final = -1
EARLIEST: Final = -2
MAX_TIMESTAMP: Final = -3  # v7+ (KIP-734): the record with the greatest timestamp
EARLIEST_LOCAL: Final = -4  # v8+ (KIP-405): the local log's start, here the log start
LATEST_TIERED: Final = -5  # v9+ (KIP-1005): the last offset in tiered storage
EARLIEST_PENDING_UPLOAD: Final = -6  # v11+ (KIP-1023): the first not yet in tiered storage
_RECORD_OVERHEAD: Final = 16  # a record's bytes in a batch beyond its key and value, about


class Backend(Protocol):
    """What the listener needs of `fencelog serve` (broker/server/server.py)."""

    @property
    def writer(self) -> Engine: ...
    @property
    def reader(self) -> Engine: ...

    limits: Limits

    async def write(self, work: Callable[[], T]) -> T: ...
    async def read(self, work: Callable[[], T]) -> T: ...
    async def fetch_read(self, read: Callable[[Engine], T]) -> T: ...
    async def produce(self, request: ProduceRequest) -> ProduceOutcome: ...
    def appended(self, topic: str) -> asyncio.Event: ...
    def wake(self, topic: str | None = None) -> None: ...
    def stopping(self) -> bool: ...
    def answered(self, operation: str, seconds: float, error: str | None) -> None: ...
    def produced(self, topic: str, records: int, size: int) -> None: ...
    def fetched(self, topic: str, records: int, size: int) -> None: ...
    def read_ahead(self, outcome: str) -> None: ...


class KafkaApi:
    def __init__(
        self,
        backend: Backend,
        *,
        host: str,
        port: int,
        auth_token: str | None,
        auto_create: bool,
        default_partitions: int,
        cluster_id: str,
    ) -> None:
        self.backend = backend
        self.host = host
        self.port = port
        self.auth_token = auth_token
        self.auto_create = auto_create
        self.default_partitions = default_partitions
        self.cluster_id = cluster_id
        self.cluster_number = topic_ids.cluster_number(cluster_id)
        self.frame_bytes_max = backend.limits.frame_bytes_max
        self.connections_max = backend.limits.connections_max
        self.connections: set[KafkaConnection] = set()
        limits = backend.limits
        self.refusals = Refusals(
            limits.kafka_refusal_warn_interval_ms / 1000, limits.kafka_refusal_hosts_max
        )
        self.coordinator = Coordinator(self._next_generation)
        self._generation_claims = 0
        self._handlers: dict[int, Callable[[KafkaConnection, Any, int], Any]] = {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            3: self.metadata,
            8: self.offset_commit,
            9: self.offset_fetch,
            10: self.find_coordinator,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            17: self.sasl_handshake,
            18: self.api_versions,
            19: self.create_topics,
            22: self.init_producer_id,
            24: self.add_partitions_to_txn,
            25: self.add_offsets_to_txn,
            26: self.end_txn,
            28: self.txn_offset_commit,
            36: self.sasl_authenticate,
            wire.ConsumerGroupHeartbeatRequest.API_KEY: self.consumer_group_heartbeat,
            wire.ConsumerGroupDescribeRequest.API_KEY: self.consumer_group_describe,
        }
        for family in (TopicsAdmin, Configs, GroupsAdmin, TxnAdmin, Cluster):
            self._handlers.update(family(self).handlers())

    async def handle(self, connection: KafkaConnection, request: wire.Request) -> Any:
        handler = self._handlers[request.header.api_key]
        return await handler(connection, request.body, request.header.api_version)

    # ApiVersions, Metadata, FindCoordinator -------------------------------------------

    async def api_versions(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        return wire.api_versions_body(version)

    async def metadata(  # noqa: PLR0912
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        ids = await self.topics_view()
        names: list[str | None] | None = None
        by_id: dict[int, uuid.UUID] = {}  # index in names: the topic id asked (v12)
        if body.topics is not None:
            names = []
            for topic in body.topics:
                asked_id = getattr(topic, "topic_id", None) if version >= 10 else None
                if topic.name is None and asked_id is not None:
                    by_id[len(names)] = asked_id
                    names.append(self._topic_named(ids, asked_id))
                else:
                    names.append(topic.name)
        if version == 0 and not names:
            names = None  # v0: an empty list means every topic
        auto = body.allow_auto_topic_creation if version >= 4 else True
        topics = {t.name: t for t in await self.backend.read(self.backend.reader.list_topics)}
        response = metadata.MetadataResponse
        topic_cls = response.MetadataResponseTopic
        asked = getattr(body, "include_topic_authorized_operations", False)
        topic_ops = authorized_ops.authorized(authorized_ops.TOPIC, asked)
        answers = []
        created = False
        for index, name in enumerate(sorted(topics) if names is None else names):
            info = topics.get(name) if name is not None else None
            error = wire.NONE
            if index in by_id and name is None:
                answers.append(
                    topic_cls(
                        error_code=wire.UNKNOWN_TOPIC_ID,
                        name=None,
                        topic_id=by_id[index],
                        partitions=[],
                    )
                )
                continue
            if info is None and name is not None:
                info, error = await self._auto_create(name, auto)
                created = created or info is not None
            if info is None:
                answers.append(topic_cls(error_code=error, name=name, partitions=[]))
                continue
            answers.append(
                topic_cls(
                    error_code=wire.NONE,
                    name=info.name,
                    is_internal=False,
                    authorized_operations=topic_ops,
                    partitions=[
                        topic_cls.MetadataResponsePartition(
                            error_code=wire.NONE,
                            partition_index=p,
                            leader_id=NODE_ID,
                            leader_epoch=0,
                            replica_nodes=[NODE_ID],
                            isr_nodes=[NODE_ID],
                            offline_replicas=[],
                        )
                        for p in range(info.partitions)
                    ],
                )
            )
        if version >= 10:  # each topic's id (topic_ids.py)
            if created:
                ids = await self.topics_view()
            for answer in answers:
                if answer.error_code == wire.NONE and answer.name in ids:
                    answer.topic_id = ids[answer.name][0]
        return response(
            version=version,
            throttle_time_ms=0,
            brokers=[
                response.MetadataResponseBroker(
                    node_id=NODE_ID, host=self.host, port=self.port, rack=None
                )
            ],
            cluster_id=self.cluster_id,
            controller_id=NODE_ID,
            topics=answers,
            authorized_operations=authorized_ops.authorized(
                authorized_ops.CLUSTER,
                getattr(body, "include_cluster_authorized_operations", False),
            ),
        )

    async def topics_view(self) -> TopicsView:
        """Each topic's Kafka topic id (topic_ids.py) and partition count, by name."""
        kafka = self.backend.reader.kafka
        found = await self.backend.read(kafka.topic_ids)
        cluster = self.cluster_number
        return {
            name: (topic_ids.topic_uuid(cluster, tid), partitions)
            for name, (tid, partitions) in found.items()
        }

    @staticmethod
    def _topic_named(ids: TopicsView, asked: uuid.UUID) -> str | None:
        for name, (tid, _) in ids.items():
            if tid == asked:
                return name
        return None

    async def _auto_create(self, name: str, allowed: bool) -> tuple[TopicInfo | None, int]:
        if not (allowed and self.auto_create):
            from broker.core import records as record_rules  # the name check, without a write

            try:  # a name no topic can have is said at once, as Kafka does
                record_rules.check_topic_name(name, self.backend.writer.limits)
            except BrokerError:
                return None, wire.INVALID_TOPIC_EXCEPTION
            return None, wire.UNKNOWN_TOPIC_OR_PARTITION
        writer = self.backend.writer
        try:
            created = await self.backend.write(
                lambda: writer.create_topic(name, self.default_partitions)
            )
        except BrokerError as error:
            if error.code is ErrorCode.TOPIC_EXISTS:
                return await self.backend.read(lambda: self.backend.reader.describe_topic(name)), 0
            if error.code is ErrorCode.INVALID_TOPIC_NAME:
                return None, wire.INVALID_TOPIC_EXCEPTION
            raise
        log.info("created topic %s (%d partitions) for a Kafka client", name, created.partitions)
        return created, wire.NONE

    async def find_coordinator(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = metadata.FindCoordinatorResponse
        if version >= 4:
            return response(
                version=version,
                throttle_time_ms=0,
                coordinators=[
                    response.Coordinator(
                        key=key,
                        node_id=NODE_ID,
                        host=self.host,
                        port=self.port,
                        error_code=wire.NONE,
                        error_message=None,
                    )
                    for key in body.coordinator_keys
                ],
            )
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            error_message=None,
            node_id=NODE_ID,
            host=self.host,
            port=self.port,
        )

    # Produce --------------------------------------------------------------------------

    async def produce(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        work = [
            (topic.name, part.index, self._produce_partition(topic.name, part.index, part.records))
            for topic in body.topic_data
            for part in topic.partition_data
        ]
        outcomes = await asyncio.gather(*(coroutine for _, _, coroutine in work))
        response = producer.ProduceResponse
        topic_cls = response.TopicProduceResponse
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition, _), (error, base_offset, message, refused) in zip(
            work, outcomes, strict=True
        ):
            by_topic.setdefault(topic, []).append(
                topic_cls.PartitionProduceResponse(
                    index=partition,
                    error_code=error,
                    base_offset=base_offset,
                    log_append_time_ms=-1,
                    log_start_offset=0,
                    record_errors=refused,
                    error_message=message,
                )
            )
        return response(
            version=version,
            throttle_time_ms=0,
            responses=[
                topic_cls(name=name, partition_responses=parts) for name, parts in by_topic.items()
            ],
        )

    async def _produce_partition(
        self, topic: str, partition: int, data: bytes | None
    ) -> tuple[int, int, str | None, list[Any]]:
        """(Kafka error, base offset, message, record errors) of one partition's record
        batches."""
        try:
            batches = kafka_records.read_batches(data, partition)
        except kafka_records.BadRecords as bad:
            log.info("refused a Kafka produce to %s/%d: %s", topic, partition, bad)
            return bad.code, -1, str(bad), []
        base_offset = -1
        first_index = 0  # of the batch's first record in the partition's data
        for index, batch in enumerate(batches):
            try:
                offset = await self._produce_batch(topic, batch)
            except BrokerError as error:
                code = _produce_error(error)
                if code == wire.UNKNOWN_SERVER_ERROR:
                    log.error("a Kafka produce to %s/%d failed: %s", topic, partition, error)
                return code, -1, error.message, produce_errors.record_errors(error, first_index)
            if index == 0:
                base_offset = offset
            first_index += len(batch.records)
        return wire.NONE, base_offset, None, []

    async def _produce_batch(self, topic: str, batch: kafka_records.ProducedBatch) -> int:
        backend = self.backend
        if batch.transactional:
            pid, epoch = batch.producer_id, batch.producer_epoch
            writer = backend.writer
            txn_id = await backend.write(lambda: writer.kafka.open_txn(pid, epoch))
            fields = ProducerFields(0, 0, batch.base_sequence + 1, 0, txn_id)
            await backend.write(
                lambda: writer.produce(topic, batch.records, producer=fields, kafka=True)
            )
            return -1  # the records take their offsets at the commit
        if batch.producer_id >= 0:
            fields = ProducerFields(
                batch.producer_id, batch.producer_epoch, batch.base_sequence + 1
            )
        else:
            fields = ProducerFields()
        request = ProduceRequest(topic, batch.records, fields, kafka_epochs=True)
        outcome = await backend.produce(request)
        if isinstance(outcome, BrokerError):
            raise outcome
        first: AppendResult = outcome[0]
        return first.offset

    # Fetch ----------------------------------------------------------------------------

    async def fetch(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        loop = asyncio.get_running_loop()
        limits = self.backend.limits
        wait_s = max(0, min(body.max_wait_ms, limits.fetch_wait_ms_max)) / 1000
        deadline = loop.time() + wait_s
        wanted = [
            (t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
            for t in body.topics
        ]
        max_bytes = body.max_bytes if version >= 3 else 0x7FFFFFFF
        min_bytes = max(1, body.min_bytes)
        ahead = connection.take_read_ahead(ReadAheadKey.of(wanted, max_bytes))
        while True:
            events = {topic: self.backend.appended(topic) for topic, _ in wanted}
            found = await self._read_or_take(wanted, max_bytes, ahead)
            ahead = None
            size = sum(len(part[3] or b"") for parts in found.values() for part in parts)
            errors = any(part[1] for parts in found.values() for part in parts)
            remaining = deadline - loop.time()
            if size >= min_bytes or errors or remaining <= 0 or self.backend.stopping():
                break
            waits = [asyncio.ensure_future(event.wait()) for event in events.values()]
            if not waits:
                await asyncio.sleep(remaining)
                break
            _, pending = await asyncio.wait(
                waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for waiting in pending:
                waiting.cancel()
        for topic, parts in found.items():
            for _, _, _, batch, _ in parts:
                if batch:
                    self.backend.fetched(topic, kafka_records.count_of(batch), len(batch))
        following = _following(wanted, found)
        if following:
            connection.read_ahead_after_answer(
                ReadAheadKey.of(following, max_bytes),
                lambda: self.backend.fetch_read(
                    lambda reader: _read_fetch_ahead(reader, following, max_bytes)
                ),
            )
        response = consumer.FetchResponse
        topic_cls = response.FetchableTopicResponse
        part_cls = topic_cls.PartitionData
        read_committed = version >= 4 and body.isolation_level == 1
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            session_id=0,
            responses=[
                topic_cls(
                    topic=topic,
                    partitions=[
                        part_cls(
                            partition_index=partition,
                            error_code=error,
                            high_watermark=end,
                            last_stable_offset=end,
                            log_start_offset=start,
                            aborted_transactions=[] if read_committed else None,
                            preferred_read_replica=-1,
                            records=batch or b"",
                        )
                        for partition, error, end, batch, start in parts
                    ],
                )
                for topic, parts in found.items()
            ],
        )

    async def _read_or_take(
        self,
        wanted: list[tuple[str, list[tuple[int, int, int]]]],
        max_bytes: int,
        ahead: asyncio.Future[_AheadRead] | None,
    ) -> Found:
        """The fetch's read: the one read ahead for it where there is one and each of its
        topics is still the one it read (not deleted, or deleted and created again)."""
        if ahead is not None:
            outcome = READ_AHEAD_FAILED  # a failed read ahead: read now
            with contextlib.suppress(Exception):
                found, created = await ahead
                now = await self.backend.fetch_read(lambda reader: _created(reader, created))
                outcome = READ_AHEAD_USED if now == created else READ_AHEAD_STALE
            self.backend.read_ahead(outcome)
            if outcome == READ_AHEAD_USED:
                return found
        return await self.backend.fetch_read(lambda reader: _read_fetch(reader, wanted, max_bytes))

    # ListOffsets ----------------------------------------------------------------------

    async def list_offsets(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        reader = self.backend.reader
        wanted = [
            (t.name, [(p.partition_index, p.timestamp) for p in t.partitions]) for t in body.topics
        ]
        found = await self.backend.read(lambda: _read_offsets(reader, wanted))
        response = consumer.ListOffsetsResponse
        topic_cls = response.ListOffsetsTopicResponse
        return response(
            version=version,
            throttle_time_ms=0,
            topics=[
                topic_cls(
                    name=topic,
                    partitions=[
                        topic_cls.ListOffsetsPartitionResponse(
                            partition_index=partition,
                            error_code=error,
                            timestamp=timestamp,
                            offset=offset,
                            leader_epoch=0 if offset >= 0 else -1,
                        )
                        for partition, error, timestamp, offset in parts
                    ],
                )
                for topic, parts in found
            ],
        )

    # CreateTopics ---------------------------------------------------------------------

    async def create_topics(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.CreateTopicsResponse
        results = []
        for topic in body.topics:
            partitions = -1
            message: str | None
            try:
                partitions = topic_requests.partitions_asked(
                    topic.name,
                    topic.num_partitions,
                    topic.replication_factor,
                    [(a.partition_index, list(a.broker_ids)) for a in topic.assignments or ()],
                    self.default_partitions,
                )
                config = topic_config(topic.name, {c.name: c.value for c in topic.configs or ()})
            except topic_requests.Refused as refused:
                error, message = refused.code, refused.message
            except BrokerError as invalid:
                error, message = wire.INVALID_CONFIG, invalid.message
            else:
                error, message = await self._create_topic(
                    topic.name, partitions, body.validate_only, config
                )
            results.append(
                response.CreatableTopicResult(
                    name=topic.name,
                    error_code=error,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=partitions if error == wire.NONE else -1,
                    replication_factor=1 if error == wire.NONE else -1,
                    configs=[],
                )
            )
        return response(version=version, throttle_time_ms=0, topics=results)

    async def _create_topic(
        self, name: str, partitions: int, validate_only: bool, config: TopicConfig | None
    ) -> tuple[int, str | None]:
        """Create the topic, or with validate_only check that it could be, creating
        nothing; (Kafka error, message)."""
        writer = self.backend.writer
        from broker.core import records as record_rules  # the topic checks, without a write

        try:
            record_rules.check_topic_name(name, writer.limits)
            record_rules.check_partition_count(partitions, writer.limits)
            if validate_only:
                await self._refuse_existing(name)
            else:
                await self.backend.write(
                    lambda: writer.create_topic(name, partitions, config=config)
                )
        except BrokerError as error:
            code = {
                ErrorCode.TOPIC_EXISTS: wire.TOPIC_ALREADY_EXISTS,
                ErrorCode.INVALID_TOPIC_NAME: wire.INVALID_TOPIC_EXCEPTION,
                ErrorCode.INVALID_ARGUMENT: wire.INVALID_PARTITIONS,
            }.get(error.code)
            if code is None:
                raise
            return code, error.message
        return wire.NONE, None

    async def _refuse_existing(self, name: str) -> None:
        """TOPIC_EXISTS when the topic exists (what creating it would say)."""
        reader = self.backend.reader
        try:
            await self.backend.read(lambda: reader.describe_topic(name))
        except BrokerError as error:
            if error.code is ErrorCode.UNKNOWN_TOPIC:
                return
            raise
        raise BrokerError(ErrorCode.TOPIC_EXISTS, f"topic {name} already exists")

    # consumer groups ------------------------------------------------------------------

    async def _next_generation(self, group_id: str) -> int:
        """A new generation for the group from the ownership table: a claim by a new
        session, which severs no live holder (the older ones are gone) and so takes the
        current generation + 1."""
        self._generation_claims += 1
        session = f"kafka-coordinator:{id(self)}:{self._generation_claims}"
        owners = self.backend.writer.owners
        result = await self.backend.write(
            lambda: owners.own(session, OWNERSHIP_GROUP, [(group_id, 1)])
        )
        generation: int = result.claimed[0].generation
        await self.backend.write(lambda: owners.release(session, OWNERSHIP_GROUP, [group_id]))
        return generation

    async def join_group(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        result = await self.coordinator.join(
            body.group_id,
            body.member_id,
            body.group_instance_id if version >= 5 else None,
            connection.client_id,
            body.session_timeout_ms,
            body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms,
            body.protocol_type,
            [(p.name, bytes(p.metadata)) for p in body.protocols],
        )
        response = consumer.JoinGroupResponse
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name or ("" if version < 7 else None),
            leader=result.leader,
            member_id=result.member_id,
            members=[
                response.JoinGroupResponseMember(
                    member_id=member_id, group_instance_id=instance, metadata=data
                )
                for member_id, instance, data in result.members
            ],
        )

    async def sync_group(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        result = await self.coordinator.sync(
            body.group_id,
            body.generation_id,
            body.member_id,
            {a.member_id: bytes(a.assignment) for a in body.assignments},
            body.group_instance_id if version >= 3 else None,
        )
        return consumer.SyncGroupResponse(
            version=version,
            throttle_time_ms=0,
            error_code=result.error,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def heartbeat(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        instance = body.group_instance_id if version >= 3 else None
        error = self.coordinator.heartbeat(
            body.group_id, body.generation_id, body.member_id, instance
        )
        return consumer.HeartbeatResponse(version=version, throttle_time_ms=0, error_code=error)

    async def leave_group(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = consumer.LeaveGroupResponse
        if version < 3:
            (error,) = self.coordinator.leave(body.group_id, [(body.member_id, None)])
            return response(version=version, throttle_time_ms=0, error_code=error)
        leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        errors = self.coordinator.leave(body.group_id, leaving)
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            members=[
                response.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
                for (m, i), e in zip(leaving, errors, strict=True)
            ],
        )

    async def offset_commit(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        error = self.coordinator.check_commit(
            body.group_id,
            body.generation_id_or_member_epoch,
            body.member_id,
            body.group_instance_id if version >= 7 else None,
        )
        writer = self.backend.writer
        response = consumer.OffsetCommitResponse
        topic_cls = response.OffsetCommitResponseTopic
        topics = await self._commit_each_topic(
            body.topics,
            error,
            lambda name, asked: writer.commit_offset_details(
                body.group_id, name, asked.offsets, asked.details
            ),
            _group_error,
            with_epochs=version >= 6,
        )
        return response(
            version=version,
            throttle_time_ms=0,
            topics=[
                topic_cls(
                    name=name,
                    partitions=[
                        topic_cls.OffsetCommitResponsePartition(partition_index=p, error_code=code)
                        for p, code in partitions
                    ],
                )
                for name, partitions in topics
            ],
        )

    async def _commit_each_topic(
        self,
        topics: Any,
        error: int,
        commit: Callable[[str, kafka_offsets.CommitAsked], None],
        kafka_error: Callable[[BrokerError], int],
        *,
        with_epochs: bool,
    ) -> list[tuple[str, list[tuple[int, int]]]]:
        """(topic, [(partition, Kafka error)]) of each topic's offsets, committed one
        topic per write unless error already refuses them all."""
        answers = []
        limits = self.backend.limits
        for topic in topics:
            asked = kafka_offsets.commit_asked(topic.partitions, limits, with_epochs=with_epochs)
            code = error
            if code == wire.NONE and asked.offsets:
                try:
                    await self.backend.write(partial(commit, topic.name, asked))
                except BrokerError as failed:
                    code = kafka_error(failed)
            indexes = [p.partition_index for p in topic.partitions]
            refused = asked.refused if error == wire.NONE else {}  # error answers them all
            answers.append((topic.name, [(p, refused.get(p, code)) for p in indexes]))
        return answers

    async def offset_fetch(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        stable = version >= 7 and bool(body.require_stable)
        if version >= 8:
            return await self._offset_fetch_groups(body, version, stable)
        asked = (
            None
            if body.topics is None
            else [(t.name, list(t.partition_indexes)) for t in body.topics]
        )
        error, found = await self._committed(body.group_id, asked, stable)
        response = consumer.OffsetFetchResponse
        topic_cls = response.OffsetFetchResponseTopic
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=error,
            topics=_fetched_topics(topic_cls, topic_cls.OffsetFetchResponsePartition, found),
        )

    async def _committed(
        self, group: str, asked: list[tuple[str, list[int]]] | None, stable: bool
    ) -> tuple[int, list[tuple[str, list[Any]]]]:
        reader = self.backend.reader
        try:
            found = await self.backend.read(
                lambda: kafka_offsets.read_committed(reader, group, asked, stable)
            )
        except BrokerError as failed:
            return _group_error(failed), []
        return wire.NONE, found

    async def _offset_fetch_groups(self, body: Any, version: int, stable: bool) -> Any:
        """OffsetFetch v8+: several groups at once; from v9 a consumer group's member
        names itself and its epoch, which must be current."""
        response = consumer.OffsetFetchResponse
        group_cls = response.OffsetFetchResponseGroup
        topic_cls = group_cls.OffsetFetchResponseTopics
        groups = []
        for asked_group in body.groups:
            asked = (
                None
                if asked_group.topics is None
                else [(t.name, list(t.partition_indexes)) for t in asked_group.topics]
            )
            error = wire.NONE
            if version >= 9 and asked_group.group_id in self.coordinator.consumer.groups:
                error = self.coordinator.consumer.check_fetch(
                    asked_group.group_id, asked_group.member_epoch, asked_group.member_id
                )
            found: list[tuple[str, list[Any]]] = []
            if error == wire.NONE:
                error, found = await self._committed(asked_group.group_id, asked, stable)
            groups.append(
                group_cls(
                    group_id=asked_group.group_id,
                    error_code=error,
                    topics=_fetched_topics(
                        topic_cls, topic_cls.OffsetFetchResponsePartitions, found
                    ),
                )
            )
        return response(version=version, throttle_time_ms=0, groups=groups)

    # KIP-848: ConsumerGroupHeartbeat, ConsumerGroupDescribe ---------------------------

    async def consumer_group_heartbeat(
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        request = Heartbeat(
            body.group_id,
            body.member_id,
            body.member_epoch,
            body.instance_id,
            body.rack_id,
            body.rebalance_timeout_ms,
            None if body.subscribed_topic_names is None else list(body.subscribed_topic_names),
            body.subscribed_topic_regex if version >= 1 else None,
            body.server_assignor,
            None
            if body.topic_partitions is None
            else [(t.topic_id, list(t.partitions)) for t in body.topic_partitions],
        )
        host = connection.peer.rpartition(":")[0]
        result = await self.coordinator.consumer.heartbeat(
            request, connection.client_id, host, self.topics_view
        )
        response = wire.ConsumerGroupHeartbeatResponse
        assignment = None
        if result.assignment is not None:
            assignment = response.Assignment(
                topic_partitions=[
                    response.Assignment.TopicPartitions(topic_id=tid, partitions=parts)
                    for tid, parts in result.assignment
                ]
            )
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=result.error,
            error_message=result.message,
            member_id=result.member_id,
            member_epoch=result.epoch,
            heartbeat_interval_ms=result.interval_ms,
            assignment=assignment,
        )

    async def consumer_group_describe(
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        from broker.kafka.groups_admin import describe_consumer_groups

        return await describe_consumer_groups(self, body, version)

    # transactions ---------------------------------------------------------------------

    async def init_producer_id(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = producer.InitProducerIdResponse
        writer = self.backend.writer
        tid, timeout = body.transactional_id, body.transaction_timeout_ms
        try:
            found = await self.backend.write(lambda: writer.kafka.init(tid, timeout))
        except BrokerError as error:
            code = wire.INVALID_TRANSACTION_TIMEOUT
            if error.code is not ErrorCode.INVALID_ARGUMENT:
                code = _txn_error(error)
            log.info("refused InitProducerId (%s): %s", tid, error.message)
            return response(
                version=version,
                throttle_time_ms=0,
                error_code=code,
                producer_id=-1,
                producer_epoch=-1,
            )
        if tid is not None:
            log.info(
                "transactional id %s: producer %d epoch %d", tid, found.producer_id, found.epoch
            )
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            producer_id=found.producer_id,
            producer_epoch=found.epoch,
        )

    async def _begin(self, tid: str, pid: int, epoch: int) -> tuple[int, int]:
        """The open transaction of tid (begun if need be), or a Kafka error."""
        writer = self.backend.writer
        try:
            return await self.backend.write(lambda: writer.kafka.begin(tid, pid, epoch)), wire.NONE
        except BrokerError as error:
            return -1, _txn_error(error)

    async def add_partitions_to_txn(
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        tid = body.v3_and_below_transactional_id
        _, error = await self._begin(
            tid, body.v3_and_below_producer_id, body.v3_and_below_producer_epoch
        )
        topics = {t.name: list(t.partitions) for t in body.v3_and_below_topics}
        known = {
            t.name: t.partitions for t in await self.backend.read(self.backend.reader.list_topics)
        }
        response = producer.AddPartitionsToTxnResponse
        result_cls = response.AddPartitionsToTxnTopicResult
        results = []
        for name, partitions in topics.items():
            codes = []
            for p in partitions:
                code = error
                if name not in known or not 0 <= p < known[name]:
                    code = wire.UNKNOWN_TOPIC_OR_PARTITION
                codes.append(
                    result_cls.AddPartitionsToTxnPartitionResult(
                        partition_index=p, partition_error_code=code
                    )
                )
            results.append(result_cls(name=name, results_by_partition=codes))
        return response(version=version, throttle_time_ms=0, results_by_topic_v3_and_below=results)

    async def add_offsets_to_txn(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        _, error = await self._begin(body.transactional_id, body.producer_id, body.producer_epoch)
        return producer.AddOffsetsToTxnResponse(
            version=version, throttle_time_ms=0, error_code=error
        )

    async def txn_offset_commit(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        txn_id, error = await self._begin(
            body.transactional_id, body.producer_id, body.producer_epoch
        )
        if error == wire.NONE and version >= 3 and body.generation_id >= 0:
            error = self.coordinator.check_commit(
                body.group_id, body.generation_id, body.member_id, body.group_instance_id
            )
        writer = self.backend.writer
        response = producer.TxnOffsetCommitResponse
        topic_cls = response.TxnOffsetCommitResponseTopic
        topics = await self._commit_each_topic(
            body.topics,
            error,
            lambda name, asked: writer.txn_commit_offset_details(
                txn_id, body.group_id, name, asked.offsets, asked.details
            ),
            _txn_error,
            with_epochs=version >= 2,
        )
        return response(
            version=version,
            throttle_time_ms=0,
            topics=[
                topic_cls(
                    name=name,
                    partitions=[
                        topic_cls.TxnOffsetCommitResponsePartition(
                            partition_index=p, error_code=code
                        )
                        for p, code in partitions
                    ],
                )
                for name, partitions in topics
            ],
        )

    async def end_txn(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        writer = self.backend.writer
        tid, pid, epoch, commit = (
            body.transactional_id,
            body.producer_id,
            body.producer_epoch,
            body.committed,
        )
        try:
            await self.backend.write(lambda: writer.kafka.end(tid, pid, epoch, commit))
            error = wire.NONE
        except BrokerError as failed:
            error = _txn_error(failed)
            log.info(
                "EndTxn of %s (%s) refused: %s",
                tid,
                "commit" if commit else "abort",
                failed.message,
            )
        if commit and error == wire.NONE:
            self.backend.wake()
        return producer.EndTxnResponse(version=version, throttle_time_ms=0, error_code=error)

    # SASL -----------------------------------------------------------------------------

    async def sasl_handshake(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        ok = body.mechanism == "PLAIN"
        connection.sasl_mechanism = body.mechanism if ok else None
        return sasl.SaslHandshakeResponse(
            version=version,
            error_code=wire.NONE if ok else wire.UNSUPPORTED_SASL_MECHANISM,
            mechanisms=["PLAIN"],
        )

    async def sasl_authenticate(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = sasl.SaslAuthenticateResponse
        if connection.sasl_mechanism != "PLAIN":
            return response(
                version=version,
                error_code=wire.ILLEGAL_SASL_STATE,
                error_message="SaslHandshake with mechanism PLAIN comes first",
                auth_bytes=b"",
            )
        if not connection.authenticate(bytes(body.auth_bytes)):
            connection.log_refusal(
                refusals.REFUSED_AUTH_FAILED,
                f"Kafka connection {connection.peer}: SASL/PLAIN authentication failed",
            )
            return response(
                version=version,
                error_code=wire.SASL_AUTHENTICATION_FAILED,
                error_message="authentication failed: the password must be the server's auth token",
                auth_bytes=b"",
            )
        return response(
            version=version,
            error_code=wire.NONE,
            error_message=None,
            auth_bytes=b"",
            session_lifetime_ms=0,
        )

    # life cycle -----------------------------------------------------------------------

    async def stop(self) -> None:
        await self.coordinator.stop()


# readers (run on a reading thread: the reader, or for a fetch the reader or the fetcher) ---


def _read_fetch(
    reader: Engine,
    wanted: list[tuple[str, list[tuple[int, int, int]]]],
    max_bytes: int,
    created: dict[str, int | None] | None = None,
) -> Found:
    """Per topic: (partition, Kafka error, high watermark, one record batch or None, log
    start offset); the batches within max_bytes and each partition's max bytes as Kafka
    keeps them (broker/kafka/fetch_budget.py). Each topic's creation time goes into
    `created` where given (None: no such topic)."""
    found: Found = {}
    budget = FetchBudget(max_bytes)
    for topic, partitions in wanted:
        parts = found.setdefault(topic, [])
        try:
            info = reader.describe_topic(topic)
        except BrokerError:
            parts.extend(
                (p, wire.UNKNOWN_TOPIC_OR_PARTITION, -1, None, -1) for p, _, _ in partitions
            )
            if created is not None:
                created[topic] = None
            continue
        if created is not None:
            created[topic] = info.created_ms
        details = {p.partition: p for p in info.partition_details}
        for partition, offset, partition_max in partitions:
            detail = details.get(partition)
            if detail is None:
                parts.append((partition, wire.UNKNOWN_TOPIC_OR_PARTITION, -1, None, -1))
                continue
            end = detail.end_offset
            if offset < detail.start_offset or offset > end:
                parts.append((partition, wire.OFFSET_OUT_OF_RANGE, end, None, detail.start_offset))
                continue
            batch = None
            if offset < end and not budget.exhausted():
                limit = min(partition_max, budget.left_bytes)
                records = _records_in(detail, limit)
                page = reader.fetch_kafka_page(topic, partition, offset, records, limit)
                if page is not None and kafka_records.uniform(page):
                    assert isinstance(page.value_lengths, int)
                    count = budget.take_uniform(
                        kafka_records.uniform_batches(page), page.value_lengths, limit
                    )
                    if count:
                        batch = kafka_records.encode_uniform(page, count)
                        end = max(end, page.offset + count)
                else:
                    stored = reader.fetch_kafka_rows(topic, partition, offset, records)
                    taken = budget.take(stored, partition_max)
                    if taken:
                        batch = kafka_records.encode_batch(taken)
                        end = max(end, taken[-1][0] + 1)
            parts.append((partition, wire.NONE, end, batch, detail.start_offset))
    return found


def _following(
    wanted: list[tuple[str, list[tuple[int, int, int]]]], found: Found
) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """What the consumer's next fetch asks for if this answer left every partition it
    asked for behind its end (a consumer catching up): the same partitions and limits,
    each from after the records answered. Empty: a partition answered an error, nothing,
    or its last record, so the next fetch may wait or ask for something else."""
    following: list[tuple[str, list[tuple[int, int, int]]]] = []
    for topic, partitions in wanted:
        answered = {part[0]: part for part in found.get(topic, [])}
        nexts = []
        for partition, _, partition_max in partitions:
            part = answered.get(partition)
            if part is None or part[1] or not part[3]:
                return []
            after = kafka_records.next_offset(part[3])
            if after >= part[2]:
                return []
            nexts.append((partition, after, partition_max))
        following.append((topic, nexts))
    return following


def _read_fetch_ahead(
    reader: Engine, wanted: list[tuple[str, list[tuple[int, int, int]]]], max_bytes: int
) -> _AheadRead:
    """_read_fetch, and the creation time of each topic it read (None: none such)."""
    created: dict[str, int | None] = {}
    return _read_fetch(reader, wanted, max_bytes, created), created


def _created(reader: Engine, topics: dict[str, int | None]) -> dict[str, int | None]:
    """Each topic's creation time now (None: it does not exist)."""
    now: dict[str, int | None] = {}
    for topic in topics:
        try:
            now[topic] = reader.describe_topic(topic).created_ms
        except BrokerError:
            now[topic] = None
    return now


def _records_in(detail: PartitionInfo, limit: int) -> int:
    """About how many of the partition's records fit in limit bytes (its average record
    size says), so a fetch reads no rows it then drops."""
    average = detail.bytes // detail.records if detail.records else 0
    return max(1, limit // (average + _RECORD_OVERHEAD) + 1)


def _read_offsets(
    reader: Engine, wanted: list[tuple[str, list[tuple[int, int]]]]
) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """Per topic: (partition, Kafka error, timestamp, offset) for each asked timestamp."""
    answers = []
    for topic, partitions in wanted:
        parts: list[tuple[int, int, int, int]] = []
        try:
            info = reader.describe_topic(topic)
        except BrokerError:
            parts.extend((p, wire.UNKNOWN_TOPIC_OR_PARTITION, -1, -1) for p, _ in partitions)
            answers.append((topic, parts))
            continue
        ends = {p.partition: (p.start_offset, p.end_offset) for p in info.partition_details}
        for partition, timestamp in partitions:
            bounds = ends.get(partition)
            if bounds is None:
                parts.append((partition, wire.UNKNOWN_TOPIC_OR_PARTITION, -1, -1))
            elif timestamp == LATEST:
                parts.append((partition, wire.NONE, -1, bounds[1]))
            elif timestamp in (EARLIEST, EARLIEST_LOCAL):  # no tiered storage: one log
                parts.append((partition, wire.NONE, -1, bounds[0]))
            elif timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
                # nothing is ever in tiered storage: -1, as a Kafka broker without it says
                parts.append((partition, wire.NONE, -1, -1))
            elif timestamp == MAX_TIMESTAMP:
                at = reader.offset_of_greatest_time(topic, partition)
                parts.append((partition, wire.NONE, *(at[::-1] if at else (-1, -1))))
            elif timestamp < 0:
                parts.append((partition, wire.UNSUPPORTED_VERSION, -1, -1))
            else:
                at = reader.offset_for_time(topic, partition, timestamp)
                parts.append((partition, wire.NONE, *(at[::-1] if at else (-1, -1))))
        answers.append((topic, parts))
    return answers


# errors ---------------------------------------------------------------------------------


# fencelog's errors as Kafka's, for every API; then what an API answers differently
_ERRORS: Final = {
    ErrorCode.UNKNOWN_TOPIC: wire.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC_NAME: wire.INVALID_TOPIC_EXCEPTION,
    ErrorCode.UNKNOWN_PARTITION: wire.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED: wire.INVALID_PRODUCER_EPOCH,
    ErrorCode.INVALID_GENERATION: wire.INVALID_PRODUCER_EPOCH,
    ErrorCode.TXN_NOT_OPEN: wire.INVALID_TXN_STATE,
    ErrorCode.TXN_ABORTED: wire.INVALID_TXN_STATE,
    ErrorCode.UNKNOWN_TXN: wire.INVALID_TXN_STATE,
    ErrorCode.INVALID_NAME: wire.INVALID_REQUEST,
    ErrorCode.INVALID_ARGUMENT: wire.INVALID_REQUEST,
}
_PRODUCE_ERRORS: Final = _ERRORS | {
    # the transaction was aborted under the producer (Kafka: its epoch was bumped)
    ErrorCode.TXN_ABORTED: wire.INVALID_PRODUCER_EPOCH,
    # a record the broker refuses (no key on a compacted topic, a bad header): Kafka's
    # INVALID_RECORD, not INVALID_REQUEST (the request itself was well formed)
    ErrorCode.INVALID_ARGUMENT: wire.INVALID_RECORD,
    ErrorCode.RECORD_TOO_LARGE: wire.MESSAGE_TOO_LARGE,
    ErrorCode.INVALID_TOPIC_NAME: wire.INVALID_TOPIC_EXCEPTION,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: wire.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.PID_EXPIRED: wire.UNKNOWN_PRODUCER_ID,
    ErrorCode.UNKNOWN_PID: wire.UNKNOWN_PRODUCER_ID,
    ErrorCode.STORAGE_BUSY: wire.KAFKA_STORAGE_ERROR,
    ErrorCode.PRODUCER_BUSY: wire.CONCURRENT_TRANSACTIONS,
}
_TXN_ERRORS: Final = _ERRORS | {
    # aborted without EndTxn (timed out): Kafka fences that incarnation (KAFKA-20785)
    ErrorCode.TXN_ABORTED: wire.PRODUCER_FENCED,
    ErrorCode.UNKNOWN_PID: wire.INVALID_PRODUCER_ID_MAPPING,
    ErrorCode.STORAGE_BUSY: wire.CONCURRENT_TRANSACTIONS,
}
_GROUP_ERRORS: Final = _ERRORS | {ErrorCode.INVALID_NAME: wire.INVALID_GROUP_ID}


def _produce_error(error: BrokerError) -> int:
    return _PRODUCE_ERRORS.get(error.code, wire.UNKNOWN_SERVER_ERROR)


def _txn_error(error: BrokerError) -> int:
    return _TXN_ERRORS.get(error.code, wire.UNKNOWN_SERVER_ERROR)


def _group_error(error: BrokerError) -> int:
    return _GROUP_ERRORS.get(error.code, wire.UNKNOWN_SERVER_ERROR)


def _fetched_topics(
    topic_cls: Any,
    partition_cls: Any,
    found: Sequence[tuple[str, Sequence[kafka_offsets.Committed]]],
) -> list[Any]:
    """OffsetFetch's topics of committed offsets, in the classes of the version asked
    (v8 and later name the partition class in the plural)."""
    return [
        topic_cls(
            name=topic,
            partitions=[
                partition_cls(
                    partition_index=c.partition,
                    committed_offset=c.offset,
                    committed_leader_epoch=c.leader_epoch,
                    metadata=c.metadata,
                    error_code=c.error,
                )
                for c in parts
            ],
        )
        for topic, parts in found
    ]
