"""The engine's ownership operations: claims, releases, severing, fences, the audit log.

Each operation is one SQLite transaction: load the holdings it touches (with whether
each holder is live), decide in broker/core/ownership.py, write the new holdings and
audit rows, COMMIT. Severing a session releases everything it holds and marks a process
session severed; the server closes a severed connection (it gets the session ids back).

A holder whose session ended holds nothing. A server releases a connection's claims as
it ends; nobody sees a process die, so a claim or release that meets a holder no longer
live first releases what that session held, audited as its own release, and marks it
severed (a process that was only paused learns on waking that its claims are gone), and
the listing shows no holder there: embedded answers as served (issue 37).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterable, Sequence

from broker import rows
from broker.core import ownership as rules
from broker.core.ownership import Event, Grant, Holding
from broker.engine import sessions
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.storage import ownership as store
from broker.storage.database import Database
from broker.types import Claimed, Fence, OwnershipInfo, OwnResult, ReleaseResult, SessionInfo


class Owners:
    def __init__(
        self,
        database: Database,
        limits: Limits,
        clock: Callable[[], int],
        served_sessions: Callable[[], Collection[str]],
    ) -> None:
        self.database = database
        self.limits = limits
        self.clock = clock
        self.served_sessions = served_sessions

    # sessions -----------------------------------------------------------------------

    def register_process(self) -> str:
        session_id = sessions.process_session_id()
        with self.database.write() as conn:
            store.upsert_session(conn, session_id, sessions.session_pid(session_id), self.clock())
        return session_id

    def heartbeat(self, session_id: str) -> bool:
        """Keep a process session alive; False once it was severed."""
        with self.database.write() as conn:
            return store.heartbeat(conn, session_id, self.clock())

    def session_closed(self, session_id: str) -> list[tuple[str, str]]:
        """Release what the session holds; the (group, resource) pairs released."""
        with self.database.write() as conn:
            released = self._release_all(conn, session_id, Event.RELEASED, None)
            if session_id.startswith("proc-"):
                store.delete_session(conn, session_id)
        return released

    # claims -------------------------------------------------------------------------

    def own(self, session_id: str, group: str, claims: Sequence[tuple[str, int]]) -> OwnResult:
        rules.check_claims(group, claims)
        if len(claims) > self.limits.own_resources_max:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a claim names at most {self.limits.own_resources_max} resources",
            )
        with self.database.write() as conn:
            now_ms = self.clock()
            self._check_not_severed(conn, session_id)
            holders = [self._holder(conn, group, resource) for resource, _ in claims]
            self._end_sessions_gone(conn, session_id, holders, now_ms)
            current = {r: self._holding(conn, group, r, now_ms) for r, _ in claims}
            decision = rules.decide_claims(session_id, claims, current)
            if not decision.refusals:
                return self._grant(conn, session_id, group, decision.grants, dict(claims), now_ms)
            for refusal in decision.refusals:  # the refusal is audited, so it commits
                store.audit(
                    conn,
                    now_ms,
                    group,
                    refusal.resource,
                    Event.REFUSED,
                    session_id,
                    refusal.current_generation,
                    refusal.requested_generation,
                    refusal.holder,
                )
        raise rules.refusal_error(group, decision.refusals)

    def _check_not_severed(self, conn: sqlite3.Connection, session_id: str) -> None:
        row = store.session(conn, session_id) if session_id.startswith("proc-") else None
        if row is not None and row.severed_ms is not None:
            raise BrokerError(
                ErrorCode.SEVERED,
                "this client's session was severed by a newer claim",
                session=session_id,
                hint="open a new client to claim again",
            )

    def _grant(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        group: str,
        grants: Sequence[Grant],
        requested: dict[str, int],
        now_ms: int,
    ) -> OwnResult:
        severed = sorted({g.severed for g in grants if g.severed is not None})
        for other in severed:
            self._release_all(conn, other, Event.SEVERED, session_id)
            store.sever_session(conn, other, now_ms)
        for grant in grants:
            if grant.event is not Event.UNCHANGED:
                store.put_holding(conn, group, grant.resource, grant.generation, session_id, now_ms)
            store.audit(
                conn,
                now_ms,
                group,
                grant.resource,
                grant.event,
                session_id,
                grant.generation,
                requested[grant.resource],
                grant.severed,
            )
        store.trim_audit(conn, self.limits.ownership_audit_rows_max)
        claimed = tuple(Claimed(group, g.resource, g.generation) for g in grants)
        return OwnResult(claimed, tuple(severed))

    def release(
        self,
        session_id: str,
        group: str,
        resources: Sequence[str] | None,
        *,
        any_holder: bool = False,
    ) -> ReleaseResult:
        """Release holdings in group: the named resources, or all the session holds.

        With any_holder (an operator's release), a resource held by another session is
        freed by severing that session, as a newer claim would; otherwise only the
        session's own holdings can be released.
        """
        rules.check_name("group", group)
        with self.database.write() as conn:
            rows = store.group_holdings(conn, group)
            if not rows:
                raise BrokerError(
                    ErrorCode.UNKNOWN_GROUP,
                    f"no resource of group {group} was ever claimed: nothing to release",
                    group=group,
                    hint="check the group name (fencelog own list shows every group)",
                )
            ended = self._end_sessions_gone(conn, session_id, [h for _, _, h in rows], self.clock())
            holders = {r: h for r, _, h in rows if h is not None and h not in ended}
            if not any_holder:
                holders = {r: h for r, h in holders.items() if h == session_id}
            wanted = sorted(holders) if resources is None else sorted(set(resources))
            missing = [r for r in wanted if r not in holders]
            if not missing and wanted:
                return self._release_named(conn, session_id, group, wanted, holders)
        # after COMMIT: the claims of sessions that had ended are released all the same
        raise _not_held(group, missing, "anyone" if any_holder else "this session")

    def _release_named(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        group: str,
        wanted: Sequence[str],
        holders: dict[str, str],
    ) -> ReleaseResult:
        now_ms = self.clock()
        severed = sorted({holders[r] for r in wanted} - {session_id})
        for other in severed:
            self._release_all(conn, other, Event.SEVERED, session_id)
            store.sever_session(conn, other, now_ms)
        generations = {r: n for r, n, _ in store.group_holdings(conn, group)}
        for resource in wanted:
            if store.release(conn, group, resource, session_id):
                store.audit(
                    conn, now_ms, group, resource, Event.RELEASED, session_id, generations[resource]
                )
        return ReleaseResult(tuple(wanted), tuple(severed))

    def _end_sessions_gone(
        self, conn: sqlite3.Connection, acting: str, holders: Iterable[str | None], now_ms: int
    ) -> set[str]:
        """Release what each holder whose session ended still holds (the acting session
        aside), as the server does when a connection ends; the sessions so ended."""
        ended = {
            holder
            for holder in holders
            if holder not in (None, acting) and not self._live(conn, holder, now_ms)
        }
        for holder in sorted(ended):
            self._release_all(conn, holder, Event.RELEASED, None)
            store.sever_session(conn, holder, now_ms)
        return ended

    def _holder(self, conn: sqlite3.Connection, group: str, resource: str) -> str | None:
        stored = store.holding(conn, group, resource)
        return None if stored is None else stored[1]

    def _release_all(
        self, conn: sqlite3.Connection, session_id: str, event: Event, by: str | None
    ) -> list[tuple[str, str]]:
        now_ms = self.clock()
        released = []
        for group, resource, generation in store.holdings_of(conn, session_id):
            store.release(conn, group, resource, session_id)
            store.audit(conn, now_ms, group, resource, event, session_id, generation, None, by)
            released.append((group, resource))
        return released

    # fences -------------------------------------------------------------------------

    def check_fences(self, conn: sqlite3.Connection, fences: Sequence[Fence]) -> None:
        now_ms = self.clock()
        for fence in fences:
            rules.check_fence(fence, self._holding(conn, fence.group, fence.resource, now_ms))

    def _holding(self, conn: sqlite3.Connection, group: str, resource: str, now_ms: int) -> Holding:
        stored = store.holding(conn, group, resource)
        if stored is None:
            return Holding()
        generation, holder = stored
        return Holding(generation, holder, holder is not None and self._live(conn, holder, now_ms))

    def is_live(self, conn: sqlite3.Connection, session_id: str, now_ms: int) -> bool:
        """Whether a session (of any kind) is alive now; used by exclusive access too."""
        return self._live(conn, session_id, now_ms)

    def _live(self, conn: sqlite3.Connection, session_id: str, now_ms: int) -> bool:
        row = store.session(conn, session_id) if session_id.startswith("proc-") else None
        return sessions.is_live(
            session_id,
            row,
            now_ms,
            self.limits.session_timeout_ms,
            self.served_sessions(),
            self.database.data_dir.path,
        )

    # views --------------------------------------------------------------------------

    def holdings(self, group: str | None = None) -> list[OwnershipInfo]:
        """Every (group, resource); a holder whose session ended is shown as none (what
        it held is released by the next claim or release that meets it)."""
        with self.database.read() as conn:
            now_ms = self.clock()
            listed = []
            for row in store.all_holdings(conn):
                if group is not None and row.group != group:
                    continue
                live = row.holder is not None and self._live(conn, row.holder, now_ms)
                holder = row.holder if live else None
                info = OwnershipInfo(
                    row.group, row.resource, row.generation, holder, live, row.claimed_ms
                )
                listed.append(info)
            return listed

    def sessions(self, limit: int) -> list[SessionInfo]:
        """The server's open connections (live by definition), then every process
        session with a row, judged live or not as a claim would judge it."""
        connections = [
            SessionInfo(session_id, "connection", None, None, None, severed=False, live=True)
            for session_id in sorted(self.served_sessions())[:limit]
        ]
        with self.database.read() as conn:
            now_ms = self.clock()
            stored = store.all_sessions(conn, max(0, limit - len(connections)))
            processes = [
                SessionInfo(
                    row.session_id,
                    "process",
                    row.pid,
                    started_ms,
                    row.heartbeat_ms,
                    severed=row.severed_ms is not None,
                    live=self._live(conn, row.session_id, now_ms),
                )
                for row, started_ms in stored
            ]
        return connections + processes

    def history(self, group: str | None, limit: int) -> list[rows.AuditRow]:
        if limit <= 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"limit must be > 0, not {limit}")
        with self.database.read() as conn:
            return store.recent_audit(conn, group, limit)


def _not_held(group: str, missing: Sequence[str], whom: str) -> BrokerError:
    unheld = (
        f"{group}:{missing[0]} is not held by {whom}"
        if missing
        else f"no resource of {group} is held by {whom}"
    )
    return BrokerError(
        ErrorCode.NOT_HELD,
        f"{unheld}: nothing to release",
        group=group,
        resources=list(missing),
        hint="its holder released it or its session ended; the generation "
        "stays recorded (fencelog own list)",
    )


class Heartbeats:
    """A process session's heartbeats on their own connection (Engine.heartbeats)."""

    def __init__(self, owners: Owners) -> None:
        self._owners = owners

    def beat(self, session_id: str) -> bool:
        """Keep the session alive; False once it was severed. STORAGE_BUSY: another
        process held the write lock past the busy timeout, and this beat is missed."""
        return self._owners.heartbeat(session_id)

    def close(self) -> None:
        self._owners.database.close()
