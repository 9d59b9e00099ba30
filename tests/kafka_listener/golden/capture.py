"""Capture the requests real Kafka clients send, for tests/kafka_listener/test_kafka_wire.py.

    python tests/kafka_listener/golden/capture.py > tests/kafka_listener/golden/requests.json

Starts a fencelog server with a Kafka listener in this process on a temporary data
directory, records every request frame it reads, has each client (librdkafka via
confluent-kafka, kafka-python, aiokafka) produce one record with a key and a header,
and writes the first frame of each (API key, version) each client sent, as hex.
Regenerate when a client's protocol use changes.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from broker.kafka import wire
from broker.kafka.options import KafkaListen
from broker.server.server import Server

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

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "enable.idempotence": True})
    producer.produce("golden", value=b"librdkafka", key=b"k", headers=[("h", b"1")])
    producer.flush(10)
    captured["librdkafka"] = first_of_each()

    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=address)
    kp.send("golden", b"kafka-python", key=b"k", headers=[("h", b"1")]).get(timeout=10)
    kp.close()
    captured["kafka-python"] = first_of_each()

    from aiokafka import AIOKafkaProducer

    async def aio() -> None:
        ap = AIOKafkaProducer(bootstrap_servers=address)
        await ap.start()
        await ap.send_and_wait("golden", b"aiokafka", key=b"k", headers=[("h", b"1")])
        await ap.stop()

    asyncio.run(aio())
    captured["aiokafka"] = first_of_each()
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    json.dump(captured, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
