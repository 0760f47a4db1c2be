"""Backoff for retried model calls: exponential, jittered, never shorter than the server asks."""

from __future__ import annotations

import random

__all__ = ["MAX_DELAY", "backoff"]

MAX_DELAY = 300.0
"""No retry waits longer; the durable broker's visibility timeout is far above it."""


def backoff(
    attempt: int, retry_after: float | None, *, base: float = 1.0, cap: float = 60.0
) -> float:
    """Seconds to wait before retry `attempt` (0 for the first).

    `base * 2**attempt`, capped at `cap`, times a random factor in [0.5, 1] so
    that many clients hit by one outage do not return in step; at least the
    server's `Retry-After`; at most MAX_DELAY.
    """
    # The exponent stops growing long before the cap matters (2.0**1024 overflows).
    delay: float = min(cap, base * 2.0 ** min(attempt, 64)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, MAX_DELAY)
