"""The differential test's ownership steps: claims with generations below, at and above
the current one and resets, releases (its own, an operator's), writes and reads with
current, stale and wrong fences, in transactions too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.types import Fence
from support.differential.base import RunBase, appended
from support.differential.world import FENCED_TOPIC, OWNER_GROUP, RESOURCES, Answer

if TYPE_CHECKING:
    from support.differential.plan import Step


class OwnershipSteps(RunBase):
    def _own(self, index: int, step: Step) -> Answer:
        claims = {r: self._claim_generation(step.group, r, step.choice) for r in step.resources}
        claimed = self.actors[step.actor].client.own(step.group, claims)
        for c in claimed:
            self.generations[(c.group, c.resource)] = c.generation
            self.claims[(step.actor, c.group, c.resource)] = c.generation
        return tuple((c.group, c.resource, c.generation) for c in claimed)

    def _claim_generation(self, group: str, resource: str, choice: str) -> int:
        current = self.generations.get((group, resource), 0)
        return {
            "zero": 0,
            "one": 1,
            "below": max(current - 1, 1),
            "equal": max(current, 1),
            "next": current + 1,
            "above": current + 5,
        }[choice]

    def _release(self, index: int, step: Step) -> Answer:
        resources = None if step.flag else list(step.resources)
        any_holder = step.count == 3
        released = self.actors[step.actor].client.release(
            step.group, resources, any_holder=any_holder
        )
        for resource in released:
            for key in [k for k in self.claims if k[1:] == (step.group, resource)]:
                del self.claims[key]
        return tuple(released)

    def _fenced_produce(self, index: int, step: Step) -> Answer:
        held = sorted(
            p for p, r in enumerate(RESOURCES) if (step.actor, OWNER_GROUP, r) in self.claims
        )
        partition = step.partition % 2
        if held and step.choice in ("mine", "stale"):  # a partition it holds, if any
            partition = held[step.partition % len(held)]
        fences = self._fences(step.actor, partition, step.choice)
        results = self.actors[step.actor].client.produce(
            FENCED_TOPIC, self._values(index, step.count), partition=partition, fences=fences
        )
        return appended(results)

    def _fenced_fetch(self, index: int, step: Step) -> Answer:
        partition = step.partition % 2
        fences = self._fences(step.actor, partition, step.choice)
        records = self.actors[step.actor].client.fetch(FENCED_TOPIC, {partition: 0}, fences=fences)
        return tuple(r.value for r in records)

    def _txn_fenced_produce(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        partition = step.partition % 2
        fences = self._fences(step.actor, partition, step.choice)
        results = self.actors[step.actor].client.produce(
            FENCED_TOPIC,
            self._values(index, step.count),
            partition=partition,
            fences=fences,
            txn=txn_id,
        )
        return appended(results)

    def _fences(self, actor: int, partition: int, choice: str) -> list[Fence]:
        resource = RESOURCES[partition]
        other = RESOURCES[1 - partition]
        mine = self.claims.get((actor, OWNER_GROUP, resource), 1)
        return {
            "none": [],
            "mine": [Fence(OWNER_GROUP, resource, mine)],
            "stale": [Fence(OWNER_GROUP, resource, max(mine - 1, 0))],
            "other-partition": [
                Fence(OWNER_GROUP, other, self.claims.get((actor, OWNER_GROUP, other), 1))
            ],
            "other-group": [
                Fence("others", resource, self.claims.get((actor, "others", resource), 1))
            ],
        }[choice]
