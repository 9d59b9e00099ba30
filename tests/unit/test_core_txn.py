"""broker/core/txn.py: the transaction rules alone, with no storage and no clock but the
numbers passed in. Each test states one rule of DESIGN.md section 6 as a caller sees it:
which state takes records, which commit is prepared, applied or answered again, which
abort is refused, which member write is fenced, and how ids and timeouts are checked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core import txn as rules
from broker.core.txn import CommitAction, TxnState, TxnView
from broker.errors import BrokerError, ErrorCode

DEADLINE_MS = 5_000
ID_MAX = (1 << 63) - 1


def view(
    state: TxnState = TxnState.OPEN,
    *,
    group: str = "billing",
    reason: str | None = None,
    txn_id: int = 7,
) -> TxnView:
    return TxnView(txn_id, group, state, DEADLINE_MS, reason)


def refused(code: ErrorCode, call: object, *args: object) -> BrokerError:
    assert callable(call)
    with pytest.raises(BrokerError) as caught:
        call(*args)
    assert caught.value.code is code, caught.value
    return caught.value


# transaction ids --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_id", "expected"),
    [("1", 1), ("42", 42), (" 17 ", 17), ("007", 7), (5, 5), (str(ID_MAX), ID_MAX)],
)
def test_a_txn_id_is_a_positive_integer_as_text_or_int(given_id: str | int, expected: int) -> None:
    assert rules.parse_txn_id(given_id) == expected


@pytest.mark.parametrize(
    "bad",
    ["abc", "0", "-1", "", " ", "1.5", "+3", "1e3", "0x10", "12abc", 0, -1, 1 << 63, str(1 << 63)],
)
def test_a_malformed_txn_id_is_invalid_argument(bad: str | int) -> None:
    error = refused(ErrorCode.INVALID_ARGUMENT, rules.parse_txn_id, bad)
    assert "transaction id is a positive integer" in error.message


@pytest.mark.parametrize("bad", [True, False, 1.0, None, b"1"])
def test_only_ints_and_text_are_txn_ids(bad: object) -> None:
    refused(ErrorCode.INVALID_ARGUMENT, rules.parse_txn_id, bad)


def test_a_superscript_digit_is_an_invalid_argument_not_a_crash() -> None:
    refused(ErrorCode.INVALID_ARGUMENT, rules.parse_txn_id, "\u00b2")


@given(st.integers(min_value=1, max_value=ID_MAX))
def test_every_positive_id_round_trips_through_its_text(txn_id: int) -> None:
    assert rules.parse_txn_id(str(txn_id)) == txn_id
    assert rules.parse_txn_id(txn_id) == txn_id


@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=25))
def test_any_ascii_text_is_an_id_or_invalid_argument(text: str) -> None:
    try:
        parsed = rules.parse_txn_id(text)
    except BrokerError as error:
        assert error.code is ErrorCode.INVALID_ARGUMENT
    else:
        assert 0 < parsed <= ID_MAX
        assert parsed == int(text.strip())


# names and timeouts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "check", [rules.check_group, rules.check_member, rules.check_key], ids=lambda c: c.__name__
)
def test_groups_members_and_keys_are_printable_names(check: object) -> None:
    assert callable(check)
    check("billing-2024/q1 task 1")
    for bad in ["", "x" * 256, "tab\there", "new\nline"]:
        refused(ErrorCode.INVALID_NAME, check, bad)


@pytest.mark.parametrize("timeout_ms", [1, 60_000, 86_400_000])
def test_a_timeout_within_bounds_is_accepted(timeout_ms: int) -> None:
    rules.check_timeout(timeout_ms, 86_400_000)


@pytest.mark.parametrize("timeout_ms", [0, -1, 86_400_001])
def test_a_timeout_out_of_bounds_is_invalid_argument(timeout_ms: int) -> None:
    error = refused(ErrorCode.INVALID_ARGUMENT, rules.check_timeout, timeout_ms, 86_400_000)
    assert str(timeout_ms) in error.message


# journal partitions -----------------------------------------------------------------------


def test_a_group_always_has_the_same_journal_partition() -> None:
    assert rules.journal_of("billing", 16) == rules.journal_of("billing", 16)
    # crc32 of the UTF-8 name: stable across runs and processes (no salted hash())
    assert rules.journal_of("billing", 16) == 10
    assert rules.journal_of("g", 16) == 6


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=64))
def test_a_journal_partition_is_in_range(group: str, journals: int) -> None:
    assert 0 <= rules.journal_of(group, journals) < journals


# expiry -----------------------------------------------------------------------------------


def test_an_open_transaction_expires_at_its_deadline() -> None:
    assert not rules.is_expired(view(), DEADLINE_MS - 1)
    assert rules.is_expired(view(), DEADLINE_MS)
    assert rules.is_expired(view(), DEADLINE_MS + 10_000)


@pytest.mark.parametrize("state", [TxnState.PREPARED, TxnState.COMMITTED, TxnState.ABORTED])
def test_only_open_transactions_expire(state: TxnState) -> None:
    # once prepared, the commit is decided: no deadline can abort it any more
    assert not rules.is_expired(view(state), DEADLINE_MS + 10_000)


# what takes records -----------------------------------------------------------------------


def test_an_open_transaction_takes_records() -> None:
    rules.check_writable(view())


def test_an_aborted_transaction_refuses_records_with_txn_aborted_and_why() -> None:
    error = refused(ErrorCode.TXN_ABORTED, rules.check_writable, view(TxnState.ABORTED))
    assert error.details["reason"] == "aborted"
    timed_out = view(TxnState.ABORTED, reason=rules.TIMED_OUT)
    error = refused(ErrorCode.TXN_ABORTED, rules.check_writable, timed_out)
    assert "timed out" in error.message
    assert error.details["txn_id"] == 7
    assert error.hint is not None


@pytest.mark.parametrize("state", [TxnState.PREPARED, TxnState.COMMITTED])
def test_a_decided_transaction_refuses_records_with_txn_not_open(state: TxnState) -> None:
    error = refused(ErrorCode.TXN_NOT_OPEN, rules.check_writable, view(state))
    assert error.details["state"] == str(state)
    assert str(state) in error.message


# commit -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (TxnState.OPEN, CommitAction.PREPARE),
        (TxnState.PREPARED, CommitAction.APPLY),
        (TxnState.COMMITTED, CommitAction.DONE),
    ],
)
def test_commit_prepares_an_open_applies_a_prepared_and_answers_a_committed(
    state: TxnState, action: CommitAction
) -> None:
    assert rules.commit_action(view(state), None) is action
    assert rules.commit_action(view(state), "billing") is action


def test_committing_an_aborted_transaction_is_txn_aborted() -> None:
    error = refused(
        ErrorCode.TXN_ABORTED,
        rules.commit_action,
        view(TxnState.ABORTED, reason="by request"),
        None,
    )
    assert "by request" in error.message


@pytest.mark.parametrize("state", list(TxnState))
def test_a_commit_naming_another_group_is_txn_wrong_group_whatever_the_state(
    state: TxnState,
) -> None:
    error = refused(ErrorCode.TXN_WRONG_GROUP, rules.commit_action, view(state), "payroll")
    assert (error.details["group"], error.details["requested"]) == ("billing", "payroll")


# abort ------------------------------------------------------------------------------------


def test_abort_aborts_an_open_and_answers_an_aborted_transaction() -> None:
    assert rules.abort_allowed(view(), None) is True
    assert rules.abort_allowed(view(TxnState.ABORTED), "billing") is False


@pytest.mark.parametrize("state", [TxnState.PREPARED, TxnState.COMMITTED])
def test_a_decided_commit_cannot_be_aborted(state: TxnState) -> None:
    error = refused(ErrorCode.TXN_NOT_OPEN, rules.abort_allowed, view(state), None)
    assert "cannot be undone" in error.message


@pytest.mark.parametrize("state", list(TxnState))
def test_an_abort_naming_another_group_is_txn_wrong_group(state: TxnState) -> None:
    refused(ErrorCode.TXN_WRONG_GROUP, rules.abort_allowed, view(state), "payroll")


# members ----------------------------------------------------------------------------------


def test_a_member_writes_with_its_current_generation() -> None:
    rules.check_member_generation(7, 3, 2, 2)


def test_a_pid_that_never_joined_is_unknown_pid() -> None:
    error = refused(ErrorCode.UNKNOWN_PID, rules.check_member_generation, 7, 3, None, 1)
    assert error.details["producer_id"] == 3


def test_an_older_generation_is_fenced() -> None:
    error = refused(ErrorCode.FENCED, rules.check_member_generation, 7, 3, 2, 1)
    assert (error.details["stored_generation"], error.details["received_generation"]) == (2, 1)


def test_a_generation_never_handed_out_is_invalid_generation() -> None:
    refused(ErrorCode.INVALID_GENERATION, rules.check_member_generation, 7, 3, 2, 3)


# errors -----------------------------------------------------------------------------------


def test_unknown_names_the_id_and_says_where_to_look() -> None:
    error = rules.unknown(99)
    assert error.code is ErrorCode.UNKNOWN_TXN
    assert error.details["txn_id"] == 99
    assert "txn list" in (error.hint or "")


def test_error_codes_are_the_documented_exit_statuses() -> None:
    assert [
        int(ErrorCode.UNKNOWN_TXN),
        int(ErrorCode.TXN_ABORTED),
        int(ErrorCode.TXN_NOT_OPEN),
        int(ErrorCode.TXN_WRONG_GROUP),
    ] == [70, 71, 72, 73]


def test_writers_to_keep_are_the_named_members_at_their_current_generation() -> None:
    joined = {"task-1": (7, 2), "task-2": (8, 1)}
    assert rules.writers_to_keep(5, joined, {"task-1": 2}) == {(7, 2)}
    assert rules.writers_to_keep(5, joined, {}) == set()
    with pytest.raises(BrokerError) as never:
        rules.writers_to_keep(5, joined, {"task-3": 1})
    assert never.value.code is ErrorCode.INVALID_ARGUMENT
    assert never.value.details["member"] == "task-3"
    with pytest.raises(BrokerError) as stale:
        rules.writers_to_keep(5, joined, {"task-1": 1})
    assert stale.value.code is ErrorCode.FENCED


def test_a_kafka_transaction_goes_on_while_open_and_is_fenced_once_aborted_under_it() -> None:
    assert rules.kafka_continues(view(TxnState.OPEN), "copier") is True
    for ended in (None, view(TxnState.COMMITTED), view(TxnState.PREPARED)):
        assert rules.kafka_continues(ended, "copier") is False  # the next one begins
    with pytest.raises(BrokerError) as fenced:
        rules.kafka_continues(view(TxnState.ABORTED, reason=rules.TIMED_OUT), "copier")
    assert fenced.value.code is ErrorCode.TXN_ABORTED
    assert "copier's transaction 7 was aborted (timed out) before EndTxn" in fenced.value.message


def test_offsets_pending_in_a_transaction_count_while_it_may_still_commit() -> None:
    assert rules.holds_pending_offsets(TxnState.PREPARED, DEADLINE_MS, DEADLINE_MS + 1)
    assert rules.holds_pending_offsets(TxnState.OPEN, DEADLINE_MS, DEADLINE_MS - 1)
    assert not rules.holds_pending_offsets(TxnState.OPEN, DEADLINE_MS, DEADLINE_MS)  # expired
    assert not rules.holds_pending_offsets(TxnState.ABORTED, DEADLINE_MS, 0)
    assert not rules.holds_pending_offsets(TxnState.COMMITTED, DEADLINE_MS, 0)
