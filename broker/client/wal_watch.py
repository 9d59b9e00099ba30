"""Waking a reader when another process appends to a data directory.

An embedded reader cannot be told about a write made by another process, but every
commit touches the database's WAL file, so it watches that file with watchfiles (inotify
on Linux) instead of polling the database. The watcher is started before the first read,
so a commit that lands between "read found nothing" and "wait" is still seen; a wait also
returns at least every `recheck_ms` so that a missed event costs a little latency, never
a hang.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Generator
from pathlib import Path

from watchfiles import Change, watch

from broker.discovery import DB_FILE

_WATCHED = (DB_FILE, DB_FILE + "-wal")


def _is_log_file(change: Change, path: str) -> bool:
    return Path(path).name in _WATCHED


class WalWatcher:
    """Blocks until the data directory's database changes, or a timeout."""

    def __init__(
        self, data_dir: Path, recheck_ms: int = 250, stop: threading.Event | None = None
    ) -> None:
        """stop, once set, ends every wait within recheck_ms (close() sets it; a close
        from another thread ends this watch's wait so)."""
        self._stop = stop or threading.Event()
        self._changes: Generator[set[tuple[Change, str]], None, None] = watch(
            data_dir,
            watch_filter=_is_log_file,
            debounce=50,
            step=5,
            rust_timeout=recheck_ms,
            yield_on_timeout=True,
            recursive=False,
            stop_event=self._stop,
        )
        # The first next() creates the inotify watch; do it now, before any read.
        self._pending = bool(next(self._changes, None))

    def wait(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for a change; True if one was seen. Returns at once,
        False, once stopped."""
        if self._pending:
            self._pending = False
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                if next(self._changes, None):
                    return True
            except ValueError:  # closed from another thread as this one went on: stopped
                return False
        return False

    def close(self) -> None:
        """Stop watching; a watch still waiting in another thread ends by itself."""
        self._stop.set()
        if inspect.getgeneratorstate(self._changes) != inspect.GEN_RUNNING:
            with contextlib.suppress(ValueError):  # began running meanwhile
                self._changes.close()
