"""The differential test's transaction steps: begun (with and without keys, with their
first records), written by their owner and by joined members (stale joins too), shown,
kept alive, committed (whole, or the members named) and aborted, twice and after each
other; consumer offsets committed, inside transactions and out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from support.differential.base import RunBase, appended
from support.differential.world import MEMBERS, PLAIN_TOPIC, TXN_GROUPS, TXN_TARGETS, Answer

if TYPE_CHECKING:
    from support.differential.plan import Step


class TxnSteps(RunBase):
    def _txn_begin(self, index: int, step: Step) -> Answer:
        key = f"key-{step.ref % 4}" if step.flag else None
        info = self.actors[step.actor].client.txn_begin(step.group, key=key)
        self.txns.append(info.txn_id)
        return self._txn(info)

    def _txn_begin_produce(self, index: int, step: Step) -> Answer:
        topic, partition = TXN_TARGETS[step.partition]
        info, results = self.actors[step.actor].client.txn_begin_produce(
            TXN_GROUPS[step.ref % 2], topic, self._values(index, step.count), partition=partition
        )
        self.txns.append(info.txn_id)
        return (self._txn(info), appended(results))

    def _txn_produce(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        topic, partition = TXN_TARGETS[step.partition]
        results = self.actors[step.actor].client.produce(
            topic, self._values(index, step.count), partition=partition, txn=txn_id
        )
        return appended(results)

    def _txn_join(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        member = self.actors[step.actor].client.txn_join(txn_id, MEMBERS[step.count % 2])
        self.members.append(member)
        return (
            self.ids.txn(member.txn_id),
            member.member,
            self.ids.pid(member.producer_id),
            member.generation,
            member.discarded,
        )

    def _member_produce(self, index: int, step: Step) -> Answer:
        if not self.members:
            return ("no member",)
        member = self.members[step.ref % len(self.members)]  # older joins are stale
        topic, partition = TXN_TARGETS[step.partition]
        results = self.actors[step.actor].client.produce(
            topic, self._values(index, step.count), partition=partition, producer=member.producer
        )
        return appended(results)

    def _txn_commit(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        members = None  # "all": every member's records, as joined last
        joined = [m for m in self.members if m.txn_id == txn_id]
        if step.choice == "latest":  # as a coordinator names the attempts that succeeded
            members = {m.member: m.generation for m in joined}
        elif step.choice == "stale":  # an attempt that was joined again since
            members = {m.member: max(m.generation - 1, 1) for m in joined}
        return self._txn(self.actors[step.actor].client.txn_commit(txn_id, members=members))

    def _txn_abort(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        return self._txn(self.actors[step.actor].client.txn_abort(txn_id))

    def _txn_show(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        detail = self.actors[step.actor].client.txn_show(txn_id)
        # at_ms is a clock reading; a body names topics by id, alike on both brokers
        journal = tuple((e.journal, e.position, e.kind, repr(e.body)) for e in detail.journal)
        return (self._txn(detail.info), journal, tuple(self._record(r) for r in detail.records))

    def _txn_keepalive(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        return self._txn(self.actors[step.actor].client.txn_keepalive(txn_id, 60_000))

    def _commit_offsets(self, index: int, step: Step) -> Answer:
        offsets = {step.partition % 2: step.ref % 5}
        client = self.actors[step.actor].client
        client.commit_offsets(f"readers-{step.count}", PLAIN_TOPIC, offsets)
        return ("committed",)

    def _txn_commit_offsets(self, index: int, step: Step) -> Answer:
        txn_id = self._pick_txn(step)
        if txn_id is None:
            return ("no transaction",)
        offsets = {step.partition % 2: step.ref % 7}
        client = self.actors[step.actor].client
        client.txn_commit_offsets(txn_id, f"readers-{step.count}", PLAIN_TOPIC, offsets)
        return ("journaled",)
