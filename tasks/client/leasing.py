"""Relay calls leased to hosts (`DurableClient.lease_calls`, `heartbeat_lease`,
`lease_result`, `release_lease`): the store's leases (`store.leases`), a long poll woken
by the workers' announcements, and a result taken as an answer is.

A lease asked for with nothing to offer waits up to `wait` seconds, until the client's
`OfferWatch` (`tasks.client.offers`), which looks for every waiting lease at once, on each
run announcement and every `RECHECK` seconds, finds a call of its tools.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta

from store.audit import Decider
from store.leases import Lease
from tasks.client.answering import Answering
from tasks.client.offers import RECHECK, OfferWatch
from tasks.client.waiting import RunWaiter
from tasks.storeio import StoreDoor

__all__ = ["RECHECK", "Leasing"]


class Leasing:
    """One client's leases of relay calls."""

    def __init__(
        self,
        store: StoreDoor,
        answering: Answering,
        waiter: Callable[[], RunWaiter | None],
    ) -> None:
        self.store = store
        self.answering = answering
        self.waiter = waiter
        self._watch: OfferWatch | None = None
        self._stopped = False

    async def lease(
        self,
        *,
        tools: Collection[str] | None,
        holder: str,
        limit: int,
        wait: float,
        lease: timedelta,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Lease]:
        """`DurableClient.lease_calls`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        watch = self._watch_here()
        with watch.waiting(tools) as waits:
            # A host asks again as soon as it is answered: where the watch has just found
            # nothing for it, and nothing was announced since, its wait needs no look.
            fresh = wait > 0 and watch.nothing_for(tools)
            while True:
                if fresh:
                    leases, fresh = [], False
                else:
                    leases = await self.store.lease_calls(tools=tools, holder=holder, limit=limit,
                        lease=lease,
                    )  # fmt: skip
                if leases or loop.time() >= deadline:
                    return leases
                # Woken when a call of its tools is offered (or the API stopping); the
                # caller, asked then whether it is still there, is asked nothing in
                # between: a thousand idle hosts cost no wake-up a second. At its bound
                # it answers with nothing, looking no more: the host's next request looks.
                left = deadline - loop.time()
                if not await waits.until_woken(left):
                    return []
                if watch.stopping or (gone is not None and await gone()):
                    return []  # what it would lease now would wait out its lease

    def stop_waiting(self) -> None:
        """Answer every lease request waiting now, and every one to come, with nothing
        (the API stopping: its hosts ask the next one); from any thread."""
        self._stopped = True
        if self._watch is not None:
            self._watch.stop()

    def _watch_here(self) -> OfferWatch:
        """This client's watch on the running loop (a client may outlive a loop)."""
        if self._watch is None or self._watch.loop is not asyncio.get_running_loop():

            def news() -> asyncio.Event | None:
                waiter = self.waiter()
                return None if waiter is None else waiter.news()

            self._watch = OfferWatch(self.store, news)
            if self._stopped:
                self._watch.stop()
        return self._watch

    async def heartbeat(
        self, lease_id: str, *, holder: str, tools: Collection[str] | None
    ) -> datetime:
        """`DurableClient.heartbeat_lease`."""
        return await self.store.heartbeat_lease(lease_id, holder=holder, tools=tools)

    async def release(self, lease_id: str, *, holder: str, tools: Collection[str] | None) -> None:
        """`DurableClient.release_lease`."""
        await self.store.release_lease(lease_id, holder=holder, tools=tools)

    async def result(
        self,
        lease_id: str,
        *,
        output: str,
        is_error: bool,
        host: Decider,
        tools: Collection[str] | None,
    ) -> str:
        """`DurableClient.lease_result`: returns the run id."""
        since = time.time_ns()
        done = await self.store.lease_result(
            lease_id,
            output=output,
            is_error=is_error,
            host=host,
            tools=tools,
            max_bytes=self.answering.settings.max_answer_bytes,
        )
        await self.answering.decided([(done.answer, done.accepted)], since=since, via=host.via)
        await self.answering.publish(done.accepted.outbox)
        return done.accepted.run_id
