-- 001: topics, their partitions, and the partitions' logs.
--
-- A record's producer fields (producer_id, generation, sequence, epoch, txn_id) are stored
-- on every row so that producer state can always be rebuilt from the log alone.
-- partitions.next_offset is the log end offset: the offset the next appended record takes.
-- It moves only inside the writer transaction that inserts the records, so offsets stay
-- contiguous from 0 whichever process appends.

CREATE TABLE topics (
    topic_id     INTEGER PRIMARY KEY,
    name         TEXT    NOT NULL UNIQUE,
    partitions   INTEGER NOT NULL CHECK (partitions > 0),
    created_ms   INTEGER NOT NULL,
    owner_group  TEXT
) STRICT;

CREATE TABLE partitions (
    topic_id     INTEGER NOT NULL REFERENCES topics (topic_id),
    partition    INTEGER NOT NULL CHECK (partition >= 0),
    next_offset  INTEGER NOT NULL DEFAULT 0,
    bytes        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
) STRICT, WITHOUT ROWID;

CREATE TABLE records (
    topic_id     INTEGER NOT NULL,
    partition    INTEGER NOT NULL,
    offset       INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    key          BLOB,
    value        BLOB    NOT NULL,
    headers      BLOB    NOT NULL,
    producer_id  INTEGER NOT NULL DEFAULT 0,
    generation   INTEGER NOT NULL DEFAULT 0,
    sequence     INTEGER NOT NULL DEFAULT 0,
    epoch        INTEGER NOT NULL DEFAULT 0,
    txn_id       INTEGER,
    PRIMARY KEY (topic_id, partition, offset)
) STRICT, WITHOUT ROWID;
