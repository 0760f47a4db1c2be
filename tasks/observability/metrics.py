"""Prometheus metrics of the work a process does: turns, model calls, tokens, cost, and
the provider limits' 429s and waits.

They are observed by `Metrics`, a hook every runtime registers (`tasks.hooks`),
from the turns' and model calls' events, into prometheus_client's default
registry: a worker serves them when `RELAYQ_WORKER_METRICS_PORT` is set
(`workers.metrics`), and an eager host (`DurableClient(eager=True)`) has them in
its own. What the store and the broker
hold (runs, open requests, queue depths) is read when the API is scraped instead
(`tasks.observability.gauges`).

| metric | labels | what |
|---|---|---|
| `relayq_turn_duration_seconds` | agent, outcome | a turn, claim to end; outcome: `TurnOutcome` |
| `relayq_model_calls_total` | agent, provider, model, result | `ok`, `error`, `rate_limited` |
| `relayq_model_call_duration_seconds` | provider, model | one model call |
| `relayq_model_tokens_total` | agent, provider, model, kind | `prompt`, `completion` |
| `relayq_model_cost_total` | agent, provider, model | once prices are known (`set_cost_function`) |
| `relayq_provider_rate_limited_total` | provider, model, status | 429 and 529 replies |
| `relayq_provider_limit_wait_seconds` | provider, model | time waited for the provider's capacity |
| `relayq_provider_circuit_changes_total` | provider, model, state | circuit changes seen here |
| `relayq_store_call_wait_seconds` | store | the oldest store call in flight's wait (PostgreSQL) |
| `relayq_broker_unheard_seconds` | broker | since the worker's consumer last heard its broker |
| `relayq_loop_stalls_total` | | the worker's event loop stalled (`tasks.runner.loopwatch`) |
| `relayq_loop_stall_seconds` | | a stall's length, once it ended (or ended the process) |
| `relayq_tool_threads_abandoned_total` | | sync tool calls given up on while their thread ran on |
| `relayq_tool_threads_stuck` | | such threads still running (`tasks.runner.tool_threads`) |

A provider is named by its endpoint's host (`api.openai.com`), as the provider
limiter's labels (`host/model`) name it, never by its key, port or path; a model
given as a function is `in-process`.

For a provider limiter, which calls these where it waits or meets a 429:

    from tasks.observability.metrics import count_rate_limited, observe_limit_wait
    observe_limit_wait("api.openai.com", 1.5, model="gpt-4o")  # waited 1.5 s for capacity
    count_rate_limited("api.openai.com", model="gpt-4o")      # a 429 it took in and retried

A 429 that reaches the turn as a `ModelError(status=429)` is counted by the turn's
hooks (`Metrics.after_model_call`): count only those the limiter keeps from it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from prometheus_client import Counter, Gauge, Histogram

from relayq.circuit import CircuitChange, CircuitHooks
from relayq.pricing import CostFunction, cost_of, provider_prices, set_cost_function
from relayq.ratelimit import LimiterHooks, LimitWait
from store import Database
from tasks.broker.circuit import add_hooks as add_circuit_hooks
from tasks.broker.limiter import add_hooks
from tasks.hooks import ModelCalled, RunHooks, TurnEnded, provider_label, provider_of

__all__ = [
    "CostFunction",
    "cost_of",
    "provider_prices",
    "Metrics",
    "count_rate_limited",
    "hosts_waiting",
    "observe_limit_wait",
    "observe_broker_unheard",
    "count_loop_stall",
    "count_abandoned_tool_thread",
    "set_stuck_tool_threads",
    "observe_loop_stall",
    "observe_store_calls",
    "provider_label",
    "provider_of",
    "set_cost_function",
]

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


def observe_limit_wait(provider: str, seconds: float, *, model: str = "") -> None:
    """Time a call waited for the provider's capacity (for a provider limiter)."""
    LIMIT_WAIT.labels(provider, model).observe(max(0.0, seconds))


class _LimitWaits(LimiterHooks):
    """The provider limiter's waits in place, as `relayq_provider_limit_wait_seconds`.
    (Its rejections reach the turn as ModelErrors, which `Metrics` counts.)"""

    def after_wait(self, event: LimitWait) -> None:
        if not event.requeued:
            observe_limit_wait(event.host, event.seconds, model=event.model)


add_hooks(_LimitWaits())


class _CircuitChanges(CircuitHooks):
    """The provider circuits' changes, as `relayq_provider_circuit_changes_total`."""

    def after_change(self, event: CircuitChange) -> None:
        CIRCUIT_CHANGES.labels(event.host, event.model, event.state).inc()


add_circuit_hooks(_CircuitChanges())


STORE_CALL_WAIT = Gauge(
    "relayq_store_call_wait_seconds",
    "Seconds the oldest store call in flight has waited for the store's answer (0 with none)",
    ["store"],
    multiprocess_mode="livemax",
)


def observe_store_calls(db: Database) -> None:
    """Keep `relayq_store_call_wait_seconds` up to date, each second, from the store's watch
    of its round trips (`store.stalls`; PostgreSQL only: SQLite's calls are local)."""
    if db.stalls is not None:
        setter = STORE_CALL_WAIT.labels(store=db.engine.dialect.name).set
        if setter not in db.stalls.on_tick:
            db.stalls.on_tick.append(setter)


BROKER_UNHEARD = Gauge(
    "relayq_broker_unheard_seconds",
    "Seconds since the worker's consumer last heard its broker (a reply, or a connection)",
    ["broker"],
    multiprocess_mode="livemax",
)


def observe_broker_unheard(seconds: float, *, broker: str) -> None:
    """Set by the worker's consumer each second (`workers.broker_heard`)."""
    BROKER_UNHEARD.labels(broker=broker).set(seconds)


LOOP_STALLS = Counter(
    "relayq_loop_stalls_total",
    "Times the worker's event loop did not turn for RELAYQ_LOOP_STALL (tasks.runner.loopwatch)",
)
LOOP_STALL_SECONDS = Histogram(
    "relayq_loop_stall_seconds",
    "How long the worker's event loop stood still, once it turned again or the process ended",
    buckets=_SECONDS,
)


def count_loop_stall() -> None:
    """A stall declared (`tasks.runner.loopwatch`): counted at once, so a scrape sees it
    meanwhile."""
    LOOP_STALLS.inc()


def observe_loop_stall(seconds: float) -> None:
    """A stall's length, once it ended."""
    LOOP_STALL_SECONDS.observe(seconds)


TOOL_THREADS_ABANDONED = Counter(
    "relayq_tool_threads_abandoned_total",
    "Sync tool calls given up on (a timeout, a cancelled turn) while their thread ran on",
)
TOOL_THREADS_STUCK = Gauge(
    "relayq_tool_threads_stuck",
    "Threads of given-up sync tool calls still running (tasks.runner.tool_threads)",
    multiprocess_mode="livesum",
)


def count_abandoned_tool_thread() -> None:
    TOOL_THREADS_ABANDONED.inc()


def set_stuck_tool_threads(threads: int) -> None:
    TOOL_THREADS_STUCK.set(threads)


HOSTS_WAITING = Gauge(
    "relayq_relay_hosts_waiting",
    "Lease requests of relay hosts this API holds open, waiting for a call to offer",
    multiprocess_mode="livesum",
)


def hosts_waiting() -> AbstractContextManager[None]:
    """Counts a lease request in `relayq_relay_hosts_waiting` while it is open
    (`api._relay`)."""
    return HOSTS_WAITING.track_inprogress()


def count_rate_limited(provider: str, *, model: str = "", status: int = 429) -> None:
    """One reply saying the provider is over its limit (for a provider limiter that
    takes it in; the turn counts those it sees raised)."""
    RATE_LIMITED_REPLIES.labels(provider, model, str(status)).inc()


class Metrics(RunHooks):
    """Turns and model calls, as the metrics above: registered on every runtime."""

    on_loop = True  # quick, and made for the loop (`RunHooks.on_loop`)

    def after_turn(self, event: TurnEnded) -> None:
        TURN_SECONDS.labels(event.agent, event.outcome.value).observe(event.seconds)

    def after_model_call(self, event: ModelCalled) -> None:
        # A call kept back by the provider's limits or open circuit never reached it.
        if event.result is None:
            return
        MODEL_SECONDS.labels(event.provider, event.model).observe(event.seconds)
        MODEL_CALLS.labels(event.agent, event.provider, event.model, event.result).inc()
        if event.result == "rate_limited":
            count_rate_limited(event.provider, model=event.model, status=event.status or 429)
        usage = event.usage
        if usage is not None:
            labels = (event.agent, event.provider, event.model)
            TOKENS.labels(*labels, "prompt").inc(usage.prompt_tokens)
            TOKENS.labels(*labels, "completion").inc(usage.completion_tokens)
            if event.cost is not None and event.cost > 0:
                COST.labels(*labels).inc(event.cost)
