"""A Kafka connection that sends exactly the requests a test builds, with kafka-python's
protocol classes, and reads their answers with a deadline: for what no client does on
purpose (a zombie's commit, a request of an old generation)."""

from __future__ import annotations

import socket
import struct
from typing import Any

STEP_TIMEOUT_S = 20.0


class RawKafka:
    def __init__(self, address: str, client_id: str = "raw-test") -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=STEP_TIMEOUT_S)
        self.client_id = client_id
        self._correlation = 0

    def call(self, request: Any, version: int) -> Any:
        """Send request at version; its decoded answer."""
        self.send(request, version)
        (size,) = struct.unpack(">i", self._exactly(4))
        frame = self._exactly(size)
        response_class = request.header.get_response_class()
        answer = response_class.decode(frame, version=version, header=True)
        assert answer.header.correlation_id == self._correlation
        return answer

    def send(self, request: Any, version: int) -> None:
        """Send request at version, framed, with the next correlation id."""
        self._correlation += 1
        request.with_header(correlation_id=self._correlation, client_id=self.client_id)
        self.sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))

    def closed_unanswered(self) -> bool:
        """Whether the broker closed the connection without sending a byte (a reset
        counts: it closed with the request unread); fails when it did neither within the
        deadline."""
        try:
            return self.sock.recv(100) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()
