"""Agents for the batch queues' tests (`RELAYQ_AGENTS=...,tests.durable.batch_agents`).

`paced` takes a while over each model call and writes, as the call starts, its
prompt and the worker it runs on (`RELAYQ_TEST_WORKER`) to `paced.log`: the
log's order is the order the worker took the turns in. The sleep is the
behaviour under test (a worker kept busy), not synchronisation.
"""

from __future__ import annotations

import asyncio
import os

from relayq import Agent, InProcessRequest, InProcessResponse
from tests.durable.agents import note, prompt_of

PACE = 0.25
"""Seconds each model call of `paced` takes."""


def started(prompt: str) -> str:
    """The line `paced.log` holds for a call on `prompt`."""
    return f"{prompt}\t{os.environ.get('RELAYQ_TEST_WORKER', '?')}"


async def paced_model(req: InProcessRequest) -> InProcessResponse:
    note("paced", started(prompt_of(req)))
    await asyncio.sleep(PACE)
    return InProcessResponse(content="paced")


paced = Agent("paced", paced_model)
