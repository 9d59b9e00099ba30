-- 007: the data journal without its producer index.
--
-- txn_data_by_producer cost every journaled record a second b-tree insert and every
-- copied record a second delete, to serve lookups that run once per join or commit
-- (fencing a member's older generation, keeping the writers a commit names). Those now
-- read the transaction's own rows through the primary key (txn_id first), as the
-- commit's copy does anyway.

DROP INDEX IF EXISTS txn_data_by_producer;
