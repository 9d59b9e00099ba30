"""One SQLite database per data directory: opening it safely, migrating it, and the
transactions every change goes through.

Rules this module keeps:
- WAL mode, `isolation_level=None`, and an explicit `BEGIN IMMEDIATE` for every write, so
  several processes sharing a data directory serialise their writes in SQLite itself.
- The schema is the numbered files in schema/, applied in order inside one writer
  transaction (schema 012 with a Python step: storage/txns.move_record_journal); schema
  015's move of the old log into batches follows in steps of their own
  (storage/upgrade.py), each its own transaction, before open returns;
  `PRAGMA user_version` records how many have been applied and `PRAGMA application_id`
  marks the file as fencelog's.
- A directory or file that is not fencelog's is refused before anything is written to it.
- The data directory is 0700 and the database files 0600.
- storage never decides: it persists what the engine tells it and translates SQLite's
  failures into BrokerError.
- A large write (a transaction's commit copying its records into the log) leaves its
  checkpoint to a thread with a connection of its own, so that the commit returns
  without copying the WAL into the database first (a 150 MB transaction's COMMIT spent
  half its time there). Every other write keeps SQLite's own automatic checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NoReturn

from msgspec import Struct

from broker import failpoints, threads
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from broker.rows import decode_headers
from broker.storage import upgrade
from broker.types import Durability

APPLICATION_ID: Final = 0x46454E43  # "FENC"
log = logging.getLogger(__name__)
_SYNCHRONOUS: Final[dict[Durability, str]] = {"full": "FULL", "normal": "NORMAL"}
# Files fencelog itself may leave in a data directory; anything else makes it foreign.
_OWN_FILE = re.compile(
    r"^(fencelog\.db(-wal|-shm|-journal)?|server\.(json|lock)|fencelog\.sock|snapshots|sessions"
    r"|.*\.tmp(-journal)?)$"
)


sqlite3.register_converter("fencelog_headers", decode_headers)


def _schema_scripts() -> list[tuple[int, str]]:
    folder = Path(__file__).with_name("schema")  # package data, beside this module
    scripts = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{3})_\w+\.sql$", entry.name)
        if match:
            scripts.append((int(match.group(1)), entry.read_text(encoding="utf-8")))
    scripts.sort()
    assert [number for number, _ in scripts] == list(range(1, len(scripts) + 1))
    return scripts


SCHEMA_SCRIPTS: Final = _schema_scripts()
SCHEMA_VERSION: Final = len(SCHEMA_SCRIPTS)


def opens_as_fencelog(application_id: int, tables: int) -> bool:
    """A database fencelog may open: one with its mark, or an empty one (any other is
    another program's, FOREIGN_DATA_DIR)."""
    return application_id == APPLICATION_ID or (application_id == 0 and tables == 0)


def schema_too_new(where: object, version: int, hint: str) -> BrokerError:
    return BrokerError(
        ErrorCode.SCHEMA_TOO_NEW,
        f"{where} has schema version {version}; this fencelog knows up to {SCHEMA_VERSION}",
        found=version,
        supported=SCHEMA_VERSION,
        hint=hint,
    )


TXN_BATCHES_SCHEMA: Final = 12  # data journals as packed batches, moved by a Python step
LOG_SCHEMA: Final = 15  # the log as batches; storage/upgrade.py moves the old records


def _statements(script: str) -> Iterator[str]:
    """Split a schema script into complete statements (triggers included)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    assert not pending.strip(), "schema script ends mid-statement"


class DataDir(Struct, frozen=True):
    path: Path

    @property
    def db_path(self) -> Path:
        return self.path / DB_FILE

    def prepare(self) -> None:
        """Create the directory (0700) or check that an existing one is fencelog's."""
        if self.path.exists() and not self.path.is_dir():
            raise BrokerError(
                ErrorCode.DATA_DIR_UNREADABLE,
                f"{self.path} is not a directory",
                path=str(self.path),
                hint="pass --broker a directory path (or tcp://HOST:PORT)",
            )
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            names = os.listdir(self.path)
        except OSError as exc:
            raise BrokerError(
                ErrorCode.DATA_DIR_UNREADABLE,
                f"cannot use data directory {self.path}: {exc.strerror}",
                path=str(self.path),
                hint="check the path and its permissions",
            ) from exc
        for name in names:  # what a creator killed mid-way left (see _create)
            if (found := _CREATING.match(name)) and not _alive(int(found[1])):
                with contextlib.suppress(OSError):  # old only: the pid may be another host's
                    if time.time() - (self.path / name).stat().st_mtime > _CREATING_STALE_S:
                        (self.path / name).unlink()
        if DB_FILE not in names and any(not _OWN_FILE.match(name) for name in names):
            raise BrokerError(
                ErrorCode.FOREIGN_DATA_DIR,
                f"{self.path} is not empty and holds no fencelog data",
                path=str(self.path),
                hint="point --broker at an empty or fencelog directory",
            )


_CREATING_STALE_S: Final = 60.0  # a creation takes milliseconds
_CREATING = re.compile(r"^fencelog\.db\.(\d+)\.[0-9a-f]+\.tmp(-journal)?$")  # _create's


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


_INLINE_CHECKPOINT_PAGES: Final = 1000  # SQLite's default: a commit past it checkpoints
_CHECKPOINT_AFTER_S: Final = 0.05  # large commits within this share one checkpoint
_UPGRADE_PROGRESS_S: Final = 5.0  # a move of the log at open says how far it is, this often
_CACHE_KIB: Final = -2000  # SQLite's default page cache: 2,000 KiB
# Reads of the database file through a memory map of its first 1 GiB instead of read()
# into the page cache: a batch's values span overflow pages, and copying them through
# read() a page at a time was three quarters of a scan (bench/RESULTS.md, issue 36).
# Writes still go through write() (SQLite maps read-only), so durability is as before;
# what a map changes is that an I/O error reading the file arrives as SIGBUS rather than
# as SQLITE_IOERR. The WAL file is never mapped.
_MMAP_BYTES: Final = 1 << 30
_HELD_PAGES_BYTES_MIN: Final = 1 << 20
_HELD_PAGES_BYTES_MAX: Final = 256 << 20
# A WAL file past this is checkpointed whole and truncated (writers wait meanwhile): a
# passive checkpoint never lets a WAL that writers keep adding to start over.
_WAL_TRUNCATE_BYTES: Final = 64 << 20
# How long TRUNCATE waits for the writer of the moment and for readers still in the
# WAL, holding new writers back meanwhile; past it, it gives up until the next time.
_CHECKPOINT_BUSY_S: Final = 0.2


class Checkpoints:
    """A thread, with a connection of its own, that checkpoints the WAL shortly after
    the large commits it is told of, and once more when closed: PASSIVE (it never waits for
    readers or writers), then, once the WAL file is past _WAL_TRUNCATE_BYTES, TRUNCATE
    (it waits for the writer of the moment, holds the next ones back while it copies
    what the passive one left, and empties the file).

    It never opens the database's files itself, not even to read them: closing any
    descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    included ("How To Corrupt An SQLite Database", 2.2.1). Reading the WAL index
    (-shm) that way to learn how many pages wait corrupted a database that another
    process was writing to."""

    def __init__(self, db_path: Path, durability: Durability) -> None:
        self.db_path = db_path
        self.wal_path = db_path.with_name(db_path.name + "-wal")
        self.durability = durability
        self._due = threading.Event()
        self._closing = False
        self._thread = threads.start(
            threading.Thread(target=self._run, name="fencelog-checkpoints", daemon=True)
        )

    def wake(self) -> None:
        self._due.set()

    def close(self) -> None:
        self._closing = True
        self._due.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.db_path, isolation_level=None, timeout=_CHECKPOINT_BUSY_S)
        except sqlite3.Error:  # SQLite's own checkpoint, every 1000 pages, goes on
            return
        try:
            conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
            while True:
                self._due.wait()
                if not self._closing:
                    time.sleep(_CHECKPOINT_AFTER_S)
                self._due.clear()
                self._checkpoint(conn)
                if self._closing:
                    return
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            wal_bytes = self.wal_path.stat().st_size
        except FileNotFoundError:
            return  # the last connection closed: SQLite checkpointed and removed it
        # busy or failing: the next large commit tries again, SQLite's own checkpoint
        # every 1000 pages meanwhile
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if wal_bytes > _WAL_TRUNCATE_BYTES:  # what the passive one left: a moment
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()


class Database:
    """A connection to one data directory's database."""

    def __init__(self, conn: sqlite3.Connection, data_dir: DataDir, durability: Durability):
        self.conn = conn
        self.data_dir = data_dir
        self.durability = durability
        self.write_transactions = 0  # begun on this connection; see Engine's WriteCache
        self.checkpoints: Checkpoints | None = None  # started by the first large write
        self._holding = False  # a larger page cache for one write (hold_pages)
        self._left_unsynced = False  # durability full, left at NORMAL by write_unsynced
        self._writing_unsynced = False  # write_unsynced is entering write()
        self._starting = threading.Lock()

    @classmethod
    def open(
        cls, path: Path, durability: Durability = "full", busy_timeout_ms: int = 30_000
    ) -> Database:
        data_dir = DataDir(path)
        data_dir.prepare()
        old_umask = os.umask(0o077)
        try:
            if not data_dir.db_path.exists():
                _create(data_dir, durability, busy_timeout_ms)
            elif data_dir.db_path.is_file() and data_dir.db_path.stat().st_size == 0:
                raise empty_database(data_dir.db_path)
            conn = sqlite3.connect(
                data_dir.db_path,
                isolation_level=None,
                check_same_thread=False,
                detect_types=sqlite3.PARSE_COLNAMES,
                timeout=busy_timeout_ms / 1000,
            )
        except sqlite3.Error as exc:
            raise BrokerError(
                ErrorCode.DATA_DIR_UNREADABLE,
                f"cannot open {data_dir.db_path}: {exc}",
                path=str(data_dir.db_path),
            ) from exc
        finally:
            os.umask(old_umask)
        database = cls(conn, data_dir, durability)
        try:
            database._configure(busy_timeout_ms)
            database._migrate()
        except BaseException:
            conn.close()
            raise
        return database

    def _configure(self, busy_timeout_ms: int) -> None:
        try:
            # One statement, so one snapshot: read apart, a process that is creating the
            # schema can commit in between, and its tables seem to lack their mark.
            application_id, tables = self.conn.execute(
                "SELECT (SELECT application_id FROM pragma_application_id),"
                " (SELECT count(*) FROM sqlite_schema)"
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            if _busy(exc) or (_corrupt(exc) and _sqlite_header(self.data_dir.db_path)):
                # busy, or a SQLite file that is damaged (truncated, overwritten): not foreign
                _raise_translated(exc, "the open of the data directory", self.data_dir.db_path)
            raise BrokerError(
                ErrorCode.FOREIGN_DATA_DIR,
                f"{self.data_dir.db_path} is not a fencelog database ({exc})",
                path=str(self.data_dir.db_path),
                hint="point --broker at an empty or fencelog directory",
            ) from exc
        if not opens_as_fencelog(application_id, tables):
            raise BrokerError(
                ErrorCode.FOREIGN_DATA_DIR,
                f"{self.data_dir.db_path} is a SQLite database, but not fencelog's",
                path=str(self.data_dir.db_path),
                hint="point --broker at an empty or fencelog directory",
            )
        self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        with _translated("the switch of its database to WAL", self.data_dir.db_path):
            self._enter_wal(busy_timeout_ms)
        self.conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
        self.conn.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
        for name in (DB_FILE, DB_FILE + "-wal", DB_FILE + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(self.data_dir.path / name, 0o600)

    def _enter_wal(self, busy_timeout_ms: int) -> None:
        """Switch a new database to WAL (a database stays in WAL once switched). The
        switch needs the only lock on the file; two processes opening a new directory
        at once can each hold the shared lock the other waits on, and SQLite answers
        one of them SQLITE_BUSY at once rather than let them deadlock. That one tries
        again until the busy timeout is spent."""
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.002)

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        if self.schema_version() == SCHEMA_VERSION and not upgrade.pending(self.conn):
            return
        self._apply_schema()
        self._move_records()

    def _apply_schema(self) -> None:
        if self.schema_version() == SCHEMA_VERSION:
            return
        with self.write() as conn:
            version = self.schema_version()
            if version > SCHEMA_VERSION:
                raise schema_too_new(
                    self.data_dir.path, version, "upgrade fencelog to open this data directory"
                )
            for number, script in SCHEMA_SCRIPTS[version:]:
                for statement in _statements(script):
                    conn.execute(statement)
                if number == TXN_BATCHES_SCHEMA:  # what SQL cannot do: pack the old records
                    from broker.storage.txns import move_record_journal  # this upgrade only

                    move_record_journal(conn)
                conn.execute(f"PRAGMA user_version = {number}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _move_records(self) -> None:
        """Schemas 015's and 016's moves of the log into its layout, a bounded step a
        transaction (storage/upgrade.py): a kill at any point leaves them to the next
        open. A move that lasts says so (a warning: what a command prints), every
        _UPGRADE_PROGRESS_S, and when it has finished."""
        points = failpoints.from_environment(upgrade.FAILPOINT_ENV, upgrade.FAILPOINT_STEPS)
        limit = upgrade.step_records()
        started = told = time.monotonic()
        total = 0
        said = False
        while True:
            with self.write() as conn:
                moved = upgrade.move_step(conn, limit, points)  # 0: nothing (left) to move
            now = time.monotonic()
            if not moved:
                if said:
                    log.warning(
                        "upgraded %s: %d records moved in %.1f s",
                        self.data_dir.path,
                        total,
                        now - started,
                    )
                return
            total += moved
            points.reached("step")
            if now - told >= _UPGRADE_PROGRESS_S:
                told, said = now, True
                log.warning(
                    "upgrading %s to schema %d: %d records moved so far (once; stopped, it "
                    "goes on at the next open)",
                    self.data_dir.path,
                    SCHEMA_VERSION,
                    total,
                )

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One writer transaction: BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error.
        (Errors are translated by except clauses rather than nested context managers:
        every produce group pays for this, and those cost more than its BEGIN.)"""
        conn = self.conn
        if self._left_unsynced and not self._writing_unsynced:  # this COMMIT syncs again
            conn.execute("PRAGMA synchronous = FULL")
            self._left_unsynced = False
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            _raise_translated(exc, "write", self.data_dir.db_path)
        self.write_transactions += 1
        try:
            yield conn
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.DatabaseError):
                _raise_translated(exc, "write", self.data_dir.db_path)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            _raise_translated(exc, "commit", self.data_dir.db_path)

    def _checkpoint_later(self) -> None:
        """Hand the checkpoint of what was just committed to the checkpoint thread
        (started here the first time)."""
        with self._starting:
            if self.checkpoints is None:
                self.checkpoints = Checkpoints(self.data_dir.db_path, self.durability)
        self.checkpoints.wake()

    @contextlib.contextmanager
    def write_unsynced(self) -> Iterator[sqlite3.Connection]:
        """A writer transaction whose COMMIT is not synced on its own, whatever the
        durability: for a step that nothing is told of before a later synced write makes
        it durable too (the WAL is one file, written in order, so that write's sync covers
        every frame before it), or whose loss in a power loss is harmless (a transaction's
        BEGIN: engine/transactions.py). A process killed in between loses nothing.

        The connection stays at synchronous NORMAL after it, until the next write()
        sets FULL again before its BEGIN: a transaction's steps, unsynced then synced,
        switch once each way."""
        if self.durability != "full":
            with self.write() as conn:
                yield conn
            return
        if not self._left_unsynced:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self._left_unsynced = True
        self._writing_unsynced = True
        try:
            with self.write() as conn:
                self._writing_unsynced = False
                yield conn
        finally:
            self._writing_unsynced = False

    def hold_pages(self, conn: sqlite3.Connection, new_bytes: int) -> None:
        """Inside a write about to add new_bytes (a large commit's copy): a page cache
        large enough to keep its pages until COMMIT, up to _HELD_PAGES_BYTES_MAX (with
        SQLite's usual 2 MiB, a large write spills pages to the WAL midway and writes
        the ones it changes again), and no checkpoint inside its COMMIT: the checkpoint
        thread copies the WAL afterwards. release_pages() after the write."""
        if new_bytes > _HELD_PAGES_BYTES_MIN:
            held = min(new_bytes * 2, _HELD_PAGES_BYTES_MAX)
            conn.execute(f"PRAGMA cache_size = {-(held >> 10)}")  # negative: KiB
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._holding = True

    def release_pages(self) -> None:
        """The usual page cache and automatic checkpoint again, the memory of the
        larger cache freed, and the large write's checkpoint handed to the thread."""
        if self._holding:
            self._holding = False
            self.conn.execute(f"PRAGMA cache_size = {_CACHE_KIB}")
            self.conn.execute(f"PRAGMA wal_autocheckpoint = {_INLINE_CHECKPOINT_PAGES}")
            self.conn.execute("PRAGMA shrink_memory")
            self._checkpoint_later()

    def data_version(self) -> int:
        """Changes whenever another connection (any process) commits; never for this
        connection's own commits."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several reads (a deferred transaction). SQLite's
        failures inside it are translated too: a damaged page shows up on the read
        that touches it."""
        with _translated("read", self.data_dir.db_path):
            self.conn.execute("BEGIN")
            try:
                yield self.conn
            finally:
                if self.conn.in_transaction:
                    self.conn.execute("COMMIT")

    def file_sizes(self) -> tuple[int, int]:
        sizes = []
        for name in (DB_FILE, DB_FILE + "-wal"):
            try:
                sizes.append((self.data_dir.path / name).stat().st_size)
            except FileNotFoundError:
                sizes.append(0)
        return sizes[0], sizes[1]

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()  # a last checkpoint of what this connection wrote
        self.conn.close()


def _create(data_dir: DataDir, durability: Durability, busy_timeout_ms: int) -> None:
    """Create fencelog.db whole or not at all: its schema is built in a file of its own,
    synced, and then linked into place, never over one another process linked first. So
    fencelog.db is never empty, and an empty one is damage (empty_database), where it
    used to open as a new broker: its pids and generations handed out again."""
    temporary = data_dir.path / f"{DB_FILE}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        conn = sqlite3.connect(temporary, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous = FULL")
            Database(conn, DataDir(data_dir.path), durability)._migrate()
        finally:
            conn.close()
        try:
            os.link(temporary, data_dir.db_path)
        except FileExistsError:
            pass  # another process created it meanwhile: that one is the database
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # A file system without hard links: as before this change, SQLite creates
            # the file where it opens it (never over one another process made).
    except (sqlite3.Error, OSError) as exc:  # the directory refuses a new file
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise BrokerError(
            ErrorCode.DATA_DIR_UNREADABLE,
            f"cannot create {data_dir.db_path}: {why}",
            path=str(data_dir.db_path),
            hint="check the directory's permissions and free space",
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()


_NO_HARD_LINKS: Final = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})


def empty_database(db_path: Path) -> BrokerError:
    return BrokerError(
        ErrorCode.DATA_CORRUPT,
        f"{db_path} is empty (0 bytes): fencelog never leaves it empty, so it was "
        "truncated or replaced",
        path=str(db_path),
        hint=f"restore a snapshot, or remove {DB_FILE} and its -wal and -shm to start anew",
    )


@contextlib.contextmanager
def _translated(operation: str, db_path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.DatabaseError as exc:  # OperationalError among them
        _raise_translated(exc, operation, db_path)


def _raise_translated(exc: sqlite3.DatabaseError, operation: str, db_path: Path) -> NoReturn:
    """A storage error as the BrokerError a caller gets (an IntegrityError as it is)."""
    if isinstance(exc, sqlite3.IntegrityError):
        raise exc
    message = str(exc)
    if _corrupt(exc):
        raise BrokerError(
            ErrorCode.DATA_CORRUPT,
            f"{db_path} is damaged ({message})",
            path=str(db_path),
            hint="`fencelog check` tells what is damaged; restore a snapshot "
            "(`fencelog snapshot restore FILE --force`) or move the directory away",
        ) from exc
    if _busy(exc):
        raise BrokerError(
            ErrorCode.STORAGE_BUSY,
            f"the data directory stayed locked by another writer during {operation}",
            hint="retry; a long-running writer holds the database",
        ) from exc
    raise BrokerError(
        ErrorCode.STORAGE_FAILED, f"storage failed during {operation}: {message}"
    ) from exc


def _sqlite_header(path: Path) -> bool:
    """path begins as every SQLite database does (a file that does not was never one)."""
    try:
        with path.open("rb") as file:
            return file.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _corrupt(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT or SQLITE_NOTADB: the file fencelog.db is damaged or truncated (a
    database of another application is recognised, and refused, by its application id)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _busy(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED, in any of their extended codes: another connection
    holds what this one needs."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
