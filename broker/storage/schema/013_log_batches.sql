-- 013: the shape of each large batch appended to a partition's log (issue 21), kept
-- beside its records so that a page (broker/storage/pages.py) learns it without reading
-- every record: one row per batch of at least SHAPED_RECORDS_MIN records (smaller ones
-- would cost a row each for little), written in the same transaction as its records
-- by every path that inserts records (storage/logs.py's appends, storage/txns.py's
-- commit copy).
--
-- A batch holds offsets [first_offset, last_offset]. timestamp_ms and value_length are
-- every record's, or NULL where they vary; keyed and headed say whether any record has
-- a key or headers; a record's sequence is first_sequence + its index * sequence_step.
-- Its records are all in `records` while the row exists, but those below the log start:
-- retention deletes the rows wholly below it, compaction the row of any record it
-- deletes, and a topic's deletion its rows. Records written before 013 have no row;
-- their pages are read as before.

CREATE TABLE log_batches (
    topic_id       INTEGER NOT NULL,
    partition      INTEGER NOT NULL,
    first_offset   INTEGER NOT NULL,
    last_offset    INTEGER NOT NULL,
    timestamp_ms   INTEGER,
    value_length   INTEGER,
    keyed          INTEGER NOT NULL,
    headed         INTEGER NOT NULL,
    producer_id    INTEGER NOT NULL,
    generation     INTEGER NOT NULL,
    first_sequence INTEGER NOT NULL,
    sequence_step  INTEGER NOT NULL,
    epoch          INTEGER NOT NULL,
    txn_id         INTEGER,
    PRIMARY KEY (topic_id, partition, first_offset)
) STRICT, WITHOUT ROWID;
