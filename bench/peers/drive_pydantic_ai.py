"""Pydantic AI as its users run it: an `Agent` in plain asyncio, runs gathered, nothing kept.

    python -m bench.peers.drive_pydantic_ai --base-url URL --runs N --turns T --home DIR

An OpenAI-compatible chat model pointed at the local model server and one `step`
tool. A run lives in this process's memory only: it is not durable, and it writes
and stores nothing.
"""

from __future__ import annotations

from pydantic_ai import Agent, ModelResponse, UsageLimits
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from bench.peers.sample import PeerArgs, Sample, hand_back, measure_runs


def step(n: int) -> str:
    """Take one step."""
    return f"step {n} done"


async def drive(args: PeerArgs) -> Sample:
    provider = OpenAIProvider(base_url=args.base_url, api_key="bench-key")
    agent = Agent(OpenAIChatModel("bench-model", provider=provider), tools=[step])
    # The default limit (50 requests a run) would end the long runs early.
    limits = UsageLimits(request_limit=args.turns + 1)

    async def run_one(i: int) -> int:
        result = await agent.run(f"job {i}", usage_limits=limits)
        return sum(1 for m in result.all_messages() if isinstance(m, ModelResponse))

    # Entered, the agent closes its HTTP client at the end.
    async with agent:
        return await measure_runs(
            "pydantic-ai", runs=args.runs, turns_each=args.turns, run_one=run_one, store=None
        )


if __name__ == "__main__":
    hand_back(drive)
