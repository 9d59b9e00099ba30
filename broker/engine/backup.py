"""One-file copies of a whole broker: taken online, restored into a data directory.

A copy is made as of one read transaction while writers go on (WAL mode), never as a file
copy of a live database: with SQLite's online backup API in one step, page by page, or,
when a quarter of the database or more is free pages (after retention deleted much),
with `VACUUM INTO`, which rebuilds every table into a compact copy but takes 1.5 to 2
times as long and falls further behind as the database grows (bench/RESULTS.md "Growth
curves"). It holds everything: logs, lease rows, producer snapshots,
ownership generations, consumer offsets. Restoring checks that the file is a fencelog
database this version can open, and refuses to replace a non-empty data directory
unless asked to, or one a running server owns.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from broker.discovery import DB_FILE, find_server
from broker.errors import BrokerError, ErrorCode
from broker.storage import logs as log_store
from broker.storage import txns as txn_store
from broker.storage.database import (
    APPLICATION_ID,
    LOG_SCHEMA,
    SCHEMA_VERSION,
    TXN_BATCHES_SCHEMA,
    DataDir,
    empty_database,
    opens_as_fencelog,
    schema_too_new,
)
from broker.types import Inspection

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
_COPY_CHUNK_BYTES = 1 << 20
_COMPACT_WHEN_FREE = 4  # a quarter of the pages free or more: the copy leaves them out


def take(conn: sqlite3.Connection, out: Path) -> int:
    """Write a consistent copy of the database behind conn to out; its size in bytes."""
    if out.exists():
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{out} already exists",
            hint="choose a new file name; a snapshot never overwrites",
        )
    old_umask = os.umask(0o077)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        if free * _COMPACT_WHEN_FREE >= pages > 0:
            conn.execute("VACUUM INTO ?", (str(out),))
        else:
            copy = sqlite3.connect(out)
            try:
                conn.backup(copy)  # one step: one read transaction, so one consistent state
                # a file on its own, without -wal and -shm beside it wherever it is opened
                copy.execute("PRAGMA journal_mode = DELETE")
            finally:
                copy.close()
    except sqlite3.Error as exc:
        with contextlib.suppress(FileNotFoundError):
            out.unlink()
        raise BrokerError(ErrorCode.STORAGE_FAILED, f"cannot write {out}: {exc}") from exc
    finally:
        os.umask(old_umask)
    return out.stat().st_size


def check_file(path: Path) -> int:
    """The schema version of a fencelog snapshot file; BrokerError if it is not one."""
    if not path.is_file():
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, f"{path} is not a file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            application_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if _sqlite_header(path) is None:
            raise BrokerError(
                ErrorCode.FOREIGN_DATA_DIR, f"{path} is not a fencelog snapshot ({exc})"
            ) from exc
        raise BrokerError(
            ErrorCode.DATA_CORRUPT,
            f"{path} is damaged: {exc}{_truncation(path)}",
            hint="copy the snapshot again, whole, or take another",
        ) from exc
    if application_id != APPLICATION_ID:
        raise BrokerError(ErrorCode.FOREIGN_DATA_DIR, f"{path} is not a fencelog snapshot")
    if version > SCHEMA_VERSION:
        raise schema_too_new(path, version, "upgrade fencelog to restore it")
    if check != "ok":
        raise BrokerError(ErrorCode.DATA_CORRUPT, f"{path} is damaged: {check}{_truncation(path)}")
    return version


_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_BYTES = 100


def _sqlite_header(path: Path) -> bytes | None:
    """The file's SQLite header (its first 100 bytes), or None: not an SQLite file."""
    with contextlib.suppress(OSError), path.open("rb") as file:
        header = file.read(_HEADER_BYTES)
        if header.startswith(_SQLITE_MAGIC):
            return header
    return None


def _truncation(path: Path) -> str:
    """ "; truncated: N of M bytes" where the header's page count says the file is
    longer than it is (the count is valid when bytes 24-27 match 92-95), else ""."""
    header = _sqlite_header(path)
    if header is None or len(header) < _HEADER_BYTES or header[24:28] != header[92:96]:
        return ""
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    expected = int.from_bytes(header[28:32], "big") * page_size
    actual = path.stat().st_size
    return f"; truncated: {actual} of {expected} bytes" if 0 < actual < expected else ""


def inspect(data_dir: Path, problems_max: int = 100) -> Inspection:
    """Run `PRAGMA integrity_check` on data_dir's database, read-only (a server or other
    processes may go on using it meanwhile)."""
    if not data_dir.is_dir():
        raise BrokerError(
            ErrorCode.DATA_DIR_MISSING,
            f"data directory {data_dir} does not exist",
            path=str(data_dir),
            hint="check --broker or FENCELOG_BROKER",
        )
    db_path = data_dir / DB_FILE
    if db_path.exists() and not db_path.is_file():  # as every other command says of it
        raise BrokerError(
            ErrorCode.DATA_DIR_UNREADABLE,
            f"cannot open {db_path}: it is not a file",
            path=str(db_path),
        )
    if not db_path.is_file():
        raise BrokerError(
            ErrorCode.DATA_DIR_MISSING,
            f"{data_dir} holds no fencelog database ({DB_FILE})",
            path=str(data_dir),
            hint="nothing to check: the directory has not been written to",
        )
    size = db_path.stat().st_size
    if size == 0:
        raise empty_database(db_path)
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise BrokerError(
            ErrorCode.DATA_DIR_UNREADABLE, f"cannot open {db_path}: {exc}", path=str(db_path)
        ) from exc
    try:
        # one snapshot for every read: a process opening the directory meanwhile may be
        # moving its log (storage/upgrade.py) and commit steps between two of them
        conn.execute("BEGIN")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        application_id, tables = conn.execute(
            "SELECT (SELECT application_id FROM pragma_application_id),"
            " (SELECT count(*) FROM sqlite_schema)"
        ).fetchone()
        if not opens_as_fencelog(application_id, tables):
            raise BrokerError(
                ErrorCode.FOREIGN_DATA_DIR,
                f"{db_path} is a SQLite database, but not fencelog's",
                path=str(db_path),
            )
        if version > SCHEMA_VERSION:
            raise schema_too_new(db_path, version, "upgrade fencelog to check this data directory")
        rows = conn.execute(f"PRAGMA integrity_check({int(problems_max)})").fetchall()
        found = tuple(str(row[0]) for row in rows if row[0] != "ok")
        if not found and version >= TXN_BATCHES_SCHEMA:  # SQLite's checks cannot see inside
            found = tuple(txn_store.damaged_batches(conn, problems_max))
        if not found and version >= LOG_SCHEMA:
            found = tuple(log_store.damaged_batches(conn, problems_max))
    except sqlite3.DatabaseError as exc:
        return Inspection(db_path, size, None, (str(exc),))
    finally:
        conn.close()
    return Inspection(db_path, size, version, found)


def restore(snapshot: Path, data_dir: Path, *, force: bool, progress: Progress) -> int:
    """Make data_dir hold exactly the snapshot; the bytes copied."""
    check_file(snapshot)
    if data_dir.is_dir() and find_server(data_dir) is not None:
        raise BrokerError(
            ErrorCode.DATA_DIR_IN_USE,
            f"a fencelog server owns {data_dir}",
            hint="stop it before restoring into its directory",
        )
    DataDir(data_dir).prepare()
    present = [p for p in data_dir.iterdir() if p.name.startswith(DB_FILE)]
    if any(p.name == DB_FILE for p in present) and not force:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"{data_dir} already holds a broker",
            hint="pass --force to replace it",
        )
    temporary = data_dir / (DB_FILE + ".restore.tmp")
    copied = _copy(snapshot, temporary, progress)
    for path in present:
        path.unlink()
    os.replace(temporary, data_dir / DB_FILE)
    return copied


def _copy(source: Path, target: Path, progress: Progress) -> int:
    total = source.stat().st_size
    done = 0
    old_umask = os.umask(0o077)
    try:
        with source.open("rb") as reader, target.open("wb") as writer:
            while chunk := reader.read(_COPY_CHUNK_BYTES):
                writer.write(chunk)
                done += len(chunk)
                progress(done, total)
            writer.flush()
            os.fsync(writer.fileno())
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        raise BrokerError(ErrorCode.STORAGE_FAILED, f"cannot restore: {exc}") from exc
    finally:
        os.umask(old_umask)
    return done
