"""The differential test's bad inputs: calls a careless caller makes, which both brokers
must refuse alike (or accept alike)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.client.client import Client
from broker.client.producer import Producer
from broker.types import Fence, ProducerFields, TxnInfo
from support.differential.base import RunBase
from support.differential.world import (
    EXCLUSIVE_TOPIC,
    FENCED_TOPIC,
    OWNER_GROUP,
    PLAIN_TOPIC,
    RESOURCES,
    Answer,
)

if TYPE_CHECKING:
    from support.differential.plan import Step


def _known_txn(run: RunBase) -> int:
    return run.txns[-1] if run.txns else 1


BAD_INPUTS: dict[str, Callable[[Client, RunBase], object]] = {
    "own negative generation": lambda c, r: c.own(OWNER_GROUP, {RESOURCES[0]: -1}),
    "own empty group": lambda c, r: c.own("", [RESOURCES[0]]),
    "own empty resource": lambda c, r: c.own(OWNER_GROUP, [""]),
    "own no resources": lambda c, r: c.own(OWNER_GROUP, []),
    "release unknown group": lambda c, r: c.release("nobody", None),
    "release never claimed": lambda c, r: c.release(OWNER_GROUP, ["nothing/9"]),
    "produce missing partition": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], partition=7),
    "produce negative partition": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], partition=-1),
    "produce unknown topic": lambda c, r: c.produce("missing", [b"x"]),
    "produce no fence": lambda c, r: c.produce(FENCED_TOPIC, [b"x"], partition=0),
    "produce fence of unknown group": lambda c, r: c.produce(
        FENCED_TOPIC, [b"x"], partition=0, fences=[Fence("nobody", RESOURCES[0], 1)]
    ),
    "produce negative sequence": lambda c, r: c.produce(
        PLAIN_TOPIC, [b"x"], partition=0, producer=ProducerFields(1, 1, -5)
    ),
    "produce unleased pid": lambda c, r: c.produce(
        PLAIN_TOPIC, [b"x"], partition=0, producer=ProducerFields(99_999, 1, 1)
    ),
    "produce to unknown txn": lambda c, r: c.produce(PLAIN_TOPIC, [b"x"], txn=999_999),
    "produce txn and fence": lambda c, r: c.produce(
        FENCED_TOPIC, [b"x"], partition=0, txn=_known_txn(r)
    ),
    "fetch missing partition": lambda c, r: c.fetch(PLAIN_TOPIC, {5: 0}),
    "fetch past the end": lambda c, r: c.fetch(PLAIN_TOPIC, {0: 10_000}),
    "fetch negative offset": lambda c, r: c.fetch(PLAIN_TOPIC, {0: -3}),
    "lease missing partition": lambda c, r: c.lease_pid(PLAIN_TOPIC, 9),
    "lease unknown pid": lambda c, r: c.lease_pid(PLAIN_TOPIC, 0, 88_888),
    "lease unknown topic": lambda c, r: c.lease_pid("missing", 0),
    "commit unknown txn": lambda c, r: c.txn_commit(999_999),
    "abort unknown txn": lambda c, r: c.txn_abort(999_999),
    "commit in the wrong group": lambda c, r: c.txn_commit(_known_txn(r), group="elsewhere"),
    "join unknown txn": lambda c, r: c.txn_join(999_999, "m1"),
    "join empty member": lambda c, r: c.txn_join(_known_txn(r), ""),
    "begin empty group": lambda c, r: c.txn_begin(""),
    "begin zero timeout": lambda c, r: c.txn_begin("billing", timeout_ms=0),
    "commit unknown member": lambda c, r: c.txn_commit(_known_txn(r), members={"ghost": 1}),
    "offsets negative": lambda c, r: c.commit_offsets("readers", PLAIN_TOPIC, {0: -1}),
    "offsets missing partition": lambda c, r: c.commit_offsets("readers", PLAIN_TOPIC, {4: 1}),
    "attach bad access": lambda c, r: c.producer(EXCLUSIVE_TOPIC, idempotent=False, access="solo"),
    "attach unknown topic": lambda c, r: c.producer("missing", idempotent=False, access="shared"),
    "attach future epoch": lambda c, r: c.producer(
        EXCLUSIVE_TOPIC, idempotent=False, access="exclusive", epoch=50, wait_timeout_s=0
    ),
    "create existing topic": lambda c, r: c.create_topic(PLAIN_TOPIC, 2),
    "create zero partitions": lambda c, r: c.create_topic("zero", 0),
}


class BadInputSteps(RunBase):
    def _bad_input(self, index: int, step: Step) -> Answer:
        """A call a careless caller makes: both brokers must refuse it with the same code."""
        result = BAD_INPUTS[step.choice](self.actors[step.actor].client, self)
        if isinstance(result, Producer):  # accepted after all: let go at once
            epoch = result.epoch
            result.close()
            return ("attached", result.access, epoch)
        if isinstance(result, TxnInfo):
            return ("accepted", self._txn(result))
        return ("accepted", type(result).__name__)
