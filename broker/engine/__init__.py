"""The engine: the one place where the rules (broker/core) meet storage (broker/storage).

Each operation loads what it decides on, asks core, writes the outcome in one SQLite
writer transaction, and only after COMMIT updates what it keeps in memory. Its parts:

- engine.py: `Engine`, the operations' entry points and the produce path;
- ownership.py: claims, releases, severing and fences (seeds/single-reader-writer);
- producer_table.py: idempotent producer state per (pid, partition), leases, snapshots;
- exclusive_access.py: Shared / Exclusive / WaitForExclusive attachments and topic epochs;
- transactions.py: double-journaled transactions (begin, journal, prepare, apply);
- write_cache.py: what the writer connection remembers between produce groups;
- sessions.py: session ids and whether a session's process is alive;
- backup.py: whole-broker snapshot files.

Only the server and the client's embedded transport import this package.
"""

from __future__ import annotations

from broker.engine.engine import Engine, wall_clock_ms
from broker.types import Clock

__all__ = ["Clock", "Engine", "wall_clock_ms"]
