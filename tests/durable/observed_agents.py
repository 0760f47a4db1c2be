"""An agent on a real (local) provider, for the metrics and tracing tests
(`RELAYQ_AGENTS=tests.durable.agents,tests.durable.observed_agents`).

`metered` calls the OpenAI-style endpoint at `RELAYQ_TEST_PROVIDER_URL`, which
`metered_reply` serves (`tests.provider_server`): the first reply calls the relay
tool `confirm` with the prompt's order number, the next, given its result, ends
the run. A prompt with `throttle` in it gets one 429 first. The first reply reports
20 prompt and 5 completion tokens, the second 11 and 7.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from relayq import Agent
from relayq.providers import ProviderConfig
from relayq.relay import relay_tool
from tests.provider_server import API_KEY, Reply, error, openai_calls, openai_text

MODEL = "gpt-metered"
KEY_ENV = "RELAYQ_TEST_PROVIDER_KEY"

_throttled: set[str] = set()
_lock = threading.Lock()


def metered_reply(dialect: str, body: dict[str, Any]) -> Reply:
    prompt = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
    if any(m["role"] == "tool" for m in body["messages"]):
        return openai_text("confirmed", model=MODEL)
    with _lock:
        first = prompt not in _throttled
        _throttled.add(prompt)
    if "throttle" in prompt and first:
        return error(429, "slow down", **{"Retry-After": "0"})
    return openai_calls(("c1", "confirm", {"order": prompt.split()[-1]}), model=MODEL)


def metered_agent(base_url: str, *, register: bool = True) -> Agent:
    return Agent(
        "metered",
        ProviderConfig(style="openai", base_url=base_url, model=MODEL, api_key_env=KEY_ENV),
        tools=[relay_tool("confirm", "a person confirms the order")],
        register=register,
    )


metered = metered_agent(os.environ.get("RELAYQ_TEST_PROVIDER_URL", "http://127.0.0.1:9/v1"))

__all__ = ["API_KEY", "KEY_ENV", "MODEL", "metered", "metered_agent", "metered_reply"]
