-- 015: the log as batches (issue 36). Every append (a produce's records for one
-- partition, a committed transaction's journaled batch) is one row of `log`, its records
-- packed as the columns a page carries (broker/rows.py Page): the values concatenated,
-- and each other column as one number for every record or as text, one decimal number
-- a line. A reader finds the row holding an offset by the primary key and starts
-- inside it; a page of a fetch is these columns joined, with no work per record.
-- DESIGN.md ("The log of batches") gives the reasons for this packing.
--
-- A row holds `records` records from first_offset (its base offset) to last_offset.
-- Their offsets are first_offset, first_offset + 1, ... unless compaction took some
-- away: offset_deltas then gives each one's offset - first_offset, a line each.
-- - bytes: of their keys and values (partitions.bytes counts the same);
-- - timestamp_ms: every record's when `timestamps` is NULL, else the first's;
--   max_timestamp_ms: the greatest (retention by time drops a row once it is old);
-- - producer fields are the batch's: a record's sequence is first_sequence + its
--   offset - first_offset (first_sequence 0: none, a plain or transaction's record);
-- - value_lengths: an integer when every value has that length, else text; key_lengths
--   NULL when no record has a key, else text (-1: that record has none), keys the keys
--   concatenated; headers NULL when no record has any, else msgpack [[index, stored
--   headers], ...] of those that do.
-- The small columns come first: a read of them leaves the packed ones in their
-- overflow pages. storage/upgrade.py moves the records of schemas 001-014 (`records`,
-- one row each) into this table in bounded steps at open, then drops `records` and
-- log_batches; until it has finished, nothing else reads the log.

CREATE TABLE log (
    topic_id         INTEGER NOT NULL,
    partition        INTEGER NOT NULL,
    first_offset     INTEGER NOT NULL,
    last_offset      INTEGER NOT NULL,
    records          INTEGER NOT NULL CHECK (records > 0),
    bytes            INTEGER NOT NULL,
    timestamp_ms     INTEGER NOT NULL,
    max_timestamp_ms INTEGER NOT NULL,
    producer_id      INTEGER NOT NULL,
    generation       INTEGER NOT NULL,
    first_sequence   INTEGER NOT NULL,
    epoch            INTEGER NOT NULL,
    txn_id           INTEGER,
    value_lengths    ANY     NOT NULL,
    timestamps       BLOB,
    key_lengths      BLOB,
    headers          BLOB,
    offset_deltas    BLOB,
    keys             BLOB,
    vals             BLOB    NOT NULL,
    PRIMARY KEY (topic_id, partition, first_offset)
) STRICT, WITHOUT ROWID;
