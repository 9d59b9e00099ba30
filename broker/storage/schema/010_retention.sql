-- 010: retention and compaction (issue 20).
--
-- topic_configs: a topic's retention (by age of its records' timestamps, by bytes per
-- partition) and its cleanup policy: 'delete' drops records from the front of each
-- partition past its retention; 'compact' keeps the newest record of every key (and a
-- tombstone, a keyed record with an empty value, for tombstone_retention_ms). No row:
-- 'delete' with no retention, what every topic had before.
--
-- partitions.start_offset: the log start offset. Cleaning deletes records below it;
-- offsets are never reused or renumbered, and compaction leaves gaps above it.

CREATE TABLE topic_configs (
    topic_id         INTEGER PRIMARY KEY,
    retention_ms     INTEGER,
    retention_bytes  INTEGER,
    cleanup          TEXT    NOT NULL DEFAULT 'delete' CHECK (cleanup IN ('delete', 'compact'))
) STRICT;

ALTER TABLE partitions ADD COLUMN start_offset INTEGER NOT NULL DEFAULT 0;

-- Compaction asks, of each keyed record, whether a later record has its key: this index
-- answers it without a scan (and serves `consume --compacted`). Keyed records only: a
-- plain record's insert does not pay for it.
CREATE INDEX records_by_key ON records (topic_id, partition, key, offset) WHERE key IS NOT NULL;
