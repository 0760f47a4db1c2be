"""Where a model lives and how to reach it: the *name* of the key's variable, never the key."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from relayq._errors import ModelError
from relayq._types import Usage

__all__ = ["ModelPrice", "ProviderConfig", "Style"]

Style = Literal["openai", "anthropic"]

_KEY_VARIABLES: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY", "OPENROUTER_API_KEY"),
    "anthropic": ("ANTHROPIC_API_KEY",),
}


class ModelPrice(BaseModel):
    """What a model charges per million tokens, in whatever unit the operator counts in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    """Per million prompt tokens."""
    output: float = Field(ge=0)
    """Per million completion tokens."""

    def cost_of(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.input + usage.completion_tokens * self.output) / 1e6


class ProviderConfig(BaseModel):
    """An OpenAI-compatible or Anthropic endpoint. Safe to store and to send: no secret in it.

    ProviderConfig(style="openai", base_url="https://openrouter.ai/api/v1",
                   model="openai/gpt-4o-mini", api_key_env="OPENROUTER_API_KEY")
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    style: Style = "openai"
    base_url: str
    """`{base_url}/chat/completions` (openai) or `{base_url}/v1/messages` (anthropic)."""
    model: str
    api_key_env: str | None = None
    """The environment variable holding the key; by default OPENAI_API_KEY then
    OPENROUTER_API_KEY (openai style) or ANTHROPIC_API_KEY (anthropic)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra, non-secret headers (e.g. OpenRouter's `HTTP-Referer`)."""
    max_tokens: int | None = None
    """Anthropic requires one; 4096 unless set."""
    timeout: float = 120.0
    """Seconds for one HTTP call."""
    retries: int = 2
    """In-process retries of 429/5xx/timeouts. Durable workers use Celery retries instead."""
    max_connections: int = 1000
    """Connections one process keeps open to the endpoint: calls in flight at once."""

    # Limits shared by every worker process (see `relayq.ratelimit`); None: no limit.
    requests_per_minute: int | None = Field(default=None, gt=0)
    """Calls started per minute, spaced evenly (60 / requests_per_minute seconds apart)."""
    tokens_per_minute: int | None = Field(default=None, gt=0)
    """Tokens (prompt and completion) per minute. A call is counted at an estimate when it
    starts (its prompt's characters / 4, plus `max_tokens`, or else the average completion
    seen so far) and corrected by the usage in the reply."""
    max_in_flight: int | None = Field(default=None, gt=0)
    """Calls waiting on the endpoint at once, across all workers."""

    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Prices by model name, for costs and budgets (`relayq.budgets`):
    `{"gpt-4o-mini": ModelPrice(input=0.15, output=0.6)}`. A model without one has no cost."""

    def cost_of(self, usage: Usage, model: str | None = None) -> float | None:
        """What `usage` of `model` (by default this config's) cost; None with no price for it."""
        price = self.prices.get(model or self.model)
        return None if price is None else price.cost_of(usage)

    def key_variables(self) -> tuple[str, ...]:
        return (self.api_key_env,) if self.api_key_env else _KEY_VARIABLES[self.style]

    def resolve_key(self, explicit: str | None = None) -> str:
        """The API key: `explicit`, else the first of `key_variables()` that is set."""
        if explicit:
            return explicit
        for name in self.key_variables():
            value = os.environ.get(name)
            if value:
                return value
        raise ModelError(
            f"no API key for the {self.style} endpoint {self.base_url}: "
            f"set {' or '.join(self.key_variables())}, or pass api_key="
        )
