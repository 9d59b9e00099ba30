-- Named queries. Each block starts with `-- name: NAME`; storage/queries.py loads them.
-- Logic never assembles SQL: it picks a query here by name and binds parameters.
-- A query named *_run inserts RUN_ROWS rows in one statement: the loader repeats its
-- VALUES row, with {i} the row's index in the run and {value} the parameter of its value
-- (numbered after the row's shared parameters).

-- name: partition_insert
INSERT INTO partitions (topic_id, partition) VALUES (?, ?);

-- name: topic_by_name
SELECT t.topic_id, t.name, t.partitions, t.created_ms, t.owner_group,
       coalesce(c.cleanup, 'delete')
FROM topics AS t LEFT JOIN topic_configs AS c USING (topic_id) WHERE t.name = ?;

-- name: topic_by_id
SELECT t.topic_id, t.name, t.partitions, t.created_ms, t.owner_group,
       coalesce(c.cleanup, 'delete')
FROM topics AS t LEFT JOIN topic_configs AS c USING (topic_id) WHERE t.topic_id = ?;

-- name: topics_all
SELECT t.topic_id, t.name, t.partitions, t.created_ms, t.owner_group,
       coalesce(c.cleanup, 'delete')
FROM topics AS t LEFT JOIN topic_configs AS c USING (topic_id) ORDER BY t.name;

-- name: partitions_of_topic
SELECT partition, next_offset, bytes, start_offset FROM partitions WHERE topic_id = ?
ORDER BY partition;

-- name: partition_start
SELECT start_offset FROM partitions WHERE topic_id = ? AND partition = ?;

-- name: partition_end
SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?;

-- name: partition_advance
UPDATE partitions SET next_offset = next_offset + ?, bytes = bytes + ?
WHERE topic_id = ? AND partition = ?;

-- name: records_delete_topic
DELETE FROM records WHERE topic_id = ?;

-- name: partitions_delete_topic
DELETE FROM partitions WHERE topic_id = ?;

-- name: topic_delete
DELETE FROM topics WHERE topic_id = ?;

-- name: record_insert
INSERT INTO records (topic_id, partition, offset, timestamp_ms, key, value, headers,
                     producer_id, generation, sequence, epoch, txn_id)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: record_insert_plain
-- A record without key or headers outside a transaction (X'90': msgpack's empty array,
-- EMPTY_HEADERS). Literals instead of parameters: nothing for sqlite3 to adapt.
INSERT INTO records (topic_id, partition, offset, timestamp_ms, key, value, headers,
                     producer_id, generation, sequence, epoch, txn_id)
VALUES (?, ?, ?, ?, NULL, ?, X'90', ?, ?, ?, ?, NULL);

-- name: record_insert_run
-- RUN_ROWS consecutive records of one plain batch (as record_insert_plain), or of a
-- journaled one that APPLY_COMMIT copies. ?1-?10: topic, partition, first offset,
-- timestamp, pid, generation, first sequence, sequence step (1 with a pid, 0 without),
-- epoch, transaction (NULL outside one).
INSERT INTO records (topic_id, partition, offset, timestamp_ms, key, value, headers,
                     producer_id, generation, sequence, epoch, txn_id)
VALUES (?1, ?2, ?3 + {i}, ?4, NULL, {value}, X'90', ?5, ?6, ?7 + {i} * ?8, ?9, ?10);

-- name: record_insert_stamped_run
-- RUN_ROWS consecutive records of one batch with the producer's timestamps and no key or
-- headers (what Kafka clients send): record_insert_run with a timestamp per row. ?1-?9:
-- topic, partition, first offset, pid, generation, first sequence, sequence step, epoch,
-- transaction; then the RUN_ROWS values, then the RUN_ROWS timestamps.
INSERT INTO records (topic_id, partition, offset, timestamp_ms, key, value, headers,
                     producer_id, generation, sequence, epoch, txn_id)
VALUES (?1, ?2, ?3 + {i}, {stamp}, NULL, {value}, X'90', ?4, ?5, ?6 + {i} * ?7, ?8, ?9);

-- name: log_batch_insert
-- A large batch's shape (schema 013), in the transaction that inserts its records.
INSERT INTO log_batches (topic_id, partition, first_offset, last_offset, timestamp_ms,
                         value_length, keyed, headed, producer_id, generation,
                         first_sequence, sequence_step, epoch, txn_id)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: log_batches_page
-- The shapes of the batches holding offsets [?3, ?4), from the one holding ?3 (none
-- when no shape starts at or before ?3), in offset order.
SELECT first_offset, last_offset, timestamp_ms, value_length, keyed, headed, producer_id,
       generation, first_sequence, sequence_step, epoch, txn_id
FROM log_batches
WHERE topic_id = ?1 AND partition = ?2 AND first_offset < ?4
  AND first_offset >= (SELECT max(first_offset) FROM log_batches
                       WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3)
ORDER BY first_offset;

-- name: log_batches_delete_topic
DELETE FROM log_batches WHERE topic_id = ?;

-- name: log_batches_delete_below
-- The shapes of batches wholly below a new log start (retention).
DELETE FROM log_batches WHERE topic_id = ?1 AND partition = ?2 AND last_offset < ?3;

-- name: log_batch_delete_holding
-- The shape of the batch holding offset ?3, whose record compaction deletes: its
-- records are no longer all there, and its pages are read as before.
DELETE FROM log_batches
WHERE topic_id = ?1 AND partition = ?2 AND first_offset = (
    SELECT max(first_offset) FROM log_batches
    WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3)
  AND last_offset >= ?3;

-- name: log_batches_disagreeing
-- fencelog check: shapes whose records are not all there (above the log start) or do
-- not have the shape (timestamp, value size, keys, headers, producer fields).
SELECT b.topic_id, b.partition, b.first_offset
FROM log_batches AS b JOIN partitions AS p
  ON p.topic_id = b.topic_id AND p.partition = b.partition
WHERE (SELECT count(*) FROM records AS r
       WHERE r.topic_id = b.topic_id AND r.partition = b.partition
         AND r.offset >= max(b.first_offset, p.start_offset) AND r.offset <= b.last_offset)
      != b.last_offset - max(b.first_offset, p.start_offset) + 1
   OR EXISTS (
       SELECT 1 FROM records AS r
       WHERE r.topic_id = b.topic_id AND r.partition = b.partition
         AND r.offset >= b.first_offset AND r.offset <= b.last_offset
         AND (r.timestamp_ms != ifnull(b.timestamp_ms, r.timestamp_ms)
              OR length(r.value) != ifnull(b.value_length, length(r.value))
              OR (NOT b.keyed AND r.key IS NOT NULL)
              OR (NOT b.headed AND r.headers != X'90')
              OR r.producer_id != b.producer_id OR r.generation != b.generation
              OR r.sequence != b.first_sequence + (r.offset - b.first_offset) * b.sequence_step
              OR r.epoch != b.epoch OR r.txn_id IS NOT b.txn_id))
ORDER BY b.topic_id, b.partition, b.first_offset
LIMIT ?;

-- name: records_page_values_counted
-- The page's values concatenated (the aggregate walks the primary key in order), their
-- bytes and how many records gave them, which the page checks against its count.
SELECT ifnull(CAST(group_concat(value, '') AS BLOB), X''), sum(length(value)), count(*)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_values
-- The page's values concatenated, where its batches' shapes give every record's value
-- length: the page checks the concatenation's length instead of SQLite counting.
SELECT ifnull(CAST(group_concat(value, '') AS BLOB), X'')
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_last
-- The last record at offsets [?3, ?4): one seek of the primary key.
SELECT offset, value FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset < ?4
ORDER BY offset DESC LIMIT 1;

-- name: records_page_bytes
-- Bytes of keys and values of a page's records (where its batches' shapes do not say).
SELECT sum(length(value)) + ifnull(sum(length(key)), 0)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_first
-- The first record of a page, which records_page_summary compares every row with.
SELECT timestamp_ms, length(value), producer_id, generation, sequence, epoch, txn_id, value
FROM records
WHERE topic_id = ? AND partition = ? AND offset = ?;

-- name: records_page_summary
-- A page's shape (broker/storage/pages.py): its count, last offset, bytes of keys and
-- values, how many records have a key or headers, and how many differ from the first
-- record (?5..?11) in each column.
SELECT count(*), max(offset), sum(length(value)) + ifnull(sum(length(key)), 0),
       count(key), sum(headers != X'90'),
       sum(timestamp_ms != ?5), sum(length(value) != ?6),
       sum(producer_id != ?7 OR generation != ?8 OR sequence != ?9 OR epoch != ?10
           OR txn_id IS NOT ?11)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset < ?4;

-- name: records_page_sizes
-- Bytes of key and value, one record a line (where a page is cut at read_bytes_max).
SELECT CAST(group_concat(length(value) + ifnull(length(key), 0), char(10)) AS BLOB)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_value_at
SELECT value FROM records WHERE topic_id = ? AND partition = ? AND offset = ?;

-- name: records_page_timestamps
SELECT CAST(group_concat(timestamp_ms, char(10)) AS BLOB)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_value_lengths
SELECT CAST(group_concat(length(value), char(10)) AS BLOB)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_keys
-- Key lengths (-1: no key) and the keys concatenated, in offset order.
SELECT CAST(group_concat(ifnull(length(key), -1), char(10)) AS BLOB),
       CAST(group_concat(key, '') AS BLOB)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_producers
-- producer_id, generation, sequence, epoch, txn_id (-1: none), one line per record.
SELECT CAST(group_concat(producer_id, char(10)) AS BLOB),
       CAST(group_concat(generation, char(10)) AS BLOB),
       CAST(group_concat(sequence, char(10)) AS BLOB),
       CAST(group_concat(epoch, char(10)) AS BLOB),
       CAST(group_concat(ifnull(txn_id, -1), char(10)) AS BLOB)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4;

-- name: records_page_headers
-- The page's records that have headers (most have none: X'90', msgpack's empty array).
SELECT offset, headers
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset <= ?4
  AND headers != X'90';

-- name: records_read_rows
-- A Row: a record without its topic, headers as stored (msgpack).
SELECT partition, offset, timestamp_ms, key, value, headers,
       producer_id, generation, sequence, epoch, txn_id
FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ?
ORDER BY offset
LIMIT ?;

-- name: session_upsert
INSERT INTO sessions (session_id, pid, started_ms, heartbeat_ms) VALUES (?, ?, ?, ?)
ON CONFLICT (session_id) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms;

-- name: session_heartbeat
UPDATE sessions SET heartbeat_ms = ? WHERE session_id = ? RETURNING severed_ms;

-- name: session_by_id
SELECT session_id, pid, heartbeat_ms, severed_ms FROM sessions WHERE session_id = ?;

-- name: sessions_all
SELECT session_id, pid, started_ms, heartbeat_ms, severed_ms FROM sessions
ORDER BY session_id
LIMIT ?;

-- name: session_sever
UPDATE sessions SET severed_ms = ? WHERE session_id = ? AND severed_ms IS NULL;

-- name: session_delete
DELETE FROM sessions WHERE session_id = ?;

-- name: holding_get
SELECT generation, holder FROM ownership WHERE group_name = ? AND resource = ?;

-- name: holding_put
INSERT INTO ownership (group_name, resource, generation, holder, claimed_ms)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT (group_name, resource) DO UPDATE
SET generation = excluded.generation, holder = excluded.holder, claimed_ms = excluded.claimed_ms;

-- name: holdings_of_session
SELECT group_name, resource, generation FROM ownership WHERE holder = ?;

-- name: holding_release
UPDATE ownership SET holder = NULL WHERE group_name = ? AND resource = ? AND holder = ?;

-- name: holdings_all
SELECT group_name, resource, generation, holder, claimed_ms FROM ownership
ORDER BY group_name, resource;

-- name: audit_insert
INSERT INTO ownership_audit (at_ms, group_name, resource, event, session_id, generation,
                             requested, other)
VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: audit_trim
DELETE FROM ownership_audit WHERE audit_id <= (SELECT max(audit_id) FROM ownership_audit) - ?;

-- name: audit_recent
SELECT audit_id, at_ms, group_name, resource, event, session_id, generation, requested, other
FROM ownership_audit
WHERE (?1 IS NULL OR group_name = ?1)
ORDER BY audit_id DESC
LIMIT ?2;

-- name: group_holdings
SELECT resource, generation, holder FROM ownership WHERE group_name = ? ORDER BY resource;

-- name: lease_insert
INSERT INTO producer_leases (topic_id, partition, producer_id, first_offset, first_ms)
VALUES (?, ?, ?, ?, ?);

-- name: lease_of_producer
SELECT first_offset, first_ms FROM producer_leases
WHERE topic_id = ? AND partition = ? AND producer_id = ?;

-- name: leases_delete_topic
DELETE FROM producer_leases WHERE topic_id = ?;

-- name: records_last_of_producers
-- Each idempotent pid's newest record from an offset on: its generation, sequence and
-- offset are its state. sequence > 0 marks an idempotent append (a plain record has
-- pid 0, a transaction's has sequence 0). SQLite takes the bare columns of a max()
-- aggregate from the row holding the maximum.
SELECT producer_id, max(offset), generation, sequence, timestamp_ms
FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ? AND sequence > 0
GROUP BY producer_id
ORDER BY 2;

-- name: record_last_of_producer
-- An evicted pid's newest record: a scan back from the log end to its first record.
SELECT offset, generation, sequence, timestamp_ms
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND producer_id = ?4 AND sequence > 0
ORDER BY offset DESC
LIMIT 1;

-- name: records_of_sequences
-- A duplicate's originals: a pid's sequences ?6..?7 between offsets ?3..?4, from the
-- higher offset down, stopping once all ?8 are found.
SELECT sequence, offset
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset BETWEEN ?3 AND ?4
  AND producer_id = ?5 AND sequence BETWEEN ?6 AND ?7
ORDER BY offset DESC
LIMIT ?8;

-- name: offsets_delete_topic
DELETE FROM consumer_offsets WHERE topic_id = ?;

-- name: producer_id_issue
INSERT INTO producer_ids (producer_id, generation, issued_ms) VALUES (?, ?, ?)
ON CONFLICT (producer_id) DO NOTHING;

-- name: producer_id_issued
SELECT generation, issued_ms FROM producer_ids WHERE producer_id = ?;

-- name: counter_get
SELECT value FROM counters WHERE name = ?;

-- name: counter_put
INSERT INTO counters (name, value) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: snapshot_insert
INSERT INTO producer_snapshots (created_ms, producers, evictions, body) VALUES (?, ?, ?, ?);

-- name: snapshot_newest
SELECT snapshot_id, created_ms, body FROM producer_snapshots ORDER BY snapshot_id DESC LIMIT 1;

-- name: snapshots_all
SELECT snapshot_id, created_ms, producers, evictions, length(body) FROM producer_snapshots
ORDER BY snapshot_id DESC;

-- name: snapshots_trim
DELETE FROM producer_snapshots
WHERE snapshot_id <= (SELECT max(snapshot_id) FROM producer_snapshots) - ?;

-- name: snapshots_delete_all
DELETE FROM producer_snapshots;

-- name: offset_commit
INSERT INTO consumer_offsets (group_name, topic_id, partition, next_offset, producer_state,
                              committed_ms, metadata, leader_epoch)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (group_name, topic_id, partition) DO UPDATE
SET next_offset = excluded.next_offset, producer_state = excluded.producer_state,
    committed_ms = excluded.committed_ms, metadata = excluded.metadata,
    leader_epoch = excluded.leader_epoch;

-- name: offsets_of_group
SELECT partition, next_offset, producer_state, committed_ms, metadata, leader_epoch
FROM consumer_offsets
WHERE group_name = ? AND topic_id = ?
ORDER BY partition;

-- name: offsets_all_groups
-- Every group's next offsets, on the topics that exist (limit: how many rows at most).
SELECT o.group_name, t.name, o.partition, o.next_offset, o.committed_ms
FROM consumer_offsets AS o JOIN topics AS t USING (topic_id)
ORDER BY o.group_name, t.name, o.partition
LIMIT ?;

-- name: access_get
SELECT epoch, last_exclusive FROM topic_access WHERE topic_id = ?;

-- name: access_put
INSERT INTO topic_access (topic_id, epoch, last_exclusive) VALUES (?, ?, ?)
ON CONFLICT (topic_id) DO UPDATE SET epoch = excluded.epoch,
                                     last_exclusive = excluded.last_exclusive;

-- name: access_delete_topic
DELETE FROM topic_access WHERE topic_id = ?;

-- name: attachments_of_topic
SELECT attachment_id, session_id, name, mode, epoch FROM producer_attachments
WHERE topic_id = ? ORDER BY attachment_id;

-- name: attachment_by_id
SELECT topic_id, session_id, name, mode, epoch FROM producer_attachments
WHERE attachment_id = ?;

-- name: attachment_update
UPDATE producer_attachments SET mode = ?, epoch = ? WHERE attachment_id = ?;

-- name: attachment_delete
DELETE FROM producer_attachments WHERE attachment_id = ?;

-- name: attachments_of_session
SELECT attachment_id, topic_id FROM producer_attachments WHERE session_id = ?;

-- name: attachments_delete_topic
DELETE FROM producer_attachments WHERE topic_id = ?;

-- name: records_compacted
SELECT ?, partition, offset, timestamp_ms, key, value, headers AS "headers [fencelog_headers]",
       producer_id, generation, sequence, epoch, txn_id
FROM records
WHERE topic_id = ?2 AND partition = ?3 AND offset IN (
    SELECT max(offset) FROM records
    WHERE topic_id = ?2 AND partition = ?3 AND key IS NOT NULL
    GROUP BY key)
ORDER BY offset;

-- name: topic_insert_with_id
INSERT INTO topics (topic_id, name, partitions, created_ms, owner_group) VALUES (?, ?, ?, ?, ?);

-- name: topic_id_max
SELECT coalesce(max(topic_id), 0) FROM topics;

-- name: attachment_id_max
SELECT coalesce(max(attachment_id), 0) FROM producer_attachments;

-- name: attachment_insert_with_id
INSERT INTO producer_attachments (attachment_id, topic_id, session_id, name, mode, epoch,
                                  attached_ms)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: offsets_delete_group
DELETE FROM consumer_offsets WHERE group_name = ?;

-- name: offsets_delete_partition
DELETE FROM consumer_offsets WHERE group_name = ? AND topic_id = ? AND partition = ?;

-- name: offsets_state_put
UPDATE consumer_offsets SET producer_state = ? WHERE group_name = ? AND topic_id = ?;

-- name: txn_insert
INSERT INTO txns (txn_id, group_name, txn_key, journal, state, began_ms, deadline_ms)
VALUES (?, ?, ?, ?, 'open', ?, ?);

-- name: txn_by_id
SELECT txn_id, group_name, txn_key, journal, state, began_ms, deadline_ms, ended_ms, reason,
       prepare_position
FROM txns WHERE txn_id = ?;

-- name: txn_by_key
SELECT txn_id, group_name, txn_key, journal, state, began_ms, deadline_ms, ended_ms, reason,
       prepare_position
FROM txns WHERE group_name = ? AND txn_key = ? AND state != 'aborted'
ORDER BY txn_id DESC LIMIT 1;

-- name: txns_live
SELECT txn_id, group_name, txn_key, journal, state, began_ms, deadline_ms, ended_ms, reason,
       prepare_position
FROM txns WHERE state IN ('open', 'prepared') ORDER BY txn_id;

-- name: txns_recent
SELECT txn_id, group_name, txn_key, journal, state, began_ms, deadline_ms, ended_ms, reason,
       prepare_position
FROM txns ORDER BY txn_id DESC LIMIT ?;

-- name: txns_expired
SELECT txn_id FROM txns WHERE state = 'open' AND deadline_ms <= ? ORDER BY txn_id;

-- name: txns_prepared_in_journal
SELECT txn_id FROM txns
WHERE state = 'prepared' AND journal = ? AND prepare_position <= ?
ORDER BY prepare_position;

-- name: txns_prepared
SELECT txn_id FROM txns WHERE state = 'prepared' ORDER BY journal, prepare_position;

-- name: txn_set_state
UPDATE txns SET state = ?, ended_ms = ?, reason = ? WHERE txn_id = ?;

-- name: txn_set_deadline
UPDATE txns SET deadline_ms = ? WHERE txn_id = ?;

-- name: txn_set_prepared
UPDATE txns SET state = 'prepared', prepare_position = ? WHERE txn_id = ?;

-- name: txn_journal_end
SELECT coalesce(max(position) + 1, 0) FROM txn_journal WHERE journal = ?;

-- name: txn_journal_append
INSERT INTO txn_journal (journal, position, txn_id, kind, at_ms, body) VALUES (?, ?, ?, ?, ?, ?);

-- name: txn_journal_of
SELECT journal, position, kind, at_ms, body FROM txn_journal WHERE txn_id = ?
ORDER BY position;

-- name: txn_partition_touch
INSERT INTO txn_partitions (txn_id, topic_id, partition) VALUES (?, ?, ?)
ON CONFLICT (txn_id, topic_id, partition) DO NOTHING;

-- name: txn_partition_add
-- Records journaled into a partition: its counts grow with them (storage/txns.py).
INSERT INTO txn_partitions (txn_id, topic_id, partition, records, bytes) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (txn_id, topic_id, partition)
DO UPDATE SET records = records + excluded.records, bytes = bytes + excluded.bytes;

-- name: txn_partitions_zero_topic
-- A deleted topic's journaled records of open transactions are gone: so are their counts.
UPDATE txn_partitions SET records = 0, bytes = 0
WHERE topic_id = ? AND txn_id IN (SELECT txn_id FROM txns WHERE state = 'open');

-- name: txn_partitions_of
SELECT tp.topic_id, t.name, tp.partition, tp.records, tp.bytes, tp.base_offset
FROM txn_partitions tp LEFT JOIN topics t ON t.topic_id = tp.topic_id
WHERE tp.txn_id = ?
ORDER BY tp.topic_id, tp.partition;

-- name: txn_partition_count
UPDATE txn_partitions
SET (records, bytes) = (SELECT coalesce(sum(b.records), 0), coalesce(sum(b.bytes), 0)
                        FROM txn_batches b
                        WHERE b.txn_id = ?1 AND b.topic_id = txn_partitions.topic_id
                          AND b.partition = txn_partitions.partition)
WHERE txn_id = ?1;

-- name: txn_partitions_drop_empty
DELETE FROM txn_partitions WHERE txn_id = ? AND records = 0;

-- name: txn_partition_applied
UPDATE txn_partitions SET base_offset = ? WHERE txn_id = ? AND topic_id = ? AND partition = ?;

-- name: txn_batch_end
-- The position after a partition's last journaled batch (0: none).
SELECT position + records FROM txn_batches
WHERE txn_id = ? AND topic_id = ? AND partition = ?
ORDER BY position DESC LIMIT 1;

-- name: txn_batch_insert
INSERT INTO txn_batches (txn_id, topic_id, partition, position, records, bytes, timestamp_ms,
                         producer_id, generation, epoch, body)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: txn_batches_of_partition
-- APPLY_COMMIT's copy reads a partition's batches in journal order, ?5 at a time from
-- position ?4, each page read whole: with this statement left open, the copy's inserts
-- ran about 75% slower (bench/RESULTS.md, issue 23).
SELECT position, records, timestamp_ms, producer_id, generation, body FROM txn_batches
WHERE txn_id = ?1 AND topic_id = ?2 AND partition = ?3 AND position >= ?4
ORDER BY position LIMIT ?5;

-- name: txn_batches_read
SELECT coalesce(t.name, ''), b.partition, b.position, b.records, b.timestamp_ms,
       b.producer_id, b.generation, b.epoch, b.body
FROM txn_batches b LEFT JOIN topics t ON t.topic_id = b.topic_id
WHERE b.txn_id = ?
ORDER BY b.topic_id, b.partition, b.position;

-- name: txn_batches_delete_partition
DELETE FROM txn_batches WHERE txn_id = ? AND topic_id = ? AND partition = ?;

-- name: txn_batches_delete
DELETE FROM txn_batches WHERE txn_id = ?;

-- name: txn_batches_older
-- A member's records of generations before ?3, counted, then deleted by txn_batches_fence.
SELECT coalesce(sum(records), 0) FROM txn_batches
WHERE txn_id = ?1 AND producer_id = ?2 AND generation < ?3;

-- name: txn_batches_fence
DELETE FROM txn_batches WHERE txn_id = ?1 AND producer_id = ?2 AND generation < ?3;

-- name: txn_batches_delete_topic
DELETE FROM txn_batches WHERE topic_id = ?;

-- name: txn_batches_all
-- Every journaled batch, for `fencelog check` to decode.
SELECT txn_id, topic_id, partition, position, records, body FROM txn_batches;

-- name: txn_data_legacy
-- The one-row-per-record data journal of schemas 005 to 011, moved by schema 012.
SELECT txn_id, topic_id, partition, position, timestamp_ms, key, value, headers,
       producer_id, generation, epoch
FROM txn_data;

-- name: txn_data_legacy_drop
DROP TABLE txn_data;

-- name: txn_member_get
SELECT producer_id, generation FROM txn_members WHERE txn_id = ? AND member = ?;

-- name: txn_member_by_pid
SELECT member, generation FROM txn_members WHERE txn_id = ? AND producer_id = ?;

-- name: txn_member_put
INSERT INTO txn_members (txn_id, member, producer_id, generation) VALUES (?, ?, ?, ?)
ON CONFLICT (txn_id, member) DO UPDATE SET generation = excluded.generation;

-- name: txn_members_delete
DELETE FROM txn_members WHERE txn_id = ?;

-- name: txn_offset_put
INSERT INTO txn_offsets (txn_id, group_name, topic_id, partition, next_offset, producer_state,
                         metadata, leader_epoch)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (txn_id, group_name, topic_id, partition) DO UPDATE
SET next_offset = excluded.next_offset, producer_state = excluded.producer_state,
    metadata = excluded.metadata, leader_epoch = excluded.leader_epoch;

-- name: txn_offsets_apply
INSERT INTO consumer_offsets (group_name, topic_id, partition, next_offset, producer_state,
                              committed_ms, metadata, leader_epoch)
SELECT group_name, topic_id, partition, next_offset, producer_state, ?2, metadata, leader_epoch
FROM txn_offsets WHERE txn_id = ?1 AND topic_id IN (SELECT topic_id FROM topics)
ORDER BY group_name, topic_id, partition
ON CONFLICT (group_name, topic_id, partition) DO UPDATE
SET next_offset = excluded.next_offset, producer_state = excluded.producer_state,
    committed_ms = excluded.committed_ms, metadata = excluded.metadata,
    leader_epoch = excluded.leader_epoch;

-- name: txn_offsets_pending
-- Partitions of a topic whose offsets for a group a transaction holds, with its state
-- and deadline (core.txn.holds_pending_offsets says which count).
SELECT o.partition, t.state, t.deadline_ms FROM txn_offsets o JOIN txns t ON t.txn_id = o.txn_id
WHERE o.group_name = ?1 AND o.topic_id = ?2
ORDER BY o.partition;

-- name: txn_offsets_count
SELECT count(*) FROM txn_offsets WHERE txn_id = ?;

-- name: txn_offsets_delete
DELETE FROM txn_offsets WHERE txn_id = ?;

-- name: txns_prune
SELECT txn_id FROM txns WHERE state IN ('committed', 'aborted')
ORDER BY txn_id DESC LIMIT -1 OFFSET ?;

-- name: txn_delete
DELETE FROM txns WHERE txn_id = ?;

-- name: txn_journal_delete
DELETE FROM txn_journal WHERE txn_id = ?;

-- name: txn_partitions_delete
DELETE FROM txn_partitions WHERE txn_id = ?;

-- name: txn_batch_writers
SELECT producer_id, generation, sum(records) FROM txn_batches WHERE txn_id = ?
GROUP BY producer_id, generation;

-- name: txn_batches_delete_writer
DELETE FROM txn_batches WHERE txn_id = ? AND producer_id = ? AND generation = ?;

-- name: txn_members_all
SELECT member, producer_id, generation FROM txn_members WHERE txn_id = ?;

-- name: txn_fence_put
INSERT INTO txn_fences (txn_id, group_name, resource, generation) VALUES (?, ?, ?, ?)
ON CONFLICT DO NOTHING;

-- name: txn_fences_of
SELECT group_name, resource, generation FROM txn_fences WHERE txn_id = ?;

-- name: txn_fences_delete
DELETE FROM txn_fences WHERE txn_id = ?;

-- name: txn_offset_states
SELECT DISTINCT group_name, topic_id, producer_state FROM txn_offsets
WHERE txn_id = ? AND producer_state IS NOT NULL AND topic_id IN (SELECT topic_id FROM topics);

-- name: txn_topics
SELECT DISTINCT topic_id FROM txn_partitions WHERE txn_id = ? ORDER BY topic_id;

-- name: txn_first_sequence
SELECT first_sequence FROM txn_partitions WHERE txn_id = ? AND topic_id = ? AND partition = ?;

-- name: txn_first_sequence_set
UPDATE txn_partitions SET first_sequence = ?4
WHERE txn_id = ?1 AND topic_id = ?2 AND partition = ?3;

-- name: kafka_producer
SELECT transactional_id, producer_id, epoch, txn_timeout_ms, txn_id
FROM kafka_producers WHERE transactional_id = ?;

-- name: kafka_producer_by_pid
SELECT transactional_id, producer_id, epoch, txn_timeout_ms, txn_id
FROM kafka_producers WHERE producer_id = ?;

-- name: kafka_producer_put
INSERT INTO kafka_producers
    (transactional_id, producer_id, epoch, txn_timeout_ms, txn_id, updated_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (transactional_id) DO UPDATE SET
    producer_id = ?2, epoch = ?3, txn_timeout_ms = ?4, txn_id = ?5, updated_ms = ?6;

-- name: kafka_producer_set_txn
UPDATE kafka_producers SET txn_id = ?2, updated_ms = ?3 WHERE transactional_id = ?1;

-- name: kafka_producers_all
SELECT transactional_id, producer_id, epoch, txn_timeout_ms, txn_id
FROM kafka_producers ORDER BY transactional_id LIMIT ?;

-- name: records_offset_for_time
SELECT offset, timestamp_ms FROM records
WHERE topic_id = ? AND partition = ? AND timestamp_ms >= ?
ORDER BY offset LIMIT 1;

-- name: records_read_kafka
-- What a Kafka record batch holds of a record: offset, timestamp, key, value, headers.
SELECT offset, timestamp_ms, key, value, headers
FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ?
ORDER BY offset
LIMIT ?;

-- name: topic_config
SELECT retention_ms, retention_bytes, cleanup FROM topic_configs WHERE topic_id = ?;

-- name: topic_config_put
INSERT INTO topic_configs (topic_id, retention_ms, retention_bytes, cleanup)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (topic_id) DO UPDATE SET retention_ms = ?2, retention_bytes = ?3, cleanup = ?4;

-- name: topic_config_delete
DELETE FROM topic_configs WHERE topic_id = ?;

-- name: topic_set_partitions
UPDATE topics SET partitions = ?2 WHERE topic_id = ?1;

-- name: partition_insert_at
INSERT INTO partitions (topic_id, partition) VALUES (?, ?);

-- name: records_front
-- The first records of a partition from its log start: what cleaning may delete next.
SELECT offset, timestamp_ms, length(value) + coalesce(length(key), 0)
FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ?
ORDER BY offset
LIMIT ?;

-- name: records_delete_below
DELETE FROM records WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset < ?4;

-- name: partition_start_set
UPDATE partitions SET start_offset = ?3, bytes = max(0, bytes - ?4)
WHERE topic_id = ?1 AND partition = ?2;

-- name: partition_shrink
UPDATE partitions SET bytes = max(0, bytes - ?3) WHERE topic_id = ?1 AND partition = ?2;

-- name: records_superseded
-- Up to ?5 keyed records of a partition, at offsets in [?3, ?4), that a later record
-- with the same key supersedes (compaction); tombstones are the caller's.
SELECT r.offset, length(r.value) + length(r.key)
FROM records AS r
WHERE r.topic_id = ?1 AND r.partition = ?2 AND r.offset >= ?3 AND r.offset < ?4
  AND r.key IS NOT NULL
  AND EXISTS (
      SELECT 1 FROM records AS later
      WHERE later.topic_id = ?1 AND later.partition = ?2 AND later.key = r.key
        AND later.offset > r.offset)
ORDER BY r.offset
LIMIT ?5;

-- name: records_old_tombstones
-- Up to ?6 tombstones (a key, an empty value) at offsets in [?3, ?4) older than ?5 ms.
SELECT offset, length(key)
FROM records
WHERE topic_id = ?1 AND partition = ?2 AND offset >= ?3 AND offset < ?4
  AND key IS NOT NULL AND length(value) = 0 AND timestamp_ms < ?5
ORDER BY offset
LIMIT ?6;

-- name: record_delete
DELETE FROM records WHERE topic_id = ? AND partition = ? AND offset = ?;

-- name: record_time_at_or_after
-- The first record of a partition at or after an offset, and its timestamp: one seek of
-- the primary key (topic_id, partition, offset), a probe of offset_for_time's search.
SELECT offset, timestamp_ms FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ?
ORDER BY offset LIMIT 1;

-- name: records_after
-- Whether a partition holds a record after an offset (a read inside a compaction gap).
SELECT 1 FROM records WHERE topic_id = ? AND partition = ? AND offset > ? LIMIT 1;
