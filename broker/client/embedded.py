"""The embedded transport: the engine in this process.

Besides calling the engine, it gives the process a session when it first claims
something: a row in the sessions table kept alive by a heartbeat thread on its own
SQLite connection. When the heartbeat finds the session severed (a newer claim took a
resource from it), the severed callbacks run. A reader waiting for other processes'
writes watches the WAL file (broker/client/wal_watch.py).

A client may be shared by threads: the engine's one SQLite connection is used by one
thread at a time (a lock around every engine call; a waiting reader waits outside it,
each thread on its own watch of the WAL). close() from any thread ends the waits of the
others, and every later call is CONNECTION_FAILED ("this client is closed"), as served.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from broker.core.exclusive import ExclusiveWait, GiveUp, parse_access
from broker.engine import Engine, wall_clock_ms
from broker.errors import BrokerError, ErrorCode
from broker.limits import Limits
from broker.protocol import codec
from broker.protocol.ops import Operation
from broker.rows import AuditRow, Row
from broker.types import (
    AppendResult,
    Attachment,
    Claimed,
    Clock,
    Durability,
    Fence,
    Inspection,
    KafkaGroup,
    NewRecord,
    OwnershipInfo,
    ProducerFields,
    Record,
    RecordColumns,
    ResultColumns,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from broker.client.wal_watch import WalWatcher

SeveredCallback = Callable[[str], None]
P = ParamSpec("P")
R = TypeVar("R")


class _Heartbeat(threading.Thread):
    def __init__(self, engine: Engine, session_id: str, on_severed: Callable[[str], None]):
        super().__init__(name="fencelog-heartbeat", daemon=True)
        self._heartbeats = engine.heartbeats()
        self._session_id = session_id
        self._interval_s = min(engine.limits.session_timeout_ms / 3000, 1.0)
        self._on_severed = on_severed
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.wait(self._interval_s):
                try:
                    alive = self._heartbeats.beat(self._session_id)
                except BrokerError as exc:
                    # Another process held the write lock past the busy timeout: this
                    # beat is missed, not the session. The session timeout judges it.
                    if exc.code is ErrorCode.STORAGE_BUSY:
                        continue
                    raise
                if not alive:
                    self._on_severed(
                        "severed: another process claimed or released a resource of this session"
                    )
                    return
        finally:
            self._heartbeats.close()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


class _PulseBeat(threading.Thread):
    """Beats this session's pulse (engine/sessions.py) without ever touching SQLite, so
    that another process holding the write lock cannot make this one look dead."""

    def __init__(self, engine: Engine, session_id: str, on_severed: Callable[[str], None]):
        super().__init__(name="fencelog-pulse", daemon=True)
        self._pulse = engine.pulse(session_id)
        self._interval_s = min(engine.limits.session_timeout_ms / 3000, 1.0)
        self._on_severed = on_severed
        self._stopping = threading.Event()
        self._stopped = False

    def run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            gap_ms = self._pulse.beat()
            if gap_ms is not None:
                self._stopped = True
                self._on_severed(
                    f"severed: this process did not run for {gap_ms / 1000:.1f} s, longer "
                    "than the session timeout; what it held may have passed to others"
                )
                return

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)
        # A pulse marked stopped stays, so nobody takes the session for live again.
        self._pulse.close(remove=not self._stopped)


class EmbeddedTransport:
    validates_records = True  # the engine in this process checks every batch
    served = False

    @classmethod
    def open(
        cls, path: Path, durability: Durability, limits: Limits, clock: Clock | None
    ) -> EmbeddedTransport:
        """Open the data directory in this process (on the wall clock unless given one)."""
        clock = clock or wall_clock_ms
        return cls(Engine.open(path, durability=durability, limits=limits, clock=clock))

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.limits = engine.limits
        self._heartbeat: _Heartbeat | None = None
        self._pulse: _PulseBeat | None = None
        self._session_id: str | None = None
        self._severed_callbacks: list[SeveredCallback] = []
        self._severed_reason: str | None = None
        self._closed = False
        self._lock = threading.RLock()  # one thread at a time on the engine's connection
        self._stop = threading.Event()  # set by close(): every wait ends
        # each thread's own watch (one cannot be shared), dropped with its thread: a
        # client used from many short-lived threads keeps no inotify instance of theirs
        self._local = threading.local()
        self._watchers: weakref.WeakSet[WalWatcher] = weakref.WeakSet()  # for close()
        self.broker_now_ms = engine.clock

    @contextlib.contextmanager
    def _engine(self) -> Iterator[Engine]:
        """The engine, for one call, this thread's alone; CONNECTION_FAILED once closed."""
        with self._lock:
            if self._closed:
                raise closed()
            yield self.engine

    def call(self, entry: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """One operation of the table: the engine method it names, called here."""
        with self._engine() as engine:
            result: R = getattr(engine, entry.method)(*args, **kwargs)
        return result

    def backup(self, path: str) -> int:
        with self._engine() as engine:
            return engine.backup(path)

    def kafka_groups(self) -> list[KafkaGroup] | None:
        """None live: a Kafka listener runs only in a server, which an embedded open
        of its directory would have gone through."""
        return []

    def fetch_arrow(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int | None,
        fences: Sequence[Fence] = (),
    ) -> pa.RecordBatch:
        """Columnar (Client.fetch_arrow looks for it): Engine.fetch_arrow."""
        with self._engine() as engine:
            return engine.fetch_arrow(topic, partition, offset, max_records, fences)

    # records ------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        records: Sequence[NewRecord],
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
        attachment: int | None = None,
    ) -> Sequence[AppendResult]:
        with self._engine() as engine:
            return engine.produce(
                topic, records, producer=producer, fences=fences, attachment=attachment
            )

    def produce_columns(
        self,
        topic: str,
        records: RecordColumns,
        *,
        producer: ProducerFields,
        fences: Sequence[Fence],
    ) -> ResultColumns:
        with self._engine() as engine:
            results = engine.produce(topic, records, producer=producer, fences=fences)
        return codec.result_columns(results)

    def fetch_rows(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        fences: Sequence[Fence],
    ) -> list[Row]:
        with self._engine() as engine:
            return engine.fetch_rows(topic, positions, max_records, fences)

    def fetch_ahead(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> Callable[[], list[Record]]:
        return lambda: self.fetch(topic, positions, max_records, wait_ms, fences)

    def fetch(
        self,
        topic: str,
        positions: dict[int, int],
        max_records: int,
        wait_ms: int,
        fences: Sequence[Fence],
    ) -> list[Record]:
        # at most fetch_wait_ms_max, as a server bounds a long poll
        deadline = time.monotonic() + min(wait_ms, self.limits.fetch_wait_ms_max) / 1000
        watching = False
        while True:
            with self._engine() as engine:
                found = engine.fetch(topic, positions, max_records, fences)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            if not watching:  # watch first, then read again: a write between is not missed
                self._watcher_of_thread()
                watching = True
                continue
            self._wait_for_change(remaining)

    # exclusive producers --------------------------------------------------------------

    def attach(
        self, topic: str, access: str, name: str, epoch: int | None, wait_ms: int
    ) -> Attachment:
        """Attach; a waiter polls (woken by other processes' writes) until promoted."""
        wait = ExclusiveWait(topic, wait_ms, recheck_s=0.5)
        session_id = self.session_id()
        with self._engine() as engine:
            attached = engine.attach_producer(topic, session_id, parse_access(access), name, epoch)
        deadline = wait.deadline(time.monotonic())
        while step := wait.step(attached.mode, deadline, time.monotonic()):
            if isinstance(step, GiveUp):
                with self._engine() as engine:
                    engine.detach_producer(attached.attachment_id)
                raise step.error
            # A holder that died writes nothing: the wait is short so that liveness is
            # looked at again soon, not only when another process writes.
            self._wait_for_change(step.timeout_s)
            with self._engine() as engine:
                attached = engine.poll_attachment(attached.attachment_id, topic)
        return attached

    def _watcher_of_thread(self) -> WalWatcher:
        """This thread's watch of the WAL file, started on its first wait (outside the
        engine's lock: it takes up to a recheck to begin)."""
        watcher: WalWatcher | None = getattr(self._local, "watcher", None)
        if watcher is not None:
            return watcher
        if self._closed:
            raise closed()
        from broker.client.wal_watch import WalWatcher  # watchfiles: only when waiting

        watcher = WalWatcher(self.engine.database.data_dir.path)  # its own stop: close()
        with self._lock:
            self._watchers.add(watcher)
        if self._closed:  # closed meanwhile: close() may not have seen it
            watcher.close()
            raise closed()
        self._local.watcher = watcher
        return watcher

    def _wait_for_change(self, timeout_s: float) -> None:
        """Wait (outside the engine's lock) for another process's write, timeout_s at
        most; CONNECTION_FAILED if the client is closed meanwhile."""
        self._watcher_of_thread().wait(timeout_s)
        if self._stop.is_set():
            raise closed()

    @property
    def _watcher(self) -> WalWatcher | None:
        """The calling thread's watch, if it has one (tests wait for a follower's)."""
        return next(iter(self._watchers), None)

    def detach(self, topic: str, attachment_id: int) -> None:
        with self._engine() as engine:
            engine.detach_producer(attachment_id)

    # ownership ----------------------------------------------------------------------

    def session_id(self) -> str:
        with self._engine() as engine:
            return self._session_of(engine)

    def _session_of(self, engine: Engine) -> str:
        if self._session_id is None:
            self._session_id = engine.owners.register_process()
            self._pulse = _PulseBeat(self.engine, self._session_id, self._severed)
            self._pulse.start()
            self._heartbeat = _Heartbeat(self.engine, self._session_id, self._severed)
            self._heartbeat.start()
        return self._session_id

    def on_severed(self, callback: SeveredCallback) -> None:
        self._severed_callbacks.append(callback)

    def _severed(self, reason: str) -> None:
        self._severed_reason = reason
        for callback in list(self._severed_callbacks):
            callback(reason)

    def own(self, group: str, claims: Sequence[tuple[str, int]]) -> list[Claimed]:
        if self._severed_reason is not None:
            raise BrokerError(
                ErrorCode.SEVERED,
                f"this client's session was {self._severed_reason}",
                hint="open a new client to claim again",
            )
        with self._engine() as engine:
            return list(engine.owners.own(self._session_of(engine), group, claims).claimed)

    def release(self, group: str, resources: Sequence[str] | None, any_holder: bool) -> list[str]:
        with self._engine() as engine:
            result = engine.owners.release(
                self._session_of(engine), group, resources, any_holder=any_holder
            )
        return list(result.released)

    def ownership(self, group: str | None) -> list[OwnershipInfo]:
        with self._engine() as engine:
            return engine.owners.holdings(group)

    def ownership_history(self, group: str | None, limit: int) -> list[AuditRow]:
        with self._engine() as engine:
            return engine.owners.history(group, limit)

    def close(self) -> None:
        """Close, from any thread: the waits of other threads end (CONNECTION_FAILED)
        and their engine calls finish first."""
        self._stop.set()
        for watcher in list(self._watchers):
            watcher.close()  # the waits of other threads end now, not after the lock
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self._session_id is not None:
                self.engine.session_closed(self._session_id)
            if self._pulse is not None:
                self._pulse.stop()
            for watcher in list(self._watchers):
                watcher.close()  # one made meanwhile (a close twice changes nothing)
            self.engine.close()


def closed() -> BrokerError:
    return BrokerError(ErrorCode.CONNECTION_FAILED, "this client is closed", client_closed=True)


def restore_snapshot(
    snapshot: Path, data_dir: Path, *, force: bool, progress: Callable[[int, int], None]
) -> int:
    """Restore a `fencelog snapshot` file into a data directory that no server owns;
    the bytes restored. progress(done, total) is told as the copy goes."""
    from broker.engine import backup

    return backup.restore(snapshot, data_dir, force=force, progress=progress)


def check_data_dir(data_dir: Path) -> Inspection:
    """SQLite's integrity check of a data directory's database, read-only: it may run
    while a server or other processes use the directory."""
    from broker.engine import backup

    return backup.inspect(data_dir)
