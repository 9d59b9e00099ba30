"""Capture the requests real Kafka clients send in whole sessions, for the fuzz test
(tests/kafka_listener/test_kafka_fuzz.py).

    cd tests/kafka_listener/golden && python capture_sessions.py > sessions.json

capture.py's way (a server in this process, every request frame it reads recorded),
over more of the protocol: kcat listing metadata, producing and consuming; with
confluent-kafka (librdkafka) an admin creating a topic, a consumer group member that
commits, and a transactional producer that sends its consumer's offsets to the
transaction; kafka-python's consumer group and admin. Writes the first frame of each
(API key, version) each client sent, as hex. Regenerate when a client's protocol use
changes.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from broker.kafka import wire
from broker.kafka.options import KafkaListen
from broker.server.server import Server

TIMEOUT_S = 20.0
frames: list[bytes] = []
_read = wire.read_request


def _recording(frame: bytes | memoryview) -> wire.Request:
    frames.append(bytes(frame))
    return _read(frame)


def first_of_each() -> dict[str, str]:
    found: dict[str, str] = {}
    for frame in frames:
        key, version = struct.unpack(">hh", frame[:4])
        found.setdefault(f"{key}/v{version}", frame.hex())
    frames.clear()
    return found


def kcat(address: str) -> None:
    run = ["kcat", "-b", address]
    subprocess.run([*run, "-L"], check=True, timeout=TIMEOUT_S, capture_output=True)
    subprocess.run(
        [*run, "-P", "-t", "sessions", "-k", "k"], input=b"kcat\n", check=True, timeout=TIMEOUT_S
    )
    subprocess.run(
        [*run, "-C", "-t", "sessions", "-o", "beginning", "-e"],
        check=True,
        timeout=TIMEOUT_S,
        capture_output=True,
    )


def librdkafka(address: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic("sessions-in", num_partitions=2)]).values():
        future.result(TIMEOUT_S)
    plain = Producer({"bootstrap.servers": address, "enable.idempotence": True})
    plain.produce("sessions-in", b"in", key=b"k", headers=[("h", b"1")])
    plain.flush(TIMEOUT_S)
    consumer = Consumer(
        {
            "bootstrap.servers": address,
            "group.id": "sessions",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(["sessions-in"])
    message = None
    for _ in range(int(TIMEOUT_S * 10)):
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            break
    assert message is not None and message.error() is None, message
    producer = Producer({"bootstrap.servers": address, "transactional.id": "sessions-txn"})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce("sessions-out", b"out", key=b"k")
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), TIMEOUT_S
    )
    producer.commit_transaction(TIMEOUT_S)
    consumer.commit(asynchronous=False)
    consumer.close()


def kafka_python(address: str) -> None:
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic("sessions-kp", 1, 1)])
    admin.close()
    consumer = KafkaConsumer(
        "sessions-in",
        bootstrap_servers=address,
        group_id="sessions-kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    for _ in consumer:
        consumer.commit()
        break
    consumer.close()


def main() -> None:
    wire.read_request = _recording
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    data_dir = Path(tempfile.mkdtemp()) / "data"
    server = Server(data_dir, durability="normal", kafka=KafkaListen("127.0.0.1", 0))
    asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0, unix=False), loop).result(10)
    assert server.info is not None and server.info.kafka is not None
    address = server.info.kafka
    captured: dict[str, Any] = {}
    for name, session in (
        ("kcat", kcat),
        ("librdkafka", librdkafka),
        ("kafka-python", kafka_python),
    ):
        session(address)
        captured[name] = first_of_each()
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    json.dump(captured, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
