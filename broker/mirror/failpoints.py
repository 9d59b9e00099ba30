"""FENCELOG_MIRROR_FAILPOINT=STEP[:N]: SIGKILL the mirror the Nth time it reaches STEP.

For fault tests, as the engine's FENCELOG_FAILPOINT: a kill at a chosen step of a batch
rather than wherever a signal happens to land. The steps, in a batch's order:
- written: the batch's records are in the target's open transaction, its position not;
- positioned: the position is in the transaction too, not committed;
- committed: the transaction is committed, the next batch not read.
"""

from __future__ import annotations

import os
import signal
from typing import Final

from broker.errors import BrokerError, ErrorCode

FAILPOINT_ENV: Final = "FENCELOG_MIRROR_FAILPOINT"
STEPS: Final = ("written", "positioned", "committed")


class Failpoints:
    def __init__(self, spec: str | None) -> None:
        self.step: str | None = None
        self.remaining = 0
        if not spec:
            return
        step, _, count = spec.partition(":")
        if step not in STEPS or (count and not count.isdigit()):
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{FAILPOINT_ENV}={spec!r} is not STEP[:N] with STEP one of {', '.join(STEPS)}",
            )
        self.step, self.remaining = step, int(count or 1)

    def reached(self, step: str) -> None:
        if step != self.step:
            return
        self.remaining -= 1
        if self.remaining == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def from_environment() -> Failpoints:
    return Failpoints(os.environ.get(FAILPOINT_ENV))
