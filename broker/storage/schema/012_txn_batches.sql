-- 012: a data journal keeps each produce into a transaction as one row, its records
-- packed in `body` (issue 23). It kept one row per record: every record was a b-tree
-- insert when journaled, read again by the commit's copy and deleted one by one after
-- it, which is most of what a transaction cost beyond a plain produce. The copy now
-- unpacks a batch and inserts its records as a plain produce does, and dropping the
-- journal is one row per batch.
--
-- position is the partition's position of the batch's first record; a batch holds
-- positions [position, position + records). body is msgpack: [values, keys, headers,
-- timestamps], the last three nil when no record has a key, headers (stored encoded,
-- as in records) or a timestamp of its own (the record then takes timestamp_ms).
-- storage/database.py moves what txn_data holds (transactions open or prepared when
-- the broker was upgraded) into this table, one batch per record, and drops txn_data.

CREATE TABLE txn_batches (
    txn_id        INTEGER NOT NULL,
    topic_id      INTEGER NOT NULL,
    partition     INTEGER NOT NULL,
    position      INTEGER NOT NULL,
    records       INTEGER NOT NULL,
    bytes         INTEGER NOT NULL,
    timestamp_ms  INTEGER NOT NULL,
    producer_id   INTEGER NOT NULL,
    generation    INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    body          BLOB    NOT NULL,
    PRIMARY KEY (txn_id, topic_id, partition, position)
) STRICT;
