"""A worker's resident memory, and its bound (`RELAYQ_WORKER_MAX_MEMORY`).

A worker runs for weeks; what a tool or a library keeps and never returns grows its
memory until the kernel kills it, mid-turn, with every run it holds. Over its bound,
an asyncio worker retires instead (`Runtime.retire`): it takes no new turn, finishes
those it holds and ends, for its supervisor to start a fresh process. A prefork
worker's children are bounded by Celery itself (`worker_max_memory_per_child`, set
from the same setting: `workers.config`).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable

__all__ = ["MemoryBound", "MiB", "rss_bytes"]

MiB = 2**20


def rss_bytes() -> int:
    """This process's resident memory now; where /proc is missing, its peak."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class MemoryBound:
    """Retires the worker once its resident memory is over `limit` bytes: `check` is one
    look (`Heartbeat.checks` runs it after every beat)."""

    def __init__(self, limit: int, retire: Callable[[str], None]) -> None:
        self.limit = limit
        self._retire = retire

    def check(self) -> None:
        rss = rss_bytes()
        if rss > self.limit:
            self._retire(
                f"its memory, {rss // MiB} MiB, is over RELAYQ_WORKER_MAX_MEMORY "
                f"({self.limit // MiB} MiB)"
            )
