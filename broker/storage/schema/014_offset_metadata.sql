-- 014: what a Kafka consumer commits beside an offset (issue 35): OffsetCommit's
-- metadata text (NULL: none) and the leader epoch of the last record it read (-1:
-- none), answered by OffsetFetch as Kafka answers them. A native commit may give the
-- metadata too. A transaction's offsets carry them to their commit.

ALTER TABLE consumer_offsets ADD COLUMN metadata TEXT;
ALTER TABLE consumer_offsets ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT -1;
ALTER TABLE txn_offsets ADD COLUMN metadata TEXT;
ALTER TABLE txn_offsets ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT -1;
