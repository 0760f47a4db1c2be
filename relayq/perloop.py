"""`PerLoop`: a resource made once per event loop, and closed on every path.

A connection made on an event loop belongs to it: another loop cannot use it, and one
left open when its loop ends is a socket nobody closes (redis-py and the standard
library say so with a ResourceWarning). So each of relayq's clients that a host or a
worker may use from several loops (an HTTP session, a Redis pool) keeps one per loop
here, and it is closed:

- by `aclose()` on its loop, the normal way;
- as its loop shuts down its async generators: asyncio.run, asyncio.Runner and
  pytest-asyncio's loops do, after cancelling their tasks; it is the one hook a
  loop offers, and it covers a client used from many `asyncio.run` calls;
- at exit, for a loop still running in a thread of its own (a worker's): from
  outside, as soon as the loop can, for at most a second in all.

    sessions = PerLoop(open=make_session, close=lambda s: s.close())
    session = await sessions.get()
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["PerLoop"]

T = TypeVar("T")

_EXIT_WAIT = 1.0
"""Seconds to wait at exit, in all, for running loops to close what they hold."""


@dataclass(slots=True)
class _Held(Generic[T]):
    value: T
    closer: AsyncGenerator[None, None]
    """Suspended at its yield; finishing it closes the value (held by its loop too)."""


class PerLoop(Generic[T]):
    """One `open()` per event loop, closed with `close(value)` (see the module)."""

    def __init__(self, *, open: Callable[[], T], close: Callable[[T], Awaitable[None]]) -> None:
        self._open = open
        self._close = close
        self._held: dict[asyncio.AbstractEventLoop, _Held[T]] = {}
        self._lock = threading.Lock()  # loops in several threads may read `_held` at once
        _LIVE.add(self)

    def here(self) -> T | None:
        """The running loop's value, if it has one yet."""
        held = self._held.get(asyncio.get_running_loop())
        return None if held is None else held.value

    async def get(self) -> T:
        """The running loop's value, made at its first use."""
        loop = asyncio.get_running_loop()
        held = self._held.get(loop)
        if held is None:
            value = self._open()
            held = _Held(value, self._close_with(loop, value))
            with self._lock:
                self._held[loop] = held
            await anext(held.closer)  # the loop holds it now, to finish as the loop ends
        return held.value

    async def aclose(self) -> None:
        """Close the running loop's value; the next `get` makes a new one."""
        await self._finish(asyncio.get_running_loop())

    def loops(self) -> list[asyncio.AbstractEventLoop]:
        """The loops holding a value now."""
        with self._lock:
            return list(self._held)

    async def _close_with(self, loop: asyncio.AbstractEventLoop, value: T) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            with self._lock:
                held = self._held.get(loop)
                if held is not None and held.value is value:
                    del self._held[loop]
            await self._close(value)

    async def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        held = self._held.get(loop)
        if held is not None:
            await held.closer.aclose()

    def close_from_outside(self) -> list[concurrent.futures.Future[None]]:
        """Close every loop's value from outside its loop: an idle loop's at once, a running
        one's as soon as it can (the futures to wait for). A closed loop runs nothing: it
        closed its value as it ended, or its sockets go with the process."""
        running = []
        for loop in self.loops():
            if loop.is_running():
                running.append(asyncio.run_coroutine_threadsafe(self._finish(loop), loop))
            elif not loop.is_closed():
                loop.run_until_complete(self._finish(loop))
        return running


_LIVE: weakref.WeakSet[PerLoop[Any]] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    closing: list[concurrent.futures.Future[None]] = []
    for per_loop in list(_LIVE):
        # Exiting anyway: whatever fails to close leaves its sockets to the OS.
        with contextlib.suppress(Exception):
            closing += per_loop.close_from_outside()
    concurrent.futures.wait(closing, timeout=_EXIT_WAIT)
