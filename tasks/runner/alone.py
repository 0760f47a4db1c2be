"""Turns that run alone: a few processes of the worker's own, each running one turn at a time.

Why: the asyncio pool runs hundreds of turns in one process, so a turn whose tool kills
its process (`os._exit`, a crash in a C extension, the kernel's OOM killer) or blocks its
loop takes every turn beside it down, and nobody can tell which of them did it. Such a
worker's runs are marked suspect (`store.transitions.died_holding`), and a suspect run's
next turn runs here: if it dies again, it dies alone, and that death is counted against it
(`RELAYQ_CRASH_LIMIT`). A turn that ends clears the mark.

Why processes of the worker's own rather than a queue that isolated workers serve: every
worker can run them, so a deployment needs nothing more (no second kind of worker to run
and size), and the turn keeps its claim, its broker message and its place in its queue;
the worker's warm shutdown waits for them as for its other turns. Started when first
needed and kept (`RELAYQ_ALONE_PROCESSES` of them at most, each stopped after a minute
idle), so a worker that died beside 40 runs costs 40 turns in a few processes, not 40
interpreter starts.

The protocol is one JSON line each way per turn, on a pipe of the child's own (`serve`):
what a tool prints goes to the child's stderr, the worker's log. A child whose parent
dies exits at once (its stdin closes): its claim is the parent's, and other workers'
sweepers take it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from relayq import RelayqError

__all__ = ["AloneError", "AloneProcesses", "ProcessDied", "serve"]

log = logging.getLogger(__name__)

IDLE_EXIT = 60.0
"""Seconds a child waits for its next turn before it is stopped."""

REPLY_LIMIT = 1 << 20
"""Bytes of one reply line, at most (a turn's outcome: a summary and a message)."""

Job = dict[str, Any]
Reply = dict[str, Any]


class ProcessDied(RelayqError):
    """The process running a turn alone ended before it answered."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(returncode)
        self.returncode = returncode

    @property
    def how(self) -> str:
        """`signal 9 (SIGKILL)`, `exit 70`, or `no answer in time`."""
        code = self.returncode
        if code is None:
            return "no answer in time"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"signal {-code} ({signal.Signals(-code).name})"
            return f"signal {-code}"
        return f"exit {code}"

    def __str__(self) -> str:
        return f"the process running the turn alone died ({self.how})"


class AloneError(RelayqError):
    """A turn run alone met an error its process could only report by type."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(run_id, error)
        self.run_id = run_id
        self.error = error

    def __str__(self) -> str:
        return f"run {self.run_id}: the turn met {self.error} in its process of its own"


class _Child:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.idle_since = time.monotonic()

    @property
    def pid(self) -> int:
        return self.process.pid

    async def ask(self, job: Job, timeout: float) -> Reply:
        """The child's reply to `job`; ProcessDied if it ends first, or gives no answer
        within `timeout` (it is killed then)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(job).encode() + b"\n")
            await self.process.stdin.drain()
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            await self.kill()
            raise ProcessDied(None) from None
        except (BrokenPipeError, ConnectionResetError):
            line = b""
        if not line.endswith(b"\n"):  # the child ended: EOF, or a line cut short
            raise ProcessDied(await self.process.wait())
        reply: Reply = json.loads(line)
        return reply

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        """Ask the child to end (its stdin closed), and kill it if it does not soon."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 5.0)
        except TimeoutError:
            await self.kill()


class AloneProcesses:
    """Up to `size` child processes started with `command`, each running one job at a time.

    Used from one event loop (the worker's). A job waits for a free child; a child that
    died, or said it retires, is not used again.
    """

    def __init__(self, command: Sequence[str], *, size: int, idle: float = IDLE_EXIT) -> None:
        self.command = list(command)
        self.size = size
        self.idle = idle
        self._free: list[_Child] = []
        self._busy: set[_Child] = set()
        self._slots: asyncio.Semaphore | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.started = 0
        """Children started so far."""

    @property
    def children(self) -> list[int]:
        """The pids of the children alive now."""
        return [c.pid for c in (*self._free, *self._busy)]

    async def run(self, job: Job, *, timeout: float) -> Reply:
        """The reply of a child to `job`; ProcessDied if the child died running it."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
            self._reaper = asyncio.create_task(self._reap_idle())
        async with self._slots:
            child = self._free.pop() if self._free else await self._start()
            self._busy.add(child)
            try:
                reply = await child.ask(job, timeout)
            except BaseException:
                # Died, or this job was cancelled midway: the child is not used again.
                self._busy.discard(child)
                await child.kill()
                raise
            self._busy.discard(child)
            if reply.get("retiring"):
                await child.stop()
            else:
                child.idle_since = time.monotonic()
                self._free.append(child)
            return reply

    async def _start(self) -> _Child:
        process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=REPLY_LIMIT,
        )
        self.started += 1
        log.info("started process %d to run turns alone", process.pid)
        return _Child(process)

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle / 4, 0.05))
            now = time.monotonic()
            idle = [c for c in self._free if now - c.idle_since > self.idle]
            for child in idle:
                self._free.remove(child)
                await child.stop()

    async def close(self) -> None:
        """Stop every child (a busy one is killed: its job's caller is going away too)."""
        if self._reaper is not None:
            self._reaper.cancel()
        free, self._free = self._free, []
        busy, self._busy = self._busy, set()
        await asyncio.gather(*(c.stop() for c in free), *(c.kill() for c in busy))


def serve(handle: Callable[[Job], Reply], *, retiring: Callable[[], bool]) -> None:
    """A child's main loop: a job a line from stdin, its reply a line on the original
    stdout; the process exits when stdin closes (its parent went away), at once.

    File descriptors 0 and 1 are taken over first, so that a tool that reads stdin or
    prints reads nothing and prints to stderr, never into the protocol.
    """
    jobs: IO[str] = os.fdopen(os.dup(0), "r")
    replies: IO[str] = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    arrived: list[Job] = []
    ready = threading.Condition()

    def read() -> None:
        # Its own thread, so that a parent gone is noticed while a job runs.
        for line in jobs:
            with ready:
                arrived.append(json.loads(line))
                ready.notify()
        os._exit(0)  # stdin closed: the parent ended, or stopped this child

    threading.Thread(target=read, name="relayq-alone-jobs", daemon=True).start()
    while True:
        with ready:
            ready.wait_for(lambda: bool(arrived))
            job = arrived.pop(0)
        reply = handle(job)
        if retiring():
            reply["retiring"] = True
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
