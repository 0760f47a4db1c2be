"""No fork while a thread of the worker's main process is inside the store.

A prefork worker's main process forks its pool's children (and a replacement for each
one that ends) while threads of its own run: the batch-queue watcher reads the store.
A child forked while such a thread was inside the store's library (SQLite's C code)
inherits that library's mutexes as they were at the fork, held by a thread it does not
have: it hangs at its first store call, deaf to SIGTERM, and the worker's warm shutdown
waits for it for good. Such a thread makes its store calls inside `no_fork_meanwhile()`,
and a fork waits for the call to end (a few milliseconds; the first call migrates).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["no_fork_meanwhile"]

_GUARD = threading.RLock()


@contextmanager
def no_fork_meanwhile() -> Iterator[None]:
    """A fork of this process, from any thread, waits until the block has ended."""
    with _GUARD:
        yield


os.register_at_fork(
    before=_GUARD.acquire, after_in_parent=_GUARD.release, after_in_child=_GUARD.release
)
