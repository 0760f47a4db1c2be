"""An agent on a queue of its own (`RELAYQ_AGENTS=tests.durable.agents,tests.durable.queue_agents`).

Each turn says which worker ran it (`RELAYQ_TEST_WORKER`), so a test sees
where the turns of a run went: a local tool, then a relay call, then the text.
"""

from __future__ import annotations

import os
from typing import Any

from relayq import Agent, InProcessRequest, InProcessResponse, ToolContext, define_tool
from relayq.relay import relay_tool
from tests.durable.agents import calls, tool_outputs

VIP_QUEUE = "relayq.turns.vip"


def worker_name() -> str:
    return os.environ.get("RELAYQ_TEST_WORKER", "?")


def where(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"tool on {worker_name()}"


def vip_model(req: InProcessRequest) -> InProcessResponse:
    outs = tool_outputs(req)
    match len(outs):
        case 0:
            return calls(("c1", "where"))
        case 1:
            return calls(("c2", "lookup"))
        case _:
            return InProcessResponse(content=f"{' | '.join(outs)} | text on {worker_name()}")


vip = Agent(
    "vip",
    vip_model,
    tools=[define_tool("where", "w", None, where), relay_tool("lookup", "the host looks it up")],
    queue=VIP_QUEUE,
)
