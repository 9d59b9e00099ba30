"""Message specs, in the JSON form kafka-python builds its protocol classes from, for
the Kafka APIs fencelog answers that kafka-python 3.0 does not ship (KIP-848's
ConsumerGroupHeartbeat and ConsumerGroupDescribe). Written for fencelog from the
protocol's field list: names, types and versions are the wire's; the prose is ours."""
