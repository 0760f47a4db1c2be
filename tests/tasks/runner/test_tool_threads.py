"""Issue 51: a sync tool that never returns costs one thread, not the worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from prometheus_client import REGISTRY

from tasks.runner.tool_threads import ToolThreads

T = TypeVar("T")


def abandoned_counted() -> float:
    return REGISTRY.get_sample_value("relayq_tool_threads_abandoned_total") or 0.0


def stuck_now() -> float:
    return REGISTRY.get_sample_value("relayq_tool_threads_stuck") or 0.0


async def on(pool: ToolThreads, fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


async def test_calls_return_their_result_or_raise_their_error():
    pool = ToolThreads(2, stuck_limit=4)
    try:
        assert await on(pool, lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ZeroDivisionError):
            await on(pool, lambda: 1 / 0)
        # ... and as the loop's default executor, `asyncio.to_thread` runs on it
        asyncio.get_running_loop().set_default_executor(pool)
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        assert name.startswith("relayq-tool-")
    finally:
        pool.shutdown()


async def test_calls_submitted_together_each_get_a_thread_of_their_own():
    # Given a pool of two with one thread, idle after a first call
    pool = ToolThreads(2, stuck_limit=4)
    try:
        await on(pool, lambda: None)

        # When two calls that each wait for the other are submitted at once
        meet = threading.Barrier(2, timeout=5)
        both = await asyncio.wait_for(asyncio.gather(on(pool, meet.wait), on(pool, meet.wait)), 10)

        # Then they ran side by side: the idle thread was counted on by one of them only
        assert sorted(both) == [0, 1]
    finally:
        pool.shutdown()


async def test_a_call_given_up_on_frees_its_place_and_is_counted_until_it_returns():
    # Given a pool of one thread, and a call that holds it until released
    release = threading.Event()
    told: list[int] = []
    pool = ToolThreads(1, stuck_limit=5, on_stuck=told.append)
    counted = abandoned_counted()
    try:
        # When its caller gives up on it (a tool's timeout)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(on(pool, release.wait), 0.2)

        # Then the next call runs at once on a new thread, though the first still runs
        assert await asyncio.wait_for(on(pool, lambda: "next"), 5) == "next"
        assert pool.stuck == 1
        assert pool.abandoned == 1
        assert abandoned_counted() == counted + 1
        assert stuck_now() == 1
        assert told == []  # under the limit

        # ... and once the stuck call returns, its thread ends and is no longer counted
        release.set()
        deadline = time.monotonic() + 5
        while pool.stuck and time.monotonic() < deadline:  # noqa: ASYNC110  (a thread's count)
            await asyncio.sleep(0.01)
        assert pool.stuck == 0
        assert stuck_now() == 0
        assert await on(pool, lambda: "still") == "still"
    finally:
        release.set()
        pool.shutdown()


async def test_at_the_stuck_limit_the_owner_is_told_once_and_shutdown_waits_for_none_of_them():
    # Given a pool of two threads that tells its owner at 3 stuck calls
    release = threading.Event()
    told: list[int] = []
    pool = ToolThreads(2, stuck_limit=3, on_stuck=told.append)
    try:
        # When four calls that never return are given up on
        for _ in range(4):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(on(pool, release.wait), 0.05)

        # Then the owner was told once, at the third
        assert told == [3]
        assert pool.stuck == 4
        # ... calls still run
        assert await asyncio.wait_for(on(pool, lambda: 1), 5) == 1
    finally:
        # ... and shutting down waits for the threads that serve callers, not the stuck
        began = time.monotonic()
        pool.shutdown(wait=True)
        assert time.monotonic() - began < 5
        assert not release.is_set()
        release.set()


async def test_a_call_still_queued_when_given_up_on_never_runs():
    # Given a pool of one thread, held by a call
    release = threading.Event()
    ran: list[str] = []
    pool = ToolThreads(1, stuck_limit=5)
    try:
        held = asyncio.ensure_future(on(pool, release.wait))
        await asyncio.sleep(0.05)

        # When a call behind it is given up on before it started
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(on(pool, lambda: ran.append("late")), 0.05)
        release.set()
        await held

        # Then it never runs, and no thread counts as stuck
        assert await on(pool, lambda: "after") == "after"
        assert ran == []
        assert pool.stuck == 0
        assert pool.abandoned == 0
    finally:
        release.set()
        pool.shutdown()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least one thread"):
        ToolThreads(0, stuck_limit=1)
