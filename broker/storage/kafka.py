"""The Kafka listener's rows: transactional ids (schema 009)."""

from __future__ import annotations

import sqlite3

from msgspec import Struct

from broker.storage.queries import Q


class KafkaProducerRow(Struct, frozen=True):
    transactional_id: str
    producer_id: int
    epoch: int
    txn_timeout_ms: int
    txn_id: int | None


def producer(conn: sqlite3.Connection, transactional_id: str) -> KafkaProducerRow | None:
    row = conn.execute(Q["kafka_producer"], (transactional_id,)).fetchone()
    return None if row is None else KafkaProducerRow(*row)


def producer_by_pid(conn: sqlite3.Connection, producer_id: int) -> KafkaProducerRow | None:
    row = conn.execute(Q["kafka_producer_by_pid"], (producer_id,)).fetchone()
    return None if row is None else KafkaProducerRow(*row)


def all_producers(conn: sqlite3.Connection, limit: int) -> list[KafkaProducerRow]:
    """The first limit transactional ids, by name."""
    return [KafkaProducerRow(*row) for row in conn.execute(Q["kafka_producers_all"], (limit,))]


def put_producer(conn: sqlite3.Connection, row: KafkaProducerRow, now_ms: int) -> None:
    conn.execute(
        Q["kafka_producer_put"],
        (row.transactional_id, row.producer_id, row.epoch, row.txn_timeout_ms, row.txn_id, now_ms),
    )


def set_txn(
    conn: sqlite3.Connection, transactional_id: str, txn_id: int | None, now_ms: int
) -> None:
    conn.execute(Q["kafka_producer_set_txn"], (transactional_id, txn_id, now_ms))
