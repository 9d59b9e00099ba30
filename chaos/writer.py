"""A writer the chaos suite pauses with SIGSTOP: an owner or an exclusive producer on an
embedded data directory, writing one record per `pace_s` until fenced or `deadline_s`.

    python -m chaos.writer DATA_DIR TOPIC NAME (owner GENERATION | exclusive) PACE_S DEADLINE_S

stdout, one line each: `ready EPOCH_OR_GENERATION`, `ack OFFSET`, `holding` / `released`
(stdin `hold` opens a write transaction on the data directory's database and keeps it
until stdin says `release`, so a SIGSTOP catches the process inside it), then `fenced`
(exit 3), `error NAME` (exit with the error's code), or `done` (exit 0). Its records
are `NAME:N`; an owner writes with its fence and a header `generation`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from pathlib import Path

import msgspec.structs

from broker.client.client import connect
from broker.client.producer import ProducerFenced
from broker.discovery import DB_FILE
from broker.errors import BrokerError, ErrorCode
from broker.limits import DEFAULT_LIMITS

FENCED_EXIT = 3
SESSION_TIMEOUT_MS = 1500
GROUP = "chaos"
_lock = threading.Lock()
_QUIET_AFTER_RELEASE_S = 1.0
_quiet_until = [0.0]  # monotonic time before which the writer does not write


def say(line: str) -> None:
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _commands(data_dir: Path) -> None:
    """stdin `hold`: a write transaction held on the database until `release`."""
    held: sqlite3.Connection | None = None
    for line in sys.stdin:
        if line.strip() == "hold" and held is None:
            _quiet_until[0] = float("inf")  # no write of its own waits behind the hold
            held = sqlite3.connect(data_dir / DB_FILE, timeout=30, isolation_level=None)
            held.execute("BEGIN IMMEDIATE")
            say("holding")
        elif line.strip() == "release" and held is not None:
            # Quiet for a moment after letting go: the suite stops this process again at
            # once, and must catch it outside a write of its own, not inside the next one.
            _quiet_until[0] = time.monotonic() + _QUIET_AFTER_RELEASE_S
            held.execute("ROLLBACK")
            held.close()
            held = None
            say("released")
    if held is not None:
        held.close()


def main() -> int:
    data_dir, topic, name, role = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    rest = sys.argv[5:]
    generation = int(rest.pop(0)) if role == "owner" else 0
    pace_s, deadline_s = float(rest[0]), float(rest[1])
    limits = msgspec.structs.replace(DEFAULT_LIMITS, session_timeout_ms=SESSION_TIMEOUT_MS)
    deadline = time.monotonic() + deadline_s
    threading.Thread(target=_commands, args=(data_dir,), daemon=True).start()
    try:
        with connect(data_dir, durability="normal", limits=limits) as client:
            if role == "owner":
                [claimed] = client.own(GROUP, [topic], generation=generation)
                say(f"ready {claimed.generation}")

                def send(value: bytes) -> int:
                    [result] = client.produce(
                        topic,
                        [value],
                        partition=0,
                        headers=(("generation", str(generation).encode()),),
                        fences=[claimed.fence],
                    )
                    return result.offset
            else:
                producer = client.producer(
                    topic, access="wait-exclusive", name=name, wait_timeout_s=deadline_s
                )
                say(f"ready {producer.epoch}")

                def send(value: bytes) -> int:
                    [result] = producer.send([value], partition=0)
                    return result.offset

            number = 0
            while time.monotonic() < deadline:
                while time.monotonic() < _quiet_until[0]:
                    time.sleep(0.01)
                say(f"ack {send(f'{name}:{number}'.encode())}")
                number += 1
                time.sleep(pace_s)  # pacing: a steady stream to pause in the middle of
    except ProducerFenced:
        say("fenced")
        return FENCED_EXIT
    except BrokerError as error:
        if error.code in (ErrorCode.FENCED, ErrorCode.SEVERED, ErrorCode.PRODUCER_FENCED):
            say("fenced")
            return FENCED_EXIT
        say(f"error {error.code.name} {' '.join(error.message.split())}")
        return int(error.code)
    say("done")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
