"""A consumer catching up is read ahead (broker/kafka/api.py fetch): once a fetch's answer
is written, the server reads what the same connection's next fetch will ask for. What the
consumer gets is what a fetch read when asked gives, the read is not used for a topic
deleted or created again since, and /metrics tells what became of each read ahead."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import FetchRequest
from kafka.record import MemoryRecords
from prometheus_client.parser import text_string_to_metric_families

from broker.client.client import connect
from support.kafka_raw import RawKafka
from support.servers import ServeProcess, serving

STEP_S = 20.0
RECORDS = 3_000
PARTITION_MAX = 20_000  # about 160 records of 100 bytes a fetch: many fetches


def fetch(raw: RawKafka, topic: str, offset: int) -> list[tuple[int, bytes]]:
    """A Fetch v11 of partition 0 from offset, no waiting; its (offset, value)s."""
    topic_cls = FetchRequest.FetchTopic
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1_000_000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            topic_cls(
                topic=topic,
                partitions=[
                    topic_cls.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=PARTITION_MAX,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    answer = raw.call(request, 11)
    (part,) = answer.responses[0].partitions
    assert part.error_code == 0, part
    found: list[tuple[int, bytes]] = []
    records = MemoryRecords(part.records or b"")
    while (batch := records.next_batch()) is not None:
        found += [(record.offset, record.value) for record in batch]
    return found


def fill(server: ServeProcess, topic: str, label: bytes) -> list[bytes]:
    values = [label + b"-%05d-" % i + b"v" * 88 for i in range(RECORDS)]
    with connect(server.address) as client:
        client.create_topic(topic)
        for first in range(0, RECORDS, 1_000):
            client.produce(topic, values[first : first + 1_000], partition=0)
    return values


def read_ahead_counts(server: ServeProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{server.info['http']}/metrics", timeout=STEP_S) as got:
        text = got.read().decode()
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "fencelog_kafka_fetch_read_ahead"
        for sample in family.samples
    }


def served(tmp_path: Path) -> Any:
    args = ("--no-unix", "--kafka-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0")
    return serving(tmp_path / "data", tmp_path / "ready.json", serve_args=args)


def test_a_consumer_catching_up_reads_every_record_once_in_order(tmp_path: Path) -> None:
    with served(tmp_path) as server:
        values = fill(server, "orders", b"a")
        raw = RawKafka(server.kafka)
        try:
            found: list[tuple[int, bytes]] = []
            for _ in range(RECORDS):  # bounded: each fetch answers at least a record
                page = fetch(raw, "orders", len(found))
                if not page:
                    break
                found += page
            assert found == list(enumerate(values))
            # a fetch from elsewhere than where the last answer ended drops what was read
            assert fetch(raw, "orders", 5)[0] == (5, values[5])
            assert fetch(raw, "orders", 100)[0] == (100, values[100])
        finally:
            raw.close()
        counts = read_ahead_counts(server)
        fetches_behind_the_end = RECORDS // 170  # each answer is under 170 records
        assert counts.get("used", 0) >= fetches_behind_the_end, counts
        assert counts.get("dropped", 0) >= 1, counts
        assert "stale" not in counts and "failed" not in counts, counts


def test_a_topic_created_again_is_not_answered_from_what_was_read_ahead(
    tmp_path: Path,
) -> None:
    with served(tmp_path) as server:
        fill(server, "orders", b"old")
        raw = RawKafka(server.kafka)
        try:
            first = fetch(raw, "orders", 0)
            assert 0 < len(first) < RECORDS  # the rest read ahead for offset len(first)
            with connect(server.address) as client:
                client.delete_topic("orders")
            new_values = fill(server, "orders", b"new")
            after = fetch(raw, "orders", len(first))
            assert after
            assert after == [(offset, new_values[offset]) for offset, _ in after]
        finally:
            raw.close()
        # the read ahead ran before the delete (almost always: it starts as the first
        # answer is written) and was found stale, or after the topic was made again
        counts = read_ahead_counts(server)
        taken = {outcome: counts[outcome] for outcome in ("used", "stale") if outcome in counts}
        assert taken in ({"stale": 1.0}, {"used": 1.0}), counts
