"""Decoding a fetched page (broker/protocol/codec.py, broker/rows.py), pure: the values a
server sends in, Records or a ProtocolError out; no SQLite, no socket.

What a user sees: a well-formed page gives its records column by column; a malformed
page from a server is a protocol error, never wrong records, whatever it holds; and
reading a page does not leave Python's cycle collector switched the other way.
The pages a real partition gives, embedded and served, are tests/storage/test_pages.py.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import rows
from broker.protocol import codec
from broker.protocol.frames import ProtocolError
from broker.types import Record

TOPIC = "t"

# malformed pages ------------------------------------------------------------------------

GOOD = {
    "page": [
        3,  # partition
        10,  # offset
        3,  # records
        b"aabbbc",  # values
        b"2\n3\n1",  # value lengths
        1_000,  # every timestamp
        b"kk",  # keys
        b"-1\n2\n0",  # key lengths: none, "kk", empty
        [[11, msgpack.packb([["h", b"v"]])]],  # headers of offset 11
        [7, 1, b"4\n5\n6", 0, None],  # producer: pid 7, generation 1, sequences 4..6
    ]
}


def test_a_well_formed_page_is_read_column_by_column() -> None:
    records = codec.records_from_chunks(TOPIC, [GOOD])
    assert records == [
        Record(TOPIC, 3, 10, 1_000, None, b"aa", (), 7, 1, 4, 0, None),
        Record(TOPIC, 3, 11, 1_000, b"kk", b"bbb", (("h", b"v"),), 7, 1, 5, 0, None),
        Record(TOPIC, 3, 12, 1_000, b"", b"c", (), 7, 1, 6, 0, None),
    ]


def with_field(index: int, value: object) -> dict[str, Any]:
    fields = list(GOOD["page"])
    fields[index] = value
    return {"page": fields}


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        ("a string", "each fetched chunk is"),
        ({"page": GOOD["page"][:9]}, "each fetched chunk is"),
        (with_field(3, "aabbbc"), "each fetched chunk is"),
        (with_field(2, True), "each fetched chunk is"),
        (with_field(2, -1), "a count >= 0"),
        (with_field(2, 4), "value lengths for a page of 4 records"),
        (with_field(4, b"2\n3\n2"), "do not add up to 6 bytes"),
        (with_field(4, 3), "3 values of 3 bytes in 6 bytes"),
        (with_field(5, b"1\n2"), "2 timestamps for a page of 3"),
        (with_field(5, b"1\nx\n3"), "invalid literal"),
        (with_field(7, b"-1\n2\n5"), "do not add up to 2 bytes"),
        (with_field(8, [[99, b"\x90"]]), "outside the page"),
        (with_field(8, [[11, b"\xc1"]]), "a fetched page is malformed"),
        (with_field(8, [11]), "headers are [offset, stored headers] pairs"),
        (with_field(9, [7, 1, 4, 0]), "5 producer columns"),
        (with_field(9, [7, 1, "4", 0, None]), "5 producer columns"),
        ({"rows": [[1, 2]]}, "11-field rows"),
    ],
)
def test_a_malformed_page_is_a_protocol_error(chunk: object, message: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        codec.records_from_chunks(TOPIC, [GOOD, chunk])
    assert message in str(raised.value)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-3, 12) | st.binary(max_size=8),
        lambda inner: st.lists(inner, max_size=11) | st.dictionaries(st.just("page"), inner),
        max_leaves=30,
    )
)
def test_anything_a_server_might_send_is_records_or_a_protocol_error(chunk: object) -> None:
    with contextlib.suppress(ProtocolError):
        records = codec.records_from_chunks(TOPIC, [chunk])
        assert all(isinstance(r, Record) for r in records)
        assert all(r.value is None or isinstance(r.value, bytes) for r in records)


# null values --------------------------------------------------------------------------------


def test_a_value_length_of_minus_one_in_text_is_a_null_value() -> None:
    nulls = with_field(4, b"2\n-1\n4")  # "aa", null, "bbbc"
    values = [r.value for r in codec.records_from_chunks(TOPIC, [nulls])]
    assert values == [b"aa", None, b"bbbc"]
    every = {"page": [3, 10, 2, b"", b"-1\n-1", 1_000, b"", -1, [], [0, 0, 0, 0, None]]}
    assert [r.value for r in codec.records_from_chunks(TOPIC, [every])] == [None, None]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        (-1, "values of -1 bytes"),  # a length given as one number never means null
        (b"2\n-2\n4", "a value length of -2"),
        (b"3\n-1\n4", "do not add up to 6 bytes"),
    ],
)
def test_a_null_only_as_minus_one_in_text(lengths: object, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        codec.records_from_chunks(TOPIC, [with_field(4, lengths)])


def test_a_page_without_nulls_gives_each_as_empty() -> None:
    """What a served reader that did not say it reads nulls gets (rows.without_nulls)."""
    page = rows.Page(0, 5, 3, b"ab", b"1\n-1\n1", 7, b"", -1, [], (0, 0, 0, 0, None))
    assert [r.value for r in rows.records_of_page(TOPIC, page)] == [b"a", None, b"b"]
    plain = rows.without_nulls(page)
    assert [r.value for r in rows.records_of_page(TOPIC, plain)] == [b"a", b"", b"b"]
    row = (0, 5, 7, None, None, rows.EMPTY_HEADERS, 0, 0, 0, 0, None)
    assert rows.row_without_null(row)[rows.ROW_VALUE] == b""


# the cycle collector ----------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_page_leaves_the_collector_as_it_was(enabled: bool) -> None:
    page = rows.Page(0, 0, 2, b"ab", 1, 5, b"", -1, [], (0, 0, 0, 0, None))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert [r.value for r in rows.records_of_page(TOPIC, page)] == [b"a", b"b"]
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()
