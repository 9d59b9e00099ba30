"""The NATS JetStream baseline, driven by nats-py: the same load patterns as
bench/served.py, with JetStream's de-duplication (the Nats-Msg-Id header).

Rules:
- nats-py and nats-server are optional (`pip install -e '.[bench]'`, `apt-get install
  nats-server`); `unavailable()` says why the baseline cannot run, and the caller skips
  it. nats-py is imported only here and only when used.
- One connection (one `nats.connect`) per pattern; every publish is `js.publish`, which
  waits for the stream's acknowledgement, with a Nats-Msg-Id unique within the run.
- Each pattern publishes to a fresh file-storage stream (kept, as fencelog keeps its
  topics) and checks afterwards that it holds exactly the messages published.
  `connect` checks once that a repeated Nats-Msg-Id is answered as a duplicate, so the
  comparison is de-duplicated on both sides.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.util
import itertools
import time
from collections.abc import Sequence
from typing import Any, Final

from bench.processes import nats_server_binary

MSG_ID: Final = "Nats-Msg-Id"


def unavailable() -> str | None:
    """Why the NATS baseline cannot run here, or None when it can."""
    missing = []
    if nats_server_binary() is None:
        missing.append("nats-server is not installed (Debian: apt-get install nats-server)")
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py is not installed (pip install -e '.[bench]')")
    return "; ".join(missing) or None


def client_version() -> str:
    try:
        return importlib.metadata.version("nats-py")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class JetStream:
    """One nats-py connection and its JetStream context."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._js = connection.jetstream()
        self._streams = itertools.count(1)
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, address: str) -> JetStream:
        nats = importlib.import_module("nats")
        connection = await nats.connect(address, allow_reconnect=False, connect_timeout=5)
        jetstream = cls(connection)
        await jetstream._check_deduplication()
        return jetstream

    async def close(self) -> None:
        await self._connection.close()

    async def new_stream(self) -> str:
        """A fresh file-storage stream; its one subject."""
        name = f"bench{next(self._streams)}"
        await self._js.add_stream(name=name, subjects=[name], storage="file")
        return name

    async def messages(self, stream: str) -> int:
        info = await self._js.stream_info(stream)
        return int(info.state.messages)

    def _headers(self) -> dict[str, str]:
        return {MSG_ID: str(next(self._ids))}

    async def _check_deduplication(self) -> None:
        stream = await self.new_stream()
        headers = self._headers()
        first = await self._js.publish(stream, b"x", headers=headers)
        again = await self._js.publish(stream, b"x", headers=headers)
        assert not first.duplicate and again.duplicate, "JetStream did not de-duplicate"
        await self._js.delete_stream(stream)

    async def publish_window(self, values: Sequence[bytes], window: int) -> float:
        """Seconds to publish each value with its own acknowledgement, `window` in flight,
        to a fresh stream."""
        stream = await self.new_stream()
        pending = iter(values)

        async def publisher() -> None:
            for value in pending:
                await self._js.publish(stream, value, headers=self._headers())

        start = time.perf_counter()
        await asyncio.gather(*(publisher() for _ in range(window)))
        elapsed_s = time.perf_counter() - start
        assert await self.messages(stream) == len(values), "JetStream lost or added messages"
        return elapsed_s

    async def publish_latencies(self, values: Sequence[bytes]) -> list[float]:
        """Seconds of each acknowledged publish, one at a time, to a fresh stream."""
        stream = await self.new_stream()
        latencies = []
        for value in values:
            headers = self._headers()
            start = time.perf_counter()
            await self._js.publish(stream, value, headers=headers)
            latencies.append(time.perf_counter() - start)
        assert await self.messages(stream) == len(values), "JetStream lost or added messages"
        return latencies
