"""Sessions, holdings and the ownership audit log in SQLite: rows, never rules."""

from __future__ import annotations

import sqlite3

from msgspec import Struct

from broker.rows import AuditRow
from broker.storage.queries import Q


class SessionRow(Struct, frozen=True):
    session_id: str
    pid: int
    heartbeat_ms: int
    severed_ms: int | None


class HoldingRow(Struct, frozen=True):
    group: str
    resource: str
    generation: int
    holder: str | None
    claimed_ms: int


def upsert_session(conn: sqlite3.Connection, session_id: str, pid: int, now_ms: int) -> None:
    conn.execute(Q["session_upsert"], (session_id, pid, now_ms, now_ms))


def heartbeat(conn: sqlite3.Connection, session_id: str, now_ms: int) -> bool:
    """Record a heartbeat; False if the session was severed or is gone."""
    row = conn.execute(Q["session_heartbeat"], (now_ms, session_id)).fetchone()
    return row is not None and row[0] is None


def session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    row = conn.execute(Q["session_by_id"], (session_id,)).fetchone()
    return SessionRow(*row) if row else None


def all_sessions(conn: sqlite3.Connection, limit: int) -> list[tuple[SessionRow, int]]:
    """Every process session's row with its start time (ms)."""
    return [
        (SessionRow(session_id, pid, heartbeat_ms, severed_ms), started_ms)
        for session_id, pid, started_ms, heartbeat_ms, severed_ms in conn.execute(
            Q["sessions_all"], (limit,)
        )
    ]


def sever_session(conn: sqlite3.Connection, session_id: str, now_ms: int) -> None:
    conn.execute(Q["session_sever"], (now_ms, session_id))


def delete_session(conn: sqlite3.Connection, session_id: str) -> None:
    conn.execute(Q["session_delete"], (session_id,))


def holding(conn: sqlite3.Connection, group: str, resource: str) -> tuple[int, str | None] | None:
    row = conn.execute(Q["holding_get"], (group, resource)).fetchone()
    return (int(row[0]), row[1]) if row else None


def put_holding(
    conn: sqlite3.Connection,
    group: str,
    resource: str,
    generation: int,
    holder: str | None,
    now_ms: int,
) -> None:
    conn.execute(Q["holding_put"], (group, resource, generation, holder, now_ms))


def holdings_of(conn: sqlite3.Connection, session_id: str) -> list[tuple[str, str, int]]:
    return [(g, r, int(n)) for g, r, n in conn.execute(Q["holdings_of_session"], (session_id,))]


def release(conn: sqlite3.Connection, group: str, resource: str, session_id: str) -> bool:
    return conn.execute(Q["holding_release"], (group, resource, session_id)).rowcount > 0


def all_holdings(conn: sqlite3.Connection) -> list[HoldingRow]:
    return [HoldingRow(*row) for row in conn.execute(Q["holdings_all"])]


def audit(
    conn: sqlite3.Connection,
    now_ms: int,
    group: str,
    resource: str,
    event: str,
    session_id: str | None,
    generation: int,
    requested: int | None = None,
    other: str | None = None,
) -> None:
    conn.execute(
        Q["audit_insert"],
        (now_ms, group, resource, event, session_id, generation, requested, other),
    )


def trim_audit(conn: sqlite3.Connection, keep: int) -> None:
    conn.execute(Q["audit_trim"], (keep,))


def recent_audit(conn: sqlite3.Connection, group: str | None, limit: int) -> list[AuditRow]:
    return [AuditRow(*row) for row in conn.execute(Q["audit_recent"], (group, limit))]


def group_holdings(conn: sqlite3.Connection, group: str) -> list[tuple[str, int, str | None]]:
    """Every resource ever claimed in group: (resource, generation, holder or None)."""
    return [(r, int(n), h) for r, n, h in conn.execute(Q["group_holdings"], (group,))]
