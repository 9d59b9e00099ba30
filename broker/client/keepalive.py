"""Keep a transaction alive for as long as another process lives.

A job that cannot call `txn_keepalive` itself while it works (a Spark job: its driver
plans the write in a short-lived Python worker and commits it in another) starts this
module beside it:

    python -m broker.client.keepalive < '{"broker": ..., "txn_id": 7, "timeout_ms": ...,
                                          "watch_pid": PID}'

It moves the transaction's deadline to timeout_ms from now every third of timeout_ms,
and stops once the transaction has ended (committed or aborted: the broker refuses the
keepalive) or the watched process is gone: between keepalives it waits on the process
itself (a pidfd on Linux; elsewhere a look every WATCH_S), so it stops within about a
second of the driver's death. The broker then aborts the abandoned transaction when its
last deadline passes (at most one timeout later), as any abandoned transaction. The
settings come on stdin so an auth token never shows in `ps`.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable

from msgspec import Struct
from msgspec.structs import asdict

from broker.client.client import Client, connect
from broker.errors import BrokerError, ErrorCode

# A transaction that ended, or one the broker never had: nothing left to keep alive.
ENDED: frozenset[ErrorCode] = frozenset(
    {ErrorCode.TXN_ABORTED, ErrorCode.TXN_NOT_OPEN, ErrorCode.UNKNOWN_TXN}
)
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0
WATCH_S = 0.25  # where no pidfd tells of the watched process's end: how often to look


class Keeping(Struct, frozen=True):
    """What to keep alive, where, and while which process lives."""

    broker: str
    txn_id: int
    timeout_ms: int
    watch_pid: int
    group: str | None = None
    token: str | None = None

    @property
    def interval_s(self) -> float:
        return min(max(self.timeout_ms / 3000, MIN_INTERVAL_S), MAX_INTERVAL_S)


def alive(pid: int) -> bool:
    """True while pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def ends_within(pid: int, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait up to timeout_s for pid to end; True if it has (at once, if it had)."""
    try:
        watch = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or the process is gone already
        deadline = time.monotonic() + timeout_s
        while alive(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sleep(min(WATCH_S, left))
        return True
    try:
        poller = select.poll()
        poller.register(watch, select.POLLIN)
        return bool(poller.poll(timeout_s * 1000)) or not alive(pid)
    finally:
        os.close(watch)


def keep(keeping: Keeping, sleep: Callable[[float], None] = time.sleep) -> str:
    """Keep the transaction alive until it ends or the watched process does; why it
    stopped ("ended: ..." or "watched process gone")."""
    client: Client | None = None
    try:
        while alive(keeping.watch_pid):
            try:
                if client is None:
                    client = connect(keeping.broker, token=keeping.token, create=False)
                client.txn_keepalive(keeping.txn_id, keeping.timeout_ms, group=keeping.group)
            except BrokerError as error:
                if error.code in ENDED:
                    return f"ended: {error.message}"
                if client is not None:  # a lost connection: the next round reconnects
                    client.close()
                    client = None
            if ends_within(keeping.watch_pid, keeping.interval_s, sleep):
                break
        return "watched process gone"
    finally:
        if client is not None:
            client.close()


def start(keeping: Keeping) -> subprocess.Popen[bytes]:
    """Run keep() in a process of its own (its own session: a signal to the caller's
    process group does not reach it; it watches keeping.watch_pid instead)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "broker.client.keepalive"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(asdict(keeping)).encode())
    process.stdin.close()
    return process


def main() -> int:
    keeping = Keeping(**json.loads(sys.stdin.read()))
    keep(keeping)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
