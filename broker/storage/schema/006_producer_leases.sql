-- 006: producer state from the records alone; batch headers give way to lease rows.
--
-- Every record already carries its producer fields (pid, generation, sequence), so a
-- header per idempotent batch repeated the log, at the price of two more B-tree inserts
-- (the header and its index) in every commit. From here on producer state is replayed
-- from the records after the newest producer snapshot's offset vector, and a duplicate's
-- original offsets come from a bounded search of the partition's records.
--
-- What the records cannot say is when the broker appended a pid's first record on a
-- partition (a record may carry the producer's own timestamp), and the lease runs from
-- there. producer_leases keeps that, with the pid's first offset (the lower bound of any
-- search for it), written once per (pid, partition) with its first batch.
--
-- An existing data directory keeps what its headers knew: each pid's first batch on each
-- partition becomes its lease row (SQLite takes the bare columns of a min() aggregate
-- from the row holding the minimum).

CREATE TABLE producer_leases (
    topic_id      INTEGER NOT NULL,
    partition     INTEGER NOT NULL,
    producer_id   INTEGER NOT NULL,
    first_offset  INTEGER NOT NULL,
    first_ms      INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id)
) STRICT, WITHOUT ROWID;

INSERT INTO producer_leases (topic_id, partition, producer_id, first_offset, first_ms)
SELECT topic_id, partition, producer_id, min(base_offset), append_ms
FROM producer_batches
GROUP BY topic_id, partition, producer_id;

DROP INDEX producer_batches_by_sequence;
DROP TABLE producer_batches;
