"""Kafka's transaction and producer describe APIs: ListTransactions, DescribeTransactions,
DescribeProducers.

A Kafka transactional id is a row of fencelog's kafka_producers (its producer id, epoch,
timeout and current transaction), and its transactions are fencelog transactions of the
group `kafka:<transactional.id>` (broker/engine/kafka_producers.py). Their states, as
Kafka names them: none open since the last EndTxn is Empty; open is Ongoing; prepared
(committed, being applied) is PrepareCommit; an ended one still named is CompleteCommit
or CompleteAbort. A transaction's partitions are those it has written records to.

DescribeProducers lists a partition's idempotent producers from fencelog's producer
table: Kafka's last sequence is fencelog's high-water sequence - 1 (Kafka counts from 0).
A transaction's records are judged by their transaction, not by the table, so a
transactional producer is not listed; they enter the log only at commit, so no partition
has an open transaction's start offset (-1); the table keeps no last timestamp (-1).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from kafka.protocol import admin

from broker.core.txn import TxnState
from broker.engine.kafka_producers import TransactionalId
from broker.errors import BrokerError, ErrorCode
from broker.kafka import wire
from broker.kafka.admin_codes import TRANSACTIONAL_ID_NOT_FOUND, Handler
from broker.types import ProducerEntry, TxnInfo

if TYPE_CHECKING:
    from broker.kafka.api import KafkaApi
    from broker.kafka.listener import KafkaConnection

EMPTY: Final = "Empty"
STATES: Final = {
    TxnState.OPEN: "Ongoing",
    TxnState.PREPARED: "PrepareCommit",
    TxnState.COMMITTED: "CompleteCommit",
    TxnState.ABORTED: "CompleteAbort",
}
KAFKA_STATES: Final = frozenset(
    {EMPTY, "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"}
    | {"Dead", "PrepareEpochFence"}
)
Described = tuple[TransactionalId, TxnInfo | None]


def kafka_state(txn: TxnInfo | None) -> str:
    return EMPTY if txn is None else STATES.get(TxnState(txn.state), EMPTY)


class TxnAdmin:
    def __init__(self, api: KafkaApi) -> None:
        self.backend = api.backend

    def handlers(self) -> dict[int, Handler]:
        return {
            admin.ListTransactionsRequest.API_KEY: self.list_transactions,
            admin.DescribeTransactionsRequest.API_KEY: self.describe_transactions,
            admin.DescribeProducersRequest.API_KEY: self.describe_producers,
        }

    async def _transactions(self, ids: list[str] | None) -> list[Described]:
        reader = self.backend.reader
        rows_max = reader.limits.kafka_listed_rows_max
        return await self.backend.read(lambda: reader.kafka.transactions(ids, rows_max))

    # ListTransactions ---------------------------------------------------------------

    async def list_transactions(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.ListTransactionsResponse
        pattern = body.transactional_id_pattern if version >= 2 else None
        try:  # the whole id matches, as Java's Matcher.matches() asks
            matches = re.compile(pattern).fullmatch if pattern else None
        except re.error:
            return response(
                version=version,
                throttle_time_ms=0,
                error_code=wire.INVALID_REQUEST,
                unknown_state_filters=[],
                transaction_states=[],
            )
        states = set(body.state_filters)
        pids = set(body.producer_id_filters)
        older_ms = body.duration_filter if version >= 1 else -1
        listed = [
            response.TransactionState(
                transactional_id=row.transactional_id,
                producer_id=row.producer_id,
                transaction_state=kafka_state(txn),
            )
            for row, txn in await self._transactions(None)
            if (not states or kafka_state(txn) in states)
            and (not pids or row.producer_id in pids)
            and (older_ms < 0 or (txn is not None and txn.age_ms >= older_ms))
            and (matches is None or matches(row.transactional_id))
        ]
        return response(
            version=version,
            throttle_time_ms=0,
            error_code=wire.NONE,
            unknown_state_filters=sorted(states - KAFKA_STATES),
            transaction_states=listed,
        )

    # DescribeTransactions -----------------------------------------------------------

    async def describe_transactions(
        self, connection: KafkaConnection, body: Any, version: int
    ) -> Any:
        asked = list(body.transactional_ids)
        found = {row.transactional_id: (row, txn) for row, txn in await self._transactions(asked)}
        response = admin.DescribeTransactionsResponse
        return response(
            version=version,
            throttle_time_ms=0,
            transaction_states=[_described(response, tid, found.get(tid)) for tid in asked],
        )

    # DescribeProducers --------------------------------------------------------------

    async def describe_producers(self, connection: KafkaConnection, body: Any, version: int) -> Any:
        response = admin.DescribeProducersResponse
        topics = []
        for topic in body.topics:
            partitions = list(topic.partition_indexes)
            count, states = await self._producers(topic.name)
            topics.append(
                response.TopicResponse(
                    name=topic.name,
                    partitions=[_producers(response, p, count, states) for p in partitions],
                )
            )
        return response(version=version, throttle_time_ms=0, topics=topics)

    async def _producers(self, topic: str) -> tuple[int, list[tuple[int, ProducerEntry]]]:
        """The topic's partition count (0: no such topic) and its producers."""
        reader = self.backend.reader

        def read() -> tuple[int, list[tuple[int, ProducerEntry]]]:
            return reader.describe_topic(topic).partitions, reader.producer_states(topic)

        try:
            return await self.backend.read(read)
        except BrokerError as error:
            if error.code is not ErrorCode.UNKNOWN_TOPIC:
                raise
            return 0, []


def _described(response: Any, tid: str, found: Described | None) -> Any:
    state_cls = response.TransactionState
    if found is None:
        return state_cls(
            error_code=TRANSACTIONAL_ID_NOT_FOUND,
            transactional_id=tid,
            transaction_state="",
            transaction_timeout_ms=0,
            transaction_start_time_ms=-1,
            producer_id=-1,
            producer_epoch=-1,
            topics=[],
        )
    row, txn = found
    by_topic: dict[str, list[int]] = {}
    for part in txn.partitions if txn is not None else ():
        if part.topic is not None:
            by_topic.setdefault(part.topic, []).append(part.partition)
    return state_cls(
        error_code=wire.NONE,
        transactional_id=tid,
        transaction_state=kafka_state(txn),
        transaction_timeout_ms=row.txn_timeout_ms,
        transaction_start_time_ms=txn.began_ms if txn is not None else -1,
        producer_id=row.producer_id,
        producer_epoch=row.epoch,
        topics=[
            state_cls.TopicData(topic=topic, partitions=sorted(parts))
            for topic, parts in sorted(by_topic.items())
        ],
    )


def _producers(
    response: Any, partition: int, partitions: int, states: list[tuple[int, ProducerEntry]]
) -> Any:
    partition_cls = response.TopicResponse.PartitionResponse
    known = 0 <= partition < partitions
    return partition_cls(
        partition_index=partition,
        error_code=wire.NONE if known else wire.UNKNOWN_TOPIC_OR_PARTITION,
        error_message=None,
        active_producers=[
            partition_cls.ProducerState(
                producer_id=entry.producer_id,
                producer_epoch=entry.generation,
                last_sequence=entry.high_water_sequence - 1,
                last_timestamp=-1,
                coordinator_epoch=-1,
                current_txn_start_offset=-1,
            )
            for p, entry in states
            if p == partition
        ],
    )
