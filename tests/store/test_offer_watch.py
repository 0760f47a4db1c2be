"""Lease waits woken by one look for all of them (`tasks.client.offers`), on the store:
a thousand idle waits cost one read a round, a new call wakes one wait of its tool, and
a wait ends at its bound."""

from __future__ import annotations

import asyncio
import contextlib
import time

from sqlalchemy import event

from store import Database
from tasks.client.offers import OfferWatch
from tasks.storeio import StoreCalls, StoreDoor

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
    return OfferWatch(
        StoreDoor(db, store), lambda: None if news is None else news.event, recheck=recheck
    )


async def until(check, what: str, timeout: float = 30.0) -> None:
    """Once `check()` is true; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        await asyncio.sleep(0.01)


async def test_a_thousand_idle_waits_cost_one_read_a_round(db: Database):
    watch = watch_of(db)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "relayq_relay_calls" in statement:  # (SQLite's BEGIN and PRAGMAs aside)
            statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    with many_waits(watch, 1000, ["shell"]) as waits:
        # When the watch has looked five times for the thousand waits
        await until(lambda: watch.looks >= 5, "five looks")
        looks, read = watch.looks, len(statements)
        # Then each look was one statement, whatever the number of waits, and none woke
        assert not any(w.woken for w in waits)
    # (a look is counted as it starts: its statement may not have run yet)
    assert read in (looks - 1, looks), (looks, read)


async def test_a_new_call_wakes_one_wait_of_its_tool_the_oldest(db: Database):
    news = News()
    watch = watch_of(db, news, recheck=60)
    with many_waits(watch, 50, ["lookup"]) as waits, watch.waiting(["other"]) as other:
        await until(lambda: watch.looks >= 1, "the first look (nothing offered)")
        # When a run halts on one relay call of `lookup`, and is announced
        await halt_on_relay(db, "c1", run_id="run_offered")
        news.announce()
        await until(lambda: waits[0].woken, "the oldest wait woken")
        # Then the oldest wait of that tool is woken, and no other
        assert [n for n, w in enumerate(waits) if w.woken] == [0]
        assert not other.woken


async def test_a_wait_ends_at_its_bound_beside_a_thousand(db: Database):
    watch = watch_of(db)
    with many_waits(watch, 1000, ["shell"]), watch.waiting(["shell"]) as mine:
        began = time.monotonic()
        woken = await mine.until_woken(1.5)
        took = time.monotonic() - began
    # Not woken (nothing was offered), and not before its bound
    assert not woken
    assert took >= 1.5


def many_waits(watch: OfferWatch, count: int, tools: list[str]):
    """`count` waits registered at once, oldest first."""
    stack = contextlib.ExitStack()
    waits = [stack.enter_context(watch.waiting(tools)) for _ in range(count)]

    @contextlib.contextmanager
    def held():
        with stack:
            yield waits

    return held()
