"""The turn-cost tests' agent (`RELAYQ_AGENTS=tests.durable.cost_agents`): the benchmark's
provider (`bench.model_server`) with one local tool, rate limited, so a turn goes through
everything a turn can ask of Redis (the limiter, the provider's circuit); and every store
call the worker makes recorded (`tests.durable.store_counter`)."""

from __future__ import annotations

from bench.agents import STEP, bench_model
from relayq import Agent
from tests.durable import store_counter  # noqa: F401  (the worker's store calls, recorded)

counted = Agent(
    "counted",
    bench_model(requests_per_minute=60_000, max_in_flight=100),
    tools=[STEP],
    max_turns=10,
)
