"""Agents with tools from MCP servers (`RELAYQ_AGENTS=tests.durable.mcp_agents`).

`RELAYQ_TEST_MCP_URL` is the HTTP server (`tests.mcp_server`, started by the test); the
stdio one each worker process starts itself.
"""

from __future__ import annotations

import os
import sys

from relayq import Agent, InProcessRequest, InProcessResponse, InProcessToolCall
from relayq.mcp import MCPServerHTTP, MCPServerStdio
from tests.mcp_processes import ROOT, stdio_args

from .agents import log_dir, note, prompt_of, tool_outputs

web = MCPServerHTTP(
    os.environ.get("RELAYQ_TEST_MCP_URL", "http://127.0.0.1:9/mcp"), name="web", relay=["ship"]
)
box = MCPServerStdio(
    sys.executable,
    args=stdio_args(),
    env={"RELAYQ_TEST_LOG": str(log_dir())},
    cwd=ROOT,
    name="box",
)


def tally_both(req: InProcessRequest) -> InProcessResponse:
    """Turn 1: one call to each server; turn 2: their outputs, one a line."""
    prompt = prompt_of(req)
    note("model", prompt)
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content="\n".join(outputs))
    return InProcessResponse(
        tool_calls=[
            InProcessToolCall(id="w", name="web_tally", arguments={"name": f"{prompt}/web"}),
            InProcessToolCall(id="b", name="box_tally", arguments={"name": f"{prompt}/box"}),
        ]
    )


def ship_by_host(req: InProcessRequest) -> InProcessResponse:
    """Turn 1: the server's `ship`, declared a relay tool: the host runs it."""
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content=outputs[0])
    order = prompt_of(req)
    return InProcessResponse(
        tool_calls=[InProcessToolCall(id="s", name="web_ship", arguments={"order": order})]
    )


mcp_tools = Agent("mcp-tools", tally_both, mcp_servers=[web, box])
mcp_relay = Agent("mcp-relay", ship_by_host, mcp_servers=[web])


def wait_for_growth(req: InProcessRequest) -> InProcessResponse:
    """A nap a turn until the server offers `grown`; then one call of it, and its output."""
    outputs = tool_outputs(req)
    if outputs and outputs[-1].startswith("grown"):
        return InProcessResponse(content=outputs[-1])
    offered = {tool["function"]["name"] for tool in req.tools}
    turn = len(outputs)
    if "web_grown" in offered:
        return InProcessResponse(tool_calls=[InProcessToolCall(id=f"g{turn}", name="web_grown")])
    nap = InProcessToolCall(id=f"n{turn}", name="web_nap", arguments={"seconds": 0.2})
    return InProcessResponse(tool_calls=[nap])


mcp_growing = Agent("mcp-growing", wait_for_growth, mcp_servers=[web], max_turns=400)
