"""The turn's budget gate: before the model is called, the run's budget and its batch's are
checked (`store.budgets`); past one, the run asks for more, waits for its batch's answer,
or ends."""

from __future__ import annotations

from relayq.agents import Agent
from relayq.budgets import Budget, Spent, next_call, overrun
from relayq.pricing import cost_of
from store import Claim
from store.budgets import Gate
from tasks.deliveries import Delivered
from tasks.hooks import TurnOutcome
from tasks.runner.runtime import Runtime

__all__ = ["check_budget", "stopped_by_budget"]


async def check_budget(rt: Runtime, claim: Claim, agent: Agent) -> Gate:
    """Whether the turn may call the model ("go"), given what its next call may cost."""
    own = Budget.from_wire(claim.budget)
    guess = next_call(claim.messages, lambda usage: cost_of(agent, usage))
    spent = Spent(claim.total_tokens, claim.cost)
    if overrun(own or agent.budget, spent, guess, "run") is None and not claim.batch_budgeted:
        # Within its own budget, and no batch's to keep to: no write, no lock on the batch.
        return Gate("go")
    return await rt.store.budget_gate(
        claim.run_id,
        claim.version,
        default=agent.budget,
        next_call=guess,
    )


def stopped_by_budget(gate: Gate) -> Delivered:
    """What a turn its gate stopped comes to: the run over budget, or pending on a budget
    request (its own, or its batch's)."""
    kind = TurnOutcome.OVER_BUDGET if gate.verdict == "ended" else TurnOutcome.PENDING
    return Delivered(kind, f"{kind.value}: {gate.detail}")
