-- 017: a transaction's journaled batch is written once. Its records are packed into a
-- row of `log` when they are journaled, under a key no reader asks for: the topic id
-- hidden (0 for topic 1, else ~topic_id: never a topic's, and as many bytes in a record as
-- the topic id; storage/txns.py journal_topic_id), the partition,
-- and a first offset near the partition's end. txn_batches keeps the batch's journal
-- facts and that row's rowid in log_rowid (its body is then empty). APPLY_COMMIT
-- gives the row its real key (topic id, offsets, the topic's epoch now): an UPDATE of
-- a few numbers, which SQLite writes in place when the record keeps its size, so the
-- batch's bytes are not written a second time (schema 012's rows, with a body and no
-- log_rowid, are still copied).
--
-- A journaled batch dropped before its commit (abort, expiry, a fenced or discarded
-- writer, its topic deleted) takes its row of `log` with it: the trigger deletes the
-- row while it still has its hidden key, and never a row the commit moved.

ALTER TABLE txn_batches ADD COLUMN log_rowid INTEGER;

CREATE TRIGGER txn_batches_journaled_rows AFTER DELETE ON txn_batches
WHEN old.log_rowid IS NOT NULL
BEGIN
    DELETE FROM log WHERE rowid = old.log_rowid AND topic_id <= 0;
END;
