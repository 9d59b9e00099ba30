-- 004: exclusive producers: each topic's epoch and the producers attached to it.
--
-- An attachment belongs to a session (as a claim does) and is shared, exclusive, or
-- waiting for exclusivity; waiters are served in attachment_id order. The epoch grows
-- each time a new producer takes exclusive access and is never lost.

CREATE TABLE topic_access (
    topic_id        INTEGER PRIMARY KEY,
    epoch           INTEGER NOT NULL DEFAULT 0,
    last_exclusive  TEXT
) STRICT;

CREATE TABLE producer_attachments (
    attachment_id  INTEGER PRIMARY KEY,
    topic_id       INTEGER NOT NULL,
    session_id     TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    mode           TEXT    NOT NULL,
    epoch          INTEGER NOT NULL,
    attached_ms    INTEGER NOT NULL
) STRICT;

CREATE INDEX attachments_by_topic ON producer_attachments (topic_id, attachment_id);
CREATE INDEX attachments_by_session ON producer_attachments (session_id);
