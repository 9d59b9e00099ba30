"""A Kafka Fetch's byte budget (broker/kafka/fetch_budget.py), without a broker: the
first record of the first partition answered always, later ones only within what is
left, and the bound it counts by never below a batch's encoded size."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.kafka.fetch_budget import BATCH_HEADER_BYTES, FetchBudget, record_bytes_max
from broker.kafka.records import count_of, encode_batch, encode_uniform, uniform
from broker.rows import EMPTY_HEADERS, KafkaRow, Page, encode_headers


def row(offset: int, value_bytes: int) -> KafkaRow:
    return (offset, 1_000, None, b"v" * value_bytes, EMPTY_HEADERS)


def test_the_first_partitions_first_record_comes_whatever_its_size() -> None:
    budget = FetchBudget(100)
    big = [row(0, 5_000), row(1, 10)]
    assert budget.take(big, 100) == big[:1]
    assert budget.left_bytes == 0
    assert budget.exhausted()


def test_a_later_partition_gets_only_what_fits_in_what_is_left() -> None:
    budget = FetchBudget(1_000)
    assert len(budget.take([row(0, 200), row(1, 200)], 1_000)) == 2
    left = budget.left_bytes
    assert left == 1_000 - BATCH_HEADER_BYTES - 2 * record_bytes_max(row(0, 200))
    assert budget.take([row(0, left)], 1_000) == []  # over what is left: none this time
    assert budget.take([row(0, 10), row(1, 10_000)], 1_000) == [row(0, 10)]


def test_a_partitions_own_limit_holds_after_the_first() -> None:
    budget = FetchBudget(1_000_000)
    assert budget.take([row(0, 10)], 1_000_000) == [row(0, 10)]
    assert budget.take([row(0, 500)], 300) == []


stored_rows = st.lists(
    st.tuples(
        st.integers(0, 1 << 40),  # timestamp delta
        st.none() | st.binary(max_size=300),
        st.binary(max_size=20_000),
        st.lists(st.tuples(st.text(min_size=1, max_size=40), st.none() | st.binary(max_size=300))),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(stored_rows)
def test_the_bound_is_never_below_the_encoded_batch(
    found: list[tuple[int, bytes | None, bytes, list[tuple[str, bytes | None]]]],
) -> None:
    rows: list[KafkaRow] = [
        ((1 << 33) + index, 1_000 + stamp, key, value, encode_headers(tuple(headers)))
        for index, (stamp, key, value, headers) in enumerate(found)
    ]
    bound = BATCH_HEADER_BYTES + sum(map(record_bytes_max, rows))
    assert len(encode_batch(rows)) <= bound


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 300),  # value size
    st.integers(1, 1_500),  # records (past the 1,024 prefixes made at first)
    st.integers(0, 1 << 40),  # the page's first offset
    st.integers(0, 1 << 40),  # its timestamp
    st.integers(1, 1_500),  # records taken
)
@example(100, 20_000, 1 << 40, 5, 20_000)  # offset deltas of three varint bytes
@example(0, 9_000, 0, 0, 8_500)  # empty values
def test_a_uniform_page_encodes_as_its_rows_do(
    size: int, count: int, offset: int, timestamp: int, taken: int
) -> None:
    """encode_uniform (columns, no loop per record) gives the bytes encode_batch gives
    for the same records as rows, and take_uniform counts them as take() does."""
    taken = min(taken, count)
    values = b"".join(bytes([index % 251]) * size for index in range(count))
    page = Page(0, offset, count, values, size, timestamp, b"", -1, [], (0, 0, 0, 0, None))
    assert uniform(page)
    stored: list[KafkaRow] = [
        (offset + i, timestamp, None, values[i * size : (i + 1) * size], EMPTY_HEADERS)
        for i in range(count)
    ]
    assert encode_uniform(page, taken) == encode_batch(stored[:taken])
    limit = BATCH_HEADER_BYTES + sum(map(record_bytes_max, stored[:taken]))
    assert FetchBudget(limit).take_uniform([count], size, limit) == taken
    assert len(FetchBudget(limit).take(stored, limit)) == taken


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1 << 40)), min_size=1, max_size=8),
    st.integers(0, 120),
    st.integers(100, 20_000),
)
def test_a_page_across_batches_encodes_a_batch_each_within_its_budget(
    runs: list[tuple[int, int]], size: int, limit: int
) -> None:
    """A uniform page across stored batches (a timestamp each: runs) is a v2 batch per
    run, the records as encode_batch gives them, never past the budget that took them
    (but for the first record of a fetch)."""
    count = sum(records for records, _ in runs)
    values = b"".join(bytes([index % 251]) * size for index in range(count))
    stamps = [(records, stamp, 0) for records, stamp in runs]
    page = Page(0, 7, count, values, size, stamps, b"", -1, [], (0, 0, 0, 0, None))
    assert uniform(page)
    budget = FetchBudget(limit)
    taken = budget.take_uniform([records for records, _ in runs], size, limit)
    encoded = encode_uniform(page, taken)
    assert taken >= 1 and (len(encoded) <= limit or taken == 1)
    assert count_of(encoded) == taken  # what the fetched-records metric counts
    expected, first = b"", 0
    for records, stamp in runs:
        part = min(records, taken - first)
        if part <= 0:
            break
        expected += encode_batch(
            [
                (7 + i, stamp, None, values[i * size : (i + 1) * size], EMPTY_HEADERS)
                for i in range(first, first + part)
            ]
        )
        first += part
    assert encoded == expected
