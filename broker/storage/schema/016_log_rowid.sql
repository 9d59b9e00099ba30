-- 016: `log` keeps its rows in a table with rowids, found through a unique index on
-- (topic_id, partition, first_offset), rather than in a WITHOUT ROWID table keyed by
-- them (schema 015). A WITHOUT ROWID table is a B-tree of whole rows, and SQLite
-- compares a key with a row whose record runs on into overflow pages by reading that
-- row whole: a row of `log` is a batch, 100 KB to megabytes, so every seek (each
-- append's, each read's) read several batches whole. The index holds the three
-- numbers alone and the rows are found by rowid: a seek is microseconds, whatever the
-- batch size (DESIGN.md, "The log of batches").
--
-- The columns and their meaning are schema 015's. The rows of 015's table are moved
-- by storage/upgrade.py in bounded steps at open (each a write transaction that copies
-- the first rows left and deletes them from log_015), then log_015 is dropped; until
-- then nothing else reads the log: the open finishes the move before it returns.

ALTER TABLE log RENAME TO log_015;

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
    vals             BLOB    NOT NULL
) STRICT;

CREATE UNIQUE INDEX log_offsets ON log (topic_id, partition, first_offset);
