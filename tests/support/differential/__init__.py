"""The differential test's plan and its runner: one seeded random sequence of operations,
run through the Python client against a broker, every answer and the resulting state
written down as plain values, so that an embedded run and a served run can be compared
(tests/served/test_differential.py).

- `plan(seed, steps)` (plan.py): the operations, as data only. It never looks at a
  broker: each choice is resolved when run, against what that run has been answered so
  far (the current generation of a resource, a lease's high-water sequence, the
  transactions begun), so two runs that agree resolve it alike.
- `Run(connect, observer, served=...)`: runs a plan's steps on one broker (`answers`),
  then `state()` reads back every record of every log, the ownership listing and audit
  log, the transactions, producer states, topic access, topics and offsets. Its steps
  come in families, a module each: owning.py, producing.py, transactions.py,
  reading.py, bad_inputs.py; base.py keeps the clients and what the families share.

Clients 0..OWNERS-1 claim, release and write fenced records (a claim may sever another of
them: both runs then replace the severed client with a new one); the others lease pids
and write idempotently, attach exclusive and shared producers, and run transactions, as
owner and as joined members. Either kind may close its client and open a new one (a
session ending). What may legitimately differ between two brokers is normalised where it
is read, each with its reason: session ids, clock readings, ids taken in blocks, and the
generations a lease starts from (random).
"""

from __future__ import annotations

from support.differential.bad_inputs import BadInputSteps
from support.differential.owning import OwnershipSteps
from support.differential.plan import Step, plan
from support.differential.producing import ProducingSteps
from support.differential.reading import ReadingSteps
from support.differential.transactions import TxnSteps
from support.differential.world import LIMITS


class Run(OwnershipSteps, ProducingSteps, TxnSteps, ReadingSteps, BadInputSteps):
    """Every family of steps on one broker."""


__all__ = ["LIMITS", "Run", "Step", "plan"]
