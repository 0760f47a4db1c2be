"""Prometheus metrics of the work a process does: turns, model calls, tokens, cost, and
the provider limits' 429s and waits.

They are observed where the work happens (the turn task, the model call) into
prometheus_client's default registry: a worker serves them when
`RELAYQ_WORKER_METRICS_PORT` is set (`workers.metrics`), and an eager host
(`DurableClient(eager=True)`) has them in its own. What the store and the broker
hold (runs, open requests, queue depths) is read when the API is scraped instead
(`tasks.gauges`).

| metric | labels | what |
|---|---|---|
| `relayq_turn_duration_seconds` | agent, outcome | one turn, from its claim to its end |
| `relayq_model_calls_total` | agent, provider, model, result | `ok`, `error`, `rate_limited` |
| `relayq_model_call_duration_seconds` | provider, model | one model call |
| `relayq_model_tokens_total` | agent, provider, model, kind | `prompt`, `completion` |
| `relayq_model_cost_total` | agent, provider, model | once prices are known (`set_cost_function`) |
| `relayq_provider_rate_limited_total` | provider, model, status | 429 and 529 replies |
| `relayq_provider_limit_wait_seconds` | provider, model | time waited for the provider's capacity |
| `relayq_provider_circuit_changes_total` | provider, model, state | circuit changes seen here |

A provider is named by its endpoint's host (`api.openai.com`), as the provider
limiter's labels (`host/model`) name it, never by its key, port or path; a model
given as a function is `in-process`.

For a provider limiter, which calls these where it waits or meets a 429:

    from tasks.metrics import count_rate_limited, observe_limit_wait
    observe_limit_wait("api.openai.com", 1.5, model="gpt-4o")  # waited 1.5 s for capacity
    count_rate_limited("api.openai.com", model="gpt-4o")      # a 429 it took in and retried

A 429 that reaches the turn as a `ModelError(status=429)` is counted by the turn's
model wrapper (`observed_model`): count only those the limiter keeps from it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from prometheus_client import Counter, Histogram

from relayq import InProcessRequest, InProcessResponse, ModelError, Usage
from relayq.agents import Agent
from relayq.circuit import CircuitChange, CircuitHooks, ProviderDown
from relayq.model import Model
from relayq.providers import ProviderConfig
from relayq.ratelimit import LimiterHooks, LimitWait, Throttled
from tasks import tracing
from tasks.circuit import add_hooks as add_circuit_hooks
from tasks.limiter import add_hooks

if TYPE_CHECKING:
    from store.turns import Claim
    from tasks.deliveries import Outcome, TaskRef
    from tasks.runtime import Runtime

from relayq.pricing import CostFunction, cost_of, provider_prices, set_cost_function

__all__ = [
    "CostFunction",
    "cost_of",
    "provider_prices",
    "TurnSeen",
    "count_rate_limited",
    "observe_limit_wait",
    "observed_model",
    "observed_turn",
    "provider_label",
    "provider_of",
    "set_cost_function",
]

RATE_LIMITED = (429, 529)
"""Statuses that say the provider is over its limit (529: Anthropic's "overloaded")."""

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

TURN_SECONDS = Histogram(
    "relayq_turn_duration_seconds",
    "Turns, from the claim to the end: model call, tools and the store's writes",
    ["agent", "outcome"],
    buckets=_SECONDS,
)
MODEL_CALLS = Counter(
    "relayq_model_calls",
    "Model calls by result: ok, error, rate_limited",
    ["agent", "provider", "model", "result"],
)
MODEL_SECONDS = Histogram(
    "relayq_model_call_duration_seconds",
    "Model calls, from the request to the reply or the error",
    ["provider", "model"],
    buckets=_SECONDS,
)
TOKENS = Counter(
    "relayq_model_tokens",
    "Tokens the provider reported, by kind: prompt, completion",
    ["agent", "provider", "model", "kind"],
)
COST = Counter(
    "relayq_model_cost",
    "What model calls cost, in the unit of the configured prices (see set_cost_function)",
    ["agent", "provider", "model"],
)
RATE_LIMITED_REPLIES = Counter(
    "relayq_provider_rate_limited",
    "Replies saying the provider is over its limit (429, 529)",
    ["provider", "model", "status"],
)
LIMIT_WAIT = Histogram(
    "relayq_provider_limit_wait_seconds",
    "Time spent waiting for a provider's capacity (requests, tokens or calls in flight)",
    ["provider", "model"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

CIRCUIT_CHANGES = Counter(
    "relayq_provider_circuit_changes",
    "Provider circuit changes this process saw: open, half_open (it probed), closed",
    ["provider", "model", "state"],
)


def provider_label(config: ProviderConfig | None) -> str:
    """The provider's name in metrics: its endpoint's host; `in-process` for none."""
    if config is None:
        return "in-process"
    return urlsplit(config.base_url).hostname or "?"  # never the URL's user or password


def provider_of(agent: Agent) -> str:
    return provider_label(agent.provider.config if agent.provider is not None else None)


def observe_limit_wait(provider: str, seconds: float, *, model: str = "") -> None:
    """Time a call waited for the provider's capacity (for a provider limiter)."""
    LIMIT_WAIT.labels(provider, model).observe(max(0.0, seconds))


class _LimitWaits(LimiterHooks):
    """The provider limiter's waits in place, as `relayq_provider_limit_wait_seconds`.
    (Its rejections reach the turn as ModelErrors, which `observed_model` counts.)"""

    def after_wait(self, event: LimitWait) -> None:
        if not event.requeued:
            observe_limit_wait(event.host, event.seconds, model=event.model)


add_hooks(_LimitWaits())


class _CircuitChanges(CircuitHooks):
    """The provider circuits' changes, as `relayq_provider_circuit_changes_total`."""

    def after_change(self, event: CircuitChange) -> None:
        CIRCUIT_CHANGES.labels(event.host, event.model, event.state).inc()


add_circuit_hooks(_CircuitChanges())


def count_rate_limited(provider: str, *, model: str = "", status: int = 429) -> None:
    """One reply saying the provider is over its limit (for a provider limiter that
    takes it in; the turn counts those it sees raised)."""
    RATE_LIMITED_REPLIES.labels(provider, model, str(status)).inc()


def observed_model(agent: Agent, model: Model) -> Model:
    """`model`, the agent's for a durable turn, counted, timed and traced (`relayq.model`).

    A call the provider's limits keep back (Throttled) never reached the provider and
    is not counted; the time a call waits for them in place is part of its duration.
    """
    name, provider = agent.model_name, provider_of(agent)

    async def call(request: InProcessRequest) -> InProcessResponse:
        started = time.perf_counter()
        result: str | None = "error"
        with tracing.model_span(provider, name) as span:
            try:
                reply = await model(request)
                result = "ok"
            except Throttled:
                result = None
                raise
            except ProviderDown as exc:
                if not exc.called:
                    result = None  # kept back by the provider's open circuit: no call made
                raise
            except ModelError as exc:
                if exc.status in RATE_LIMITED:
                    result = "rate_limited"
                    count_rate_limited(provider, model=name, status=exc.status or 429)
                raise
            finally:
                if result is not None:
                    MODEL_SECONDS.labels(provider, name).observe(time.perf_counter() - started)
                    MODEL_CALLS.labels(agent.name, provider, name, result).inc()
            usage = reply.usage
            if usage is not None:
                _count_usage(agent, provider, name, usage)
                if span is not None:
                    span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        return reply

    return call


def _count_usage(agent: Agent, provider: str, model: str, usage: Usage) -> None:
    TOKENS.labels(agent.name, provider, model, "prompt").inc(usage.prompt_tokens)
    TOKENS.labels(agent.name, provider, model, "completion").inc(usage.completion_tokens)
    cost = cost_of(agent, usage)
    if cost is not None and cost > 0:
        COST.labels(agent.name, provider, model).inc(cost)


@dataclass
class TurnSeen:
    """What `observed_turn` learns of the turn it watches."""

    outcome: str = "failed"
    """The first word of the turn's summary: done, next, pending, incomplete, retry,
    cancelled, skipped; failed when the turn raised."""
    pending: str | None = None
    """The request the run now waits on, if it halted."""

    def ended(self, outcome: Outcome) -> Outcome:
        """Note how the turn ended; returns `outcome`."""
        self.outcome = outcome.summary.split(maxsplit=1)[0].rstrip(":")
        halted = outcome.turn.pending if outcome.turn is not None else None
        self.pending = halted.id if halted is not None else None
        return outcome


@asynccontextmanager
async def observed_turn(rt: Runtime, task: TaskRef | None, claim: Claim) -> AsyncIterator[TurnSeen]:
    """Time the claimed turn (`relayq_turn_duration_seconds`) and trace it (`relayq.turn`)."""
    seen = TurnSeen()
    started = time.perf_counter()
    header = getattr(task.request, "traceparent", None) if task is not None else None
    try:
        async with tracing.turn_span(rt, header, claim) as span:
            yield seen
            if span is not None:
                span.set_attribute("relayq.outcome", seen.outcome)
                if seen.pending is not None:
                    span.set_attribute("relayq.request_id", seen.pending)
    finally:
        TURN_SECONDS.labels(claim.agent, seen.outcome).observe(time.perf_counter() - started)
