"""Topic epochs and producer attachments in SQLite: rows, never rules."""

from __future__ import annotations

import sqlite3

from broker.storage.queries import Q


def access(conn: sqlite3.Connection, topic_id: int) -> tuple[int, str | None]:
    row = conn.execute(Q["access_get"], (topic_id,)).fetchone()
    return (0, None) if row is None else (int(row[0]), row[1])


def put_access(
    conn: sqlite3.Connection, topic_id: int, epoch: int, last_exclusive: str | None
) -> None:
    conn.execute(Q["access_put"], (topic_id, epoch, last_exclusive))


def attachments(conn: sqlite3.Connection, topic_id: int) -> list[tuple[int, str, str, str, int]]:
    return list(conn.execute(Q["attachments_of_topic"], (topic_id,)))


def attachment(
    conn: sqlite3.Connection, attachment_id: int
) -> tuple[int, str, str, str, int] | None:
    row = conn.execute(Q["attachment_by_id"], (attachment_id,)).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2], row[3], int(row[4]))


def insert(
    conn: sqlite3.Connection,
    topic_id: int,
    session_id: str,
    name: str,
    mode: str,
    epoch: int,
    now_ms: int,
) -> int:
    # Attachment ids are never reused: a write carries only its attachment id, so a
    # detached producer's id must never come to name its successor.
    newest = conn.execute(Q["attachment_id_max"]).fetchone()[0]
    retired = conn.execute(Q["counter_get"], ("next_attachment_id",)).fetchone()
    attachment_id = max(int(newest) + 1, int(retired[0]) if retired else 1)
    conn.execute(
        Q["attachment_insert_with_id"],
        (attachment_id, topic_id, session_id, name, mode, epoch, now_ms),
    )
    conn.execute(Q["counter_put"], ("next_attachment_id", attachment_id + 1))
    return attachment_id


def update(conn: sqlite3.Connection, attachment_id: int, mode: str, epoch: int) -> None:
    conn.execute(Q["attachment_update"], (mode, epoch, attachment_id))


def delete(conn: sqlite3.Connection, attachment_id: int) -> None:
    conn.execute(Q["attachment_delete"], (attachment_id,))


def of_session(conn: sqlite3.Connection, session_id: str) -> list[tuple[int, int]]:
    return [(int(a), int(t)) for a, t in conn.execute(Q["attachments_of_session"], (session_id,))]
