-- 011: a transaction's partitions keep their record and byte counts as records are
-- journaled (issue 23), instead of counting the data journal at PREPARE_COMMIT. Open
-- transactions begun before this version have no counts yet: count them once here.

UPDATE txn_partitions
SET records = (SELECT count(*) FROM txn_data d
               WHERE d.txn_id = txn_partitions.txn_id AND d.topic_id = txn_partitions.topic_id
                 AND d.partition = txn_partitions.partition),
    bytes = (SELECT coalesce(sum(length(value) + coalesce(length(key), 0)), 0) FROM txn_data d
             WHERE d.txn_id = txn_partitions.txn_id AND d.topic_id = txn_partitions.topic_id
               AND d.partition = txn_partitions.partition)
WHERE txn_id IN (SELECT txn_id FROM txns WHERE state = 'open');
