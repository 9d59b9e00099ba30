"""The log's records as they are stored, read straight from a database file: each
batch row of `log` (schema 015) expanded into one dict per record, for tests that look
under the engine."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from broker.storage import batches
from broker.storage.queries import Q

FIELDS = (
    "partition",
    "offset",
    "timestamp_ms",
    "key",
    "value",
    "headers",
    "producer_id",
    "generation",
    "sequence",
    "epoch",
    "txn_id",
)


def stored_records(db_path: Path, topic: str | None = None) -> list[dict[str, Any]]:
    """Every stored record (of topic, if named), by topic name, partition and offset;
    headers as stored (msgpack)."""
    found: list[dict[str, Any]] = []
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        names = dict(conn.execute("SELECT topic_id, name FROM topics"))
        # the log's rows; those under a topic id of 0 or below are transactions'
        # journaled batches, not yet in a log (schema 017)
        query = "SELECT * FROM log WHERE topic_id > 0 ORDER BY topic_id, partition, first_offset"
        for row in conn.execute(query):
            batch = batches.Stored._make(row)
            name = names.get(batch.topic_id)
            if topic is not None and name != topic:
                continue
            for stored in batches.rows(batches.Part(batch, 0, batch.records)):
                found.append({"name": name, **dict(zip(FIELDS, stored, strict=True))})
    found.sort(key=lambda record: (str(record["name"]), record["partition"], record["offset"]))
    return found


def rewrite_record(
    db_path: Path, topic: str, partition: int, offset: int, changes: dict[str, Any] | None
) -> None:
    """Change one stored record's fields (None: delete it), as a broken broker would
    have written it: the partition's batches are rewritten a record each, so that any
    field of one record (its sequence, generation, epoch, value) can differ from the
    rest."""
    records = [
        record for record in stored_records(db_path, topic) if record["partition"] == partition
    ]
    assert any(record["offset"] == offset for record in records), (partition, offset)
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        (topic_id,) = conn.execute(
            "SELECT topic_id FROM topics WHERE name = ?", (topic,)
        ).fetchone()
        conn.execute("DELETE FROM log WHERE topic_id = ? AND partition = ?", (topic_id, partition))
        for found in records:
            record = found
            if found["offset"] == offset:
                if changes is None:
                    continue
                record = {**found, **changes}
            conn.execute(
                Q["log_insert"],
                batches.pack(
                    (topic_id, partition, record["offset"]),
                    [record["value"]],
                    [record["key"]],
                    [record["headers"]],
                    [record["timestamp_ms"]],
                    (
                        record["producer_id"],
                        record["generation"],
                        record["sequence"],
                        record["epoch"],
                        record["txn_id"],
                    ),
                ),
            )
