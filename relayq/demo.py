"""The demo agents: refunds that a back-office user approves, and refunds with a policy.

    RELAYQ_AGENTS=relayq.demo relayq worker
    relayq run demo "refund order 1042"
    relayq run demo_refunds "refund order 1042"

`demo`: each job looks the order up with a local tool (`lookup_order`, run on
the worker), then asks for approval with a relay tool (`approve_refund`,
answered by a person in the inbox or with `relayq answer`), then reports the
outcome. Three model turns and one approval per job.

`demo_refunds`: looks the order up, then refunds it with a local tool wrapped
in `requires_approval`: `refund` (one of finance decides, and may edit the
amount) up to `QUORUM_ABOVE`, `refund_large` (two of finance must approve)
above it. The tool runs on the worker once approved, with the approved
arguments; the model then reports what it said.

The models are deterministic and offline unless `RELAYQ_MODEL` or
`OPENAI_API_KEY` is set: then they are that OpenAI-compatible model
(`RELAYQ_MODEL_BASE_URL`, default OpenAI's), with the same tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from relayq._tools import ToolContext, define_tool
from relayq.agents import Agent
from relayq.approvals import requires_approval
from relayq.model import Generate, InProcessRequest, InProcessResponse, InProcessToolCall
from relayq.providers import ProviderConfig
from relayq.relay import relay_tool

__all__ = [
    # the agents
    "demo",
    "demo_refunds",
    # their offline models and tools
    "QUORUM_ABOVE",
    "demo_model",
    "issue_refund",
    "lookup_order",
    "order_of",
    "order_record",
    "refunds_model",
]

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


def order_record(order: str) -> dict[str, Any]:
    """A stand-in order database: the same order always has the same customer and amount."""
    digest = hashlib.sha256(order.encode()).digest()
    customers = ("Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra")
    return {
        "order": order,
        "customer": customers[digest[0] % len(customers)],
        "amount": round(5 + digest[1] % 200 + digest[2] / 100, 2),
        "status": "delivered",
    }


def lookup_order(args: dict[str, Any], ctx: ToolContext) -> str:
    """The `lookup_order` tool: the order's record as JSON."""
    return json.dumps(order_record(str(args.get("order", ""))))


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


def _step(req: InProcessRequest) -> tuple[str, str, list[dict[str, Any]]]:
    """The user's prompt, its order number, and the tool results so far."""
    prompt = next(str(m["content"]) for m in req.messages if m["role"] == "user")
    return prompt, order_of(prompt), [m for m in req.messages if m["role"] == "tool"]


def _look_up(order: str) -> InProcessResponse:
    call = InProcessToolCall(id="lookup", name="lookup_order", arguments={"order": order})
    return InProcessResponse(tool_calls=[call])


def demo_model(req: InProcessRequest) -> InProcessResponse:
    """Look up, ask for approval, report: decided by what the transcript holds so far."""
    prompt, order, tool_messages = _step(req)
    if not tool_messages:
        return _look_up(order)
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


QUORUM_ABOVE = 150.0
"""`demo_refunds`: refunds above this amount take two approvals of finance, not one."""

REFUNDS_PROMPT = (
    "You make refunds. First call lookup_order with the order number from the "
    f"request. Then refund the order's amount: with refund up to {QUORUM_ABOVE:.0f}, "
    "with refund_large above it, giving a one-line reason. Finance approves the "
    "refund, and may change the amount. Then reply with one sentence saying what "
    "was refunded."
)

REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "reason": {"type": "string"},
    },
    "required": ["order", "amount", "reason"],
    "additionalProperties": False,
}


def issue_refund(args: dict[str, Any], ctx: ToolContext) -> str:
    """The refund itself (a stand-in payment system): runs only once approved."""
    return f"refunded {float(args['amount']):.2f} on order {args['order']}"


def _asks(args: dict[str, Any]) -> str:
    return f"Refund {args.get('amount')} on order {args.get('order')}?"


REFUND = requires_approval(
    define_tool(
        "refund", f"Refund an order of up to {QUORUM_ABOVE:.0f}.", REFUND_SCHEMA, issue_refund
    ),
    approvers=["finance"],
    prompt=_asks,
)
REFUND_LARGE = requires_approval(
    define_tool(
        "refund_large",
        f"Refund an order of more than {QUORUM_ABOVE:.0f}; two people of finance approve it.",
        REFUND_SCHEMA,
        issue_refund,
    ),
    approvers=["finance"],
    quorum=2,
    prompt=_asks,
)


def refunds_model(req: InProcessRequest) -> InProcessResponse:
    """Look up, refund with the tool the amount calls for, report what the tool said."""
    prompt, order, tool_messages = _step(req)
    if not tool_messages:
        return _look_up(order)
    if len(tool_messages) == 1:
        found = json.loads(str(tool_messages[0]["content"]))
        amount = float(found["amount"])
        return InProcessResponse(
            tool_calls=[
                InProcessToolCall(
                    id="refund",
                    name="refund" if amount <= QUORUM_ABOVE else "refund_large",
                    arguments={
                        "order": order,
                        "amount": amount,
                        "reason": f"{found['customer']} asked: {prompt}",
                    },
                )
            ]
        )
    # An edit's result starts with a note of what the approver changed: keep it, last.
    *note, outcome = str(tool_messages[-1]["content"]).splitlines() or [""]
    if outcome.startswith("declined"):
        return InProcessResponse(content=f"Order {order}: not refunded ({outcome}).")
    return InProcessResponse(content=" ".join([f"{outcome[:1].upper()}{outcome[1:]}.", *note]))


def _model(offline: Generate = demo_model) -> Any:
    name = os.environ.get("RELAYQ_MODEL")
    if not name and not os.environ.get("OPENAI_API_KEY"):
        return offline
    return ProviderConfig(
        style="openai",
        base_url=os.environ.get("RELAYQ_MODEL_BASE_URL", "https://api.openai.com/v1"),
        model=name or "gpt-4o-mini",
    )


demo = Agent("demo", _model(), tools=[LOOKUP, APPROVE], system_prompt=SYSTEM_PROMPT, max_turns=8)
demo_refunds = Agent(
    "demo_refunds",
    _model(refunds_model),
    tools=[LOOKUP, REFUND, REFUND_LARGE],
    system_prompt=REFUNDS_PROMPT,
    max_turns=8,
)
