"""What a model call cost: the provider's prices by default, or a function of your own.

Budgets (`relayq.budgets`), the turn and the `relayq_model_cost_total` metric all ask
`cost_of`; `set_cost_function` replaces the prices for all of them in this process.
"""

from __future__ import annotations

from collections.abc import Callable

from relayq._types import Usage
from relayq.agents import Agent

__all__ = ["CostFunction", "cost_of", "provider_prices", "set_cost_function"]

CostFunction = Callable[[Agent, Usage], float | None]
"""What a model call cost, from its agent (its `ProviderConfig`, prices and all) and the
usage the provider reported; None when the price is not known."""


def provider_prices(agent: Agent, usage: Usage) -> float | None:
    """The default cost function: the agent's provider's prices (`ProviderConfig.prices`)."""
    return agent.cost_of(usage)


_cost: CostFunction | None = provider_prices


def set_cost_function(fn: CostFunction | None) -> None:
    """Count costs with `fn` in place of the provider's prices (`ProviderConfig.prices`);
    None: no cost. Budgets (`relayq.budgets`) and `relayq_model_cost_total` both use it.
    Until a function gives a price, the metric has no series at all, rather than a cost of 0.
    """
    global _cost
    _cost = fn


def cost_of(agent: Agent, usage: Usage) -> float | None:
    """What `usage` of `agent`'s model cost, by the cost function; None when unknown."""
    return _cost(agent, usage) if _cost is not None else None
