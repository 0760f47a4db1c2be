"""Agents for the batch queues' tests (`RELAYQ_AGENTS=...,tests.durable.batch_agents`).

`paced` takes a while over each model call and writes, as the call starts, its
prompt and the worker it runs on (`RELAYQ_TEST_WORKER`) to `paced.log`: the
log's order is the order the worker took the turns in. The sleep is the
behaviour under test (a worker kept busy), not synchronisation. `stepping` does
the same over runs of `STEPS` turns (a local tool between them), its prompt
followed by the turn's number from 0 (`... t1`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from relayq import (
    Agent,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    ToolContext,
    define_tool,
)
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


STEPS = 3
"""Turns of each `stepping` run."""


def _step(args: dict[str, Any], ctx: ToolContext) -> str:
    return "stepped"


async def stepping_model(req: InProcessRequest) -> InProcessResponse:
    done = sum(1 for m in req.messages if m["role"] == "tool")
    note("paced", started(f"{prompt_of(req)} t{done}"))
    await asyncio.sleep(PACE / 5)
    if done < STEPS - 1:
        call = InProcessToolCall(id=f"step_{done}", name="step", arguments={})
        return InProcessResponse(tool_calls=[call])
    return InProcessResponse(content="stepped")


stepping = Agent("stepping", stepping_model, tools=[define_tool("step", "one step", None, _step)])
