"""A worker's liveness is its event loop turning, not a thread beating beside it.

The loop ticks (a callback every quarter of the bound); a watchdog thread reads the
last tick. When the loop has not ticked for `stall` seconds (`RELAYQ_LOOP_STALL`),
something holds it: a blocking call inside an `async def` tool, most often. The
watchdog then

- logs the stack of the loop's thread and what it was doing (the tool, the agent, the
  run: `LoopWatch.doing`), never an argument, a local or a prompt;
- counts the stall (`relayq_loop_stalls_total`, and its length once it ends);
- tells the heartbeat to stop (`stalled`), so the sweepers of other workers take
  this one's claims, each taken over counted as a death of its turn (`RELAYQ_CRASH_LIMIT`);
- past `exit_after` seconds (`RELAYQ_LOOP_STALL_EXIT`), ends the process with
  `EXIT_STALLED`, for its supervisor (Celery's prefork pool, systemd, compose) to start
  a new one: a loop held that long may never come back, and a process that answers
  pings while running nothing is worse than none.

A loop that turns again before then is well again: its heartbeat goes on.

The watchdog checks its own timing too: when it wakes much later than it asked (the
whole process stopped, a debugger, a host suspended), the loop is given a fresh start
rather than blamed for time nobody ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from types import FrameType

from tasks.observability.metrics import count_loop_stall, observe_loop_stall

__all__ = ["EXIT_STALLED", "LoopWatch"]

log = logging.getLogger(__name__)

EXIT_STALLED = 70
"""The exit status of a process ended because its loop stayed stalled (EX_SOFTWARE)."""

_DOING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("doing", default=())
"""What the current task and those it came from said they do, outermost first."""

STACK_FRAMES = 30
"""The innermost frames of the loop's stack a stall's log shows."""


class LoopWatch:
    """Watches one event loop from a daemon thread; `start` on the loop's owner's side."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stall: float,
        exit_after: float,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.loop = loop
        self.stall = stall
        self.exit_after = exit_after
        self._exit = exit
        self._every = max(stall / 4, 0.01)
        self._tick = time.monotonic()
        self._stalled_at: float | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self._doing: weakref.WeakKeyDictionary[asyncio.Task[object], tuple[str, ...]] = (
            weakref.WeakKeyDictionary()
        )
        self.stalls = 0
        """Stalls seen, in all."""

    @property
    def stalled(self) -> bool:
        """Whether the loop has not turned for the bound, right now."""
        return self._stalled_at is not None

    def start(self) -> None:
        """Tick on the loop, and watch from a thread of its own (from any thread)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._tick = time.monotonic()
        self.loop.call_soon_threadsafe(self._first_tick)
        self._thread = threading.Thread(target=self._watch, name="relayq-loopwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None

    def enter(self, what: str) -> None:
        """On the loop: the current task does `what` (a turn, a tool) until it `leave`s, or
        ends; a stall's log names it, with what the tasks it came from said (a tool's
        task is started by its turn's). `what` names things, never their content."""
        self._say((*_DOING.get(), what))

    def leave(self) -> None:
        """On the loop: the current task is done with what it last `enter`ed."""
        self._say(_DOING.get()[:-1])

    def _say(self, labels: tuple[str, ...]) -> None:
        # The context's copy goes to the tasks started from here; the task's own is what
        # the watchdog's thread can read.
        _DOING.set(labels)
        task = asyncio.current_task()
        if task is not None:
            self._doing[task] = labels

    @contextlib.contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """`enter` for the block; leaving it forgets what was entered inside and never
        left too (a tool's call cancelled midway)."""
        before = _DOING.get()
        self.enter(what)
        try:
            yield
        finally:
            self._say(before)

    # -- on the loop ------------------------------------------------------------------------

    def _first_tick(self) -> None:
        self._loop_thread = threading.get_ident()
        self._on_tick()

    def _on_tick(self) -> None:
        self._tick = time.monotonic()
        if not self._stop.is_set():
            self.loop.call_later(self._every, self._on_tick)

    # -- on the watchdog's thread -----------------------------------------------------------

    def _watch(self) -> None:
        asked = time.monotonic()
        while not self._stop.wait(self._every):
            now = time.monotonic()
            if now - asked > self._every + self.stall / 2:
                # This thread ran late too: the whole process stood still, not the loop.
                self._tick = now
            asked = now
            self.check(now)

    def check(self, now: float) -> None:
        """Look at the loop's last tick at `now` (monotonic): the watchdog's every look."""
        quiet = now - self._tick
        if self._stalled_at is None:
            if quiet >= self.stall:
                since = self._tick
                self.stalls += 1
                count_loop_stall()
                log.error(
                    "the event loop has not turned for %.1f s: %s; this worker's heartbeat "
                    "stops, so other workers take its runs, and it ends after %.0f s more "
                    "unless the loop turns again. The loop's thread is here:\n%s",
                    quiet,
                    self.what_it_does(),
                    max(self.exit_after - quiet, 0.0),
                    self.stack(),
                )
                self._stalled_at = since  # last: whoever sees it stalled finds it logged
            return
        if quiet < self.stall:
            seconds = self._tick - self._stalled_at
            self._stalled_at = None
            log.warning("the event loop turns again, after %.1f s: heartbeats go on", seconds)
            observe_loop_stall(seconds)
        elif quiet >= self.exit_after:
            log.critical(
                "the event loop has not turned for %.1f s: %s; the process ends (exit %d) for "
                "its supervisor to start a new one. The loop's thread is here:\n%s",
                quiet,
                self.what_it_does(),
                EXIT_STALLED,
                self.stack(),
            )
            observe_loop_stall(quiet)
            for handler in logging.getLogger().handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            self._stop.set()  # once: an exit that returns (a test's) is not asked again
            self._exit(EXIT_STALLED)

    def what_it_does(self) -> str:
        """What the loop's current task said it does (`doing`), or that it said nothing."""
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            task = None
        labels = self._doing.get(task, ()) if task is not None else ()
        if labels:
            return ", in ".join(reversed(labels))
        return "no turn or tool said what it does" if task is None else f"task {task.get_name()}"

    def stack(self) -> str:
        """The loop thread's innermost frames: files, lines and functions, never values."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            return "  (the loop's thread is not running)"
        frames = traceback.extract_stack(frame)[-STACK_FRAMES:]
        return "".join(traceback.format_list(frames)).rstrip()
