"""How a `DurableClient` waits for its runs to settle: done, pending, failed or
cancelled.

Pushed, a client's waits are served by one `RunWaiter` per event loop, woken by the
workers' announcements (`tasks.client.waiting`). Polled (an eager client, a broker other than
Redis, or `waiting="polled"`), each run is read on its own every 10 to 250 ms.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Literal

from store import StoreUnavailable
from tasks.client.waiting import RunWaiter, WaitTimeout
from tasks.settings import Settings
from tasks.storeio import StoreDoor

__all__ = ["Settling", "Waiting"]

Waiting = Literal["pushed", "polled"]
"""Woken by the workers' announcements, or polling each run."""


class Settling:
    """One client's waits for its runs: `await settling.until_settled(run_id, timeout)`."""

    def __init__(
        self,
        settings: Settings,
        store: StoreDoor,
        *,
        waiting: Waiting,
        recheck_every: timedelta,
    ) -> None:
        self.settings = settings
        self.store = store
        self.pushed = waiting == "pushed"
        """Woken by announcements (a `RunWaiter`), else polling each run."""
        self.recheck_every = recheck_every
        """How often every run waited on is read anyway (pushed waiting)."""
        self._waiter: RunWaiter | None = None

    def waiter_here(self) -> RunWaiter:
        """This client's waiter on the running loop (a client may outlive a loop)."""
        if self._waiter is None or self._waiter.loop is not asyncio.get_running_loop():
            if self._waiter is not None:
                self._waiter.close()
            seconds = self.recheck_every.total_seconds()
            self._waiter = RunWaiter(self.settings, self.store, recheck=seconds)
        return self._waiter

    def listening(self) -> int | None:
        """Where this client's hearing of announcements stands now (`RunWaiter.mark`), if
        it hears them: a run that settles after a change made from here on is heard."""
        return self.waiter_here().mark() if self.pushed else None

    async def until_settled(
        self, run_id: str, timeout: float | None, since: int | None = None
    ) -> None:
        """Return once the run is settled. `since`: where this client's hearing stood
        before the run last changed here (`listening`)."""
        if self.pushed:
            await self.waiter_here().wait(run_id, timeout, heard_since=since)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        status = "unknown"
        while True:
            try:
                status, done = await self.store.settled(run_id)
            except StoreUnavailable:
                done = False  # an outage ends no wait (as for a pushed one: `tasks.client.waiting`)
            if done:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run_id, status, timeout or 0.0)
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def changed_here(self, run_id: str) -> None:
        """Wake the waits on a run a change made here may have settled, that no worker
        announces (a cancel)."""
        if self._waiter is not None and self._waiter.loop is asyncio.get_running_loop():
            self._waiter.wake([run_id])

    async def aclose(self) -> None:
        """Close the running loop's waiter, its connection before the loop may end."""
        if self._waiter is not None and self._waiter.loop is asyncio.get_running_loop():
            await self._waiter.aclose()
            self._waiter = None

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None
