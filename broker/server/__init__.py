"""`fencelog serve`: the asyncio server that moves bytes between sockets and the engine.

- server.py: `Server`, its life cycle, session reaping and the request handlers;
- connection.py: one connection's session, frames in and replies out, in order;
- group_commit.py: concurrent produces committed in one SQLite transaction.

It imports the engine; nothing outside cli/serve.py and tests imports it.
"""

from __future__ import annotations

from broker.server.server import Server

__all__ = ["Server"]
