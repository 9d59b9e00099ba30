-- 003: idempotent producers and consumer offsets.
--
-- Every record already carries its producer fields. An idempotent append also writes its
-- batch header (as Kafka's RecordBatch does): pid, generation, sequence range, base
-- offset and the broker's append time. Producer state is derived from these headers
-- alone, by replaying them after the newest producer snapshot's offset vector.
-- counters hand out producer ids (and later transaction ids) in blocks.

CREATE TABLE producer_batches (
    topic_id        INTEGER NOT NULL,
    partition       INTEGER NOT NULL,
    base_offset     INTEGER NOT NULL,
    producer_id     INTEGER NOT NULL,
    generation      INTEGER NOT NULL,
    first_sequence  INTEGER NOT NULL,
    last_sequence   INTEGER NOT NULL,
    append_ms       INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset)
) STRICT, WITHOUT ROWID;

CREATE INDEX producer_batches_by_sequence
    ON producer_batches (topic_id, partition, producer_id, first_sequence);

CREATE TABLE counters (
    name   TEXT    PRIMARY KEY,
    value  INTEGER NOT NULL
) STRICT;

CREATE TABLE producer_snapshots (
    snapshot_id  INTEGER PRIMARY KEY,
    created_ms   INTEGER NOT NULL,
    producers    INTEGER NOT NULL,
    evictions    INTEGER NOT NULL,
    body         BLOB    NOT NULL
) STRICT;

CREATE TABLE consumer_offsets (
    group_name     TEXT    NOT NULL,
    topic_id       INTEGER NOT NULL,
    partition      INTEGER NOT NULL,
    next_offset    INTEGER NOT NULL,
    producer_state BLOB,
    committed_ms   INTEGER NOT NULL,
    PRIMARY KEY (group_name, topic_id, partition)
) STRICT, WITHOUT ROWID;
