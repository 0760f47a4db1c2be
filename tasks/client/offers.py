"""Lease waits woken when a call they can take is offered, by one look for all of them.

A host's lease request with nothing to offer waits (`tasks.client.leasing`). One
`OfferWatch` per client and event loop looks at the store for every such wait at once
(`store.leases.offered`: how many calls of each tool may be leased now), on each run
announcement (`tasks.broker.announce`: a run that settles on a relay request is
announced) and every `RECHECK` seconds (what no announcement tells: a lease that lapsed,
a call released, an announcement lost). It wakes as many waits, oldest first, as there
are calls of their tools: a thousand idle hosts cost one read a second, not a thousand,
and a new call wakes one host, not all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterator

from relayq import RelayqError
from tasks.storeio import StoreDoor

__all__ = ["RECHECK", "OfferWatch", "Wait"]

RECHECK = 1.0
"""Seconds between two looks with no announcement (lapsed leases, released calls)."""

log = logging.getLogger(__name__)


class Wait:
    """One lease request's wait: woken when a call of `tools` (None: any) is offered."""

    def __init__(self, tools: Collection[str] | None) -> None:
        self.tools = None if tools is None else frozenset(tools)
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    @property
    def woken(self) -> bool:
        return self._woken.is_set()

    async def until_woken(self, timeout: float) -> bool:
        """Whether it was woken within `timeout` seconds; it can be woken again after."""
        # asyncio.timeout, not wait_for: no task a wait, a thousand waits a second.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await self._woken.wait()
        woken = self._woken.is_set()
        self._woken.clear()
        return woken


class OfferWatch:
    """The waits of one event loop, and the task that looks for them (while any waits)."""

    def __init__(
        self,
        store: StoreDoor,
        news: Callable[[], asyncio.Event | None],
        *,
        recheck: float | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.store = store
        self.news = news
        """The event the next run announcement sets (None: announcements are not heard)."""
        self.recheck = recheck
        """Seconds between two looks with no announcement (None: `RECHECK` as it is then)."""
        self._waits: dict[Wait, None] = {}  # oldest first
        self._task: asyncio.Task[None] | None = None
        self.looks = 0
        """Reads of the store made for the waits, in all."""
        self.stopping = False
        """Stopped (`stop`): every wait is woken at once, to answer with nothing."""
        self._last: (
            tuple[frozenset[str] | None, dict[str, int], float, asyncio.Event | None] | None
        ) = None
        """The last look: the tools it looked for, the calls it found, when, and the
        announcement it waited for next."""

    def stop(self) -> None:
        """Wake every wait, now and from now on, for good (the API stopping): on the
        watch's loop, from any thread."""
        self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        self.stopping = True
        for wait in self._waits:
            wait.wake()

    @contextlib.contextmanager
    def waiting(self, tools: Collection[str] | None) -> Iterator[Wait]:
        """A wait, registered before the caller's own look: a call offered during that look
        still wakes it."""
        wait = Wait(tools)
        if self.stopping:
            wait.wake()
        self._waits[wait] = None
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._watch(), name="relayq-offer-watch")
        try:
            yield wait
        finally:
            del self._waits[wait]

    def nothing_for(self, tools: Collection[str] | None) -> bool:
        """Whether the last look, under `RECHECK` old and with no run announced since,
        found no call of `tools`: a new wait need not look for itself (any call offered
        since brings a look that wakes it)."""
        if self._last is None:
            return False
        looked, found, at, news = self._last
        if news is None or news.is_set() or self.loop.time() - at > self._recheck():
            return False
        if tools is None:
            return looked is None and not found
        return (looked is None or looked >= set(tools)) and not found.keys() & set(tools)

    def _recheck(self) -> float:
        return RECHECK if self.recheck is None else self.recheck

    async def _watch(self) -> None:
        while self._waits:
            # Taken before the look: an announcement during it brings the next look.
            news = self.news()
            try:
                await self._look(news)
            except RelayqError as exc:  # the store away: the waits time out, or the next look
                self._last = None
                log.warning("relay calls not looked for: %s", exc)
            if not self._waits:
                return
            recheck = self._recheck()
            if news is None:
                await asyncio.sleep(recheck)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), recheck)

    async def _look(self, news: asyncio.Event | None) -> None:
        waiting = [w for w in self._waits if not w.woken]
        if not waiting:
            return
        anything = any(w.tools is None for w in waiting)
        tools = None if anything else frozenset().union(*(w.tools or () for w in waiting))
        self.looks += 1
        at = self.loop.time()
        counts = await self.store.offered(tools)
        self._last = (tools, {t: n for t, n in counts.items() if n}, at, news)
        for wait in waiting:
            named = counts if wait.tools is None else wait.tools & counts.keys()
            tool = next((t for t in named if counts[t] > 0), None)
            if tool is not None:
                counts[tool] -= 1
                wait.wake()
