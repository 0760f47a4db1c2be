"""Hooks: what watches a run's work (metrics, traces, announcements, a user's accounting)
without being woven into it.

A hook is a `RunHooks` subclass overriding the methods it cares about; each method
takes one frozen event and may be sync or async. The turn driver, the answer and
cancel tasks and the client emit the events; `Hooks` calls every hook that
overrides the method, in registration order for `before_*` methods and in reverse
for `after_*` ones (so a hook that opens something in `before_turn` closes it after
the hooks registered later have seen the end). A hook that raises is logged, by
its name and the error's type, and skipped: watching never fails a turn.

Register hooks on an agent (`Agent(..., hooks=[...])`: its runs' events only), or
for every run a worker takes with the `RELAYQ_HOOKS` setting (`module:Class` names,
comma-separated: a class is built with no arguments, an instance used as it is);
relayq's own (metrics, traces, and on a worker announcements and Flower's
progress) come first. Events carry ids, names, counts and times, never a prompt, a
transcript, a tool's arguments or an answer.

The events, their order and an example (tokens counted per tenant): docs/hooks.md.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from relayq import RelayqError, Usage
from relayq.agents import Agent
from relayq.hooking import Emitter, HookEvent
from relayq.providers import ProviderConfig

if TYPE_CHECKING:
    from store import OutboxRow

__all__ = [
    "AnswerApplied",
    "AnswerApplying",
    "BadHook",
    "Hooks",
    "ModelCalled",
    "ModelCalling",
    "RequestDecided",
    "RequestOpened",
    "RunHooks",
    "RunSettled",
    "Sending",
    "ToolRan",
    "ToolStarting",
    "TurnEnded",
    "TurnOutcome",
    "TurnStarted",
    "hooks_named",
    "provider_label",
    "provider_of",
]

log = logging.getLogger(__name__)

RATE_LIMITED = (429, 529)
"""Statuses that say the provider is over its limit (529: Anthropic's "overloaded"): a
model call that met one ended `rate_limited`."""


def provider_label(config: ProviderConfig | None) -> str:
    """A provider as events and metrics name it: its endpoint's host; `in-process` for
    none (never the URL's user, password, port or path)."""
    if config is None:
        return "in-process"
    return urlsplit(config.base_url).hostname or "?"


def provider_of(agent: Agent) -> str:
    return provider_label(agent.provider.config if agent.provider is not None else None)


class TurnOutcome(StrEnum):
    """How one delivery of a turn ended: the `outcome` label of
    `relayq_turn_duration_seconds` and of the `relayq.turn` span."""

    NEXT = "next"
    """Tools ran; the run's next turn is queued."""
    DONE = "done"
    PENDING = "pending"
    """The run waits on a request (relay calls, an approval, a budget)."""
    INCOMPLETE = "incomplete"
    """The agent's `max_turns` was reached."""
    CANCELLED = "cancelled"
    OVER_BUDGET = "over_budget"
    FAILED = "failed"
    RETRY = "retry"
    """The model call failed in a way worth trying again; sent again after a backoff."""
    WAITING = "waiting"
    """On a provider that is down or out of capacity; sent again without a try spent."""
    GIVEN_BACK = "given_back"
    """The store went away under the turn; the run went back to its queue."""
    SKIPPED = "skipped"
    """A stale or duplicate delivery, or one whose claim another process took."""

    @property
    def settles(self) -> bool:
        """Whether the run is left out of the queue (done, waiting on a request, ended)."""
        return self in _SETTLED


_SETTLED = frozenset(
    {
        TurnOutcome.DONE,
        TurnOutcome.PENDING,
        TurnOutcome.INCOMPLETE,
        TurnOutcome.CANCELLED,
        TurnOutcome.OVER_BUDGET,
        TurnOutcome.FAILED,
    }
)


class RunHooks:
    """The base of every hook: each method does nothing until a subclass overrides it.

    An `async def` method is awaited on the worker's loop; a plain `def` one runs on a
    thread (the loop's default executor: `tasks.runner.tool_threads`), so a hook that blocks
    never stalls the turns beside it. relayq's own hooks, quick and written for the
    loop, set `on_loop` and are called on it.
    """

    on_loop: ClassVar[bool] = False
    """Call this hook's plain methods on the loop (relayq's own hooks only)."""

    def before_turn(self, event: TurnStarted) -> Any: ...
    def after_turn(self, event: TurnEnded) -> Any: ...
    def before_model_call(self, event: ModelCalling) -> Any: ...
    def after_model_call(self, event: ModelCalled) -> Any: ...
    def before_tool(self, event: ToolStarting) -> Any: ...
    def after_tool(self, event: ToolRan) -> Any: ...
    def after_request_opened(self, event: RequestOpened) -> Any: ...
    def after_request_decided(self, event: RequestDecided) -> Any: ...
    def before_answer_applied(self, event: AnswerApplying) -> Any: ...
    def after_answer_applied(self, event: AnswerApplied) -> Any: ...
    def after_run_settled(self, event: RunSettled) -> Any: ...
    def before_send(self, event: Sending) -> Any: ...


@dataclass(frozen=True, slots=True)
class TurnStarted(HookEvent, hook=RunHooks.before_turn):
    """A turn was claimed and is about to run (its model call and tools)."""

    run_id: str
    agent: str
    turn: int
    """The turn's number in its run, from 1."""
    attempt: int
    """1, or more when earlier tries of this turn failed."""
    task_id: str | None
    """The Celery task delivering it (None in eager mode)."""
    traceparent: str | None = None
    """The W3C trace context its message carried, if any."""


@dataclass(frozen=True, slots=True)
class TurnEnded(HookEvent, hook=RunHooks.after_turn):
    """A claimed turn's delivery ended, however it did."""

    run_id: str
    agent: str
    turn: int
    outcome: TurnOutcome
    seconds: float
    """From the claim to the end."""
    request_id: str | None = None
    """The request the run now waits on, when the outcome is `pending`."""
    error: str | None = None
    """The type of the exception that ended it, when one did (never its text)."""


@dataclass(frozen=True, slots=True)
class ModelCalling(HookEvent, hook=RunHooks.before_model_call):
    """A turn is about to call its model."""

    run_id: str
    agent: str
    provider: str
    """The endpoint's host (`api.openai.com`); `in-process` for a model function."""
    model: str


@dataclass(frozen=True, slots=True)
class ModelCalled(HookEvent, hook=RunHooks.after_model_call):
    """A model call ended: `ok`, `error`, `rate_limited`, or `None` when the call never
    reached the provider (kept back by its limits or its open circuit)."""

    run_id: str
    agent: str
    provider: str
    model: str
    result: str | None
    seconds: float
    usage: Usage | None = None
    cost: float | None = None
    """What the usage cost at the configured prices (None: no price known)."""
    status: int | None = None
    """The provider's HTTP status, for an error that had one."""
    error: str | None = None
    """The type of the exception the call raised, if it did (never its text)."""


@dataclass(frozen=True, slots=True)
class ToolStarting(HookEvent, hook=RunHooks.before_tool):
    """A tool of ours is about to run for one call of a turn."""

    run_id: str
    agent: str
    call_id: str


@dataclass(frozen=True, slots=True)
class ToolRan(HookEvent, hook=RunHooks.after_tool):
    """A tool of ours ran for one call of a turn (relay calls are the host's)."""

    run_id: str
    agent: str
    call_id: str
    is_error: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class RequestOpened(HookEvent, hook=RunHooks.after_request_opened):
    """A turn suspended its run on a stored request."""

    run_id: str
    agent: str
    request_id: str
    kind: str
    """`tool_call`, `approval` or `budget`."""


@dataclass(frozen=True, slots=True)
class RequestDecided(HookEvent, hook=RunHooks.after_request_decided):
    """The store took an answer (or a vote) on a request, where it was given."""

    request_id: str
    run_id: str
    ok: bool
    resolved: bool
    """Whether the request is now answered (a vote short of its quorum is not)."""
    via: str
    """`api`, `cli`, `inbox`, `host`, ..."""
    started_ns: int
    """When the decision was asked for (`time.time_ns()`)."""


@dataclass(frozen=True, slots=True)
class AnswerApplying(HookEvent, hook=RunHooks.before_answer_applied):
    """A worker is about to apply a request's answer to its run."""

    request_id: str


@dataclass(frozen=True, slots=True)
class AnswerApplied(HookEvent, hook=RunHooks.after_answer_applied):
    """A worker applied a request's answer, or found it applied already."""

    request_id: str
    resumed: bool
    """Whether the run was queued again by it."""
    error: str | None = None
    """The type of the exception applying it raised, if it did."""


@dataclass(frozen=True, slots=True)
class RunSettled(HookEvent, hook=RunHooks.after_run_settled):
    """A run left the queue: done, waiting on a request, or ended."""

    run_id: str
    agent: str | None
    status: str
    """`done`, `pending`, `incomplete`, `cancelled`, `over_budget` or `failed`."""


@dataclass(frozen=True, slots=True)
class Sending(HookEvent, hook=RunHooks.before_send):
    """Messages are about to be sent to the broker (or run, in eager mode)."""

    rows: Sequence[OutboxRow]


class BadHook(RelayqError, ValueError):
    """A hook named in the settings or given to an agent that is not a `RunHooks`."""


class Hooks(Emitter[RunHooks]):
    """The hooks of one runtime or client (`relayq.hooking.Emitter`): `emit(event)` tells
    each hook overriding the event's method, `extra` (an agent's) after the rest."""

    def __init__(self, hooks: Iterable[RunHooks] = ()) -> None:
        super().__init__(
            hooks, base=RunHooks, failure="hook %(hook)s.%(method)s failed (%(error)s); skipped"
        )

    def add(self, hook: RunHooks) -> None:
        """Register `hook` after those registered before it."""
        if not isinstance(hook, RunHooks):
            raise BadHook(f"{hook!r} is not a RunHooks (tasks.hooks.RunHooks)")
        super().add(hook)


def hooks_named(names: Iterable[str]) -> list[RunHooks]:
    """The hooks `RELAYQ_HOOKS` names (`module:Class`), each built with no arguments."""
    found: list[RunHooks] = []
    for name in names:
        module_name, _, attr = name.strip().partition(":")
        if not module_name or not attr:
            raise BadHook(f"a hook is named `module:Class`, not {name!r}")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise BadHook(f"cannot load hook {name!r}: {type(exc).__name__}: {exc}") from None
        hook = target() if isinstance(target, type) else target
        if not isinstance(hook, RunHooks):
            raise BadHook(f"hook {name!r} is not a RunHooks (tasks.hooks.RunHooks)")
        found.append(hook)
    return found
