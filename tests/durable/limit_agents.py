"""An agent on a real HTTP provider with shared limits
(`RELAYQ_AGENTS=tests.durable.agents,tests.durable.limit_agents`).

The provider is the test's `ProviderServer` at `RELAYQ_TEST_LIMITS_URL`; its
limits come from `RELAYQ_TEST_RPM`, `RELAYQ_TEST_TPM`, `RELAYQ_TEST_IN_FLIGHT`
and `RELAYQ_TEST_MAX_TOKENS` (unset: none); each call names its worker
(`RELAYQ_TEST_WORKER`) in a header. A run is two model calls: the model asks
for the `step` tool once, then answers.
"""

from __future__ import annotations

import os
from typing import Any

from relayq import Agent, ToolContext, define_tool
from relayq.providers import ProviderConfig
from tests.durable import sent_messages  # noqa: F401  (what this process sends, recorded)


def _number(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def step(args: dict[str, Any], ctx: ToolContext) -> str:
    return "stepped"


limited = Agent(
    "limited",
    ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_TEST_LIMITS_URL", "http://127.0.0.1:9/v1"),
        model="limits-model",
        api_key_env="RELAYQ_TEST_LIMITS_KEY",
        timeout=20,
        max_connections=16,
        # Which worker called: its first call builds its HTTP client after its moment
        # was reserved, and arrives late (the test leaves it out of its windows).
        headers={"x-test-worker": os.environ.get("RELAYQ_TEST_WORKER", "?")},
        requests_per_minute=_number("RELAYQ_TEST_RPM"),
        tokens_per_minute=_number("RELAYQ_TEST_TPM"),
        max_in_flight=_number("RELAYQ_TEST_IN_FLIGHT"),
        max_tokens=_number("RELAYQ_TEST_MAX_TOKENS"),
    ),
    tools=[define_tool("step", "take a step", None, step)],
)
