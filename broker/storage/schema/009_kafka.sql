-- 009: what the Kafka listener keeps (DESIGN.md section 11).
--
-- kafka_producers: a Kafka transactional.id's producer id and epoch, and the fencelog
-- transaction it has open. InitProducerId bumps the epoch (fencing every older
-- incarnation) and aborts what the older one left open; every later transactional
-- request must carry the current epoch.
--
-- txn_partitions.first_sequence: the Kafka sequence (+ 1) of a transaction's first
-- record on a partition. A sequenced produce into a transaction must continue it
-- (first_sequence + records journaled there); one that repeats it is a retry and is
-- answered without journaling its records twice.

CREATE TABLE kafka_producers (
    transactional_id  TEXT    PRIMARY KEY,
    producer_id       INTEGER NOT NULL UNIQUE,
    epoch             INTEGER NOT NULL,
    txn_timeout_ms    INTEGER NOT NULL,
    txn_id            INTEGER,
    updated_ms        INTEGER NOT NULL
) STRICT;

ALTER TABLE txn_partitions ADD COLUMN first_sequence INTEGER;
