-- 018: the log's time index, so that finding an offset by time is exact whatever the
-- order of the timestamps (Kafka's answer: the first record at or after the time).
-- A row of log_times marks a batch whose greatest timestamp is at least 10 ms past the
-- index's last row (the first batch of a partition has one): max_timestamp_ms is then
-- the partition's greatest timestamp so far, reached in the batch at first_offset.
-- Both columns grow with the offsets. Between two rows, every record before the first
-- row's batch is older than any time past its timestamp, and the second row's batch
-- holds a record at its timestamp: the first record at or after a time between them is
-- in the batches from one to the other, found by their greatest timestamps, a column of
-- each batch's row (storage/timestamps.py). A time past the last row is found in the
-- batches after it, none of which reaches 10 ms past it. Where timestamps ascend a
-- partition gets at most a row every 10 ms of them: a time index row costs the writes
-- of a burst of small appends next to nothing.
--
-- The triggers keep it for every way a batch enters the log with its real key: an
-- append, a copy, the schema moves' inserts, and the commit that gives a journaled
-- batch (schema 017: hidden topic id <= 0) its offsets. Compaction's rewrites only
-- lower a batch's greatest, so a row may name a batch that no longer holds its time:
-- the search reads batches, not rows, and goes on. Retention deletes the rows below the
-- log start but the last one (it still bounds what came before); a topic's delete
-- takes its rows. The rows the upgrade makes from the log already there are one for
-- each batch that raised its partition's greatest timestamp: as exact, only denser.

CREATE TABLE log_times (
    topic_id         INTEGER NOT NULL,
    partition        INTEGER NOT NULL,
    first_offset     INTEGER NOT NULL,
    max_timestamp_ms INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, first_offset)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER log_times_appended AFTER INSERT ON log
WHEN new.topic_id > 0 AND new.max_timestamp_ms >= coalesce(
    (SELECT max_timestamp_ms FROM log_times
     WHERE topic_id = new.topic_id AND partition = new.partition
     ORDER BY first_offset DESC LIMIT 1) + 10,
    -9223372036854775808)
BEGIN
    INSERT INTO log_times (topic_id, partition, first_offset, max_timestamp_ms)
    VALUES (new.topic_id, new.partition, new.first_offset, new.max_timestamp_ms);
END;

CREATE TRIGGER log_times_committed AFTER UPDATE OF topic_id ON log
WHEN old.topic_id <= 0 AND new.topic_id > 0 AND new.max_timestamp_ms >= coalesce(
    (SELECT max_timestamp_ms FROM log_times
     WHERE topic_id = new.topic_id AND partition = new.partition
     ORDER BY first_offset DESC LIMIT 1) + 10,
    -9223372036854775808)
BEGIN
    INSERT INTO log_times (topic_id, partition, first_offset, max_timestamp_ms)
    VALUES (new.topic_id, new.partition, new.first_offset, new.max_timestamp_ms);
END;

-- the batches already in the log, each partition in offset order
INSERT INTO log_times (topic_id, partition, first_offset, max_timestamp_ms)
SELECT topic_id, partition, first_offset, max_timestamp_ms
FROM (
    SELECT topic_id, partition, first_offset, max_timestamp_ms,
           max(max_timestamp_ms) OVER (
               PARTITION BY topic_id, partition ORDER BY first_offset
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
           ) AS before
    FROM log
    WHERE topic_id > 0
)
WHERE before IS NULL OR max_timestamp_ms > before;
