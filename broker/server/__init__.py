"""`fencelog serve`: the asyncio server that moves bytes between sockets and the engine.

- server.py: `Server`, its life cycle, sessions, and the handlers of the native protocol.

It imports the engine; nothing outside cli/serve.py and tests imports it.
"""

from __future__ import annotations

from broker.server.server import Server

__all__ = ["Server"]
