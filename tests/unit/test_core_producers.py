"""broker/core/producers.py, pure: a stored (pid, partition) state and a batch's producer
fields in, a decision out, the time an argument.

One test per rule of DESIGN.md section 4; every error carries the numbers an operator
needs (expected and received sequence, stored and received generation); then a
Hypothesis property: decide() agrees with a plain restatement of the rules on any state
and batch, and after_append() moves the state exactly as the rules say.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.producers import (
    Batch,
    Verdict,
    after_append,
    check_batch_fields,
    continues,
    decide,
    latest_offset,
    next_entry,
)
from broker.errors import BrokerError, ErrorCode
from broker.types import ProducerEntry

PID = 7
LEASE_MS = 10_000
T0 = 50_000  # the pid's first record on the partition
NOW = T0 + 1_000  # well inside the lease


def stored(generation: int = 5, high_water: int = 10, first_ms: int = T0) -> ProducerEntry:
    return ProducerEntry(PID, generation, high_water, first_ms, last_offset=99)


def batch(generation: int = 5, first: int = 11, count: int = 1) -> Batch:
    return Batch(PID, generation, first, count)


def refused(entry: ProducerEntry | None, sent: Batch, now_ms: int = NOW) -> BrokerError:
    with pytest.raises(BrokerError) as raised:
        decide(entry, sent, now_ms, LEASE_MS)
    return raised.value


# the rules, one test each -----------------------------------------------------------


def test_a_pid_with_no_state_appends_its_first_batch_at_sequence_one() -> None:
    assert decide(None, batch(generation=123, first=1, count=3), NOW, LEASE_MS) is Verdict.APPEND


def test_a_pid_with_no_state_that_starts_past_one_is_out_of_order_expecting_one() -> None:
    error = refused(None, batch(first=4))
    assert error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert error.details["expected_sequence"] == 1
    assert error.details["received_sequence"] == 4


def test_the_next_sequence_at_the_stored_generation_appends() -> None:
    assert decide(stored(5, 10), batch(5, 11, count=4), NOW, LEASE_MS) is Verdict.APPEND


def test_the_next_sequence_one_generation_up_appends() -> None:
    assert decide(stored(5, 10), batch(6, 11), NOW, LEASE_MS) is Verdict.APPEND


def test_an_older_generation_is_fenced_with_both_generations() -> None:
    error = refused(stored(5, 10), batch(4, 11))
    assert error.code is ErrorCode.FENCED
    assert error.details["stored_generation"] == 5
    assert error.details["received_generation"] == 4
    assert error.details["producer_id"] == PID
    assert "4" in error.message and "5" in error.message


def test_a_zombie_retry_of_a_record_already_written_is_fenced_not_a_duplicate() -> None:
    # The generation is checked before the sequence: an older instance learns it is a
    # zombie even when it only resends what it wrote before the takeover.
    assert refused(stored(5, 10), batch(4, 3)).code is ErrorCode.FENCED


def test_a_generation_two_ahead_is_invalid_with_both_generations() -> None:
    error = refused(stored(5, 10), batch(7, 11))
    assert error.code is ErrorCode.INVALID_GENERATION
    assert error.details["stored_generation"] == 5
    assert error.details["received_generation"] == 7
    assert "at most 6" in error.message


def test_a_batch_at_or_below_the_high_water_mark_is_a_duplicate() -> None:
    assert decide(stored(5, 10), batch(5, 10), NOW, LEASE_MS) is Verdict.DUPLICATE
    assert decide(stored(5, 10), batch(5, 1, count=10), NOW, LEASE_MS) is Verdict.DUPLICATE
    assert decide(stored(5, 10), batch(5, 4, count=3), NOW, LEASE_MS) is Verdict.DUPLICATE


def test_a_replay_one_generation_up_is_a_duplicate() -> None:
    # A producer resumed from saved state (generation + 1) replays what the old instance
    # wrote: answered as duplicates.
    assert decide(stored(5, 10), batch(6, 8, count=3), NOW, LEASE_MS) is Verdict.DUPLICATE


def test_a_kafka_producers_newer_epoch_starts_its_sequences_again() -> None:
    # librdkafka bumps an idempotent producer's epoch by itself after a batch failed for
    # good and numbers the new epoch from Kafka's 0 (fencelog's 1): by the native rules
    # that batch is a duplicate of sequence 1 and would be answered, never written.
    assert decide(stored(5, 10), batch(6, 1, count=3), NOW, LEASE_MS) is Verdict.DUPLICATE
    for epoch in (6, 9):  # any step up, as bumps pass partitions the producer skipped
        sent = batch(epoch, 1, count=3)
        assert decide(stored(5, 10), sent, NOW, LEASE_MS, restarts=True) is Verdict.APPEND
        after = after_append(stored(5, 10), sent, NOW, last_offset=120)
        assert (after.generation, after.high_water_sequence) == (epoch, 3)
    with pytest.raises(BrokerError) as raised:
        decide(stored(5, 10), batch(6, 11), NOW, LEASE_MS, restarts=True)
    assert raised.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert raised.value.details["expected_sequence"] == 1
    # within an epoch, and for older epochs, the rules are the native ones
    assert decide(stored(5, 10), batch(5, 4), NOW, LEASE_MS, restarts=True) is Verdict.DUPLICATE
    with pytest.raises(BrokerError) as raised:
        decide(stored(5, 10), batch(4, 1), NOW, LEASE_MS, restarts=True)
    assert raised.value.code is ErrorCode.FENCED


def test_a_batch_straddling_the_high_water_mark_is_out_of_order() -> None:
    error = refused(stored(5, 10), batch(5, 9, count=3))
    assert error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert error.details["expected_sequence"] == 11
    assert error.details["received_sequence"] == 9


def test_a_gap_after_the_high_water_mark_is_out_of_order_with_both_sequences() -> None:
    error = refused(stored(5, 10), batch(5, 13))
    assert error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert error.details["expected_sequence"] == 11
    assert error.details["received_sequence"] == 13
    assert "13" in error.message and "11" in error.message
    assert error.hint is not None


def test_the_lease_ends_pid_lease_ms_after_the_first_record() -> None:
    entry = stored(5, 10, first_ms=T0)
    assert decide(entry, batch(5, 11), T0 + LEASE_MS - 1, LEASE_MS) is Verdict.APPEND
    error = refused(entry, batch(5, 11), now_ms=T0 + LEASE_MS)
    assert error.code is ErrorCode.PID_EXPIRED
    assert error.details["expired_ms"] == T0 + LEASE_MS
    assert error.hint is not None and "lease" in error.hint


def test_an_expired_pid_is_expired_whatever_it_sends() -> None:
    # never a silent accept: not even a duplicate or a newer generation
    late = T0 + LEASE_MS + 5
    for sent in (batch(5, 11), batch(5, 3), batch(6, 11), batch(4, 11)):
        assert refused(stored(5, 10), sent, now_ms=late).code is ErrorCode.PID_EXPIRED


def test_sequence_zero_is_out_of_order_expecting_one() -> None:
    with pytest.raises(BrokerError) as raised:
        check_batch_fields(batch(5, 0))
    assert raised.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert raised.value.details["expected_sequence"] == 1
    assert raised.value.details["received_sequence"] == 0


@pytest.mark.parametrize("fields", [Batch(-1, 1, 1, 1), Batch(PID, -1, 1, 1), Batch(PID, 1, -1, 1)])
def test_negative_producer_fields_are_invalid_arguments(fields: Batch) -> None:
    with pytest.raises(BrokerError) as raised:
        check_batch_fields(fields)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT


def test_pid_zero_opts_out_of_every_check() -> None:
    check_batch_fields(Batch(0, 0, 0, 5))  # no sequence needed, nothing raised


def test_errors_carry_their_numbers_into_the_json_an_operator_sees() -> None:
    shown = refused(stored(5, 10), batch(5, 13)).to_dict()
    assert shown["error"] == "OUT_OF_ORDER_SEQUENCE"
    assert shown["code"] == 50
    assert (shown["expected_sequence"], shown["received_sequence"]) == (11, 13)
    fenced = refused(stored(5, 10), batch(3, 11)).to_dict()
    assert (fenced["code"], fenced["stored_generation"], fenced["received_generation"]) == (
        41,
        5,
        3,
    )


# after_append ---------------------------------------------------------------------------


def test_a_first_append_starts_the_lease_at_now() -> None:
    entry = after_append(None, batch(9, 1, count=3), NOW, last_offset=42)
    assert entry == ProducerEntry(PID, 9, 3, NOW, 42)


def test_an_append_moves_the_high_water_mark_and_keeps_the_lease_start() -> None:
    entry = after_append(stored(5, 10, first_ms=T0), batch(5, 11, count=4), NOW, last_offset=120)
    assert entry == ProducerEntry(PID, 5, 14, T0, 120)


def test_an_append_one_generation_up_stores_the_new_generation() -> None:
    entry = after_append(stored(5, 10), batch(6, 11, count=1), NOW, last_offset=100)
    assert entry.generation == 6
    assert entry.high_water_sequence == 11
    assert entry.first_record_ms == T0  # a fixed lease: a new generation does not renew it
    assert refused(entry, batch(5, 12)).code is ErrorCode.FENCED


# a property: decide() against a plain restatement of the rules ---------------------------


def reference(  # noqa: PLR0911 - one return per rule, on purpose
    entry: ProducerEntry | None, sent: Batch, now_ms: int
) -> Verdict | ErrorCode:
    """DESIGN.md section 4, written out as plainly as possible."""
    if entry is None:
        return Verdict.APPEND if sent.first_sequence == 1 else ErrorCode.OUT_OF_ORDER_SEQUENCE
    if now_ms >= entry.first_record_ms + LEASE_MS:
        return ErrorCode.PID_EXPIRED
    if sent.generation < entry.generation:
        return ErrorCode.FENCED
    if sent.generation > entry.generation + 1:
        return ErrorCode.INVALID_GENERATION
    last = sent.first_sequence + sent.record_count - 1
    if sent.first_sequence == entry.high_water_sequence + 1:
        return Verdict.APPEND
    if last <= entry.high_water_sequence:
        return Verdict.DUPLICATE
    return ErrorCode.OUT_OF_ORDER_SEQUENCE


entries = st.one_of(
    st.none(),
    st.builds(
        ProducerEntry,
        st.just(PID),
        st.integers(1, 6),
        st.integers(0, 12),
        st.integers(0, 3 * LEASE_MS),
        st.integers(0, 1000),
    ),
)
batches = st.builds(Batch, st.just(PID), st.integers(0, 8), st.integers(1, 15), st.integers(1, 5))


@settings(max_examples=500, deadline=None)
@given(entries, batches, st.integers(0, 4 * LEASE_MS))
def test_decide_agrees_with_the_rules_written_out(
    entry: ProducerEntry | None, sent: Batch, now_ms: int
) -> None:
    expected = reference(entry, sent, now_ms)
    try:
        verdict: Verdict | ErrorCode = decide(entry, sent, now_ms, LEASE_MS)
    except BrokerError as error:
        verdict = error.code
        if error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE:
            high_water = entry.high_water_sequence if entry else 0
            assert error.details["expected_sequence"] == high_water + 1
            assert error.details["received_sequence"] == sent.first_sequence
        if error.code in (ErrorCode.FENCED, ErrorCode.INVALID_GENERATION):
            assert entry is not None
            assert error.details["stored_generation"] == entry.generation
            assert error.details["received_generation"] == sent.generation
    assert verdict == expected
    if verdict is Verdict.APPEND:
        after = after_append(entry, sent, now_ms, last_offset=500)
        assert after.high_water_sequence == sent.first_sequence + sent.record_count - 1
        assert after.generation == sent.generation
        assert after.first_record_ms == (entry.first_record_ms if entry else now_ms)
        assert decide(after, sent, now_ms, LEASE_MS) is Verdict.DUPLICATE  # a retry


def test_a_logged_sequence_is_no_later_than_its_distance_below_the_high_water_mark() -> None:
    entry = stored(high_water=10)  # sequence 10 at offset 99
    assert [latest_offset(entry, s) for s in (10, 9, 1)] == [99, 98, 90]


@settings(max_examples=300)
@given(entries, batches, st.integers(0, 4 * LEASE_MS))
def test_the_fast_test_for_the_usual_batch_is_an_append_by_the_rules(
    entry: ProducerEntry | None, sent: Batch, now_ms: int
) -> None:
    """The engine skips check_batch_fields and decide when continues() holds: it must
    hold only where the rules say APPEND, and for every append of the same generation."""
    if entry is None:
        return
    fast = continues(entry, sent, now_ms, LEASE_MS)
    appended = reference(entry, sent, now_ms) is Verdict.APPEND
    assert not fast or appended
    if appended and sent.generation == entry.generation:
        assert fast


@settings(max_examples=300)
@given(entries, batches, st.integers(0, 4 * LEASE_MS), st.integers(0, 10_000))
def test_the_one_step_append_of_the_usual_batch_is_continues_then_after_append(
    entry: ProducerEntry | None, sent: Batch, now_ms: int, end: int
) -> None:
    """next_entry, the engine's path for a pid that goes on writing, stages exactly what
    continues() and after_append() would, and nothing where continues() does not hold."""
    if entry is None:
        return
    last_offset = end + sent.record_count - 1
    found = next_entry(
        entry,
        sent.generation,
        sent.first_sequence,
        sent.record_count,
        now_ms,
        LEASE_MS,
        last_offset,
    )
    if continues(entry, sent, now_ms, LEASE_MS):
        assert found == after_append(entry, sent, now_ms, last_offset)
        assert type(found) is ProducerEntry
    else:
        assert found is None
