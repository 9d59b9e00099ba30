"""The event loop the server and the served client run on: uvloop's where it is
installed (a dependency on Linux and macOS), else asyncio's own.

uvloop runs the same asyncio code with its socket and callback machinery in C (libuv):
a request round trip through the server costs about half the event-loop time.
"""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows, or an install without it: the same code, slower
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
