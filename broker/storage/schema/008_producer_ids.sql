-- 008: every pid the broker hands out, exactly.
--
-- Until now the broker kept only the high-water mark of its pid counter, taken in
-- blocks of 100, and accepted a first batch from any pid below it: a pid nobody was
-- given could be written with (squatted on), and the broker later handed that same pid
-- to a real producer, whose first write then failed. A row per issued pid, with the
-- generation it was issued at and when, lets a first batch be checked against what was
-- issued and keeps a pid from being issued twice.
--
-- An existing data directory keeps what its rows show: every pid with a lease row (it
-- wrote somewhere idempotently) or a transaction member's pid becomes issued, with no
-- generation (NULL: its first batch on a new partition sets it, as before). A pid leased
-- before the upgrade that never wrote is unknown from here on: lease a new one.

CREATE TABLE producer_ids (
    producer_id  INTEGER PRIMARY KEY,
    generation   INTEGER,
    issued_ms    INTEGER NOT NULL
) STRICT;

INSERT INTO producer_ids (producer_id, generation, issued_ms)
SELECT producer_id, NULL, min(first_ms)
FROM producer_leases
GROUP BY producer_id;

INSERT INTO producer_ids (producer_id, generation, issued_ms)
SELECT DISTINCT producer_id, NULL, 0
FROM txn_members
WHERE true
ON CONFLICT (producer_id) DO NOTHING;
