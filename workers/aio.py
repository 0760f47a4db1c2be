"""A Celery pool that keeps hundreds of turns in flight in one process.

Why: a turn spends nearly all its time waiting on the model. Prefork holds a
process per turn, threads a blocked thread per turn; both put two to a few
dozen calls in flight on a small machine. This pool runs each task's body
in the consumer, where relayq's bodies only *defer* a coroutine
(`tasks.runtime.defer`), runs the coroutines on the process's event loop,
and reports each task done, so its message is acknowledged (acks_late),
only when its coroutine has finished.

Guarantees are those of the durable tasks, unchanged: the claim, the
ledger and the outbox live in the store; the message stays unacknowledged
while its turn runs, and a worker that dies leaves it to be redelivered.
How many run at once is `--concurrency` (the broker prefetches that many).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import signals
from celery.concurrency.base import BasePool
from celery.utils.saferepr import saferepr

from tasks.runtime import Runtime, deferring

__all__ = ["AsyncioPool"]

log = logging.getLogger(__name__)


class AsyncioPool(BasePool):
    """Task bodies inline, deferred coroutines on one event loop, acks when they end."""

    body_can_be_buffer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._running: set[Future[Any]] = set()
        initargs = self.options.get("initargs") or (None, None)
        signals.worker_process_init.send(sender=initargs[1])

    def on_start(self) -> None:
        # Threads here hand the GIL back and forth at every database or socket
        # call; at the default 5 ms switch interval each handoff can stall a
        # call that long, and hundreds of turns queue behind those stalls.
        sys.setswitchinterval(0.0005)
        # The runtime owns the loop (and sizes its I/O threads to the store).
        self._loop = Runtime.current().loop

    def on_stop(self) -> None:
        # A warm shutdown lets the turns in flight finish; their messages are acked then.
        deadline = time.monotonic() + 30
        while self._running and time.monotonic() < deadline:
            time.sleep(0.05)

    def on_apply(
        self,
        target: Callable[..., Any],
        args: Any = None,
        kwargs: Any = None,
        callback: Callable[[Any], None] | None = None,
        accept_callback: Callable[[int, float], None] | None = None,
        **_: Any,
    ) -> None:
        started = time.monotonic()
        if accept_callback is not None:
            accept_callback(os.getpid(), started)
        with deferring() as deferred:
            ret = target(*(args or ()), **(kwargs or {}))
        if deferred and (callback is None or (isinstance(ret, tuple) and ret[0])):
            for coro in deferred:  # the body failed after deferring: nothing will await them
                coro.close()
            deferred = []
        if not deferred or callback is None:
            if callback is not None:
                callback(ret)
            return
        future = asyncio.run_coroutine_threadsafe(_all(deferred), self._loop.loop)
        self._running.add(future)
        name = args[0] if args else "task"
        task_id = args[1] if args and len(args) > 1 else "?"
        future.add_done_callback(lambda f: self._finished(f, name, task_id, started, callback))

    def _finished(
        self,
        future: Future[Any],
        name: str,
        task_id: str,
        started: float,
        callback: Callable[[Any], None],
    ) -> None:
        self._running.discard(future)
        runtime = time.monotonic() - started
        try:
            result = future.result()
        except BaseException as exc:
            log.error("Task %s[%s] failed in %.3fs: %s", name, task_id, runtime, exc)
            callback((1, ExceptionInfo(), runtime))
            return
        # The tracer logged the body's "deferred"; this is what the task did.
        log.info("Task %s[%s] finished in %.3fs: %s", name, task_id, runtime, result)
        callback((0, saferepr(result), runtime))

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        info.update({"max-concurrency": self.limit, "in-flight": len(self._running)})
        return info

    @property
    def num_processes(self) -> int:
        return 1


async def _all(work: list[Coroutine[Any, Any, Any]]) -> Any:
    result = None
    for coro in work:
        result = await coro
    return result
