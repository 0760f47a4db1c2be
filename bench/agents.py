"""The benchmark's agents: a real OpenAI-style provider (the local model server) and one
local tool; and `bench-relayed`, whose one relay call a `relayq host` serves.

The server (`bench.model_server`) asks for the `step` tool until a run has taken
`RELAYQ_BENCH_TURNS - 1` tool turns, then answers, so each run is that many turns.
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
from relayq.providers import ProviderConfig
from relayq.relay import relay_tool


def step(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"step {args.get('n', 0)} done"


STEP = define_tool(
    "step", "take one step", {"type": "object", "properties": {"n": {"type": "integer"}}}, step
)


def bench_model(**limits: Any) -> ProviderConfig:
    """The local model server (RELAYQ_BENCH_MODEL_URL), with provider `limits` if any."""
    return ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_BENCH_MODEL_URL", "http://127.0.0.1:9/v1"),
        model="bench-model",
        api_key_env="RELAYQ_BENCH_KEY",
        timeout=60,
        **limits,
    )


bench = Agent(
    "bench",
    bench_model(),
    tools=[STEP],
    max_turns=50,
)


bench_long = Agent("bench-long", bench_model(), tools=[STEP], max_turns=5000)
"""For long conversations (`bench.turns`): as many turns as the server asks for."""


async def local_model(req: InProcessRequest) -> InProcessResponse:
    """The model server's behaviour without HTTP: to tell the transport's cost from the rest."""
    done = sum(1 for m in req.messages if m["role"] == "tool")
    await asyncio.sleep(float(os.environ.get("RELAYQ_BENCH_LATENCY", "1.0")))
    if done < int(os.environ.get("RELAYQ_BENCH_TURNS", "5")) - 1:
        return InProcessResponse(
            tool_calls=[InProcessToolCall(id=f"call_{done}", name="step", arguments={"n": done})]
        )
    return InProcessResponse(content=f"finished after {done} steps")


bench_local = Agent("bench-local", local_model, tools=[STEP], max_turns=50)


# -- relay hosts (`bench.hosts`): one relay call a run, served by `relayq host` processes --


async def relayed_model(req: InProcessRequest) -> InProcessResponse:
    """Asks the host to run the prompt as a command, then answers with what it printed."""
    outputs = [str(m.get("content", "")) for m in req.messages if m["role"] == "tool"]
    if outputs:
        return InProcessResponse(content=outputs[-1])
    prompt = next(str(m["content"]) for m in req.messages if m["role"] == "user")
    return InProcessResponse(
        tool_calls=[InProcessToolCall(id="c1", name="shell", arguments={"cmd": prompt})]
    )


def echo(arguments: dict[str, Any], call: object) -> str:
    """The hosts' `shell` (`relayq host --tool shell=bench.agents:echo`): no work of its
    own, so the figures are the lease protocol's."""
    return f"ran {arguments.get('cmd', '')}"


bench_relayed = Agent(
    "bench-relayed", relayed_model, tools=[relay_tool("shell", "runs a command on the host")]
)
