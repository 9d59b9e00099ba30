"""fencelog: a single-node message broker on SQLite WAL files for exactly-once work.

import broker
with broker.open("./.fencelog") as engine:
    engine.create_topic("orders", partitions=4)
    engine.produce("orders", [broker.NewRecord(b"hello", key=b"k1")])
    records = engine.read("orders", partition=0, offset=0)

Importing `broker` (or any module under it, such as broker.core.producers) loads nothing
else: the names below are imported when first used, so a pure module does not pay for
the engine and SQLite.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from broker.engine.engine import Engine
    from broker.errors import BrokerError, ErrorCode
    from broker.types import AppendResult, AppendResults, NewRecord, Record, TopicInfo

    open = Engine.open  # broker.open(path) is the documented entry point

_LAZY = {
    "AppendResult": "broker.types",
    "AppendResults": "broker.types",
    "BrokerError": "broker.errors",
    "Engine": "broker.engine.engine",
    "ErrorCode": "broker.errors",
    "NewRecord": "broker.types",
    "Record": "broker.types",
    "TopicInfo": "broker.types",
}


def __getattr__(name: str) -> Any:
    if name == "open":
        return importlib.import_module("broker.engine.engine").Engine.open
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AppendResult",
    "AppendResults",
    "BrokerError",
    "Engine",
    "ErrorCode",
    "NewRecord",
    "Record",
    "TopicInfo",
    "__version__",
    "open",
]
