-- 002: sessions, ownership of (group, resource) with generations, and its audit log.
--
-- A session is a client: a process that opened the data directory (embedded, id
-- proc-PID-STARTTIME) or a connection to `fencelog serve` (id conn-RUN-N, live only while
-- that server has it open, so it needs no row here). Process sessions prove they are
-- alive with heartbeat_ms; severed_ms marks one that a newer claim severed.
-- ownership.generation is never lost; holder is NULL when nobody holds the resource.

CREATE TABLE sessions (
    session_id   TEXT    PRIMARY KEY,
    pid          INTEGER NOT NULL,
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    severed_ms   INTEGER
) STRICT;

CREATE TABLE ownership (
    group_name   TEXT    NOT NULL,
    resource     TEXT    NOT NULL,
    generation   INTEGER NOT NULL CHECK (generation >= 1),
    holder       TEXT,
    claimed_ms   INTEGER NOT NULL,
    PRIMARY KEY (group_name, resource)
) STRICT, WITHOUT ROWID;

CREATE INDEX ownership_by_holder ON ownership (holder) WHERE holder IS NOT NULL;

CREATE TABLE ownership_audit (
    audit_id     INTEGER PRIMARY KEY,
    at_ms        INTEGER NOT NULL,
    group_name   TEXT    NOT NULL,
    resource     TEXT    NOT NULL,
    event        TEXT    NOT NULL,
    session_id   TEXT,
    generation   INTEGER NOT NULL,
    requested    INTEGER,
    other        TEXT
) STRICT;
