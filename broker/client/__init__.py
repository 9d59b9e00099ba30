"""The Python client, the same whether the broker is embedded or served.

    from broker.client import connect
    with connect("./.fencelog") as client:
        ...

- client.py: `connect` and `Client`, the one interface over both transports;
- embedded.py: the transport that opens the data directory in this process;
- served.py: the transport that talks to `fencelog serve`, over remote.py's blocking
  connection, or async_client.py's event loop (and `AsyncClient`) when a session must
  be kept alive;
- producer.py: the idempotent, pipelining `Producer`;
- transaction.py: `Transaction`, a context manager over txn-begin / commit / abort;
- wal_watch.py: wakes an embedded `consume --follow` when the WAL changes.
"""

from __future__ import annotations

from broker.client.client import DEFAULT_BROKER, Client, connect
from broker.types import NewRecord

__all__ = ["DEFAULT_BROKER", "Client", "NewRecord", "connect"]
