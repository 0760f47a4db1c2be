"""Eager mode: each task message runs at once, in the calling process, instead of being sent.

Celery's `task_always_eager`, for durable runs: `DurableClient(eager=True)`
drives every turn with the workers' own code (`tasks.runner.turn.task.drive_turn`,
`tasks.runner.turn.answers.apply_answer`) against the same store, so a test or a notebook
runs an agent with no broker and no worker, and gets the results a worker
would store. No Celery app is built and no broker connection is opened.

A message leads to the next (a turn's outbox holds the following turn), so
`EagerDispatch` queues it behind the one running, and the first call
runs them all, in order, until the run settles: done, pending, failed,
cancelled or incomplete. A retry waits its backoff first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from relayq.agents import Agent, registered_agents
from store import Database, OutboxRow, forget_worker
from store.outbox import ANSWER_TASK, TURN_TASK
from tasks.broker.dispatch import Dispatch
from tasks.runner.runtime import Runtime
from tasks.runner.turn.answers import apply_answer
from tasks.runner.turn.task import TurnFailed, drive_turn
from tasks.settings import Settings

__all__ = ["EagerDispatch", "EagerRuntime"]

log = logging.getLogger(__name__)

_running: ContextVar[deque[OutboxRow] | None] = ContextVar("relayq_eager_running", default=None)


class _Agents(Mapping[str, Agent]):
    """The agents registered in this process now (not when the runtime was built), and the
    unregistered ones a caller handed over."""

    def __init__(self) -> None:
        self.own: dict[str, Agent] = {}

    def _all(self) -> dict[str, Agent]:
        return {**registered_agents(), **self.own}

    def __getitem__(self, name: str) -> Agent:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class EagerRuntime(Runtime):
    """A `Runtime` whose dispatch runs each message here rather than sending it.

    Its claims name it as a worker with a heartbeat, written while it runs
    turns: a worker sharing the store never takes a turn from it.
    """

    def __init__(self, settings: Settings, *, db: Database | None = None) -> None:
        self._known = _Agents()
        super().__init__(settings, db=db, agents=self._known)
        self.beating = False
        """Its heartbeat has been written: it signs off at close."""

    def _make_dispatch(self) -> Dispatch:
        return EagerDispatch(self)

    def adopt(self, agent: Agent) -> None:
        """Serve `agent` under its name, registered or not (an `Agent(..., register=False)`)."""
        self._known.own[agent.name] = agent

    def close(self) -> None:
        """Sign off, so nothing waits on this process's heartbeat."""
        if self.beating:
            forget_worker(self.db, self.worker_id)
            self.beating = False


class EagerDispatch(Dispatch):
    """Runs each message in this process: after the message running now, or at once if
    none is; the first call runs them all, in order, until the run settles."""

    def __init__(self, rt: EagerRuntime) -> None:
        self._rt = rt
        self._going = 0
        """Messages being run here now, from however many callers."""

    async def __call__(self, rows: list[OutboxRow]) -> int:
        if rows:
            # Marked sent, so no sweeper sends them to a worker meanwhile.
            await self.mark(rows)
            running = _running.get()
            if running is not None:
                running.extend(rows)
            else:
                await self._run_all(rows)
        return 0

    async def mark(self, rows: list[OutboxRow]) -> None:
        await self._rt.store.mark_published(rows)

    def serve(self, agent: Agent) -> None:
        self._rt.adopt(agent)

    def close(self) -> None:
        self._rt.close()

    async def _run_all(self, rows: list[OutboxRow]) -> None:
        rt = self._rt
        queue = deque(rows)
        token = _running.set(queue)
        self._going += 1
        try:
            # The heartbeat's thread, as a worker's (`tasks.runner.heartbeat`), while turns run.
            await rt.store.call(rt.heartbeat.start)
            rt.beating = True
            while queue:
                row = queue.popleft()
                if row.countdown:
                    await asyncio.sleep(row.countdown)
                await self._run(row)
        finally:
            self._going -= 1
            if not self._going:
                rt.heartbeat.stop()
            _running.reset(token)

    async def _run(self, row: OutboxRow) -> None:
        if row.task == TURN_TASK:
            run_id, version = row.args
            try:
                await drive_turn(self._rt, None, str(run_id), int(version))
            except TurnFailed as exc:  # stored on the run, as a worker stores it
                log.info("%s", exc)
        elif row.task == ANSWER_TASK:
            await apply_answer(self._rt, str(row.args[0]))
        else:
            raise ValueError(f"eager mode cannot run a {row.task} message")
