"""The worker process's event loop, in a thread of its own, and the bridge from a task body.

Turns are coroutines (`relayq.loop.take_turn`) on one event loop per process, so hundreds
of model calls wait at once without a thread each. A task body waits for its coroutine
(`LoopThread.wait`): under a classic pool it runs it on the loop; under the asyncio pool
(`workers.aio`) it hands it to the pool (`defer`) and sleeps in its greenlet until the
pool wakes it with the outcome. The loop's watch (`tasks.runner.loopwatch`), once started,
names what the loop does in a stall's log (`LoopThread.doing`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from greenlet import getcurrent  # type: ignore[import-untyped]

from tasks.runner.loopwatch import LoopWatch
from tasks.runner.tool_threads import ToolThreads

__all__ = ["LoopThread", "defer", "deferring"]

T = TypeVar("T")

_local = threading.local()


@contextmanager
def deferring() -> Iterator[list[Coroutine[Any, Any, Any]]]:
    """While open, `defer` hands coroutines to the caller (the asyncio pool) instead."""
    _local.slot = []
    try:
        yield _local.slot
    finally:
        _local.slot = None


def defer(work: Coroutine[Any, Any, Any]) -> bool:
    """Leave `work` for the asyncio pool to run; False when no such pool is calling."""
    slot: list[Coroutine[Any, Any, Any]] | None = getattr(_local, "slot", None)
    if slot is None:
        return False
    slot.append(work)
    return True


class LoopThread:
    """An asyncio loop in a daemon thread: one per process (`shared()`)."""

    _shared: LoopThread | None = None
    _pid: int | None = None
    _lock = threading.Lock()

    def __init__(self, io_threads: int = 8, tools: ToolThreads | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(io_threads, thread_name_prefix="relayq-io")
        """The store's threads (`Runtime.store`)."""
        self.tools = tools or ToolThreads(32, stuck_limit=8)
        """Every other thread's work, sync tools' above all (`asyncio.to_thread`): stuck
        ones never keep a store call waiting (`tasks.runner.tool_threads`)."""
        self.loop.set_default_executor(self.tools)
        self.watch: LoopWatch | None = None
        """The watch on this loop, once started (`start_watch`)."""
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="relayq-loop", daemon=True
        )
        self._thread.start()

    @classmethod
    def shared(
        cls, io_threads: int = 8, tools: Callable[[], ToolThreads] | None = None
    ) -> LoopThread:
        """The process's loop; made with these threads when none runs here yet."""
        with cls._lock:
            if cls._shared is None or cls._pid != os.getpid():
                cls._shared = LoopThread(io_threads, tools() if tools is not None else None)
                cls._pid = os.getpid()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for it (from any thread but the loop's)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def wait(self, work: Coroutine[Any, Any, T]) -> T:
        """What `work` returned, or its exception raised here, in a task body.

        So Celery's tracer reports the task as it went: `task_prerun` before the
        work, `task_success` (with the runtime) or `task_failure` after it, on any
        pool. Under a classic pool the body runs the work on this loop and waits.
        Under the asyncio pool (`workers.aio`, whose loop this is) the body runs in a
        greenlet of the consumer's thread: it hands the work to the pool (`defer`) and
        sleeps, blocking nothing, until the pool wakes it with the result or the exception.
        """
        if not defer(work):
            return self.run(work)
        pool = getcurrent().parent
        if pool is None:
            raise RuntimeError("a task body deferred its work to a caller that cannot wake it")
        result: T = pool.switch()
        return result

    def start_watch(self, *, stall: float, exit_after: float) -> LoopWatch:
        """Watch this loop (`tasks.runner.loopwatch`): a stall is logged, and ends the
        process once it lasts `exit_after` seconds."""
        watch = self.watch = LoopWatch(self.loop, stall=stall, exit_after=exit_after)
        watch.start()
        return watch

    def enter(self, what: str) -> None:
        """On the loop: what the current task does, named in a stall's log (`LoopWatch.enter`)."""
        if self.watch is not None:
            self.watch.enter(what)

    def leave(self) -> None:
        if self.watch is not None:
            self.watch.leave()

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """`enter` for the block (`LoopWatch.doing`)."""
        if self.watch is None:
            yield
            return
        with self.watch.doing(what):
            yield
