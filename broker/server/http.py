"""`serve --http-listen`: /healthz, /readyz and /metrics over plain HTTP/1.1.

A small listener on the server's own loop: one GET per connection (the answer closes
it), the request head bounded to HEAD_BYTES_MAX and read with a deadline, anything else
answered 400, 404 or 405. Nothing it answers is secret but /metrics (topic and group
names): with an auth token configured, /metrics needs `Authorization: Bearer TOKEN`; the
probes stay open, so an orchestrator can ask them without the token.

- /healthz: 200 while the process serves (it answers at all), 503 once it is stopping.
- /readyz: 200 once the server has started, which is after recovery (every commit a
  killed broker had prepared is applied when the engine opens); 503 before and while
  stopping.
- /metrics: broker/server/metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from broker.server.metrics import CONTENT_TYPE

log = logging.getLogger("fencelog.server")
HEAD_BYTES_MAX: Final = 8192
HEAD_TIMEOUT_S: Final = 10.0
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class HttpEndpoints:
    def __init__(
        self,
        *,
        ready: Callable[[], bool],
        stopping: Callable[[], bool],
        metrics: Callable[[], Awaitable[bytes]],
        auth_token: str | None,
    ) -> None:
        self._ready = ready
        self._stopping = stopping
        self._metrics = metrics
        self._token = auth_token

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(self._head(reader), HEAD_TIMEOUT_S)
            status, content_type, body = await self._answer(head)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            status, content_type, body = 400, "text/plain", b"a request head, please\n"
        except ConnectionError:
            return
        reason = _REASONS.get(status, "")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    @staticmethod
    async def _head(reader: asyncio.StreamReader) -> list[str]:
        raw = await reader.readuntil(b"\r\n\r\n")
        return raw.decode("latin-1").split("\r\n")

    async def _answer(self, head: list[str]) -> tuple[int, str, bytes]:  # noqa: PLR0911 - a route each
        parts = head[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "text/plain", b"not an HTTP/1.x request\n"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target not in {"/healthz", "/readyz", "/metrics"}:
            return 404, "text/plain", b"/healthz, /readyz and /metrics are here\n"
        if method not in {"GET", "HEAD"}:
            return 405, "text/plain", b"GET only\n"
        if target == "/healthz":
            if self._stopping():
                return 503, "text/plain", b"stopping\n"
            return 200, "text/plain", b"ok\n"
        if target == "/readyz":
            if self._ready() and not self._stopping():
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", b"not ready\n"
        if self._token is not None and not self._authorized(head[1:]):
            return 401, "text/plain", b"/metrics needs Authorization: Bearer TOKEN\n"
        return 200, CONTENT_TYPE, await self._metrics()

    def _authorized(self, headers: list[str]) -> bool:
        assert self._token is not None
        for line in headers:
            name, _, value = line.partition(":")
            if name.strip().lower() == "authorization":
                scheme, _, given = value.strip().partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    given.strip().encode(), self._token.encode()
                )
        return False
