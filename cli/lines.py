"""Reading records from stdin, one per line, in batches that do not wait.

A reader thread moves lines into a bounded queue; a batch is whatever is already queued
(up to a count and a byte bound) once the first line arrives. A file is read in large
batches; `tail -f` piped in is sent line by line as it comes.
"""

from __future__ import annotations

import io
import os
import queue
import threading
from collections.abc import Iterator
from typing import BinaryIO

from broker import threads

_EOF = b""
_QUEUE_LINES_MAX = 10_000
_CHUNK_BYTES = 64 * 1024
_STOP_POLL_S = 0.1  # how soon a waiting reader notices Ctrl-C or SIGTERM


def _pump(stream: BinaryIO, lines: queue.Queue[bytes]) -> None:
    try:
        fd: int | None = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        fd = None
    if fd is None:  # not a real file (tests feed a BytesIO)
        for line in stream:
            lines.put(line)
    else:
        # os.read, not the buffered stream: a reader blocked in it holds no lock, so the
        # process can still exit cleanly while stdin stays open (`tail -f | fencelog ...`).
        # A line's start is kept as chunks and joined once its end comes: adding each
        # chunk to it took time quadratic in its length (40 MiB of binary piped in by
        # mistake: 12 s before the line was even refused).
        parts: list[bytes] = []
        while chunk := os.read(fd, _CHUNK_BYTES):
            if b"\n" not in chunk:
                parts.append(chunk)
                continue
            *complete, rest = chunk.split(b"\n")
            if parts:
                complete[0] = b"".join(parts) + complete[0]
            for line in complete:
                lines.put(line + b"\n")
            parts = [rest] if rest else []
        if parts:
            lines.put(b"".join(parts))
    lines.put(_EOF)


def line_batches(
    stream: BinaryIO, records_max: int, bytes_max: int, stop: threading.Event | None = None
) -> Iterator[list[bytes]]:
    """Lines without their line ending, batched; the last line needs no newline. Ends
    at the end of the stream, or once `stop` is set (lines not yet batched stay unread)."""
    lines: queue.Queue[bytes] = queue.Queue(maxsize=_QUEUE_LINES_MAX)
    threads.start(threading.Thread(target=_pump, args=(stream, lines), daemon=True, name="stdin"))
    done = False
    while not done:
        line = _next_line(lines, stop)
        if line is _EOF:
            return
        batch = [_strip(line)]
        size = len(line)
        while len(batch) < records_max and size < bytes_max:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is _EOF:
                done = True
                break
            batch.append(_strip(line))
            size += len(line)
        yield batch


def _next_line(lines: queue.Queue[bytes], stop: threading.Event | None) -> bytes:
    """The next line, or _EOF once stop is set."""
    while stop is None or not stop.is_set():
        try:
            return lines.get(timeout=_STOP_POLL_S if stop is not None else None)
        except queue.Empty:
            continue
    return _EOF


def _strip(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    if line.endswith(b"\n"):
        return line[:-1]
    return line
