"""Budgets: the most a run, or a batch of runs, may spend on model calls.

    Budget(tokens=200_000, cost=2.50, approvers=["finance"])

Before each model call the worker adds its guess at that call (the run's
previous call: a run's prompts only grow) to what has been spent, and compares
the sum with the budget. If it would go past, the run asks: it suspends with one
Request of kind `budget`, decided like an approval (`relayq.approvals`):

- approve: the run goes on under the proposed limits (as much again);
- edit: the run goes on under other limits, checked against the request's
  schema (above what is spent already);
- decline, with a reason: the run ends `over_budget`.

With `on_exceed="end"` the run ends `over_budget` at once, asking no one. Cost
is in the unit of the prices (`ProviderConfig.prices`); with no price for the
model, only tokens can be counted. Everything here is pure: where the spending
is kept, and who may decide, is the store's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias

from pydantic import ConfigDict, Field, field_validator, model_validator

from relayq import transcript as tx
from relayq._errors import AnswerMismatch
from relayq._types import Answer, Request, Usage, WireModel
from relayq.approvals import BUDGET_KIND, Policy, decision_of

__all__ = [
    "BUDGET_KIND",
    "Budget",
    "Overrun",
    "Scope",
    "Spent",
    "budget_request",
    "is_budget",
    "next_call",
    "overrun",
    "raised",
]

Scope: TypeAlias = Literal["run", "batch"]


class Budget(WireModel):
    """The most a run (or a batch) may spend, and what happens when it would spend more.

    Wire shape: `{tokens?, cost?, onExceed, approvers, expiresIn?}`.
    """

    model_config = ConfigDict(extra="forbid")

    tokens: int | None = Field(default=None, gt=0)
    """Prompt and completion tokens, all model calls together."""
    cost: float | None = Field(default=None, gt=0)
    """In the unit of the provider's prices (`ProviderConfig.prices`)."""
    on_exceed: Literal["ask", "end"] = "ask"
    """`ask`: a `budget` request asks a person to allow more; `end`: the run ends at once."""
    approvers: tuple[str, ...] = ()
    """Groups whose members may allow more; empty: anyone who may answer requests."""
    expires_in: float | None = Field(default=None, gt=0)
    """Seconds a `budget` request stays open; at its deadline it counts as declined."""

    @field_validator("approvers")
    @classmethod
    def _groups(cls, groups: tuple[str, ...]) -> tuple[str, ...]:
        if any(not isinstance(g, str) or not g.strip() for g in groups):
            raise ValueError("approver groups are non-empty strings")
        return groups

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget limits tokens, cost or both")
        return self

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_wire(cls, wire: dict[str, Any] | None) -> Budget | None:
        return None if not wire else cls.model_validate(wire)

    def describe(self) -> str:
        """`10,000 tokens, 2.5 cost`: the limits, for a person."""
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        if self.cost is not None:
            parts.append(f"{_money(self.cost)} cost")
        return ", ".join(parts)


@dataclass(frozen=True)
class Spent:
    """Tokens and cost, spent or about to be."""

    tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.tokens + other.tokens, self.cost + other.cost)

    def to_wire(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "cost": round(self.cost, 6)}


@dataclass(frozen=True)
class Overrun:
    """A model call that would take a run (or its batch) past its budget."""

    scope: Scope
    budget: Budget
    spent: Spent
    next_call: Spent
    """The guess at the call about to be made."""

    def describe(self) -> str:
        """Why the run stopped: `its budget of 10,000 tokens: 9,120 spent, the next call
        about 1,400`."""
        owner = "its" if self.scope == "run" else "its batch's"
        spent, guess = [], []
        if self.budget.tokens is not None:
            spent.append(f"{self.spent.tokens:,} tokens")
            guess.append(f"{self.next_call.tokens:,} tokens")
        if self.budget.cost is not None:
            spent.append(f"{_money(self.spent.cost)} cost")
            guess.append(f"{_money(self.next_call.cost)} cost")
        return (
            f"{owner} budget of {self.budget.describe()}: {', '.join(spent)} spent, "
            f"the next call about {', '.join(guess)}"
        )

    def proposal(self) -> dict[str, Any]:
        """The limits an approval allows: as much again, and at least room for the next call."""
        out: dict[str, Any] = {}
        if self.budget.tokens is not None:
            needed = self.spent.tokens + self.next_call.tokens
            out["tokens"] = max(self.budget.tokens * 2, needed)
        if self.budget.cost is not None:
            needed_cost = self.spent.cost + self.next_call.cost
            out["cost"] = round(max(self.budget.cost * 2, needed_cost), 6)
        return out

    def schema(self) -> dict[str, Any]:
        """What an edit may set: each limit the budget has, with room for the next call (a
        lower one would only ask again at once)."""
        needed = self.spent + self.next_call
        properties: dict[str, Any] = {}
        if self.budget.tokens is not None:
            properties["tokens"] = {
                "type": "integer",
                "minimum": max(needed.tokens, 1),
                "description": f"The most tokens the {self.scope} may spend, all calls together",
            }
        if self.budget.cost is not None:
            properties["cost"] = {
                "type": "number",
                "minimum": round(needed.cost, 6),
                "description": f"The most the {self.scope} may cost, in the prices' unit",
            }
        return {
            "type": "object",
            "properties": properties,
            "required": sorted(properties),
            "additionalProperties": False,
        }


def overrun(budget: Budget | None, spent: Spent, next_call: Spent, scope: Scope) -> Overrun | None:
    """The overrun if a call costing about `next_call` would take `spent` past `budget`."""
    if budget is None:
        return None
    after = spent + next_call
    over_tokens = budget.tokens is not None and after.tokens > budget.tokens
    over_cost = budget.cost is not None and after.cost > budget.cost
    if not (over_tokens or over_cost):
        return None
    return Overrun(scope=scope, budget=budget, spent=spent, next_call=next_call)


def budget_request(
    over: Overrun, *, run_id: str, batch_id: str | None = None, now: datetime | None = None
) -> Request:
    """The `budget` request asking a person to allow more."""
    subject = f"batch {batch_id}" if over.scope == "batch" else f"run {run_id}"
    expires_at = None
    if over.budget.expires_in is not None:
        expires_at = (now or datetime.now(UTC)) + timedelta(seconds=over.budget.expires_in)
    return Request(
        kind=BUDGET_KIND,
        prompt=f"Allow {subject} to spend more? It would go past {over.describe()}",
        data={
            "scope": over.scope,
            "batch": batch_id,
            "budget": over.budget.to_wire(),
            "spent": over.spent.to_wire(),
            "nextCall": over.next_call.to_wire(),
            # The approval's shape: what approving allows, and what an edit may set.
            "arguments": over.proposal(),
            "schema": over.schema(),
            "policy": Policy(approvers=over.budget.approvers, on_expiry="decline").to_wire(),
        },
        expires_at=expires_at,
    )


def next_call(messages: list[dict[str, Any]], price: Callable[[Usage], float | None]) -> Spent:
    """The guess at the model call a turn on `messages` is about to make: the run's
    previous call again (its prompt only grows); nothing when the reply is already in
    (its tools have yet to run) or the run has made no call yet."""
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and last.get("tool_calls"):
        return Spent()
    # Back from the end to the run's start (its user message): the latest call is near
    # the end, and a conversation of 800 turns is not walked at every one.
    for message in reversed(messages):
        role = message.get("role")
        if role == "user":
            break
        usage = (message.get(tx.NOTE) or {}).get("usage")
        if role == "assistant" and usage:
            call = Usage.model_validate(usage)
            return Spent(call.total_tokens, price(call) or 0.0)
    return Spent()


def is_budget(request: Request) -> bool:
    return request.kind == BUDGET_KIND


def raised(request: Request, answer_data: dict[str, Any] | None, budget: Budget) -> Budget:
    """`budget` under the limits an approving answer to `request` allows: the proposal,
    or an edit's limits (checked against the request's schema)."""
    decision = decision_of(request, Answer(id=request.id, data=answer_data))
    limits = decision.arguments if decision.arguments is not None else request.data["arguments"]
    if not limits:
        raise AnswerMismatch(f"an answer to {request.id} allows no limits", request.id)
    return budget.model_copy(update={k: limits[k] for k in ("tokens", "cost") if k in limits})


def _money(amount: float) -> str:
    return f"{amount:,.4f}".rstrip("0").rstrip(".")
