-- Named queries. Each block starts with `-- name: NAME`; storage/queries.py loads them.
-- Logic never assembles SQL: it picks a query here by name and binds parameters.

-- name: topic_insert
INSERT INTO topics (name, partitions, created_ms, owner_group) VALUES (?, ?, ?, ?);

-- name: partition_insert
INSERT INTO partitions (topic_id, partition) VALUES (?, ?);

-- name: topic_by_name
SELECT topic_id, name, partitions, created_ms, owner_group FROM topics WHERE name = ?;

-- name: topics_all
SELECT topic_id, name, partitions, created_ms, owner_group FROM topics ORDER BY name;

-- name: partitions_of_topic
SELECT partition, next_offset, bytes FROM partitions WHERE topic_id = ? ORDER BY partition;

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

-- name: records_read
SELECT ?, partition, offset, timestamp_ms, key, value, headers AS "headers [fencelog_headers]",
       producer_id, generation, sequence, epoch, txn_id
FROM records
WHERE topic_id = ? AND partition = ? AND offset >= ?
ORDER BY offset
LIMIT ?;
