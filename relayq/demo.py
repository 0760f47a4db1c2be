"""The demo agent: refunds that a back-office user approves.

    RELAYQ_AGENTS=relayq.demo relayq worker
    relayq run demo "refund order 1042"

Each job looks the order up with a local tool (`lookup_order`, run on the
worker), then asks for approval with a relay tool (`approve_refund`, answered
by a person in the inbox or with `relayq answer`), then reports the outcome.
Three model turns and one approval per job.

The model is deterministic and offline unless `RELAYQ_MODEL` or
`OPENAI_API_KEY` is set: then it is that OpenAI-compatible model
(`RELAYQ_MODEL_BASE_URL`, default OpenAI's), with the same tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from relayq._model import InProcessRequest, InProcessResponse, InProcessToolCall
from relayq._tools import ToolContext, define_tool
from relayq.agents import Agent
from relayq.providers import ProviderConfig
from relayq.relay import relay_tool

__all__ = ["demo", "demo_model", "order_of"]

SYSTEM_PROMPT = (
    "You handle refund requests. First call lookup_order with the order number "
    "from the request. Then call approve_refund with the order, the amount and a "
    "one-line reason. When approval comes back, reply with one sentence saying "
    "whether the refund was made."
)


def order_of(prompt: str) -> str:
    """The order number a job names: its first run of digits, or one derived from its text."""
    found = re.search(r"\d+", prompt)
    if found:
        return found.group(0)
    return str(int(hashlib.sha256(prompt.encode()).hexdigest()[:6], 16) % 9000 + 1000)


def lookup_order(args: dict[str, Any], ctx: ToolContext) -> str:
    """A stand-in order database: the same order always has the same customer and amount."""
    order = str(args.get("order", ""))
    digest = hashlib.sha256(order.encode()).digest()
    customers = ("Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra")
    return json.dumps(
        {
            "order": order,
            "customer": customers[digest[0] % len(customers)],
            "amount": round(5 + digest[1] % 200 + digest[2] / 100, 2),
            "status": "delivered",
        }
    )


LOOKUP = define_tool(
    "lookup_order",
    "Look an order up by its number: customer, amount, status.",
    {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
    lookup_order,
)
APPROVE = relay_tool(
    "approve_refund",
    "Ask a person to approve refunding an order. Returns their decision.",
    {
        "type": "object",
        "properties": {
            "order": {"type": "string"},
            "amount": {"type": "number"},
            "reason": {"type": "string"},
        },
        "required": ["order", "amount", "reason"],
    },
)


def demo_model(req: InProcessRequest) -> InProcessResponse:
    """Look up, ask for approval, report: decided by what the transcript holds so far."""
    prompt = next(str(m["content"]) for m in req.messages if m["role"] == "user")
    order = order_of(prompt)
    tool_messages = [m for m in req.messages if m["role"] == "tool"]
    if not tool_messages:
        return InProcessResponse(
            tool_calls=[
                InProcessToolCall(id="lookup", name="lookup_order", arguments={"order": order})
            ]
        )
    if len(tool_messages) == 1:
        found = json.loads(str(tool_messages[0]["content"]))
        return InProcessResponse(
            tool_calls=[
                InProcessToolCall(
                    id="approve",
                    name="approve_refund",
                    arguments={
                        "order": order,
                        "amount": found["amount"],
                        "reason": f"{found['customer']} asked: {prompt}",
                    },
                )
            ]
        )
    decision = str(tool_messages[-1]["content"])
    if decision.startswith("declined"):  # how a declined relay call reads to the model
        return InProcessResponse(content=f"Order {order}: refund not made ({decision}).")
    return InProcessResponse(content=f"Order {order}: refund made ({decision}).")


def _model() -> Any:
    name = os.environ.get("RELAYQ_MODEL")
    if not name and not os.environ.get("OPENAI_API_KEY"):
        return demo_model
    return ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_MODEL_BASE_URL", "https://api.openai.com/v1"),
        model=name or "gpt-4o-mini",
    )


demo = Agent("demo", _model(), tools=[LOOKUP, APPROVE], system_prompt=SYSTEM_PROMPT, max_turns=8)
