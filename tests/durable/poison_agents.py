"""Agents whose tools harm their worker (`RELAYQ_AGENTS=tests.durable.poison_agents`).

`wedge`: one call of a sync tool that never returns (it sleeps `RELAYQ_TEST_WEDGE`
seconds, 600 unless set), with no timeout: the turn's time limit gives up on it.
`wedge_bounded`: the same tool under the agent's `tool_timeout` of 1 s: the call's
result is an error, and the run goes on to its end.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from relayq import Agent, InProcessRequest, InProcessResponse, ToolContext, define_tool

from .agents import calls, note, tool_outputs


def wedge(args: dict[str, object], ctx: ToolContext) -> str:
    note("tool", f"wedge {ctx.run_id} attempt {ctx.attempt}")
    time.sleep(float(os.environ.get("RELAYQ_TEST_WEDGE", "600")))
    return "unwedged"


async def wedge_model(req: InProcessRequest) -> InProcessResponse:
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content=f"after the wedge: {outputs[-1]}")
    return calls(("c1", "wedge"))


WEDGE = define_tool("wedge", "w", None, wedge)

wedged = Agent("wedge", wedge_model, tools=[WEDGE])
bounded = Agent("wedge_bounded", wedge_model, tools=[WEDGE], tool_timeout=timedelta(seconds=1))
