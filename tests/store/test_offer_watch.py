"""Lease waits woken by one look for all of them (`tasks.host.offers`), on the store:
a thousand idle waits cost one read a round, a new call wakes one wait of its tool, and
a wait ends at its bound."""

from __future__ import annotations

import asyncio
import contextlib
import time

from store import Database
from tasks.host.offers import OfferWatch
from tasks.storeio import StoreCalls

from .driver import halt_on_relay


class News:
    """Run announcements as `RunWaiter.news` gives them: an event set once, then a new one."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def announce(self) -> None:
        self.event.set()
        self.event = asyncio.Event()


def watch_of(db: Database, news: News | None = None, recheck: float = 0.2) -> OfferWatch:
    store = StoreCalls(inline=False, executor=lambda: None)
    return OfferWatch(db, store, lambda: None if news is None else news.event, recheck=recheck)


async def test_a_thousand_idle_waits_cost_one_read_a_round(db: Database):
    watch = watch_of(db)
    with many_waits(watch, 1000, ["shell"]) as waits:
        await asyncio.sleep(1.05)
        assert not any(w.woken for w in waits)
    # five rounds of 0.2 s (and the first): one read each, whatever the number of waits
    assert 4 <= watch.looks <= 7, watch.looks


async def test_a_new_call_wakes_one_wait_of_its_tool_the_oldest(db: Database):
    news = News()
    watch = watch_of(db, news, recheck=60)
    with many_waits(watch, 50, ["lookup"]) as waits, watch.waiting(["other"]) as other:
        await asyncio.sleep(0.05)  # the first look: nothing offered
        # When a run halts on one relay call of `lookup`, and is announced
        await halt_on_relay(db, "c1", run_id="run_offered")
        news.announce()
        await asyncio.sleep(0.3)
        # Then the oldest wait of that tool is woken, and no other
        assert [n for n, w in enumerate(waits) if w.woken] == [0]
        assert not other.woken


async def test_a_wait_ends_at_its_bound_beside_a_thousand(db: Database):
    watch = watch_of(db)
    with many_waits(watch, 1000, ["shell"]), watch.waiting(["shell"]) as mine:
        began = time.monotonic()
        woken = await mine.until_woken(1.5)
        took = time.monotonic() - began
    assert not woken
    assert 1.5 <= took < 2.5, took


def many_waits(watch: OfferWatch, count: int, tools: list[str]):
    """`count` waits registered at once, oldest first."""
    stack = contextlib.ExitStack()
    waits = [stack.enter_context(watch.waiting(tools)) for _ in range(count)]

    @contextlib.contextmanager
    def held():
        with stack:
            yield waits

    return held()
