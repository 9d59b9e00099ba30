"""fencelog: a single-node message broker on SQLite WAL files for exactly-once work.

import broker
with broker.open("./.fencelog") as engine:
    engine.create_topic("orders", partitions=4)
    engine.produce("orders", [broker.NewRecord(b"hello", key=b"k1")])
    records = engine.read("orders", partition=0, offset=0)
"""

from __future__ import annotations

from broker.engine.engine import Engine
from broker.errors import BrokerError, ErrorCode
from broker.types import AppendResult, NewRecord, Record, TopicInfo

__version__ = "0.1.0"

open = Engine.open  # broker.open(path) is the documented entry point

__all__ = [
    "AppendResult",
    "BrokerError",
    "Engine",
    "ErrorCode",
    "NewRecord",
    "Record",
    "TopicInfo",
    "__version__",
    "open",
]
