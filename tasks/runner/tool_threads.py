"""The threads sync tools run on: never the store's, and a stuck one costs one thread.

A sync tool runs in a thread (`asyncio.to_thread`: the loop's default executor, which a
worker sets to a `ToolThreads`). The store's calls have threads of their own
(`tasks.runner.loop.LoopThread.executor`), so tools that hold every thread here never keep
a store call waiting.

A call whose caller stopped waiting for it (the tool's timeout, the turn's time limit,
a cancelled turn) while it still runs is abandoned: Python cannot stop a thread, so it
runs on, but it no longer counts as one of the pool's threads, and a new thread takes
the next call. Each abandoned call is counted (`relayq_tool_threads_abandoned_total`,
and those still running: `relayq_tool_threads_stuck`); past `stuck_limit` still
running at once, `on_stuck` is told once (the worker retires: `Runtime.retire`). The
threads are daemons: a stuck one never keeps the process from ending (SIGTERM).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from tasks.observability.metrics import count_abandoned_tool_thread, set_stuck_tool_threads

__all__ = ["ToolThreads"]

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")


class _Call(Future[Any]):
    """A call's future: cancelled by its caller while it runs, its thread is abandoned."""

    def __init__(self, pool: ToolThreads) -> None:
        super().__init__()
        self._pool = pool
        self.thread: _Thread | None = None

    def cancel(self) -> bool:
        # asyncio cancels the future it wraps when its awaiting task is cancelled; a
        # running call cannot be cancelled, and that is when its thread is let go.
        if super().cancel():
            return True
        if self.running():
            self._pool._abandon(self)
        return False


@dataclass(eq=False)
class _Work:
    future: _Call
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Thread(threading.Thread):
    abandoned = False
    """Its call was given up on: it ends once the call returns."""


class ToolThreads(ThreadPoolExecutor):
    """Up to `size` threads at once for calls someone waits for, and any number stuck.

    A `ThreadPoolExecutor` in name only (asyncio takes no other as a loop's default):
    its `submit` and `shutdown` are these, and it starts none of that class's threads.
    """

    def __init__(
        self,
        size: int,
        *,
        stuck_limit: int,
        on_stuck: Callable[[int], None] | None = None,
        name: str = "relayq-tool",
    ) -> None:
        if size < 1 or stuck_limit < 1:
            raise ValueError("ToolThreads needs at least one thread and a stuck limit of 1")
        super().__init__(max_workers=1)
        self.size = size
        self.stuck_limit = stuck_limit
        self._on_stuck = on_stuck
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[_Thread] = set()  # not abandoned
        self._idle = 0
        """Threads waiting for a call no one has reserved them for."""
        self._backlog = 0
        """Calls queued with no thread reserved for them (every thread busy)."""
        self._started = 0
        self._stuck = 0
        self._told = False
        self._shutdown = False
        self.abandoned = 0
        """Calls abandoned in all."""

    @property
    def stuck(self) -> int:
        """Abandoned calls still running."""
        return self._stuck

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot run a tool call after the tool threads shut down")
            future = _Call(self)
            self._work.put(_Work(future, fn, args, kwargs))
            # Each call queued is some thread's from here on: an idle one's, a new one's,
            # or the next to finish (the backlog). Counting an idle thread only once it
            # dequeued would let two calls at once both count on it, one behind the other.
            if self._idle > 0:
                self._idle -= 1
            else:
                self._backlog += 1
                self._grow()
        return future

    def _grow(self) -> None:
        """Under the lock: a new thread for a call of the backlog, while the pool has room."""
        if self._backlog > 0 and len(self._threads) < self.size:
            self._backlog -= 1
            self._started += 1
            thread = _Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        assert isinstance(me, _Thread)
        while True:
            work = self._work.get()  # one call reserved for this thread, or a sentinel
            if work is None:
                with self._lock:
                    self._threads.discard(me)
                return
            if work.future.set_running_or_notify_cancel():
                work.future.thread = me
                try:
                    result = work.fn(*work.args, **work.kwargs)
                except BaseException as exc:
                    work.future.set_exception(exc)
                else:
                    work.future.set_result(result)
                work.future.thread = None
            del work  # nothing of the call stays alive with an idle thread
            with self._lock:
                if me.abandoned:
                    self._stuck -= 1
                    set_stuck_tool_threads(self._stuck)
                    return  # replaced when it was abandoned
                if self._backlog > 0:
                    self._backlog -= 1  # the next call queued is this thread's
                else:
                    self._idle += 1

    def _abandon(self, future: _Call) -> None:
        with self._lock:
            thread = future.thread
            if thread is None or thread.abandoned or future.done():
                return
            thread.abandoned = True
            self._threads.discard(thread)
            self._stuck += 1
            self.abandoned += 1
            stuck = self._stuck
            tell = stuck >= self.stuck_limit and not self._told
            self._told = self._told or tell
            self._grow()  # the calls waiting behind it get a thread
        count_abandoned_tool_thread()
        set_stuck_tool_threads(stuck)
        log.warning(
            "a tool call was given up on while its thread still ran it; the thread is "
            "left to finish on its own (%d such threads now)",
            stuck,
        )
        if tell and self._on_stuck is not None:
            with contextlib.suppress(Exception):
                self._on_stuck(stuck)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; `wait` for the threads still serving callers, never for
        abandoned ones."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    work = self._work.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work.future.cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                if not thread.abandoned:
                    thread.join()
