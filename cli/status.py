"""fencelog status: the data directory, its files, every topic's end offsets, and every
consumer group's lag (end offset minus committed offset, per partition)."""

from __future__ import annotations

from cli.context import state
from cli.group import COLUMNS, group_lags
from cli.options import JsonFlag
from cli.output import Output
from cli.topic import topic_dict


def status(as_json: JsonFlag = False) -> None:
    """Show the broker: data directory, schema, durability, sizes, topics, end offsets,
    consumer groups' lag."""
    client = state().client()
    info = client.status()
    groups = group_lags(client, client.consumer_groups(), client.kafka_groups())
    out = Output(as_json)
    if as_json:
        out.json(
            {
                "data_dir": info.data_dir,
                "schema_version": info.schema_version,
                "durability": info.durability,
                "database_bytes": info.database_bytes,
                "wal_bytes": info.wal_bytes,
                "producer_ids": info.producer_ids,
                "producer_evictions": info.producer_evictions,
                "topics": [topic_dict(t, partitions=True) for t in info.topics],
                "consumer_groups": groups,
            }
        )
        return
    summary = [
        ("data directory", info.data_dir),
        ("schema version", info.schema_version),
        ("durability", info.durability),
        ("database bytes", info.database_bytes),
        ("wal bytes", info.wal_bytes),
        ("producer ids", info.producer_ids),
        ("producer evictions", info.producer_evictions),
    ]
    out.table("fencelog", ["", ""], summary)
    rows = [
        (t.name, p.partition, p.end_offset, p.records, p.bytes)
        for t in info.topics
        for p in t.partition_details
    ]
    out.table("end offsets", ["topic", "partition", "end offset", "records", "bytes"], rows)
    lags = [
        (g["group"], o["topic"], o["partition"], o["committed_offset"], o["end_offset"], o["lag"])
        for g in groups
        for o in g["offsets"]
    ]
    if lags:
        out.table("consumer groups", COLUMNS, lags)
