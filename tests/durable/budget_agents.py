"""An agent with a budget on a real HTTP provider with prices
(`RELAYQ_AGENTS=tests.durable.budget_agents`).

The provider is the test's `ProviderServer` at `RELAYQ_TEST_BUDGET_URL`. A run is
four model calls (the model asks for `step` three times, then answers), each
spending 800 prompt and 200 completion tokens: at the prices below, 0.012 a call.
The run may spend 0.03, decided by the finance group past that.
"""

from __future__ import annotations

import os

from relayq import Agent, Budget, define_tool
from relayq.providers import ModelPrice, ProviderConfig

MODEL = "budget-model"

priced = Agent(
    "priced",
    ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_TEST_BUDGET_URL", "http://127.0.0.1:9/v1"),
        model=MODEL,
        api_key_env="RELAYQ_TEST_BUDGET_KEY",
        timeout=20,
        prices={MODEL: ModelPrice(input=10.0, output=20.0)},
    ),
    tools=[define_tool("step", "take a step", None, lambda args, ctx: "stepped")],
    budget=Budget(cost=0.03, approvers=["finance"]),
)
