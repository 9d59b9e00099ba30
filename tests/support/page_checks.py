"""Checks of a partition's pages against its rows (fetch_arrow against fetch_rows)."""

from __future__ import annotations

import pyarrow as pa

from broker import columnar
from broker.client.client import Client
from broker.storage import logs, pages
from support.mixed_logs import TOPIC


def rows_batch(client: Client, partition: int, offset: int, max_records: int) -> pa.RecordBatch:
    """What fetch_arrow must equal: fetch_rows' page, converted row by row."""
    rows = client.fetch_rows(TOPIC, {partition: offset}, max_records=max_records)
    return columnar.rows_to_arrow(TOPIC, rows)


def columnar_page(
    client: Client, partition: int, offset: int, max_records: int
) -> pa.RecordBatch | None:
    """pages.read_page itself, as Arrow (None: it would leave the page to the row path)."""
    engine = client._transport.engine  # type: ignore[attr-defined]
    limits = engine.limits
    with engine.database.read() as conn:
        topic = logs.topic_by_name(conn, TOPIC)
        assert topic is not None
        page = pages.read_page(conn, topic, partition, offset, max_records, limits.read_bytes_max)
        return None if page is None else columnar.page_to_arrow(TOPIC, page)


def assert_same_pages(client: Client, partitions: int, page: int, built: bool = False) -> int:
    """Every page of every partition: fetch_arrow equals fetch_rows (built: and SQLite
    built it, not the row path); records read."""
    total = 0
    for partition, end in zip(range(partitions), client.end_offsets(TOPIC), strict=True):
        offset = 0
        while offset <= end:
            batch = client.fetch_arrow(TOPIC, partition, offset, max_records=page)
            expected = rows_batch(client, partition, offset, page)
            if built:
                direct = columnar_page(client, partition, offset, page)
                assert direct is not None and direct.equals(batch), (partition, offset)
            assert batch.schema == columnar.ARROW_SCHEMA
            assert batch.to_pylist() == expected.to_pylist(), (partition, offset)
            if batch.num_rows == 0:
                assert offset == end
                break
            offsets = batch.column("offset").to_pylist()
            assert offsets == list(range(offset, offset + batch.num_rows))
            offset += batch.num_rows
            total += batch.num_rows
    return total
