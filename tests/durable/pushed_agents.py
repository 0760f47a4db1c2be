"""An agent whose calls spend tokens, for the pushed-results tests
(`RELAYQ_AGENTS=tests.durable.agents,tests.durable.pushed_agents`).

Each call spends 1,000 tokens: a run with a smaller budget stops before its
second call with a `budget` request, which a decline ends `over_budget` in the
answer task itself.
"""

from __future__ import annotations

from typing import Any

from relayq import Agent, InProcessRequest, InProcessResponse, InProcessToolCall, Usage, define_tool


def _spending_model(req: InProcessRequest) -> InProcessResponse:
    spent = Usage(prompt_tokens=800, completion_tokens=200, total_tokens=1000)
    if any(m["role"] == "tool" for m in req.messages):
        return InProcessResponse(content="spent", usage=spent)
    return InProcessResponse(tool_calls=[InProcessToolCall(id="s1", name="step")], usage=spent)


def _step(args: dict[str, Any], ctx: Any) -> str:
    return "stepped"


spending = Agent("spending", _spending_model, tools=[define_tool("step", "s", None, _step)])
