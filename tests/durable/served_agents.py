"""An agent whose tool needs an approval, for `relayq mcp`'s tests
(`RELAYQ_AGENTS=tests.durable.agents,tests.durable.served_agents`)."""

from __future__ import annotations

from typing import Any

from relayq import (
    Agent,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    ToolContext,
    define_tool,
)
from relayq.approvals import requires_approval
from relayq.relay import relay_tool

from .agents import tool_outputs

SCHEMA = {"type": "object", "properties": {"service": {"type": "string"}}, "required": ["service"]}


def release(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"released {args['service']}"


def release_model(req: InProcessRequest) -> InProcessResponse:
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content=outputs[0])
    call = InProcessToolCall(id="r1", name="release", arguments={"service": "web"})
    return InProcessResponse(tool_calls=[call])


gated = Agent(
    "gated",
    release_model,
    tools=[requires_approval(define_tool("release", "Release a service", SCHEMA, release))],
)


def release_then_look_up_model(req: InProcessRequest) -> InProcessResponse:
    """First the approved release, then one relay call, then both outputs as the text."""
    outputs = tool_outputs(req)
    if len(outputs) == 2:
        return InProcessResponse(content=" / ".join(outputs))
    if outputs:
        return InProcessResponse(
            tool_calls=[InProcessToolCall(id="l1", name="lookup", arguments={"key": "web"})]
        )
    call = InProcessToolCall(id="r1", name="release", arguments={"service": "web"})
    return InProcessResponse(tool_calls=[call])


gated_lookup = Agent(
    "gated-lookup",
    release_then_look_up_model,
    tools=[
        requires_approval(define_tool("release", "Release a service", SCHEMA, release)),
        relay_tool("lookup", "the host looks it up"),
    ],
)
