"""What librdkafka's own regression suite (tests/0nnn of confluentinc/librdkafka, run
against `fencelog serve --kafka-listen`; docs/kafka-conformance.md) found fencelog to do
differently from Kafka, each checked here the way a user's client meets it, through
confluent-kafka, kcat or raw requests (not librdkafka's test binary).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

STEP_S = 20.0  # every wait of a test is bounded by this


def test_a_keyless_record_on_a_compacted_topic_fails_alone(kafka: str) -> None:
    # librdkafka's 0011: Kafka names the records it refused (Produce v8 RecordErrors), so
    # the keyless ones fail with INVALID_RECORD and the others of their batch with
    # _INVALID_DIFFERENT_RECORD, which a client may send again; all failed the same way
    admin = AdminClient({"bootstrap.servers": kafka})
    created = admin.create_topics([NewTopic("keyed", 1, 1, config={"cleanup.policy": "compact"})])
    created["keyed"].result(STEP_S)
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 500})
    reports: list[tuple[bytes | None, Any]] = []
    for index in range(10):
        key = None if index % 5 == 0 else b"k%d" % index
        producer.produce(
            "keyed",
            key=key,
            value=b"v%d" % index,
            on_delivery=lambda error, message: reports.append((message.value(), error)),
        )
    assert producer.flush(STEP_S) == 0
    codes = {value: error.code() for value, error in reports}
    assert codes == {
        b"v%d" % index: (
            KafkaError.INVALID_RECORD if index % 5 == 0 else KafkaError._INVALID_DIFFERENT_RECORD
        )
        for index in range(10)
    }
    # the others, sent again, are appended
    for index in (1, 2):
        producer.produce("keyed", key=b"k%d" % index, value=b"again")
    assert producer.flush(STEP_S) == 0
