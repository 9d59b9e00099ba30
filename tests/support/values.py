"""Record values in tests that write none null: `present` says so, and fails the test
where a value read back is null after all (Record.value is bytes or None)."""

from __future__ import annotations


def present(value: bytes | None) -> bytes:
    """The value, which the test wrote non-null; AssertionError if it reads back null."""
    assert value is not None, "a null value where the test wrote bytes"
    return value
