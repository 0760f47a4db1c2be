"""The benchmark's agent: a real OpenAI-style provider (the local model server) and one local tool.

The server (`bench.model_server`) asks for the `step` tool until a run has taken
`RELAYQ_BENCH_TURNS - 1` tool turns, then answers, so each run is that many turns.
"""

from __future__ import annotations

import os
from typing import Any

from relayq import Agent, ToolContext, define_tool
from relayq.providers import ProviderConfig


def step(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"step {args.get('n', 0)} done"


bench = Agent(
    "bench",
    ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_BENCH_MODEL_URL", "http://127.0.0.1:9/v1"),
        model="bench-model",
        api_key_env="RELAYQ_BENCH_KEY",
        timeout=60,
    ),
    tools=[
        define_tool(
            "step",
            "take one step",
            {"type": "object", "properties": {"n": {"type": "integer"}}},
            step,
        )
    ],
    max_turns=50,
)
