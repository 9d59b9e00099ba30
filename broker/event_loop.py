"""The event loop the server and the served client run on: uvloop's where it is
installed (a dependency on Linux and macOS), else asyncio's own.

uvloop runs the same asyncio code with its socket and callback machinery in C (libuv):
a request round trip through the server costs about half the event-loop time.
"""

from __future__ import annotations

import asyncio
import time

from broker.errors import BrokerError, ErrorCode
from broker.limits import BUSY_POLL_US_MAX


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an install without it: the same code, slower
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class BusyPoll:
    """Keeps an event loop polling its sockets, without sleeping, for a short window
    after each `kick()`: a request that arrives inside the window is read at once by a
    process whose caches are still warm.

    Why: on a virtual machine, a process that sleeps in epoll for even 200 us comes back
    slowly (the wake-up itself, then cold caches): the same SQLite append took 48 us hot
    and 115 us after a 200 us sleep. Go's scheduler (NATS) spins briefly before it
    parks a thread for the same reason; Linux's net.core.busy_poll is the kernel's.

    The cost is CPU, bounded: at most `window_us` of polling after the last kick, and
    none at all while nothing happens. A window of 0 turns it off.
    """

    def __init__(self, window_us: int) -> None:
        if not 0 <= window_us <= BUSY_POLL_US_MAX:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"busy polling lasts 0 to {BUSY_POLL_US_MAX} us, not {window_us}",
            )
        self._window_s = window_us / 1e6
        self._until = 0.0
        self._polling = False

    def kick(self) -> None:
        """Poll the running loop without sleeping until `window_us` from now."""
        if not self._window_s:
            return
        self._until = time.monotonic() + self._window_s
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_soon(self._poll)

    def stop(self) -> None:
        self._until = 0.0

    def _poll(self) -> None:
        # A ready callback makes the loop poll with a zero timeout, run what arrived,
        # and come back here.
        if time.monotonic() < self._until:
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self._polling = False
