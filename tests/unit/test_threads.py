"""Threads fencelog starts leave SIGINT and SIGTERM to the main thread (broker/threads.py):
a Ctrl-C taken by another thread did not wake a main thread blocked in a call."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from broker import threads

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no thread signal masks")


def blocked_in(seen: list[set[int]]) -> None:
    seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_a_thread_started_blocks_sigint_and_sigterm_and_its_starter_keeps_its_mask() -> None:
    before = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    seen: list[set[int]] = []
    started = threads.start(threading.Thread(target=blocked_in, args=(seen,)))
    started.join(timeout=10)
    assert not started.is_alive()
    assert {signal.SIGINT, signal.SIGTERM} <= seen[0]
    assert set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before
    assert signal.SIGINT not in before  # the main thread still takes Ctrl-C
