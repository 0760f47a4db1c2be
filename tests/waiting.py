"""`until`: wait for a condition with a deadline, for tests that are not on an event loop
(`eventually` in tests/durable/conftest.py is its async twin).

    found = until(lambda: http.get(url).json()["items"], what="a request", timeout=30)

It asks again at once when the condition first fails, then less and less often (up to
`most` seconds between two asks), so a quick event costs no wait and a slow one few asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["until"]

T = TypeVar("T")


def until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 30.0,
    most: float = 0.1,
    said: Callable[[], str] = str,
) -> T:
    """`check()` once it is truthy; fails the test naming `what` after `timeout` seconds,
    with what `said()` tells then (the processes' output, say)."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:g} s\n{said()}", pytrace=False)
        time.sleep(pause)
        pause = min(pause * 2, most)
    return value
