"""What the hooks (`tasks.hooks`) hear of a claimed turn: its start, each model call, and
then the request it opened, its end, and the run settling, if it did.

The runtime's hooks hear all of it, and the agent's own after them (`Hooks.emit`).
"""

from __future__ import annotations

import time
from types import TracebackType

from relayq import InProcessRequest, InProcessResponse, ModelError
from relayq.agents import Agent
from relayq.circuit import ProviderDown
from relayq.model import Model
from relayq.pricing import cost_of
from relayq.ratelimit import Throttled
from store import Claim
from tasks.deliveries import Delivered
from tasks.hooks import (
    RATE_LIMITED,
    ModelCalled,
    ModelCalling,
    RequestOpened,
    RunHooks,
    RunSettled,
    TurnEnded,
    TurnOutcome,
    TurnStarted,
    provider_of,
)
from tasks.runner.runtime import Runtime
from tasks.runner.turn.failed import TurnFailed

__all__ = ["TurnReport", "watched"]


class TurnReport:
    """Tells the hooks of one claimed turn: its start when entered, how it ended when left.

    The driver sets `outcome` before leaving; a turn that raises ends with none, and
    the error's type. A `TurnFailed` settles the run: its error is stored.
    """

    def __init__(
        self, rt: Runtime, claim: Claim, *, task_id: str | None, traceparent: str | None
    ) -> None:
        self.rt = rt
        self.task_id = task_id
        self.traceparent = traceparent
        self.claim = claim
        self.outcome: Delivered | None = None
        """What the turn came to (None: it raised)."""
        self.error: str | None = None
        """The type of the error the turn met, raised or dealt with (the store gone away)."""
        agent = rt.known_agent(claim.agent)
        self._hooks: tuple[RunHooks, ...] = agent.hooks if agent is not None else ()
        self._started = 0.0

    async def __aenter__(self) -> TurnReport:
        claim, task_id, header = self.claim, self.task_id, self.traceparent
        self._started = time.perf_counter()
        await self.rt.hooks.emit(
            TurnStarted(
                claim.run_id, claim.agent, claim.turns + 1, claim.attempts + 1, task_id, header
            ),
            self._hooks,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        failed = False
        if exc is not None:
            self.error = type(exc).__name__
            failed = isinstance(exc, TurnFailed)  # stored on the run: it settled
        await self._ended(time.perf_counter() - self._started, failed=failed)

    async def _ended(self, seconds: float, *, failed: bool) -> None:
        """Tell the hooks how the claimed turn ended: the request it opened, the turn's end,
        and the run settling (a failed run too)."""
        claim, hooks, outcome = self.claim, self._hooks, self.outcome
        kind = outcome.kind if outcome is not None else TurnOutcome.FAILED
        pending = outcome.turn.pending if outcome is not None and outcome.turn is not None else None
        if pending is not None:
            opened = RequestOpened(claim.run_id, claim.agent, pending.id, pending.kind)
            await self.rt.hooks.emit(opened, hooks)
        ended = TurnEnded(
            claim.run_id,
            claim.agent,
            claim.turns + 1,
            kind,
            seconds,
            pending.id if pending is not None else None,
            self.error,
        )
        await self.rt.hooks.emit(ended, hooks)
        if failed or (outcome is not None and kind.settles):
            settled = RunSettled(claim.run_id, claim.agent, kind.value)
            await self.rt.hooks.emit(settled, hooks)


def watched(rt: Runtime, claim: Claim, agent: Agent, model: Model) -> Model:
    """`model`, with the hooks told of each call (`ModelCalling`, `ModelCalled`)."""
    name, provider = agent.model_name, provider_of(agent)
    hooks: tuple[RunHooks, ...] = agent.hooks

    async def call(request: InProcessRequest) -> InProcessResponse:
        await rt.hooks.emit(ModelCalling(claim.run_id, agent.name, provider, name), hooks)
        started = time.perf_counter()
        result: str | None = "error"
        reply: InProcessResponse | None = None
        status: int | None = None
        error: str | None = None
        try:
            reply = await model(request)
            result = "ok"
            return reply
        except Throttled:
            result = None  # kept back by the provider's limits: no call made
            raise
        except ProviderDown as exc:
            if not exc.called:
                result = None  # kept back by the provider's open circuit
            error = type(exc).__name__
            raise
        except ModelError as exc:
            status = exc.status
            if exc.status in RATE_LIMITED:
                result = "rate_limited"
            error = type(exc).__name__
            raise
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            usage = reply.usage if reply is not None else None
            called = ModelCalled(
                claim.run_id,
                agent.name,
                provider,
                name,
                result,
                time.perf_counter() - started,
                usage,
                cost_of(agent, usage) if usage is not None else None,
                status,
                error,
            )
            await rt.hooks.emit(called, hooks)

    return call
