"""AppendResults: a produce's results kept as columns read as the list they replaced."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import codec
from broker.types import AppendResult, AppendResults

TOPIC = "t"


def as_list(parts: list[tuple[int, int, int]]) -> list[AppendResult]:
    """The results of runs (partition, first offset, count) as a plain list."""
    return [
        AppendResult(TOPIC, partition, offset)
        for partition, first, count in parts
        for offset in range(first, first + count)
    ]


runs = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10**12), st.integers(0, 50)), max_size=5
)


@given(runs)
def test_joined_runs_read_as_the_list_of_their_results(parts: list[tuple[int, int, int]]) -> None:
    results = AppendResults.joined(
        TOPIC, [AppendResults.run(TOPIC, p, first, count) for p, first, count in parts]
    )
    expected = as_list(parts)
    assert list(results) == expected
    assert results == expected
    assert expected == results
    assert len(results) == len(expected)
    assert bool(results) == bool(expected)
    assert [results[i] for i in range(len(expected))] == expected
    assert [results[-i] for i in range(1, len(expected) + 1)] == [
        expected[-i] for i in range(1, len(expected) + 1)
    ]
    assert results[1:-1:2] == expected[1:-1:2]
    assert repr(results) == repr(expected)


def test_an_index_past_either_end_is_an_index_error() -> None:
    results = AppendResults.run(TOPIC, 0, 5, 2)
    with pytest.raises(IndexError):
        results[2]
    with pytest.raises(IndexError):
        results[-3]
    assert results[-2] == AppendResult(TOPIC, 0, 5)


def test_a_list_of_results_joins_with_runs_and_keeps_its_duplicates() -> None:
    duplicate = [AppendResult(TOPIC, 1, 7, duplicate=True)]
    results = AppendResults.run(TOPIC, 0, 0, 2) + duplicate
    assert results == [AppendResult(TOPIC, 0, 0), AppendResult(TOPIC, 0, 1), *duplicate]
    assert results.columns() == (3, [0, 0, 1], [0, 1, 7], [False, False, True])


def test_results_differ_from_other_results_and_from_what_is_not_a_sequence() -> None:
    results = AppendResults.run(TOPIC, 0, 0, 2)
    assert results != AppendResults.run(TOPIC, 0, 1, 2)
    assert results != [AppendResult(TOPIC, 0, 0)]
    assert results != "ab"
    assert results != 2


def test_a_served_reply_carries_a_run_as_numbers_and_reads_back_equal() -> None:
    results = AppendResults.run(TOPIC, 2, 40, 3)
    reply = codec.results_reply(results, columns=True)
    assert reply == {"result_columns": [3, 2, [40, 41, 42], False]}
    assert codec.results_from_reply(TOPIC, reply) == results
    rows = codec.results_reply(results, columns=False)
    assert codec.results_from_reply(TOPIC, rows) == results
