"""Transactions by double journaling: the rules. No I/O; time is passed in.

A transaction is open from BEGIN until its commit or abort. PREPARE_COMMIT is the commit
point: once it is durable the transaction will be in the logs, whatever happens next, and
it can no longer be aborted. COMPLETE says every partition was copied. An open
transaction past its deadline is aborted as timed out.

    open --commit--> prepared --apply--> committed
    open --abort / timeout--> aborted
"""

from __future__ import annotations

import enum
import re
import zlib
from collections.abc import Mapping

from msgspec import Struct

from broker.core.ownership import check_name
from broker.core.values import check_integer
from broker.errors import BrokerError, ErrorCode


class TxnState(enum.StrEnum):
    OPEN = "open"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Entry(enum.StrEnum):
    """The kinds of entries in a journal partition J(G)."""

    BEGIN = "BEGIN"
    PREPARE_COMMIT = "PREPARE_COMMIT"
    COMPLETE = "COMPLETE"
    ABORT = "ABORT"


class CommitAction(enum.Enum):
    PREPARE = "prepare"  # open: write PREPARE_COMMIT, then apply
    APPLY = "apply"  # prepared earlier (a retry, or recovery pending): apply
    DONE = "done"  # already committed: answer so


_DIGITS = re.compile(r"[0-9]+")
TIMED_OUT = "timed out"
BY_REQUEST = "by request"


class TxnView(Struct, frozen=True):
    """What the rules need to know of a transaction."""

    txn_id: int
    group: str
    state: TxnState
    deadline_ms: int
    reason: str | None


def journal_of(group: str, journals: int) -> int:
    """J(G): the journal partition of a transactional group (stable across runs)."""
    return zlib.crc32(group.encode("utf-8")) % journals


def parse_txn_id(text: str | int) -> int:
    """A transaction id as given on a command line or the wire: a positive integer."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and _DIGITS.fullmatch(text.strip()):
        value = int(text.strip())
    else:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"a transaction id is a positive integer, not {text!r}",
            hint="use the txn_id that txn-begin printed",
        )
    if value <= 0 or value >= 1 << 63:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT, f"a transaction id is a positive integer, not {value}"
        )
    return value


def check_group(group: str) -> None:
    check_name("transactional group", group)


def check_member(member: str) -> None:
    check_name("transaction member", member)


def check_key(key: str) -> None:
    check_name("transaction key", key)


def check_timeout(timeout_ms: int, timeout_max_ms: int) -> None:
    check_integer("a transaction timeout", timeout_ms)
    if not 0 < timeout_ms <= timeout_max_ms:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"a transaction timeout is 1..{timeout_max_ms} ms, not {timeout_ms}",
        )


def is_expired(txn: TxnView, now_ms: int) -> bool:
    return txn.state is TxnState.OPEN and now_ms >= txn.deadline_ms


def holds_pending_offsets(state: str, deadline_ms: int, now_ms: int) -> bool:
    """Whether offsets a transaction holds may still take effect: it is prepared, or
    open and not past its deadline (one past it is as good as aborted)."""
    return state == TxnState.PREPARED or (state == TxnState.OPEN and now_ms < deadline_ms)


def check_group_matches(txn: TxnView, group: str | None) -> None:
    if group is not None and group != txn.group:
        raise BrokerError(
            ErrorCode.TXN_WRONG_GROUP,
            f"transaction {txn.txn_id} belongs to group {txn.group}, not {group}",
            txn_id=txn.txn_id,
            group=txn.group,
            requested=group,
        )


def check_writable(txn: TxnView) -> None:
    """Records and offsets may join an open transaction only."""
    _check_open(txn, "; it takes no more records", "begin a new transaction (fencelog txn-begin)")


def check_alive(txn: TxnView) -> None:
    """Only an open transaction has a deadline to move."""
    _check_open(txn, ": it has no deadline left to move")


def _check_open(txn: TxnView, why_not: str, hint: str | None = None) -> None:
    if txn.state is TxnState.OPEN:
        return
    if txn.state is TxnState.ABORTED:
        raise aborted(txn)
    raise BrokerError(
        ErrorCode.TXN_NOT_OPEN,
        f"transaction {txn.txn_id} is {txn.state}{why_not}",
        txn_id=txn.txn_id,
        state=str(txn.state),
        hint=hint,
    )


def commit_action(txn: TxnView, group: str | None) -> CommitAction:
    check_group_matches(txn, group)
    if txn.state is TxnState.OPEN:
        return CommitAction.PREPARE
    if txn.state is TxnState.PREPARED:
        return CommitAction.APPLY
    if txn.state is TxnState.COMMITTED:
        return CommitAction.DONE
    raise aborted(txn)


def abort_allowed(txn: TxnView, group: str | None) -> bool:
    """True: abort it now; False: it is already aborted (answered as such)."""
    check_group_matches(txn, group)
    if txn.state is TxnState.OPEN:
        return True
    if txn.state is TxnState.ABORTED:
        return False
    raise BrokerError(
        ErrorCode.TXN_NOT_OPEN,
        f"transaction {txn.txn_id} is {txn.state}: its commit is decided and cannot be undone",
        txn_id=txn.txn_id,
        state=str(txn.state),
    )


def check_member_generation(
    txn_id: int, producer_id: int, stored: int | None, received: int
) -> None:
    """A member's records carry the generation it joined with; an older one is a zombie."""
    if stored is None:
        raise BrokerError(
            ErrorCode.UNKNOWN_PID,
            f"producer id {producer_id} is not a member of transaction {txn_id}",
            txn_id=txn_id,
            producer_id=producer_id,
            hint="join the transaction first (a client's transaction join)",
        )
    if received < stored:
        raise BrokerError(
            ErrorCode.FENCED,
            f"producer id {producer_id} of transaction {txn_id} was fenced: generation "
            f"{received} is older than the member's generation {stored}",
            txn_id=txn_id,
            producer_id=producer_id,
            stored_generation=stored,
            received_generation=received,
        )
    if received > stored:
        raise BrokerError(
            ErrorCode.INVALID_GENERATION,
            f"producer id {producer_id} of transaction {txn_id} has generation {stored}, "
            f"not {received}",
            txn_id=txn_id,
            producer_id=producer_id,
            stored_generation=stored,
            received_generation=received,
        )


def writers_to_keep(
    txn_id: int, joined: Mapping[str, tuple[int, int]], members: Mapping[str, int]
) -> set[tuple[int, int]]:
    """The (pid, generation) whose records a commit naming `members` (name -> generation)
    keeps, given who joined (name -> (pid, generation)). A name that never joined is
    INVALID_ARGUMENT; a generation other than the member's current one is refused as
    check_member_generation says."""
    keep = set()
    for name, generation in members.items():
        found = joined.get(name)
        if found is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name!r} never joined transaction {txn_id}",
                txn_id=txn_id,
                member=name,
            )
        check_member_generation(txn_id, found[0], found[1], generation)
        keep.add((found[0], generation))
    return keep


def aborted(txn: TxnView) -> BrokerError:
    why = txn.reason or "aborted"
    return BrokerError(
        ErrorCode.TXN_ABORTED,
        f"transaction {txn.txn_id} was aborted ({why})",
        txn_id=txn.txn_id,
        reason=why,
        hint="begin a new transaction and produce its records again",
    )


def kafka_continues(current: TxnView | None, transactional_id: str) -> bool:
    """Whether a Kafka transaction goes on in `current`, its fencelog transaction (None:
    none, or gone): True while it is open; False once it ended by EndTxn or committed,
    so the next one begins. One aborted without EndTxn (timed out, or by an operator) is
    TXN_ABORTED until the producer ends it or starts again: beginning another would
    commit the Kafka transaction's later records without its earlier ones. Kafka fences
    such a producer too (its coordinator bumps the epoch as it aborts)."""
    if current is None or current.state is not TxnState.ABORTED:
        return current is not None and current.state is TxnState.OPEN
    raise BrokerError(
        ErrorCode.TXN_ABORTED,
        f"transactional id {transactional_id}'s transaction {current.txn_id} was aborted "
        f"({current.reason or BY_REQUEST}) before EndTxn: its records are discarded and "
        "this producer is fenced",
        txn_id=current.txn_id,
        hint="end it with abort_transaction(), or start the producer again",
    )


def unknown(txn_id: int) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_TXN,
        f"there is no transaction {txn_id}",
        txn_id=txn_id,
        hint="fencelog txn list shows the open ones",
    )
