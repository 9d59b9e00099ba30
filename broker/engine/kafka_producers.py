"""Kafka producer ids and transactional ids on fencelog's pids and transactions.

- InitProducerId without a transactional.id: a fresh fencelog pid, issued at generation
  0, which is the Kafka epoch: an idempotent Kafka producer's batches are judged by the
  seed's rules exactly as a native idempotent producer's (broker/core/producers.py), its
  Kafka sequence s being fencelog's s + 1 (Kafka counts from 0, fencelog from 1), but
  for one rule of Kafka's: a newer epoch starts its sequences again at 0 (decide's
  `restarts`). librdkafka bumps an idempotent producer's epoch by itself, without
  asking, after a batch failed for good (KIP-360), and numbers the new epoch from 0; a
  producer that asks InitProducerId again gets a new pid instead.
- InitProducerId with a transactional.id: the same pid at epoch + 1 (a new pid at epoch
  0 the first time, or when the epoch would overflow Kafka's int16). The bump fences
  every older incarnation: each of its later requests carries an older epoch and is
  refused. What the older one left open is aborted first.
- A Kafka transaction is a fencelog transaction of the group `kafka:<transactional.id>`,
  begun by the first AddPartitionsToTxn or AddOffsetsToTxn and ended by EndTxn: its
  records wait in the data journals and reach the log only at commit.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Final, NamedTuple

from broker.core import retention as retention_rules
from broker.core import txn as txn_rules
from broker.engine.producer_table import ProducerTable
from broker.engine.transactions import Transactions
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.storage import kafka as store
from broker.storage import logs
from broker.storage import producers as counters
from broker.storage.database import Database
from broker.types import Clock, TxnInfo

EPOCH_MAX: Final = 32767  # Kafka's producer epoch is an int16
CLUSTER_COUNTER: Final = "kafka_cluster_id"
GROUP_PREFIX: Final = "kafka:"
TransactionalId = store.KafkaProducerRow  # a transactional id's row, as transactions() gives


class KafkaProducer(NamedTuple):
    producer_id: int
    epoch: int


class KafkaProducers:
    def __init__(
        self,
        database: Database,
        producers: ProducerTable,
        txns: Transactions,
        limits: Limits,
        clock: Clock,
    ) -> None:
        self.database = database
        self.producers = producers
        self.txns = txns
        self.limits = limits
        self.clock = clock

    def cluster_id(self) -> str:
        """The data directory's Kafka cluster id: made on the first call, then kept, as
        Kafka's is (a client that sees it change warns of two clusters)."""
        with self.database.write() as conn:
            number = counters.counter(conn, CLUSTER_COUNTER)
            if not number:
                number = int.from_bytes(os.urandom(8), "big") >> 1 or 1
                counters.set_counter(conn, CLUSTER_COUNTER, number)
        return f"fencelog-{number:016x}"

    def topic_ids(self) -> dict[str, tuple[int, int]]:
        """Each topic's fencelog topic id, which is never reused (a re-created topic of
        the same name has another), and its partition count: the Kafka listener makes
        Kafka's topic ids of them."""
        with self.database.read() as conn:
            return {row.name: (row.topic_id, row.partitions) for row in logs.all_topics(conn)}

    def init(self, transactional_id: str | None, txn_timeout_ms: int) -> KafkaProducer:
        now_ms = self.clock()
        if transactional_id is None:
            with self.database.write() as conn:
                return KafkaProducer(self.producers.new_pid(conn, 0, now_ms), 0)
        txn_rules.check_group(GROUP_PREFIX + transactional_id)
        txn_rules.check_timeout(txn_timeout_ms, self.limits.txn_timeout_max_ms)
        with self.database.read() as conn:
            found = store.producer(conn, transactional_id)
        if found is not None and found.txn_id is not None:
            self._abort(found.txn_id)  # what the older incarnation left open
        with self.database.write() as conn:
            found = store.producer(conn, transactional_id)
            if found is None or found.epoch >= EPOCH_MAX - 1:
                pid, epoch = self.producers.new_pid(conn, 0, now_ms), 0
            else:
                pid, epoch = found.producer_id, found.epoch + 1
            row = store.KafkaProducerRow(transactional_id, pid, epoch, txn_timeout_ms, None)
            store.put_producer(conn, row, now_ms)
        return KafkaProducer(pid, epoch)

    def _abort(self, txn_id: int) -> None:
        try:
            self.txns.abort(txn_id)
        except BrokerError as error:
            if error.code not in {ErrorCode.TXN_NOT_OPEN, ErrorCode.UNKNOWN_TXN}:
                raise  # a committed one stays committed; anything else is news

    def current(
        self, transactional_id: str, producer_id: int, epoch: int
    ) -> store.KafkaProducerRow:
        """The transactional id's row, when (producer_id, epoch) is its current incarnation."""
        with self.database.read() as conn:
            found = store.producer(conn, transactional_id)
        return _check(found, transactional_id, producer_id, epoch)

    def begin(self, transactional_id: str, producer_id: int, epoch: int) -> int:
        """The fencelog transaction of the current Kafka transaction, begun if need be
        (core.txn.kafka_continues)."""
        row = self.current(transactional_id, producer_id, epoch)
        current = None if row.txn_id is None else self.txns.view(row.txn_id)
        if row.txn_id is not None and txn_rules.kafka_continues(current, transactional_id):
            return row.txn_id
        info = self.txns.begin(GROUP_PREFIX + transactional_id, None, row.txn_timeout_ms)
        with self.database.write() as conn:
            _check(store.producer(conn, transactional_id), transactional_id, producer_id, epoch)
            store.set_txn(conn, transactional_id, info.txn_id, self.clock())
        return info.txn_id

    def open_txn(self, producer_id: int, epoch: int) -> int:
        """The open transaction a transactional batch of (producer_id, epoch) goes into."""
        with self.database.read() as conn:
            found = store.producer_by_pid(conn, producer_id)
        if found is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_PID,
                f"producer id {producer_id} belongs to no transactional id",
                producer_id=producer_id,
            )
        row = _check(found, found.transactional_id, producer_id, epoch)
        if row.txn_id is None:
            raise BrokerError(
                ErrorCode.TXN_NOT_OPEN,
                f"transactional id {row.transactional_id} added no partition to a transaction",
                hint="AddPartitionsToTxn comes before a transactional produce",
            )
        return row.txn_id

    def transactions(
        self, transactional_ids: Sequence[str] | None, limit: int
    ) -> list[tuple[TransactionalId, TxnInfo | None]]:
        """Each transactional id asked (None: every one, the first limit by name) that
        exists, with its current transaction (None: none open since its last end)."""
        now_ms = self.clock()
        with self.database.read() as conn:
            if transactional_ids is None:
                rows = store.all_producers(conn, limit)
            else:
                found = (store.producer(conn, tid) for tid in transactional_ids[:limit])
                rows = [row for row in found if row is not None]
            return [(row, self._txn_info(conn, row.txn_id, now_ms)) for row in rows]

    def _txn_info(
        self, conn: sqlite3.Connection, txn_id: int | None, now_ms: int
    ) -> TxnInfo | None:
        if txn_id is None:
            return None
        try:
            return self.txns.info(conn, txn_id, now_ms)
        except BrokerError as error:
            if error.code is not ErrorCode.UNKNOWN_TXN:
                raise
            return None  # gone from the bounded history

    def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        """EndTxn: commit or abort the open transaction (nothing open: nothing to do)."""
        row = self.current(transactional_id, producer_id, epoch)
        if row.txn_id is None:
            return
        if commit:
            self.txns.commit(row.txn_id)
        else:
            self._abort(row.txn_id)
        with self.database.write() as conn:
            again = store.producer(conn, transactional_id)
            if again is not None and again.txn_id == row.txn_id:
                store.set_txn(conn, transactional_id, None, self.clock())


def _check(
    found: store.KafkaProducerRow | None, transactional_id: str, producer_id: int, epoch: int
) -> store.KafkaProducerRow:
    """found, when (producer_id, epoch) is its current incarnation (core's rule)."""
    stored = None if found is None else (found.producer_id, found.epoch)
    retention_rules.check_epoch(transactional_id, stored, producer_id, epoch)
    assert found is not None
    return found
