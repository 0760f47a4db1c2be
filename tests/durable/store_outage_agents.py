"""Agents for the store-outage tests (`RELAYQ_AGENTS=tests.durable.store_outage_agents`).

`outlast`: runs of five model turns and four local tool calls, slow enough
that a store crashed or locked at any moment finds turns in flight. Each tool
execution is logged with its `ctx.attempt`, so a test can tell a call
repeated without its attempt counting up (a claim lost to a live worker) from
one redone after a crash (attempt 2 and on).

`stall`: one tool call that blocks its worker's event loop for
`RELAYQ_TEST_STALL` seconds (a synchronous call in an async tool), as a long
store call on the loop once did.
"""

from __future__ import annotations

import asyncio
import os
import time

from relayq import Agent, InProcessRequest, InProcessResponse, ToolContext, define_tool

from .agents import calls, note, tool_outputs

CALLS = 4
"""Tool calls of each run, one a turn; the fifth turn ends the run."""


async def mark(args: dict[str, object], ctx: ToolContext) -> str:
    note("tool", f"mark {ctx.run_id} {ctx.call_id} attempt {ctx.attempt}")
    await asyncio.sleep(0.3)  # in flight long enough to be caught by the outage
    return f"marked {ctx.call_id}"


async def outlast_model(req: InProcessRequest) -> InProcessResponse:
    await asyncio.sleep(0.2)
    done = len(tool_outputs(req))
    if done < CALLS:
        return calls((f"c{done + 1}", "mark"))
    return InProcessResponse(content=f"marked {done}")


outlast = Agent("outlast", outlast_model, tools=[define_tool("mark", "m", None, mark)])


async def block(args: dict[str, object], ctx: ToolContext) -> str:
    note("tool", f"stall {ctx.run_id} attempt {ctx.attempt}")
    time.sleep(float(os.environ.get("RELAYQ_TEST_STALL", "4")))  # noqa: ASYNC251  (the point)
    return "stalled"


async def stall_model(req: InProcessRequest) -> InProcessResponse:
    if tool_outputs(req):
        return InProcessResponse(content="unblocked")
    return calls(("c1", "block"))


stall = Agent("stall", stall_model, tools=[define_tool("block", "b", None, block)])
