"""Threads of fencelog's own leave SIGINT and SIGTERM to the process's main thread.

The kernel gives a signal sent to the process to any thread that does not block it.
Python runs its handler on the main thread, but when another thread took the signal,
a main thread blocked in a call (time.sleep, a lock, a socket read) is not woken: a
Ctrl-C reached a user's script only once that call returned. So every thread fencelog
starts is started with the two blocked (a new thread inherits its creator's mask).
"""

from __future__ import annotations

import signal
import threading
from typing import Final

_FOR_MAIN: Final = frozenset({signal.SIGINT, signal.SIGTERM})


def start(thread: threading.Thread) -> threading.Thread:
    """thread.start() with SIGINT and SIGTERM blocked in the new thread."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: signals go to the main thread
        thread.start()
        return thread
    kept = signal.pthread_sigmask(signal.SIG_BLOCK, _FOR_MAIN)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, kept)
    return thread
