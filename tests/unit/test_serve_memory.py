"""`fencelog serve` tells glibc's malloc to keep freed memory (cli/serve.py)."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from cli.serve import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="glibc's mallopt",
)
def test_glibc_takes_the_servers_malloc_settings() -> None:
    assert keep_freed_memory()
