"""The Kafka wire protocol: `fencelog serve --kafka-listen` (DESIGN.md section 11)."""
