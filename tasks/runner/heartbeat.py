"""A worker process's heartbeat, on a thread of its own, and what it knows of the store.

The heartbeat says the process is alive: its claims last while it is fresh
(`store.workers`). It is written from a thread that does nothing else, so
neither a busy event loop nor store calls queued on the I/O threads delay it.

It also tells the sweeper whether stale heartbeats mean anything. When a beat
of this process could not be written on time (the store down or restarting,
SQLite's file locked by a long transaction), no other process could write its
beat either: until this one has beaten steadily for a whole worker timeout,
a stale heartbeat is no sign of death (`steady`), and the sweeper adopts no
claim on its strength. A process gone from this very host is dead all the same.

A process holding a store call that did not come back once its silent connection
was cut (`store.stalls`) beats no more until the call ends: it could not give
that turn back, and must not look alive while doing nothing, so the sweepers of
other workers take its claims. Nor does one whose event loop has stopped turning
(`tasks.runner.loopwatch`): its turns run no more.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

from store import Database, beat
from store.errors import safe_text
from store.workers import HOSTNAME

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)


class Heartbeat:
    """Beats every `every` seconds for `worker_id`, from a daemon thread, until stopped."""

    def __init__(self, db: Database, worker_id: str, *, every: float, timeout: float) -> None:
        self.db = db
        self.worker_id = worker_id
        self.every = every
        self.timeout = timeout
        """Seconds without a beat after which a worker counts as dead."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beating_since: float | None = None
        self._late_at = -math.inf
        """When a beat last failed or took longer than `every` (monotonic)."""
        self._failing = False
        self._wedged = False
        self.loop_stalled: Callable[[], bool] = lambda: False
        """Whether the process's event loop has stopped turning (`tasks.runner.loopwatch`)."""
        self.checks: list[Callable[[], None]] = []
        """The process's own health checks, each run after every beat on the heartbeat's
        thread, so a stalled loop does not stop them (`tasks.runner.memory`)."""

    def start(self) -> None:
        """Write the first beat now (so no claim of this process is seen without one;
        StoreUnavailable if it cannot be), then go on beating in the background."""
        if self._thread is not None:
            return
        self._beat(first=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="relayq-heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Beat no more (a beat under way still ends); `start` begins again."""
        self._stop.set()
        self._thread = None

    def steady(self) -> bool:
        """Whether the store has taken this process's beats on time for a whole worker
        timeout, so another worker's stale heartbeat means that worker stopped beating."""
        now = time.monotonic()
        since = self._beating_since
        if since is not None and now - since > self.every:
            return False  # a beat waits on the store right now
        return now - self._late_at >= self.timeout

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every):
            self._beat()
            for check in self.checks:
                try:
                    check()
                except Exception as exc:  # a check is advice: it never stops the beats
                    log.warning("a health check failed: %s", type(exc).__name__)

    def _beat(self, *, first: bool = False) -> None:
        if not first and (self.loop_stalled() or self._held_by_a_lost_call()):
            self._late_at = time.monotonic()
            return
        started = time.monotonic()
        self._beating_since = started
        try:
            beat(self.db, self.worker_id, hostname=HOSTNAME, pid=os.getpid())
        except Exception as exc:  # the next beat tries again; a stale beat counts for nothing
            self._late_at = time.monotonic()
            if not self._failing:
                log.warning("could not write the heartbeat: %s", safe_text(exc))
            self._failing = True
            if first:
                raise
            return
        finally:
            self._beating_since = None
        ended = time.monotonic()
        if ended - started > self.every:
            self._late_at = ended
        if self._failing:
            log.warning("the heartbeat is written again")
            self._failing = False

    def _held_by_a_lost_call(self) -> bool:
        wedged = self.db.stalls is not None and self.db.stalls.wedged()
        if wedged != self._wedged:
            self._wedged = wedged
            if wedged:
                log.error(
                    "a store call did not come back once its silent connection was cut: "
                    "beating no more, so that other workers take this one's turns"
                )
            else:
                log.warning("the store call came back: beating again")
        return wedged
