"""The engine's exclusive-producer operations: attach, wait, detach, and the check that
every write makes (broker/core/exclusive.py decides; this loads and stores).

Attachments belong to sessions, like claims: a producer whose session ends (closed,
disconnected, missed heartbeats, process gone) is detached at the next look at the
topic, and the first live waiter is promoted then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from broker.core import exclusive as rules
from broker.core.ownership import check_name
from broker.engine.ownership import Owners
from broker.errors import BrokerError, ErrorCode
from broker.storage import exclusive as store
from broker.storage.database import Database
from broker.types import Access, AccessInfo, Attached, Attachment, Mode


class Exclusives:
    def __init__(self, database: Database, owners: Owners, clock: Callable[[], int]) -> None:
        self.database = database
        self.owners = owners
        self.clock = clock

    def attach(
        self,
        topic_id: int,
        topic: str,
        session_id: str,
        access: Access,
        name: str,
        previous_epoch: int | None,
    ) -> Attachment:
        check_name("producer name", name)
        if previous_epoch is not None and previous_epoch < 0:
            raise BrokerError(ErrorCode.INVALID_ARGUMENT, "an epoch is >= 0")
        with self.database.write() as conn:
            current = self.reconcile(conn, topic_id)
            epoch, last_exclusive = store.access(conn, topic_id)
            decision = rules.decide_attach(
                access, name, previous_epoch, epoch, current, last_exclusive
            )
            attachment_id = store.insert(
                conn, topic_id, session_id, name, decision.mode, decision.epoch, self.clock()
            )
            if decision.mode is Mode.EXCLUSIVE:
                store.put_access(conn, topic_id, decision.topic_epoch, name)
        return Attachment(attachment_id, topic, name, decision.mode, decision.epoch)

    def poll(self, attachment_id: int, topic: str) -> Attachment:
        """The attachment now: a waiter may have been promoted meanwhile."""
        with self.database.write() as conn:
            row = store.attachment(conn, attachment_id)
            if row is None:
                raise gone(attachment_id)
            self.reconcile(conn, row[0])
            row = store.attachment(conn, attachment_id)
        if row is None:
            raise gone(attachment_id)
        _, _, name, mode, epoch = row
        return Attachment(attachment_id, topic, name, Mode(mode), epoch)

    def detach(self, attachment_id: int) -> None:
        with self.database.write() as conn:
            row = store.attachment(conn, attachment_id)
            if row is None:
                return
            store.delete(conn, attachment_id)
            self.reconcile(conn, row[0])

    def session_closed(self, conn: sqlite3.Connection, session_id: str) -> None:
        for attachment_id, topic_id in store.of_session(conn, session_id):
            store.delete(conn, attachment_id)
            self.reconcile(conn, topic_id)

    def reconcile(self, conn: sqlite3.Connection, topic_id: int) -> list[Attached]:
        """Drop attachments of dead sessions, promote the first waiter if it may go;
        the live attachments after that."""
        live = self.attached(conn, topic_id)
        for dead in (a for a in live if not a.live):
            store.delete(conn, dead.attachment_id)
        live = [a for a in live if a.live]
        promoted = rules.next_to_promote(live)
        if promoted is not None:
            epoch, last_exclusive = store.access(conn, topic_id)
            decision = rules.grant(promoted.name, promoted.epoch or None, epoch, last_exclusive)
            store.update(conn, promoted.attachment_id, Mode.EXCLUSIVE, decision.epoch)
            store.put_access(conn, topic_id, decision.topic_epoch, promoted.name)
            live = self.attached(conn, topic_id)
        return live

    def attached(self, conn: sqlite3.Connection, topic_id: int) -> list[Attached]:
        now_ms = self.clock()
        return [
            Attached(
                attachment_id,
                session_id,
                name,
                Mode(mode),
                epoch,
                self.owners.is_live(conn, session_id, now_ms),
            )
            for attachment_id, session_id, name, mode, epoch in store.attachments(conn, topic_id)
        ]

    def check_write(
        self, conn: sqlite3.Connection, topic_id: int, attachment_id: int | None
    ) -> tuple[int, bool]:
        """Refuse a write that exclusivity forbids; the epoch the records carry, and
        whether the topic has no attachments at all (nothing that time could change)."""
        epoch, _ = store.access(conn, topic_id)
        attached = self.attached(conn, topic_id)
        current = [a for a in attached if a.live]
        exclusive = next((a for a in current if a.mode is Mode.EXCLUSIVE), None)
        attachment = None
        if attachment_id is not None:
            attachment = next((a for a in current if a.attachment_id == attachment_id), None)
            if attachment is None:
                raise gone(attachment_id, epoch)
        rules.check_write(attachment, epoch, exclusive)
        return epoch, not attached

    def epoch(self, conn: sqlite3.Connection, topic_id: int) -> int:
        """The topic's epoch now: what a write landing now carries."""
        return store.access(conn, topic_id)[0]

    def info(self, conn: sqlite3.Connection, topic_id: int) -> AccessInfo:
        epoch, _ = store.access(conn, topic_id)
        live = [a for a in self.attached(conn, topic_id) if a.live]
        exclusive = next((a for a in live if a.mode is Mode.EXCLUSIVE), None)
        return AccessInfo(
            epoch,
            exclusive,
            tuple(a for a in live if a.mode is Mode.SHARED),
            tuple(a for a in live if a.mode is Mode.WAITING),
        )


def gone(attachment_id: int, topic_epoch: int | None = None) -> BrokerError:
    return BrokerError(
        ErrorCode.PRODUCER_FENCED,
        f"producer attachment {attachment_id} was detached (closed, disconnected, or its "
        "session missed heartbeats); another producer may have taken exclusive access",
        attachment=attachment_id,
        topic_epoch=topic_epoch,
        hint="this producer can never write again; create a new one",
    )
