"""Failure points for crash tests: an environment variable STEP[:N] makes a process kill
itself (SIGKILL) the Nth time it reaches STEP, so a test can crash it at a chosen step
rather than wherever a signal happens to land. The engine's transactions read
FENCELOG_FAILPOINT (broker/engine/transactions.py), the mirror
FENCELOG_MIRROR_FAILPOINT (broker/mirror/failpoints.py); each names its own steps.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from broker.errors import BrokerError, ErrorCode


class Failpoints:
    """STEP[:N] of variable `env` (None or empty: none), STEP one of `steps`."""

    def __init__(self, env: str, steps: Sequence[str], spec: str | None) -> None:
        self.step: str | None = None
        self.remaining = 0
        if not spec:
            return
        step, _, count = spec.partition(":")
        if step not in steps or (count and not count.isdigit()):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{env}={spec!r} is not STEP[:N] with STEP one of {', '.join(steps)}",
            )
        self.step, self.remaining = step, int(count or 1)

    def reached(self, step: str) -> None:
        if step != self.step:
            return
        self.remaining -= 1
        if self.remaining == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def from_environment(env: str, steps: Sequence[str]) -> Failpoints:
    return Failpoints(env, steps, os.environ.get(env))
