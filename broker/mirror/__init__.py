"""fencelog mirror: copy topics to and from a Kafka-protocol cluster, exactly once.

- plan.py: pure decisions (the cluster's address, --kafka-config, which topics, whether
  a target topic can take a source topic, the default group, offset translation).
- records.py: the one record shape both sides read and write, and the sides' Protocols.
- fencelog_side.py: fencelog, reached only through broker.client.
- kafka_cluster.py: a Kafka cluster through confluent-kafka (the `mirror` extra), and
  kafka_source.py, kafka_sink.py: the cluster as a source and as a sink.
- failpoints.py: FENCELOG_MIRROR_FAILPOINT, a kill at a chosen step, for fault tests.
- api.py: mirror_to_kafka, mirror_from_kafka: what the CLI and Python callers call.
- run.py: the copy loop that joins a source and a sink, and group translation.

Exactly once: every batch is written in one transaction of the target together with
the mirror's next source offsets (a fencelog transaction with group offsets; a Kafka
transaction with send_offsets_to_transaction), and a start resumes from those offsets.
"""

from broker.mirror.api import mirror, mirror_from_kafka, mirror_to_kafka
from broker.mirror.run import MirrorSummary

__all__ = ["MirrorSummary", "mirror", "mirror_from_kafka", "mirror_to_kafka"]
