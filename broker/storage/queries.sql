-- Named queries. Each block starts with `-- name: NAME`; storage/queries.py loads them.
-- Logic never assembles SQL: it picks a query here by name and binds parameters.

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

-- name: log_insert
-- A batch appended (storage/batches.py pack): its row of `log` (schema 015).
INSERT INTO log (topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: log_replace
-- A batch compaction rewrote, at its first offset.
REPLACE INTO log (topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: log_from
-- A partition's batches from the one holding offset ?3 (the last starting at or before
-- it: one seek of log_offsets), in offset order; the caller stops reading when it
-- has enough.
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset >= coalesce((SELECT first_offset FROM log
                                WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3
                                ORDER BY first_offset DESC LIMIT 1), ?3)
ORDER BY first_offset;

-- name: log_times_from
-- The partition's first time index row at or after offset ?3 (schema 018).
SELECT first_offset, max_timestamp_ms FROM log_times
WHERE topic_id = ?1 AND partition = ?2 AND first_offset >= ?3
ORDER BY first_offset LIMIT 1;

-- name: log_times_last
-- The partition's last time index row (schema 018).
SELECT first_offset, max_timestamp_ms FROM log_times
WHERE topic_id = ?1 AND partition = ?2
ORDER BY first_offset DESC LIMIT 1;

-- name: log_reaching
-- The first batch holding a record at or after offset ?3 whose greatest timestamp is
-- at or after ?4, without its keys and values (NULL, empty: what a search by time does
-- not read, nor SQLite for it, being the row's last columns), then the values' length.
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, NULL, X'', length(vals)
FROM log
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset >= coalesce((SELECT first_offset FROM log
                                WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3
                                ORDER BY first_offset DESC LIMIT 1), ?3)
  AND last_offset >= ?3 AND max_timestamp_ms >= ?4
ORDER BY first_offset
LIMIT 1;

-- name: log_times_below
-- Retention: the time index rows below a new log start ?3 but the last of them, which
-- still bounds every timestamp before it.
DELETE FROM log_times
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset < (SELECT first_offset FROM log_times
                      WHERE topic_id = ?1 AND partition = ?2 AND first_offset < ?3
                      ORDER BY first_offset DESC LIMIT 1);

-- name: log_times_delete_topic
DELETE FROM log_times WHERE topic_id = ?;

-- name: log_greatest_time_after
-- The first batch after the one starting at ?3 whose greatest timestamp is the
-- partition's greatest past it (ListOffsets' MAX_TIMESTAMP): every batch's row is read
-- for its max_timestamp_ms, none of its records.
SELECT first_offset, max_timestamp_ms
FROM log
WHERE topic_id = ?1 AND partition = ?2 AND first_offset > ?3
ORDER BY max_timestamp_ms DESC, first_offset
LIMIT 1;

-- name: log_front
-- The batches from the one holding the log start ?3: what cleaning may delete next.
SELECT last_offset, max_timestamp_ms, bytes, records
FROM log
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset >= coalesce((SELECT first_offset FROM log
                                WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3
                                ORDER BY first_offset DESC LIMIT 1), ?3)
ORDER BY first_offset;

-- name: log_delete_below
-- The batches wholly below a new log start ?3.
DELETE FROM log WHERE topic_id = ?1 AND partition = ?2 AND first_offset < ?3 AND last_offset < ?3;

-- name: log_delete_topic
DELETE FROM log WHERE topic_id = ?;

-- name: log_delete_batch
DELETE FROM log WHERE topic_id = ? AND partition = ? AND first_offset = ?;

-- name: log_keyed_between
-- The batches holding keyed records, from the one holding offset ?3 to those starting
-- before ?4 (compaction's window; ?4 past the end: all).
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset >= coalesce((SELECT first_offset FROM log
                                WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3
                                ORDER BY first_offset DESC LIMIT 1), ?3)
  AND first_offset < ?4 AND key_lengths IS NOT NULL
ORDER BY first_offset;

-- name: log_all
-- Every batch, for `fencelog check` to decode (and those of schema 015 not yet moved).
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log
ORDER BY topic_id, partition, first_offset;

-- name: log_015_all
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log_015
ORDER BY topic_id, partition, first_offset;

-- name: log_last_of_producers
-- Each idempotent pid's newest batch ending at or after offset ?3: its last record's
-- generation, sequence and offset are the pid's state. first_sequence > 0 marks an
-- idempotent append (a plain batch has pid 0, a transaction's first_sequence 0).
-- SQLite takes the bare columns of a max() aggregate from the row holding the maximum.
SELECT producer_id, max(first_offset), last_offset, generation, first_sequence,
       timestamp_ms, timestamps
FROM log
WHERE topic_id = ?1 AND partition = ?2
  AND first_offset >= coalesce((SELECT first_offset FROM log
                                WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?3
                                ORDER BY first_offset DESC LIMIT 1), ?3)
  AND first_sequence > 0
GROUP BY producer_id
ORDER BY 2;

-- name: log_last_of_producer
-- An evicted pid's newest batch: a scan back from the log end to its first batch.
SELECT first_offset, last_offset, generation, first_sequence, timestamp_ms, timestamps
FROM log
WHERE topic_id = ?1 AND partition = ?2 AND first_offset >= ?3 AND producer_id = ?4
  AND first_sequence > 0
ORDER BY first_offset DESC
LIMIT 1;

-- name: log_of_sequences
-- A duplicate's originals: a pid's batches holding sequences ?6..?7 between offsets
-- ?3..?4, from the higher offset down; the caller stops once it has them all.
SELECT first_offset, last_offset, first_sequence, offset_deltas
FROM log
WHERE topic_id = ?1 AND partition = ?2 AND first_offset <= ?4 AND last_offset >= ?3
  AND producer_id = ?5 AND first_sequence > 0
  AND first_sequence <= ?7 AND first_sequence + (last_offset - first_offset) >= ?6
ORDER BY first_offset DESC;

-- name: partitions_delete_topic
DELETE FROM partitions WHERE topic_id = ?;

-- name: topic_delete
DELETE FROM topics WHERE topic_id = ?;

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
-- A journaled batch: its facts, and the rowid of its records' row of `log` (schema 017;
-- the body is then empty).
INSERT INTO txn_batches (txn_id, topic_id, partition, position, records, bytes, timestamp_ms,
                         producer_id, generation, epoch, body, log_rowid)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, x'', ?);

-- name: txn_batch_insert_packed
-- A journaled batch with its records in its body (schema 012's move of the older journal).
INSERT INTO txn_batches (txn_id, topic_id, partition, position, records, bytes, timestamp_ms,
                         producer_id, generation, epoch, body)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: log_journal_end
-- Where the next journaled row of topic ?3's partition ?2 goes (?1: the hidden topic id,
-- storage/txns.py journal_topic_id): after the last journaled row there, or at the
-- partition's end if that is further.
SELECT max((SELECT next_offset FROM partitions WHERE topic_id = ?3 AND partition = ?2),
           coalesce((SELECT last_offset + 1 FROM log WHERE topic_id = ?1 AND partition = ?2
                     ORDER BY first_offset DESC LIMIT 1), 0));

-- name: log_journaled_move
-- APPLY_COMMIT of a journaled row: its real key, offsets and the topic's epoch now.
UPDATE log SET topic_id = ?, first_offset = ?, last_offset = ?, epoch = ? WHERE rowid = ?;

-- name: log_journaled_shape
-- What the commit checks of a journaled row before it moves it: its topic id, its
-- batches.Shape, and the length of its values (which SQLite knows without reading them).
SELECT topic_id, first_offset, last_offset, records, value_lengths, timestamps, key_lengths,
       offset_deltas, length(vals)
FROM log WHERE rowid = ?;

-- name: log_by_rowid
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log WHERE rowid = ?;

-- name: txn_batches_of_partition
-- APPLY_COMMIT's copy reads a partition's batches in journal order, ?5 at a time from
-- position ?4, each page read whole: with this statement left open, the copy's inserts
-- ran about 75% slower (bench/RESULTS.md, issue 23).
SELECT position, records, timestamp_ms, producer_id, generation, body, log_rowid FROM txn_batches
WHERE txn_id = ?1 AND topic_id = ?2 AND partition = ?3 AND position >= ?4
ORDER BY position LIMIT ?5;

-- name: txn_batches_to_copy
SELECT coalesce(sum(bytes), 0) FROM txn_batches WHERE txn_id = ? AND log_rowid IS NULL;

-- name: txn_batches_read
SELECT coalesce(t.name, ''), b.partition, b.position, b.records, b.timestamp_ms,
       b.producer_id, b.generation, b.epoch, b.body, b.log_rowid
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
SELECT txn_id, topic_id, partition, position, records, body, log_rowid FROM txn_batches;

-- name: txn_batches_all_012
-- txn_batches_all of a database not yet upgraded to schema 017 (`fencelog check` reads
-- a directory as it finds it).
SELECT txn_id, topic_id, partition, position, records, body, NULL FROM txn_batches;

-- name: txn_batches_log_rowid
SELECT 1 FROM pragma_table_info('txn_batches') WHERE name = 'log_rowid';

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

-- name: partition_start_set
UPDATE partitions SET start_offset = ?3, bytes = max(0, bytes - ?4)
WHERE topic_id = ?1 AND partition = ?2;

-- name: partition_shrink
UPDATE partitions SET bytes = max(0, bytes - ?3) WHERE topic_id = ?1 AND partition = ?2;


-- name: legacy_records_table
-- Whether the one-row-per-record log of schemas 001-014 is still there (storage/upgrade.py).
SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'records';

-- name: legacy_records_first
SELECT topic_id, partition, offset, timestamp_ms, key, value, headers,
       producer_id, generation, sequence, epoch, txn_id
FROM records
ORDER BY topic_id, partition, offset
LIMIT ?;

-- name: legacy_records_delete
DELETE FROM records WHERE topic_id = ? AND partition = ? AND offset BETWEEN ? AND ?;

-- name: legacy_records_drop
DROP TABLE records;

-- name: legacy_log_batches_drop
DROP TABLE IF EXISTS log_batches;

-- name: log_015_table
-- Whether schema 015's WITHOUT ROWID log is still there (storage/upgrade.py).
SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'log_015';

-- name: log_015_first
-- The first batches left to move, for the step to choose its last one.
SELECT topic_id, partition, first_offset, records
FROM log_015
ORDER BY topic_id, partition, first_offset
LIMIT ?;

-- name: log_015_move
-- The batches up to and including (?1, ?2, ?3), copied as they are.
INSERT INTO log (topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals)
SELECT topic_id, partition, first_offset, last_offset, records, bytes, timestamp_ms, max_timestamp_ms,
       producer_id, generation, first_sequence, epoch, txn_id, value_lengths, timestamps,
       key_lengths, headers, offset_deltas, keys, vals
FROM log_015
WHERE (topic_id, partition, first_offset) <= (?1, ?2, ?3)
ORDER BY topic_id, partition, first_offset;

-- name: log_015_delete
DELETE FROM log_015 WHERE (topic_id, partition, first_offset) <= (?1, ?2, ?3);

-- name: log_015_drop
DROP TABLE log_015;
