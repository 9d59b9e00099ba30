"""`serve --kafka-listen` and its options: what the server needs to know before it loads
the Kafka codec (kafka-python costs a tenth of a second to import, and a server without
a Kafka listener never pays it)."""

from __future__ import annotations

from msgspec import Struct


class KafkaListen(Struct, frozen=True):
    """`serve --kafka-listen HOST:PORT` and the options that go with it."""

    host: str
    port: int
    auto_create: bool = True  # Kafka's auto.create.topics.enable
    partitions: int = 1  # a created topic's partitions when the client names none
    advertised: str | None = None  # the host Metadata names (default: the bound one)
