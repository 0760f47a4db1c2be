"""A Celery pool that keeps hundreds of turns in flight in one process.

Why: a turn spends nearly all its time waiting on the model. Prefork holds a
process per turn, threads a blocked thread per turn; both put two to a few
dozen calls in flight on a small machine. This pool runs each task in the
consumer and its coroutine on the process's event loop, and reports the task
done, so its message is acknowledged (acks_late), only when its coroutine has
finished.

Celery's own tracer runs each task, in a greenlet of the consumer's thread
(Celery keeps each greenlet's task request apart, as under its gevent pool).
A body that waits for its coroutine (`tasks.runner.turn.task.run_turn`) defers it
(`tasks.runner.loop.defer`) and sleeps in its greenlet; the pool wakes it with the
coroutine's result, or raises the coroutine's exception there, when the
coroutine ends. So the tracer sees what the turn really did: `task_prerun`
before it, `task_success` with its result and runtime, `task_failure` with its
exception, `task_retry` for a retry, then `task_postrun`; and the pool hands
Celery the tracer's outcome, from which Celery's request sends the task events
and acknowledges the message, as under prefork. Every relayq task waits so
(`tasks.runner.loop.LoopThread.wait`). A body that only defers and returns is
reported done when its coroutine ends, but Celery's signals fire when the body
returns.

Guarantees are those of the durable tasks, unchanged: the claim, the
ledger and the outbox live in the store; the message stays unacknowledged
while its turn runs, and a worker that dies leaves its run to the sweeper
(`workers.doorbell`). How many run at once is `--concurrency` (the broker
prefetches that many).

A lost broker connection: Celery cancels the tasks whose messages can no
longer be acknowledged (`worker_cancel_long_running_tasks_on_connection_loss`).
A cancelled turn is *detached*: its coroutine runs to its end and stores what
it did, but it is never reported to Celery, so nothing is acknowledged on the
dead connection; its message is gone with the broker, or comes back and finds
the turn done. A finished turn is reported to Celery (and its greenlet woken)
from a reader of the consumer's event loop (kombu's hub), on the consumer's
thread, as prefork's results are, so a cancel never races a report. The pool
therefore needs the consumer's event loop, which Celery runs for every
transport relayq supports (Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import signals
from celery.concurrency.base import BasePool
from celery.utils.saferepr import saferepr
from celery.utils.threads import LocalStack
from celery.worker import state as worker_state
from greenlet import greenlet  # type: ignore[import-untyped]

from tasks.runner.alone import AloneProcesses
from tasks.runner.loop import deferring
from tasks.runner.memory import MemoryBound
from tasks.runner.process import current_runtime
from tasks.runner.runtime import EXIT_RETIRED

__all__ = ["AsyncioPool", "requests_kept_apart"]

log = logging.getLogger(__name__)

BodyResult = tuple[int, Any, float]
"""What Celery's task callback takes: (failed, result or ExceptionInfo, runtime)."""


class _Turn:
    """A task whose coroutine runs, as Celery holds it.

    Celery internal: `Request.execute_using_pool` keeps a weak reference to what
    `pool.apply_async` returns (prefork's is an `ApplyResult`), and its `cancel`
    (a lost broker connection, a cold shutdown) and `terminate` (revoke with
    terminate) call `terminate(signal)` on it.
    """

    def __init__(
        self,
        name: str,
        task_id: str,
        started: float,
        callback: Callable[[BodyResult], None] | None,
        trace: greenlet | None,
    ) -> None:
        self.name = name
        self.task_id = task_id
        self.started = started
        self.callback = callback
        self.trace = trace
        """Celery's tracer, asleep in the task body until the coroutine ends; None
        when the body returned after deferring it."""
        self.result: Any = None
        self.error: BaseException | None = None
        self.runtime = 0.0
        self.detached = False
        """Never reported to Celery: its message can no longer be acknowledged."""

    def terminate(self, signal: int | None = None) -> None:
        # The coroutine is not interrupted: a turn stopped halfway would hold its
        # claim for nothing; it ends, stores what it did, and goes unreported.
        self.detached = True


class AsyncioPool(BasePool):
    """Celery's tracer in a greenlet per task, coroutines on one event loop, acks when they end."""

    body_can_be_buffer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._running: set[_Turn] = set()
        self._done: deque[_Turn] = deque()
        self._hub: Any = None
        # The event loop's thread writes a byte here when a turn finishes.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        initargs = self.options.get("initargs") or (None, None)
        signals.worker_process_init.send(sender=initargs[1])

    def on_start(self) -> None:
        # Threads here hand the GIL back and forth at every database or socket
        # call; at the default 5 ms switch interval each handoff can stall a
        # call that long, and hundreds of turns queue behind those stalls.
        sys.setswitchinterval(0.0005)
        if not requests_kept_apart():
            raise RuntimeError(
                "the asyncio pool needs Celery's task requests kept per greenlet: "
                "unset USE_FAST_LOCALS"
            )
        # The runtime owns the loop (and sizes its I/O threads to the store).
        rt = current_runtime()
        self._loop = rt.loop
        # Turns share this process: a suspect one runs in a process of its own.
        rt.alone = AloneProcesses(
            [sys.executable, "-m", "workers.alone"], size=rt.settings.worker.alone_processes
        )
        rt.on_retire.append(self._retire)
        bound = rt.settings.worker.max_memory
        if bound is not None:
            rt.heartbeat.checks.append(MemoryBound(bound, rt.retire).check)

    def _retire(self, reason: str) -> None:
        """The worker retires (`Runtime.retire`): a warm shutdown, as SIGTERM's, but ending
        with `EXIT_RETIRED` for the supervisor to start another; from any thread."""
        worker_state.should_stop = EXIT_RETIRED
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"r")  # the consumer's loop sees it at its next round

    def register_with_event_loop(self, loop: Any) -> None:
        # Celery (its `Pool` bootstep, `BasePool` API) passes the consumer's kombu
        # `Hub` each time the consumer's event loop starts, again after every
        # reconnection (a reset hub has forgotten its readers). Finished turns are
        # reported from a reader (`Hub.add_reader`): what a report schedules (the
        # ack, through `Hub.call_soon`) runs at the start of the hub's next round,
        # and a hub reset after a lost connection runs no reader.
        self._hub = loop
        loop.add_reader(self._wake_r, self._on_wake)

    def on_stop(self) -> None:
        # A warm shutdown lets the turns in flight finish; their messages are acked then
        # (the hub's event loop no longer runs: report them here, on its thread).
        deadline = time.monotonic() + 30
        while self._running and time.monotonic() < deadline:
            self._report()
            time.sleep(0.05)
        self._report()
        rt = current_runtime()
        if rt.alone is not None:
            with contextlib.suppress(Exception):
                rt.loop.run(rt.alone.close(), timeout=10)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        # `BasePool` API: Celery's `Request.cancel` / `terminate` call it with the
        # pid a task runs in, this process for every turn: nothing to kill (the
        # base class raises, and the cancel stops there). The turn itself is
        # detached through the `_Turn` that `on_apply` returned.
        pass

    def on_apply(
        self,
        target: Callable[..., Any],
        args: Any = None,
        kwargs: Any = None,
        callback: Callable[[Any], None] | None = None,
        accept_callback: Callable[[int, float], None] | None = None,
        **_: Any,
    ) -> _Turn | None:
        # `target` is Celery's tracer (`BasePool` API: it returns the outcome the
        # callback takes). Each runs in a greenlet of its own, whose parent is
        # this one: a body that waits for its coroutine switches back here.
        started = time.monotonic()
        if accept_callback is not None:
            accept_callback(os.getpid(), started)
        trace = greenlet(target)
        deferred: list[Coroutine[Any, Any, Any]] = []
        try:
            with deferring() as deferred:
                ret = trace.switch(*(args or ()), **(kwargs or {}))
        except BaseException:
            _close(deferred)  # the tracer itself failed: nothing will await them
            raise
        if trace.dead:
            # The body returned: it ran to its end, or it only deferred its work.
            if deferred and (callback is None or (isinstance(ret, tuple) and ret[0])):
                _close(deferred)  # the body failed after deferring: nothing will await them
                deferred = []
            if not deferred or callback is None:
                if callback is not None:
                    callback(ret)
                return None
            trace = None
        turn = _Turn(
            args[0] if args else "task",
            args[1] if args and len(args) > 1 else "?",
            started,
            callback,
            trace,
        )
        self._running.add(turn)
        future = asyncio.run_coroutine_threadsafe(_all(deferred), self._loop.loop)
        future.add_done_callback(lambda f: self._finished(f, turn))
        return turn

    def _finished(self, future: Future[Any], turn: _Turn) -> None:
        """On the event loop's thread: keep the outcome, and wake the consumer to report it."""
        turn.runtime = time.monotonic() - turn.started
        try:
            turn.result = future.result()
        except BaseException as exc:
            turn.error = exc
        self._done.append(turn)
        self._running.discard(turn)
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            os.write(self._wake_w, b"\0")

    def _on_wake(self) -> None:
        """The hub's reader, on the consumer's thread."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 1 << 16)
        self._report()

    def _report(self) -> None:
        """On the consumer's thread: finish each ended turn's tracer, and hand its
        outcome to Celery, which sends its task event and acknowledges its message."""
        while self._done:
            turn = self._done.popleft()
            outcome = self._resume(turn) if turn.trace is not None else _outcome(turn)
            if turn.detached:
                log.warning(
                    "Task %s[%s] finished after its broker connection was lost; "
                    "its message is not acknowledged",
                    turn.name,
                    turn.task_id,
                )
                continue
            if turn.callback is None:
                continue
            try:
                turn.callback(outcome)
            except Exception:  # one task's report must not stop the consumer
                log.exception("could not report task %s[%s]", turn.name, turn.task_id)

    def _resume(self, turn: _Turn) -> BodyResult:
        """Wake the body with its coroutine's outcome; the tracer ends the task as
        Celery does, and returns the callback's outcome."""
        assert turn.trace is not None
        error, turn.error = turn.error, None
        try:
            if error is None:
                ret = turn.trace.switch(turn.result)
            else:
                ret = turn.trace.throw(type(error), error, error.__traceback__)
            if not turn.trace.dead:  # a body waits once: it is told so, and ends
                ret = turn.trace.throw(RuntimeError("a task body may wait for one coroutine"))
        except BaseException as exc:
            # Only what the coroutine raised is the task's to report (the tracer lets
            # through what is not an Exception, e.g. a CancelledError, as Celery's
            # pools let a worker's SystemExit through); anything else is the consumer's.
            if exc is not error:
                raise
            return (1, ExceptionInfo((type(exc), exc, exc.__traceback__)), turn.runtime)
        finally:
            turn.result = None
        return ret

    def _get_info(self) -> dict[str, Any]:
        info = super()._get_info()
        info.update({"max-concurrency": self.limit, "in-flight": len(self._running)})
        return info

    @property
    def num_processes(self) -> int:
        # Celery reads it as the turns a worker runs at once: the prefetch count it
        # restores after every broker reconnect is `num_processes * multiplier`.
        return int(self.limit)


def requests_kept_apart() -> bool:
    """Whether Celery keeps a task request (and current task) per greenlet.

    Celery internal: `Task.request_stack` and `celery._state._task_stack` are
    `celery.utils.threads.LocalStack`s, keyed by `greenlet.getcurrent()` when
    greenlet is installed, unless `USE_FAST_LOCALS` makes them thread-locals. The
    tracers asleep in this pool's greenlets each need their own.
    """
    stack = LocalStack()
    stack.push("consumer")
    return greenlet(lambda: stack.top).switch() is None


def _outcome(turn: _Turn) -> BodyResult:
    """The outcome of a body that only deferred its coroutine (Celery's signals have
    fired when it returned); logged here, since the tracer logged only "deferred"."""
    if turn.error is not None:
        exc, turn.error = turn.error, None
        log.error("Task %s[%s] failed in %.3fs: %s", turn.name, turn.task_id, turn.runtime, exc)
        return (1, ExceptionInfo((type(exc), exc, exc.__traceback__)), turn.runtime)
    log.info(
        "Task %s[%s] finished in %.3fs: %s", turn.name, turn.task_id, turn.runtime, turn.result
    )
    return (0, saferepr(turn.result), turn.runtime)


def _close(work: list[Coroutine[Any, Any, Any]]) -> None:
    for coro in work:
        coro.close()


async def _all(work: list[Coroutine[Any, Any, Any]]) -> Any:
    result = None
    for coro in work:
        result = await coro
    return result
