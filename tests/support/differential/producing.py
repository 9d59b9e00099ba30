"""The differential test's producing steps: leased pids and idempotent batches (in order,
duplicated, overlapping, with gaps, stale and far generations), leases resumed; plain
and keyed records of every shape (as Arrow columns too); the client's idempotent
producer, its saved state and producers resumed from it; shared and exclusive producers
attached, waiting, writing and closed."""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

from broker.types import Headers, Lease, NewRecord, ProducerFields
from support.differential.base import LeaseState, RunBase, appended
from support.differential.world import (
    ARROW,
    EXCLUSIVE_TOPIC,
    KEYED_TOPIC,
    PLAIN_TOPIC,
    PRODUCER_SLOTS,
    SESSION_END_S,
    Answer,
)
from support.waiting import wait_until

if TYPE_CHECKING:
    from support.differential.plan import Step

_KEYS: tuple[bytes | None, ...] = (None, b"", b"k1", b"k2")
_HEADERS: tuple[Headers, ...] = (
    (),
    (("trace", b""),),
    (("trace", None),),  # Kafka's null header value, kept null
    (("trace", b"t1"), ("trace", b"t1")),
)


class ProducingSteps(RunBase):
    def _lease(self, index: int, step: Step) -> Answer:
        partition = step.partition % 2
        lease = self.actors[step.actor].client.lease_pid(PLAIN_TOPIC, partition)
        self.lease_starts.setdefault(lease.producer_id, lease.generation)
        self.leases.append(
            LeaseState(lease.producer_id, partition, lease.generation, lease.sequence)
        )
        return self._lease_answer(lease)

    def _resume_lease(self, index: int, step: Step) -> Answer:
        if not self.leases:
            return ("no lease",)
        known = self.leases[step.ref % len(self.leases)]
        partition = known.partition if step.flag else step.partition % 2
        lease = self.actors[step.actor].client.lease_pid(PLAIN_TOPIC, partition, known.producer_id)
        if partition == known.partition:
            known.generation, known.high_water_sequence = lease.generation, lease.sequence
        return self._lease_answer(lease)

    def _lease_answer(self, lease: Lease) -> Answer:
        # A lease's generation starts at random: it is compared relative to the first
        # generation the pid was leased with (expire_ms and now_ms are clock readings).
        return (
            self.ids.pid(lease.producer_id),
            self._relative(lease.producer_id, lease.generation),
            lease.sequence,
        )

    def _idempotent_produce(self, index: int, step: Step) -> Answer:
        if not self.leases:
            return ("no lease",)
        lease = self.leases[step.ref % len(self.leases)]
        generation = lease.generation + {"same": 0, "next": 1, "stale": -1, "far": 2}[step.choice]
        high = lease.high_water_sequence
        first = {
            "next": high + 1,
            "duplicate": max(high - step.count + 1, 1),
            "overlap": max(high, 1),
            "gap": high + 2,
            "first": 1,
        }[step.second_choice]
        producer = ProducerFields(lease.producer_id, generation, first)
        results = self.actors[step.actor].client.produce(
            PLAIN_TOPIC,
            self._values(index, step.count),
            partition=lease.partition,
            producer=producer,
        )
        if not all(r.duplicate for r in results):
            lease.generation = generation
            lease.high_water_sequence = max(high, first + step.count - 1)
        return appended(results)

    def _plain_produce(self, index: int, step: Step) -> Answer:
        """Records of every shape: keys null, empty or set, values empty or set, headers
        none, empty, null or repeated, timestamps given or the broker's, one partition or
        the broker's choice."""
        shapes = [
            NewRecord(
                value,
                key=_KEYS[(step.ref + n) % len(_KEYS)],
                headers=_HEADERS[(step.ref + n) % len(_HEADERS)],
            )
            for n, value in enumerate(self._values(index, step.count))
        ]
        if step.flag:
            shapes = [r._replace(value=b"", timestamp_ms=1_000 + index) for r in shapes]
        if step.partition == 2:  # the broker chooses by the key's hash; a record without
            # a key goes round robin from a random start, which differs between brokers
            shapes = [r._replace(key=b"k0") if r.key is None else r for r in shapes]
        partition = None if step.partition == 2 else step.partition
        records = [r._replace(partition=partition) for r in shapes]
        return appended(self.actors[step.actor].client.produce(PLAIN_TOPIC, records))

    def _keyed_produce(self, index: int, step: Step) -> Answer:
        """Keyed records into the compacted topic, as Arrow columns when flagged."""
        client = self.actors[step.actor].client
        values = self._values(index, step.count)
        keys = [f"k{(step.ref + n) % 3}".encode() for n in range(step.count)]
        if step.flag and ARROW:
            import pyarrow as pa

            batch = pa.table({"value": values, "key": keys})
            return tuple(
                map(
                    tuple,
                    (r.values() for r in client.produce_arrow(KEYED_TOPIC, batch).to_pylist()),
                )
            )
        records = [NewRecord(v, key=k) for v, k in zip(values, keys, strict=True)]
        return appended(client.produce(KEYED_TOPIC, records))

    def _producer_send(self, index: int, step: Step) -> Answer:
        """The client's idempotent producer: new, or resumed from a closed one's saved
        state (perhaps an older one: its replays answer as duplicates)."""
        slot = step.ref % 2
        opened: tuple[str, ...] = ()
        if slot not in self.senders:
            state = self.saved[step.ref % len(self.saved)] if step.flag and self.saved else None
            sender = self.actors[step.actor].client.producer(
                PLAIN_TOPIC, state=state, max_in_flight=1, delivery_timeout_s=SESSION_END_S
            )
            self.senders[slot] = (step.actor, sender)
            opened = ("resumed" if state is not None else "opened",)
        _, sender = self.senders[slot]
        results = sender.send(self._values(index, step.count), partition=step.partition % 2)
        for partition_state in sender.state().partitions.values():
            self.lease_starts.setdefault(partition_state.producer_id, partition_state.generation)
        return (*opened, appended(results))

    def _producer_checkpoint(self, index: int, step: Step) -> Answer:
        """Save a sender's state as a consumer that produces does with its input offsets;
        one resumed from it later replays what was sent since."""
        slot = step.ref % 2
        if slot not in self.senders:
            return ("no producer",)
        self.saved.append(self.senders[slot][1].state())
        return ("saved", len(self.saved))

    def _producer_close(self, index: int, step: Step) -> Answer:
        slot = step.ref % 2
        if slot not in self.senders:
            return ("no producer",)
        _, sender = self.senders.pop(slot)
        sender.close()
        state = sender.state()
        self.saved.append(state)
        return tuple(
            (
                p,
                self.ids.pid(s.producer_id),
                self._relative(s.producer_id, s.generation),
                s.sequence,
            )
            for p, s in sorted(state.partitions.items())
        )

    def _attach(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot in self.producers:
            self._detach(index, step)
        epoch = self.epochs.get(slot) if step.flag else None
        producer = self.actors[step.actor].client.producer(
            EXCLUSIVE_TOPIC,
            idempotent=False,
            access=step.choice,
            name=f"producer-{slot}",
            epoch=epoch,
            wait_timeout_s=0,
        )
        self.producers[slot] = (step.actor, producer)
        if producer.epoch is not None:
            self.epochs[slot] = producer.epoch
        return (producer.attachment_id, producer.name, producer.access, producer.epoch)

    def _wait_for_exclusive(self, index: int, step: Step) -> Answer:
        """A producer waits for exclusive access while others are attached; once they
        have all closed, it is promoted (at a new epoch)."""
        slot = step.ref % PRODUCER_SLOTS
        if slot in self.producers:
            self._detach(index, step)
        name = f"producer-{slot}"
        client = self.actors[step.actor].client
        with concurrent.futures.ThreadPoolExecutor(1) as waiting:
            promoted = waiting.submit(
                client.producer,
                EXCLUSIVE_TOPIC,
                idempotent=False,
                access="wait-exclusive",
                name=name,
                wait_timeout_s=SESSION_END_S,
            )
            if self.producers:  # it waits until they are gone
                wait_until(
                    lambda: any(
                        a.name == name for a in self.observer.topic_access(EXCLUSIVE_TOPIC).waiting
                    ),
                    SESSION_END_S,
                    message=f"{name} waits for exclusive access",
                )
            closed = sorted(self.producers)
            for other in closed:
                self.producers.pop(other)[1].close()
            producer = promoted.result(SESSION_END_S)
        self.producers[slot] = (step.actor, producer)
        if producer.epoch is not None:
            self.epochs[slot] = producer.epoch
        return (tuple(closed), producer.attachment_id, producer.access, producer.epoch)

    def _exclusive_send(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot not in self.producers:
            return ("no producer",)
        _, producer = self.producers[slot]
        return appended(producer.send(self._values(index, step.count), partition=0))

    def _detach(self, index: int, step: Step) -> Answer:
        slot = step.ref % PRODUCER_SLOTS
        if slot not in self.producers:
            return ("no producer",)
        _, producer = self.producers.pop(slot)
        producer.close()
        return ("closed", slot)
