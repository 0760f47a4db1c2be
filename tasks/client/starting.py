"""A client's starts (`DurableClient.start`, `start_many`, `start_batch`): the prompts
checked, the runs written, and their first turns' messages sent.

Each verb's options become one `RunSpec` (`Starting.spec`), passed whole to the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import replace
from typing import Any

from relayq import new_id
from relayq.agents import Agent
from relayq.budgets import Budget
from store import OutboxRow, RunSpec, Started
from tasks.broker.dispatch import Dispatch
from tasks.client.known_agents import KnownAgents
from tasks.settings import Settings
from tasks.storeio import StoreDoor

__all__ = ["Starting"]


class Starting:
    """Starts one client's runs (the verbs' docstrings say what each does)."""

    def __init__(
        self,
        settings: Settings,
        store: StoreDoor,
        dispatch: Dispatch,
        publish: Callable[[Iterable[OutboxRow]], Coroutine[Any, Any, int]],
    ) -> None:
        self.settings = settings
        self.store = store
        self.dispatch = dispatch
        self.publish = publish
        self._known = KnownAgents(settings.agents)

    async def spec(
        self,
        agent: Agent | str,
        *,
        started_by: str | None,
        batch_id: str | None,
        budget: Budget | None,
    ) -> RunSpec:
        """How runs of `agent` start: with, when this process knows the agent, its tools'
        digest and the queue its turns go to."""
        name = agent.name if isinstance(agent, Agent) else agent
        known = agent if isinstance(agent, Agent) else self._known(name)
        spec = RunSpec(
            name,
            started_by=started_by,
            batch_id=batch_id,
            budget=None if budget is None else budget.to_wire(),
        )
        if known is None:
            return spec
        self.dispatch.serve(known)
        if known.mcp_servers:
            # Listing its servers' tools is the worker's: its first turn pins their digest.
            return replace(spec, queue=known.queue)
        digest = (await known.toolkit()).digest()
        return replace(spec, tools_digest=digest, queue=known.queue)

    async def one(
        self, spec: RunSpec, prompt: str, *, conversation_id: str | None, job_id: str | None
    ) -> str:
        """`DurableClient.start`: returns the run's id."""
        run_id = new_id("run")
        row = await self.store.create_run(
            spec,
            run_id=run_id,
            prompt=prompt,
            conversation_id=conversation_id,
            job_id=job_id,
            max_bytes=self.settings.max_answer_bytes,
        )
        await self.publish([row])
        return run_id

    async def many(
        self, spec: RunSpec, prompts: list[str], *, job_ids: list[str] | None
    ) -> list[str]:
        """`DurableClient.start_many`: returns the runs' ids, in order."""
        runs = [(new_id("run"), prompt) for prompt in prompts]
        rows = await self.store.create_runs(
            spec, runs, job_ids=job_ids, max_bytes=self.settings.max_answer_bytes
        )
        await self.publish(rows)
        return [run_id for run_id, _ in runs]

    async def batch(
        self,
        spec: RunSpec,
        jobs: Sequence[tuple[str, str]],
        *,
        name: str | None,
        restart_changed: bool,
        options: dict[str, Any] | None,
        budget: Budget | None,
    ) -> Started:
        """`DurableClient.start_batch`: returns every job's run."""
        loop = asyncio.get_running_loop()
        went = 0

        def send_chunk(rows: list[OutboxRow]) -> None:
            # On the store call's thread, as each chunk commits: its runs start at once.
            nonlocal went
            went += asyncio.run_coroutine_threadsafe(self.publish(rows), loop).result()

        # On a thread whatever the store: a start of many chunks takes seconds.
        started = await self.store.start_batch(
            spec,
            list(jobs),
            name=name,
            options=options,
            restart_changed=restart_changed,
            batch_budget=None if budget is None else budget.to_wire(),
            on_chunk=send_chunk,
            max_bytes=self.settings.max_answer_bytes,
        )
        if went:
            # Not when nothing went: a broker that is down would only be waited for again.
            await self.dispatch.batches_changed()
        return started
