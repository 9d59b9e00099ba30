"""The differential test's plan: operations as data only (which client acts, which group,
resources, partitions, and which *kind* of generation, sequence or fence to use). A plan
never looks at a broker: each choice is resolved when run, against what that run has
been answered so far, so two runs that agree resolve it alike."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from support.differential.bad_inputs import BAD_INPUTS
from support.differential.world import COUNT_MAX, GROUPS, OWNERS, RESOURCES, TXN_GROUPS, WORKERS

OWNER_STEPS = {
    "own": 6,
    "release": 2,
    "fenced_produce": 5,
    "fenced_fetch": 2,
    "txn_fenced_produce": 2,
    "read": 1,
    "bad_input": 2,
    "reconnect": 1,
}
WORKER_STEPS = {
    "lease": 2,
    "resume_lease": 1,
    "idempotent_produce": 7,
    "producer_send": 3,
    "producer_close": 2,
    "producer_checkpoint": 1,
    "plain_produce": 1,
    "attach": 2,
    "wait_for_exclusive": 1,
    "exclusive_send": 3,
    "detach": 1,
    "txn_begin": 2,
    "txn_begin_produce": 1,
    "txn_produce": 3,
    "txn_join": 2,
    "member_produce": 3,
    "txn_commit": 2,
    "txn_abort": 1,
    "commit_offsets": 1,
    "txn_commit_offsets": 1,
    "txn_show": 1,
    "txn_keepalive": 1,
    "recreate_ledger": 1,
    "keyed_produce": 2,
    "clean": 1,
    "snapshot_producers": 1,
    "read": 2,
    "bad_input": 2,
    "reconnect": 1,
}
# Relative to the resource's current generation (as this run was last answered).
CLAIM_CHOICES = ("zero", "one", "below", "equal", "next", "above")
# Which fence a write to partition P of FENCED_TOPIC carries.
FENCE_CHOICES = ("none", "mine", "mine", "mine", "stale", "other-partition", "other-group")
# An idempotent batch: its generation and first sequence against the lease's state.
GENERATION_CHOICES = ("same", "same", "same", "next", "stale", "far")
SEQUENCE_CHOICES = ("next", "next", "next", "duplicate", "overlap", "gap", "first")


@dataclass(frozen=True)
class Step:
    """One operation, as data: what kind, which client, and its choices."""

    kind: str
    actor: int
    group: str = ""
    resources: tuple[str, ...] = ()
    choice: str = ""
    second_choice: str = ""
    partition: int = 0
    count: int = 1
    ref: int = 0  # which lease, transaction, member or producer slot (taken modulo)
    flag: bool = False


def plan(seed: int, steps: int) -> list[Step]:
    """A random sequence of `steps` operations, the same for the same seed."""
    rng = random.Random(seed)
    return [_step(rng) for _ in range(steps)]


def _step(rng: random.Random) -> Step:
    actor = rng.randrange(OWNERS + WORKERS)
    table = OWNER_STEPS if actor < OWNERS else WORKER_STEPS
    kind = rng.choices(list(table), weights=list(table.values()))[0]
    resources = tuple(sorted(rng.sample(RESOURCES, rng.choice((1, 1, 2)))))
    return Step(
        kind=kind,
        actor=actor,
        group=rng.choice(GROUPS if kind != "txn_begin" else TXN_GROUPS),
        resources=resources,
        choice=rng.choice(_choices(kind)),
        second_choice=rng.choice(SEQUENCE_CHOICES),
        partition=rng.randrange(3),
        count=rng.randint(1, COUNT_MAX),
        ref=rng.randrange(1_000),
        flag=rng.random() < 0.3,
    )


def _choices(kind: str) -> Sequence[str]:
    return {
        "own": CLAIM_CHOICES,
        "fenced_produce": FENCE_CHOICES,
        "idempotent_produce": GENERATION_CHOICES,
        "attach": ("shared", "exclusive", "exclusive", "wait-exclusive"),
        "fenced_fetch": FENCE_CHOICES,
        "txn_fenced_produce": FENCE_CHOICES,
        "txn_commit": ("all", "all", "latest", "stale"),
        "bad_input": tuple(BAD_INPUTS),
    }.get(kind, ("",))
