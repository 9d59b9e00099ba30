"""Bounded waits: how a test waits for something another thread or process does.

- `wait_until(condition)`: asks condition() again and again until it holds; the one way a
  test waits for a state (never a bare sleep followed by an assert).
- `within(seconds, work)`: work() in another thread, which must return within seconds;
  for a call that must not block (behind a long poll, say), said without timing it.

Both fail with AssertionError saying what did not happen. A test that sleeps does so only
when the passing time is what it tests (a lease or a session timeout running out on
purpose, a producer's pace), and says so beside the sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 15.0  # the default bound of one wait: generous, since a loaded machine is slow
POLL_S = 0.02  # between two looks at the condition


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float = WAIT_S,
    *,
    interval_s: float = POLL_S,
    message: str | Callable[[], str] = "the condition",
) -> T:
    """condition()'s first truthy value (an empty collection is "not yet"), asked every
    interval_s; AssertionError once timeout_s has passed, with `message` (a callable is
    asked then, for the state at that moment) and the last value condition() gave."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = condition()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"not within {timeout_s}s: {what} (last seen: {seen!r})")
        time.sleep(interval_s)


def within(seconds: float, work: Callable[[], T]) -> T:
    """work() from another thread; fails if it has not returned after `seconds`."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-within", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"still waiting after {seconds}s (a long poll left in flight?)")
    if errors:
        raise errors[0]
    return results[0]
