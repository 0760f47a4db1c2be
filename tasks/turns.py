"""`relayq.run_turn`: one model turn of one run, claimed, run and persisted.

claim (compare-and-swap on the run's version)
  -> take_turn (the model's reply is saved before any tool runs; each
     finished tool call goes to the ledger)
  -> one transaction: the turn's messages, the run's new state, and the
     next message in the outbox
  -> publish the outbox
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from relayq import ModelError, RelayqError, Request, RunCancelled, ToolResult
from relayq.agents import Agent, AgentError
from relayq.loop import Journal, Turn, take_turn
from relayq.relay import relay_calls_of
from store import (
    Claim,
    StaleClaim,
    cancel_requested,
    claim_turn,
    fail_run,
    finish_cancelled,
    finish_turn,
    ledger_get,
    ledger_put,
    list_requests,
    retry_turn,
    save_reply,
    transcript,
)
from store.outbox import TURN_QUEUE, TURN_TASK, mark_published
from tasks.publish import publish
from tasks.runtime import Runtime
from tasks.settings import MAX_COUNTDOWN

__all__ = ["TurnFailed", "backoff", "run_turn"]

log = logging.getLogger(__name__)


class TurnFailed(RelayqError):
    """The run failed in this turn; the error is stored on the run."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(run_id, error)
        self.run_id = run_id
        self.error = error

    def __str__(self) -> str:
        return f"run {self.run_id} failed: {self.error}"


def backoff(attempt: int, retry_after: float | None, *, base: float) -> float:
    """Exponential backoff with jitter, at least the server's Retry-After, below the ceiling."""
    delay = min(60.0, base * 2**attempt) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, MAX_COUNTDOWN)


class StoreJournal(Journal):
    """The turn's progress in the store: the reply before tools, each tool outcome after it."""

    def __init__(self, rt: Runtime, claim: Claim) -> None:
        self.rt = rt
        self.claim = claim

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        save_reply(self.rt.db, self.claim, messages)

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        return ledger_get(self.rt.db, self.claim.run_id, at, call_id, attempt)

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        ledger_put(self.rt.db, self.claim.run_id, at, call_id, attempt, outcome)


@dataclass(frozen=True)
class CancelFlag:
    """The run's cancel flag in the store, read at each turn and tool boundary."""

    rt: Runtime
    run_id: str

    def is_set(self) -> bool:
        return cancel_requested(self.rt.db, self.run_id)


def _missing_relay_tools(rt: Runtime, claim: Claim, relay_names: frozenset[str]) -> list[str]:
    names: set[str] = set()
    for stored in list_requests(rt.db, status=None, run_id=claim.run_id, kind="tool_call"):
        names.update(c.name for c in relay_calls_of(stored.request))
    return sorted(names - relay_names)


async def _turn(rt: Runtime, claim: Claim, agent: Agent) -> tuple[Turn, list[dict[str, Any]], str]:
    toolkit = await agent.toolkit()
    digest = toolkit.digest()
    if claim.tools_digest not in (None, digest):
        missing = _missing_relay_tools(rt, claim, toolkit.relay_names)
        if missing:
            raise AgentError(
                f"agent {agent.name!r} no longer declares relay tool(s) {', '.join(missing)} "
                f"that run {claim.run_id} used; it cannot resume",
                agent.name,
            )
    before = transcript(rt.db, claim.conversation_id)
    turn = await take_turn(
        before,
        toolkit,
        agent.model,
        run_id=claim.run_id,
        max_turns=agent.max_turns,
        system_prompt=agent.system_prompt,
        model_name=agent.model_name,
        journal=StoreJournal(rt, claim),
        cancel=CancelFlag(rt, claim.run_id),
    )
    return turn, before, digest


def drive_turn(rt: Runtime, task: Task | None, run_id: str, version: int) -> str:
    """Run one turn; returns what happened, in a word or two, for Flower."""
    task_id = task.request.id if task is not None else None
    claim = claim_turn(rt.db, run_id, version, task_id=task_id, lease=rt.settings.lease)
    if claim is None:
        return "skipped: stale or duplicate message"
    if claim.taken_over and claim.attempts > rt.settings.model_retries:
        # The turn keeps killing its worker (or outliving the hard time limit).
        error = f"the worker died {claim.attempts} times running this turn; giving up"
        fail_run(rt.db, claim, error)
        raise TurnFailed(run_id, error)
    try:
        agent = rt.agent(claim.agent)
        turn, before, digest = rt.loop.run(_turn(rt, claim, agent))
        outbox = finish_turn(
            rt.db,
            claim,
            before,
            turn,
            tools_digest=digest,
            request_ttl=agent.request_ttl,
            on_expiry=agent.on_expiry,
        )
    except StaleClaim:
        return "skipped: lost the claim"
    except RunCancelled:
        finish_cancelled(rt.db, claim)
        return "cancelled"
    except (ModelError, SoftTimeLimitExceeded) as exc:
        return _retry_or_fail(rt, task, claim, exc)
    except Exception as exc:
        error = _describe(exc)
        fail_run(rt.db, claim, error)
        raise TurnFailed(run_id, error) from None
    publish(task.app if task is not None else rt.sender, rt.db, outbox)
    return turn.status


def _retry_or_fail(rt: Runtime, task: Task | None, claim: Claim, exc: BaseException) -> str:
    retryable = isinstance(exc, SoftTimeLimitExceeded) or (
        isinstance(exc, ModelError) and exc.retryable
    )
    error = _describe(exc)
    if retryable and claim.attempts >= rt.settings.model_retries:
        error = f"gave up after {claim.attempts + 1} tries: {error}"
        retryable = False
    if not retryable:
        fail_run(rt.db, claim, error)
        raise TurnFailed(claim.run_id, error) from None
    retry_after = exc.retry_after if isinstance(exc, ModelError) else None
    countdown = backoff(claim.attempts, retry_after, base=rt.settings.retry_base)
    row = retry_turn(rt.db, claim, error=error, countdown=countdown)
    if task is None:
        publish(rt.sender, rt.db, [row])
        return "retrying"
    # A Celery retry, so Flower shows it as one; the outbox row covers a lost send.
    retry = task.retry(args=row.args, countdown=countdown, max_retries=None, throw=False)
    mark_published(rt.db, [row])
    raise retry


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, RelayqError) else f"{type(exc).__name__}: {text}"


@shared_task(
    name=TURN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, queue=TURN_QUEUE
)
def run_turn(self: Task, run_id: str, version: int) -> str:
    """One model turn of run `run_id`, if the run is still at `version`."""
    return drive_turn(Runtime.current(), self, run_id, version)
