"""One way into the store from an event loop, for workers and hosts alike.

Store calls block. On PostgreSQL each goes to a thread (its round trips must
not stall the loop). On SQLite a call runs inline, on the loop, when the
write lock is free right now (a fraction of a millisecond, and no thread
handoffs: about 1.3x the turns per second); when another process holds the
lock, its first write fails at once, having done nothing (`store.StoreBusy`,
`store.db.impatient`), and the call waits for the lock on a thread instead:
a long transaction elsewhere never stops the loop. This process's own writers
are waited for, one short transaction each (`store.sqlite_writes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

from store import StoreBusy
from store.db import impatient

__all__ = ["StoreCalls"]

T = TypeVar("T")
P = ParamSpec("P")


class StoreCalls:
    """Runs store calls for one loop's owner: `await calls(fn, *args)`."""

    def __init__(
        self,
        *,
        inline: bool,
        executor: Callable[[], Executor | None],
        ready: Callable[[], bool] | None = None,
        open: Callable[[], object] | None = None,
    ) -> None:
        self.inline = inline
        """SQLite: try inline first."""
        self._executor = executor
        """The threads to use (None: the loop's default), asked for when first needed."""
        self._ready = ready
        """Asked before each call whether the store is open (a client's: False while new,
        RuntimeError once closed); when it is not, `open` runs first, on a thread."""
        self._open = open

    async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        await self._prepare()
        if self.inline:
            # StoreBusy: another process holds the lock; the call waits for it on a thread.
            with contextlib.suppress(StoreBusy), impatient():
                return fn(*args, **kwargs)
        return await self.offload(fn, *args, **kwargs)

    async def offload(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """On a thread whatever the store: for calls that take long on any (a batch's start)."""
        await self._prepare()
        return await self._thread(functools.partial(fn, *args, **kwargs))

    async def _prepare(self) -> None:
        if self._ready is not None and not self._ready() and self._open is not None:
            await self._thread(self._open)

    async def _thread(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor(), call)
