"""Data directories of older schemas (issue 36) and what a user reads back from them.

tests/storage/fixtures/make_schema14.py builds the directory with the code of a schema
and writes tests/storage/fixtures/schemaNN.db.gz (its fencelog.db) and schemaNN.json:
`read_back` of it, plus the facts the behaviour checks need (an idempotent producer's
batch to retry, the open transaction, the exclusive topic's epoch). schema14.* were made
with the code of schema 014 (one row a record), schema15.* with that of schema 015 (the
log of batches in a WITHOUT ROWID table). The upgrade tests
(tests/storage/test_schema14_upgrade.py) gunzip each, open it with the current code and
compare `read_back` with the JSON, so both sides read through this one module, through
the public client only.

Nothing here depends on the time it runs: transaction ages and deadlines, commit times
and lease expiries are left out, and the client is opened with a clock at the moment
the fixture was made (FIXTURE_CLOCK_KEY), so that its open transaction has not timed
out and its pids have not expired however long after it is read.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from broker.client.client import Client
from broker.discovery import DB_FILE
from broker.types import Record

FIXTURES: Final = Path(__file__).resolve().parent.parent / "storage" / "fixtures"
FIXTURE_CLOCK_KEY: Final = "clock_ms"  # the JSON's: when the fixture was read back
MADE_SCHEMAS: Final = (14, 15)  # the schemas a fixture was made with: schemaNN.db.gz, .json
TXNS_LISTED_MAX: Final = 1_000
GROUPS_LISTED_MAX: Final = 10_000


@dataclass(frozen=True, slots=True)
class Made:
    """One fixture: the gzipped database the code of `schema` made, and what that code
    read back from it (with the facts the behaviour checks need)."""

    schema: int
    db: Path
    document: dict[str, Any]

    @property
    def topics(self) -> dict[str, Any]:
        """The topics as that code read them, but each offset by time asked answered as
        a scan of the partition's records does: the first at or after the time. The
        search of schemas 015-017 gave a place where the log crossed the time where the
        timestamps go back (the mixed topic); schema 018's time index gives the first,
        as schema 014's scan did."""
        topics: dict[str, Any] = self.document["topics"]
        return {name: _exact_times(topic) for name, topic in topics.items()}

    @property
    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = self.document["facts"]
        return facts

    @property
    def clock_ms(self) -> int:
        return int(self.document[FIXTURE_CLOCK_KEY])


def _exact_times(topic: dict[str, Any]) -> dict[str, Any]:
    partitions = {}
    for name, log in topic["partition_logs"].items():
        stamped = [(r["timestamp_ms"], r["offset"]) for r in log["records"]]
        answers = [
            [at, next((offset for stamp, offset in stamped if stamp >= at), None)]
            for at, _ in log["offsets_for_times"]
        ]
        partitions[name] = {**log, "offsets_for_times": answers}
    return {**topic, "partition_logs": partitions}


@cache
def made_with(schema: int) -> Made:
    """The fixture made with the code of `schema` (of MADE_SCHEMAS)."""
    document = json.loads((FIXTURES / f"schema{schema}.json").read_text())
    return Made(schema, FIXTURES / f"schema{schema}.db.gz", document)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def record_json(record: Record) -> dict[str, Any]:
    """Every field of a record (keys, values and header values in base64)."""
    return {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": b64(record.key),
        "value": b64(record.value),
        "headers": [[name, b64(value)] for name, value in record.headers],
        "producer_id": record.producer_id,
        "generation": record.generation,
        "sequence": record.sequence,
        "epoch": record.epoch,
        "txn_id": record.txn_id,
    }


def unpack_db(gz: Path, data_dir: Path) -> Path:
    """The gzipped fencelog.db as data_dir's database (data_dir is made, mode 0700)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = data_dir / DB_FILE
    with gzip.open(gz, "rb") as source, db.open("wb") as target:
        shutil.copyfileobj(source, target)
    db.chmod(0o600)
    return data_dir


def read_back(client: Client) -> dict[str, Any]:
    """Everything a user can read of the broker through the client, as JSON values:
    topics (configs, partitions, every record), the compacted view of compacted topics,
    topic access (epochs), offsets by time, idempotent producers' states, transactions
    and consumer group offsets."""
    topics = sorted(client.list_topics(), key=lambda t: t.name)
    return {
        "topics": {t.name: read_topic(client, t.name) for t in topics},
        "transactions": _transactions(client),
        "groups": _groups(client),
    }


def read_topic(client: Client, name: str) -> dict[str, Any]:
    """One topic as read_back gives it."""
    info = client.describe_topic(name)
    partitions = {}
    for details in info.partition_details:
        records = list(client.consume(name, partition=details.partition))
        partitions[str(details.partition)] = {
            "start_offset": details.start_offset,
            "end_offset": details.end_offset,
            "records_count": details.records,
            "bytes": details.bytes,
            "records": [record_json(r) for r in records],
            "offsets_for_times": _offsets_for_times(client, name, details.partition, records),
        }
    access = client.topic_access(name)
    topic: dict[str, Any] = {
        "partitions": info.partitions,
        "owner_group": info.owner_group,
        "config": {
            "retention_ms": info.config.retention_ms,
            "retention_bytes": info.config.retention_bytes,
            "cleanup": info.config.cleanup,
        },
        "epoch": access.epoch,
        "access_mode": access.mode,
        "partition_logs": partitions,
        "producers": sorted(
            [p, e.producer_id, e.generation, e.high_water_sequence, e.last_offset]
            for p, e in client.producer_states(name)
        ),
    }
    if info.config.cleanup == "compact":
        topic["compacted"] = [
            {"partition": r.partition, **record_json(r)} for r in client.read_compacted(name)
        ]
    return topic


def _offsets_for_times(
    client: Client, topic: str, partition: int, records: list[Record]
) -> list[list[int | None]]:
    """[timestamp, offset_for_time] for the earliest, a middle and the latest timestamp
    of the partition's records, and one past the latest (None: every record is older)."""
    if not records:
        return []
    stamps = sorted({r.timestamp_ms for r in records})
    asked = sorted({stamps[0], stamps[len(stamps) // 2], stamps[-1], stamps[-1] + 1})
    return [[at, client.offset_for_time(topic, partition, at)] for at in asked]


def _transactions(client: Client) -> list[dict[str, Any]]:
    listed = client.txn_list(include_ended=True, limit=TXNS_LISTED_MAX)
    return [
        {
            "txn_id": t.txn_id,
            "group": t.group,
            "key": t.key,
            "state": t.state,
            "journal": t.journal,
            "reason": t.reason,
            "partitions": sorted(
                [p.topic, p.partition, p.records, p.bytes, p.base_offset] for p in t.partitions
            ),
        }
        for t in sorted(listed, key=lambda t: t.txn_id)
    ]


def _groups(client: Client) -> list[dict[str, Any]]:
    rows = client.consumer_groups(limit=GROUPS_LISTED_MAX)
    found = []
    for group, topic in sorted({(r.group, r.topic) for r in rows}):
        offsets, state = client.committed_offsets(group, topic)
        metadata = client.committed_metadata(group, topic)
        found.append(
            {
                "group": group,
                "topic": topic,
                "offsets": {str(p): o for p, o in sorted(offsets.items())},
                "metadata": {str(p): m for p, m in sorted(metadata.items())},
                "producer_state": None
                if state is None
                else {
                    "topic": state.topic,
                    "partitions": {
                        str(p): [s.producer_id, s.generation, s.sequence]
                        for p, s in sorted(state.partitions.items())
                    },
                },
            }
        )
    return found
