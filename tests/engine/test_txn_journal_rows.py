"""A transaction's journaled batches live in the log's table under a hidden key (schema
017): written once when produced, moved to their offsets by the commit, never seen by a
read before, and gone with whatever drops them (abort, expiry, a fenced writer, a
deleted topic)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from broker.discovery import DB_FILE
from broker.engine.engine import Engine
from broker.limits import Limits
from broker.types import NewRecord, TopicConfig
from support.producing import FakeClock

VALUES = [b"%099d" % i for i in range(1000)]  # 100 KB: under the commit's page holding
SECOND_MS = 1_000


def hidden_rows(data_dir: Path) -> int:
    """Rows of `log` under a journal's key (no topic has an id of 0 or below)."""
    conn = sqlite3.connect(data_dir / DB_FILE)
    try:
        return int(conn.execute("SELECT count(*) FROM log WHERE topic_id <= 0").fetchone()[0])
    finally:
        conn.close()


def values(engine: Engine, topic: str, partition: int = 0, start: int = 0) -> list[bytes | None]:
    return [r.value for r in engine.read(topic, partition, start, max_records=10_000)]


@pytest.mark.parametrize("topics_before", [0, 1, 200])
def test_a_commit_moves_its_batches_into_the_log_without_writing_them_again(
    data_dir: Path, topics_before: int
) -> None:
    """The commit's writes (PREPARE_COMMIT, the move, COMPLETE, the time index's row of
    a batch that raises the greatest timestamp) are a few pages, not the 100 KB batch
    again: the journaled row keeps its size when it gets its real key, so SQLite
    rewrites only the page holding its numbers. Topic ids 1, 2 and 201 are the
    three sizes SQLite stores them in (no bytes, one, two)."""
    with Engine.open(data_dir, durability="normal") as engine:
        for number in range(topics_before):
            engine.create_topic(f"other-{number}")
        engine.create_topic("invoices")
        engine.produce("invoices", [NewRecord(b"before")])
        txn, _ = engine.txn_begin_produce("billing", "invoices", [NewRecord(v) for v in VALUES])
        assert hidden_rows(data_dir) == 1
        conn = engine.database.conn
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = data_dir / f"{DB_FILE}-wal"
        assert wal.stat().st_size == 0

        engine.txn_commit(txn.txn_id)

        written = wal.stat().st_size
        assert written < 70_000, f"the commit wrote {written} bytes of WAL for a 100 KB batch"
        assert values(engine, "invoices") == [b"before", *VALUES]
        assert engine.end_offsets("invoices") == [1001]
    assert hidden_rows(data_dir) == 0


def test_journaled_batches_are_never_read_before_their_commit(data_dir: Path) -> None:
    """Reads, offsets by time, retention and compaction pass an open transaction's rows
    by; the commit then puts them after what was appended meanwhile."""
    clock = FakeClock()
    with Engine.open(data_dir, durability="normal", clock=clock) as engine:
        engine.create_topic("ledger", partitions=1)
        engine.produce("ledger", [NewRecord(b"a", key=b"k")])
        txn, _ = engine.txn_begin_produce("billing", "ledger", [NewRecord(b"t1"), NewRecord(b"t2")])
        engine.produce("ledger", [NewRecord(b"b", key=b"k")])
        assert values(engine, "ledger") == [b"a", b"b"]
        assert engine.read("ledger", 0, 2) == []
        assert engine.end_offsets("ledger") == [2]
        assert engine.offset_for_time("ledger", 0, 0) == (0, clock.now_ms)
        assert engine.delete_records_below("ledger", 0, 1) == 1
        assert values(engine, "ledger", start=1) == [b"b"]
        assert hidden_rows(data_dir) == 1

        engine.create_topic("state", config=TopicConfig(cleanup="compact"))
        engine.produce("state", [NewRecord(b"v1", key=b"k")])
        keyed, _ = engine.txn_begin_produce("billing", "state", [NewRecord(b"t", key=b"k")])
        engine.produce("state", [NewRecord(b"v2", key=b"k"), NewRecord(b"x", key=b"j")])
        engine.produce("state", [NewRecord(b"v3", key=b"j")])  # what compaction may not touch
        assert engine.clean_topic("state") == 2
        assert values(engine, "state", start=2) == [b"v3"]
        assert hidden_rows(data_dir) == 2

        engine.txn_commit(txn.txn_id)
        engine.txn_commit(keyed.txn_id)

        records = engine.read("ledger", 0, 1)
        assert [(r.offset, r.value, r.txn_id) for r in records] == [
            (1, b"b", None),
            (2, b"t1", txn.txn_id),
            (3, b"t2", txn.txn_id),
        ]
        compacted = [(r.offset, r.key, r.value) for r in engine.read_compacted("state", 0)]
        assert compacted == [(3, b"j", b"v3"), (4, b"k", b"t")]
    assert hidden_rows(data_dir) == 0


def test_what_drops_journaled_batches_drops_their_rows(data_dir: Path) -> None:
    """An abort, an expiry, a member fenced by its retry and a deleted topic each take
    their journaled rows out of the log's table; nothing of them is ever read."""
    clock = FakeClock()
    limits = Limits(txn_timeout_ms=10 * SECOND_MS)
    with Engine.open(data_dir, durability="normal", clock=clock, limits=limits) as engine:
        engine.create_topic("invoices")
        engine.create_topic("scratch")

        aborted, _ = engine.txn_begin_produce("billing", "invoices", [NewRecord(b"aborted")])
        expired, _ = engine.txn_begin_produce("other", "invoices", [NewRecord(b"expired")])
        assert hidden_rows(data_dir) == 2
        engine.txn_abort(aborted.txn_id)
        assert hidden_rows(data_dir) == 1
        clock.advance(11 * SECOND_MS)
        assert engine.txn_list() == []  # expires what is past its deadline
        assert engine.txn_show(expired.txn_id).info.state == "aborted"
        assert hidden_rows(data_dir) == 0

        txn = engine.txn_begin("billing")
        first = engine.txn_join(txn.txn_id, "task-1")
        engine.produce("invoices", [NewRecord(b"first-attempt")], producer=first.producer)
        retry = engine.txn_join(txn.txn_id, "task-1")
        engine.produce("invoices", [NewRecord(b"retry")], producer=retry.producer)
        engine.produce("scratch", [NewRecord(b"gone")], producer=retry.producer)
        assert hidden_rows(data_dir) == 2, "the fenced attempt's batch went at the retry's join"
        engine.delete_topic("scratch")
        assert hidden_rows(data_dir) == 1

        engine.txn_commit(txn.txn_id)
        assert values(engine, "invoices") == [b"retry"]
    assert hidden_rows(data_dir) == 0


def test_a_committed_batch_that_raises_the_greatest_timestamp_is_found_by_time(
    data_dir: Path,
) -> None:
    """The commit gives a journaled batch its offsets after what was appended meanwhile;
    where its records are the partition's latest, offsets by time find them."""
    with Engine.open(data_dir, durability="normal") as engine:
        engine.create_topic("ledger", partitions=1)
        engine.produce("ledger", [NewRecord(b"a", timestamp_ms=1_000)])
        txn, _ = engine.txn_begin_produce(
            "billing", "ledger", [NewRecord(b"t", timestamp_ms=3_000)]
        )
        engine.produce("ledger", [NewRecord(b"b", timestamp_ms=2_000)])
        assert engine.offset_for_time("ledger", 0, 2_500) is None  # not committed yet
        engine.txn_commit(txn.txn_id)
        assert engine.offset_for_time("ledger", 0, 2_500) == (2, 3_000)
        assert engine.offset_for_time("ledger", 0, 1_500) == (1, 2_000)
