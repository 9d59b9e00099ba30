"""FENCELOG_MIRROR_FAILPOINT=STEP[:N]: SIGKILL the mirror the Nth time it reaches STEP.

For fault tests, as the engine's FENCELOG_FAILPOINT: a kill at a chosen step of a batch
rather than wherever a signal happens to land. The steps, in a batch's order:
- written: the batch's records are in the target's open transaction, its position not;
- positioned: the position is in the transaction too, not committed;
- committed: the transaction is committed, the next batch not read.
"""

from __future__ import annotations

from typing import Final

from broker import failpoints
from broker.failpoints import Failpoints

FAILPOINT_ENV: Final = "FENCELOG_MIRROR_FAILPOINT"
STEPS: Final = ("written", "positioned", "committed")


def from_environment() -> Failpoints:
    return failpoints.from_environment(FAILPOINT_ENV, STEPS)
