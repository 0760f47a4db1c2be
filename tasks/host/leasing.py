"""Relay calls leased to hosts (`DurableClient.lease_calls`, `heartbeat_lease`,
`lease_result`, `release_lease`): the store's leases (`store.leases`), a long poll woken
by the workers' announcements, and a result taken as an answer is.

A lease asked for with nothing to offer waits up to `wait` seconds. It is woken by any
run announcement (`tasks.broker.announce`: a run that settles on a relay request is
announced as every settled run is), and it looks again at least every `RECHECK`
seconds, for what no announcement tells: a lease that expired, a call released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta

from relayq.relay import RelayResult, relay_answer
from store import Database
from store.audit import Decider
from store.leases import Lease, heartbeat_lease, lease_calls, lease_result, release_lease
from tasks.host.answering import Answering
from tasks.host.waiting import RunWaiter
from tasks.storeio import StoreCalls

__all__ = ["RECHECK", "Leasing"]

RECHECK = 1.0
"""Seconds a waiting lease looks again without an announcement (expired or released calls)."""


class Leasing:
    """One client's leases of relay calls."""

    def __init__(
        self,
        db: Database,
        store: StoreCalls,
        answering: Answering,
        waiter: Callable[[], RunWaiter | None],
    ) -> None:
        self.db = db
        self.store = store
        self.answering = answering
        self.waiter = waiter

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
        waiter = self.waiter() if wait > 0 else None
        while True:
            # Taken before the look: an announcement during it still wakes the wait after.
            news = waiter.news() if waiter is not None else None
            if gone is not None and await gone():
                return []  # the caller left: what it would lease now would wait out its lease
            leases = await self.store(
                lease_calls, self.db, tools=tools, holder=holder, limit=limit, lease=lease
            )
            left = deadline - loop.time()
            if leases or left <= 0:
                return leases
            pause = min(left, RECHECK)
            if news is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), pause)

    async def heartbeat(
        self, lease_id: str, *, holder: str, tools: Collection[str] | None
    ) -> datetime:
        """`DurableClient.heartbeat_lease`."""
        return await self.store(heartbeat_lease, self.db, lease_id, holder=holder, tools=tools)

    async def release(self, lease_id: str, *, holder: str, tools: Collection[str] | None) -> None:
        """`DurableClient.release_lease`."""
        await self.store(release_lease, self.db, lease_id, holder=holder, tools=tools)

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
        done = await self.store(
            lease_result,
            self.db,
            lease_id,
            output=output,
            is_error=is_error,
            host=host,
            tools=tools,
            max_bytes=self.answering.settings.max_answer_bytes,
        )
        answer = relay_answer(
            done.request_id, [RelayResult(id=done.call_id, output=output, is_error=is_error)]
        )
        await self.answering.decided([(answer, done.accepted)], since=since, via=host.via)
        await self.answering.publish(done.accepted.outbox)
        return done.accepted.run_id
