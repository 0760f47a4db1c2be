"""SQLite's write transactions of one process: one at a time, each begun once SQLite's
write lock is free, never waiting for it while holding up the process's other writers.

A worker's event loop runs its store calls inline while SQLite's lock is free
(`tasks.storeio`), and a call that finds it taken waits for it on a thread. When what
held it was another thread of the same process (the heartbeat, or a call already sent to
a thread), the loop's next calls failed their BEGIN too and went to threads in turn, one
after another: measured in `bench.inflight`, a third of the turns per second (issue 38).

So the process's own writers queue on a lock of the process's (`SqliteWrites`), held
only while SQLite's is: the wait for it is the length of one short transaction. SQLite's
lock is asked for without waiting (a busy timeout of 0, set once per connection rather
than around every BEGIN), so only another process can make the ask fail. A writer that
may wait then tries again, with pauses, up to the busy timeout, as SQLite's own busy
handler would, without holding the process's lock meanwhile; an impatient one (the
loop's, `store.db.impatient`) gives up at once, its call sent to a thread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, RootTransaction
from sqlalchemy.exc import OperationalError

__all__ = ["SqliteWrites", "locked"]

_EVERY: weakref.WeakSet[SqliteWrites] = weakref.WeakSet()


class SqliteWrites:
    """The write transactions on `engine` (BEGIN IMMEDIATE, busy timeout 0) of this process."""

    def __init__(self, engine: Engine, *, busy_timeout: float) -> None:
        self.engine = engine
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        _EVERY.add(self)

    @contextmanager
    def transaction(self, *, impatient: bool) -> Iterator[Connection]:
        """A write transaction, committed on exit, rolled back on an exception. SQLite's
        "database is locked" (OperationalError) when another process holds the lock past
        the busy timeout, or at once when `impatient`."""
        conn, trans = self._begin(impatient)
        try:
            with conn, trans:
                yield conn
        finally:
            self._lock.release()

    def _begin(self, impatient: bool) -> tuple[Connection, RootTransaction]:
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.001
        while True:
            self._lock.acquire()
            conn = self.engine.connect()
            try:
                return conn, conn.begin()
            except OperationalError as exc:
                conn.close()
                self._lock.release()
                if impatient or not locked(exc.orig) or time.monotonic() >= deadline:
                    raise
            except BaseException:
                conn.close()
                self._lock.release()
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _forked(self) -> None:
        # A lock another thread held as the process forked stays held in the child, and
        # the parent's connections are the parent's to use and close.
        self._lock = threading.RLock()
        self.engine.dispose(close=False)


def locked(orig: BaseException | None) -> bool:
    """Whether SQLite's error says another connection holds the lock."""
    text = str(orig)
    return "locked" in text or "busy" in text


def _after_fork() -> None:
    for writes in list(_EVERY):
        writes._forked()


os.register_at_fork(after_in_child=_after_fork)
