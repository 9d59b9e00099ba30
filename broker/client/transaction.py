"""A transaction as the Python client holds it (broker/engine/transactions.py is the
broker side).

    with client.transaction("billing") as txn:
        txn.produce("invoices", [b"inv-1"])
        txn.produce("ledger", [b"debit-1"], partition=3)
        txn.commit_offsets("copier", "input", {0: 42}, producer=state)
    # committed on a clean exit, aborted when the body raises

`client.transaction()` begins it in the broker with its first produce, in the same
request (as Kafka's beginTransaction is local). From then on the transaction lives in the
broker: its id (asking for it begins the transaction) can be handed to other processes,
which `client.join_transaction(txn_id, member)` and produce into it; only its owner
commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from broker.errors import BrokerError, ErrorCode
from broker.types import AppendResults, Headers, ProducerFields, TxnInfo, TxnMember

if TYPE_CHECKING:
    import pyarrow as pa

    from broker.client.client import Client, Value
    from broker.client.producer import Producer, ProducerState


class Transaction:
    """One transaction: produce to several topics and partitions, commit consumer
    offsets, then commit or abort, once. A joined member (`owner=False`) only writes."""

    def __init__(
        self,
        client: Client,
        info: TxnInfo | None,
        member: TxnMember | None = None,
        *,
        owner: bool = True,
        group: str | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """info None: a transaction of `group` not begun yet. Its first produce begins it
        in the same request (with timeout_ms); anything that needs its id before that
        begins it on its own."""
        if info is not None:
            group = info.group
        elif group is None:
            raise TypeError("a transaction not begun yet needs its group")
        self.client = client
        self._info = info
        self._group = group
        self._timeout_ms = timeout_ms
        self.member = member
        self.owner = owner
        self._ended = False

    @property
    def info(self) -> TxnInfo:
        """The transaction as last answered (begun now if it had not been)."""
        if self._info is None:
            self._info = self.client.txn_begin(self._group, timeout_ms=self._timeout_ms)
        return self._info

    @property
    def begun(self) -> bool:
        return self._info is not None

    @property
    def txn_id(self) -> int:
        return self.info.txn_id

    @property
    def group(self) -> str:
        return self._group

    @property
    def producer(self) -> ProducerFields:
        """The producer fields every record of this transaction carries."""
        if self.member is not None:
            return self.member.producer
        return ProducerFields(txn_id=self.txn_id)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if self._ended or not self.owner:
            return
        if exc_type is None:
            self.commit()
            return
        if self._info is None:  # never begun: nothing in the broker to abort
            self._ended = True
            return
        with contextlib.suppress(BrokerError):  # the body's exception is what matters
            self.abort()

    def produce(
        self,
        topic: str,
        values: Iterable[Value],
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers = (),
    ) -> AppendResults:
        """Journal records into this transaction (offsets -1: they get theirs at commit).
        The first produce of a transaction not begun yet begins it in the same request."""
        self._check_open()
        if self._info is None:
            self._info, results = self.client.txn_begin_produce(
                self._group,
                topic,
                values,
                key=key,
                partition=partition,
                headers=headers,
                timeout_ms=self._timeout_ms,
            )
            return results
        return self.client.produce(
            topic, values, key=key, partition=partition, headers=headers, producer=self.producer
        )

    def produce_arrow(self, topic: str, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Journal an Arrow batch's rows into this transaction, column by column
        (Client.produce_arrow: its columns and results; offsets -1). Begins the
        transaction first if it was not begun yet."""
        self._check_open()
        if self._info is not None:
            return self.client.produce_arrow(topic, batch, producer=self.producer)
        # the first produce begins it in the same request, as produce() does
        self._info, results = self.client.txn_begin_produce_arrow(
            self._group, topic, batch, timeout_ms=self._timeout_ms
        )
        return results

    def commit_offsets(
        self,
        group: str,
        topic: str,
        offsets: Mapping[int, int],
        *,
        producer: Producer | ProducerState | None = None,
    ) -> None:
        """Consumer offsets (and a producer's state) stored when this transaction commits."""
        self._check_open()
        self.client.txn_commit_offsets(self.txn_id, group, topic, offsets, producer=producer)

    def commit(self) -> TxnInfo:
        """Commit: when this returns, every record is in its log (TXN_ABORTED if the
        transaction timed out or was aborted meanwhile)."""
        self._check_owner("commit")
        self._info = self.client.txn_commit(self.txn_id, group=self.group, members=None)
        self._ended = True
        return self.info

    def abort(self) -> TxnInfo:
        self._check_owner("abort")
        self._info = self.client.txn_abort(self.txn_id, group=self.group)
        self._ended = True
        return self.info

    def _check_open(self) -> None:
        if self._ended and self._info is None:
            raise BrokerError(
                ErrorCode.TXN_NOT_OPEN,
                f"this transaction of group {self._group} ended before it began",
            )
        if self._ended:
            raise BrokerError(
                ErrorCode.TXN_NOT_OPEN,
                f"transaction {self.txn_id} already ended ({self.info.state})",
                txn_id=self.txn_id,
            )

    def _check_owner(self, what: str) -> None:
        self._check_open()
        if not self.owner:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"a joined member does not {what} transaction {self.txn_id}; its owner does",
                txn_id=self.txn_id,
            )
