-- 005: transactions by double journaling (seeds/transactions-double-journaling.txt).
--
-- txn_journal holds the journal partitions J(G): BEGIN, PREPARE_COMMIT, COMPLETE and
-- ABORT entries, contiguous positions per journal. txn_data holds the data journals: a
-- transaction's records, per partition, in the order they were produced, never in the
-- log. PREPARE_COMMIT is the commit point; APPLY_COMMIT then copies each partition's
-- journaled records into the log with one INSERT ... SELECT and sets its base_offset in
-- txn_partitions, so applying twice changes nothing. Consumer offsets committed inside a
-- transaction wait in txn_offsets and take effect at PREPARE_COMMIT. The fences its
-- records were produced under are kept in txn_fences and checked again at PREPARE_COMMIT,
-- so a zombie owner's transaction never lands after a newer claim.

CREATE TABLE txns (
    txn_id            INTEGER PRIMARY KEY,
    group_name        TEXT    NOT NULL,
    txn_key           TEXT,
    journal           INTEGER NOT NULL,
    state             TEXT    NOT NULL,
    began_ms          INTEGER NOT NULL,
    deadline_ms       INTEGER NOT NULL,
    ended_ms          INTEGER,
    reason            TEXT,
    prepare_position  INTEGER
) STRICT;

CREATE INDEX txns_live ON txns (state, journal, prepare_position)
    WHERE state IN ('open', 'prepared');
CREATE INDEX txns_by_key ON txns (group_name, txn_key) WHERE txn_key IS NOT NULL;

CREATE TABLE txn_journal (
    journal     INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    txn_id      INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    at_ms       INTEGER NOT NULL,
    body        BLOB,
    PRIMARY KEY (journal, position)
) STRICT, WITHOUT ROWID;

CREATE INDEX txn_journal_by_txn ON txn_journal (txn_id);

CREATE TABLE txn_partitions (
    txn_id       INTEGER NOT NULL,
    topic_id     INTEGER NOT NULL,
    partition    INTEGER NOT NULL,
    records      INTEGER NOT NULL DEFAULT 0,
    bytes        INTEGER NOT NULL DEFAULT 0,
    base_offset  INTEGER,
    PRIMARY KEY (txn_id, topic_id, partition)
) STRICT, WITHOUT ROWID;

CREATE TABLE txn_data (
    txn_id        INTEGER NOT NULL,
    topic_id      INTEGER NOT NULL,
    partition     INTEGER NOT NULL,
    position      INTEGER NOT NULL,
    timestamp_ms  INTEGER NOT NULL,
    key           BLOB,
    value         BLOB    NOT NULL,
    headers       BLOB    NOT NULL,
    producer_id   INTEGER NOT NULL,
    generation    INTEGER NOT NULL,
    epoch         INTEGER NOT NULL,
    PRIMARY KEY (txn_id, topic_id, partition, position)
) STRICT, WITHOUT ROWID;

CREATE INDEX txn_data_by_producer ON txn_data (txn_id, producer_id, generation)
    WHERE producer_id != 0;

CREATE TABLE txn_members (
    txn_id       INTEGER NOT NULL,
    member       TEXT    NOT NULL,
    producer_id  INTEGER NOT NULL,
    generation   INTEGER NOT NULL,
    PRIMARY KEY (txn_id, member)
) STRICT, WITHOUT ROWID;

CREATE TABLE txn_offsets (
    txn_id          INTEGER NOT NULL,
    group_name      TEXT    NOT NULL,
    topic_id        INTEGER NOT NULL,
    partition       INTEGER NOT NULL,
    next_offset     INTEGER NOT NULL,
    producer_state  BLOB,
    PRIMARY KEY (txn_id, group_name, topic_id, partition)
) STRICT, WITHOUT ROWID;

CREATE TABLE txn_fences (
    txn_id       INTEGER NOT NULL,
    group_name   TEXT    NOT NULL,
    resource     TEXT    NOT NULL,
    generation   INTEGER NOT NULL,
    PRIMARY KEY (txn_id, group_name, resource, generation)
) STRICT, WITHOUT ROWID;
