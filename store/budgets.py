"""Budgets in the store: the gate before each model call, and a person's answer to a
`budget` request (`relayq.budgets`).

The gate runs in one transaction under the run's lock (and its batch's, when the
batch has a budget), so two turns of one batch never both open its request: the
first run past the batch's budget asks, and the batch's other runs wait on that
request (pending, `waiting_on` it) until it is decided: one question for the
batch, however many runs reach the limit. A run past its own budget asks on its
own. An approval raises the budget and the run (and every run waiting with it)
goes on; a decline, or the request's deadline, ends it `over_budget`, and for a
batch's budget, every run waiting and every other run of the batch at its next call.
If the asking run stops otherwise (cancelled, failed), its waiters go back to
their queue and look again (`store.requests.cancel_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlmodel import Session, col, select

from relayq import Answer
from relayq.budgets import Budget, Spent, budget_request, overrun, raised
from store.db import Database
from store.errors import StaleClaim
from store.events import emit
from store.models import BatchRow, OutboxRow, RequestRow, RunRow, utcnow
from store.outbox import enqueue_turn
from store.requests import (
    cancel_requests,
    open_request,
    release_waiters,
    request_of,
    waiters_of,
)
from store.runs import label_of
from store.transitions import move

__all__ = ["Gate", "budget_answered", "budget_gate", "end_over_budget"]


@dataclass(frozen=True)
class Gate:
    """What the budgets let a turn do before it calls the model."""

    verdict: Literal["go", "asked", "waiting", "ended"]
    """`go`: call the model; `asked`: the run waits on its `budget` request; `waiting`: on
    its batch's, which another run asked; `ended`: the run is `over_budget`."""
    detail: str = ""
    charge_batch: str | None = None
    """The batch whose spending the turn adds to (a batch with a budget)."""


def budget_gate(
    db: Database,
    run_id: str,
    version: int,
    *,
    default: Budget | None,
    next_call: Spent,
    now: datetime | None = None,
) -> Gate:
    """Let the run's turn call the model, or stop it at its budget or its batch's.

    `default` is the agent's budget, for a run with none of its own; `next_call`
    the guess at the call about to be made. StaleClaim if the turn lost its run.
    """
    moment = now or utcnow()
    with db.write() as s:
        run = s.get(RunRow, run_id, with_for_update=True)
        if run is None or run.version != version or run.status != "running":
            raise StaleClaim(run_id, version)
        budget = Budget.from_wire(run.budget) or default
        over = overrun(budget, Spent(run.total_tokens, run.cost), next_call, "run")
        batch = _budgeted_batch(s, run)
        if over is None and batch is not None:
            if batch.over_budget:
                why = f"its batch {batch.id} is over its budget, which was not raised"
                end_over_budget(s, run, moment, why)
                return Gate("ended", why)
            spent = Spent(batch.spent_tokens, batch.spent_cost)
            over = overrun(Budget.from_wire(batch.budget), spent, next_call, "batch")
        charge = batch.id if batch is not None else None
        if over is None:
            return Gate("go", charge_batch=charge)
        if over.budget.on_exceed == "end":
            why = f"over {over.describe()}"
            end_over_budget(s, run, moment, why)
            return Gate("ended", why)
        if over.scope == "batch" and batch is not None:
            asking = _batch_request_undecided(s, batch.id)
            if asking is not None:
                move(s, run, "pending", now=moment, waiting_on=asking)
                return Gate("waiting", f"waits on {asking} for its batch's budget")
        request = budget_request(over, run_id=run.id, batch_id=run.batch_id, now=moment)
        move(s, run, "pending", now=moment)
        open_request(s, run, request, moment, ttl=None, on_expiry="error")
        return Gate("asked", f"asks {request.id}: {over.describe()}")


def _budgeted_batch(s: Session, run: RunRow) -> BatchRow | None:
    """The run's batch, locked, if it has a budget."""
    if run.batch_id is None:
        return None
    batch = s.get(BatchRow, run.batch_id, with_for_update=True)
    return batch if batch is not None and batch.budget else None


def _batch_request_undecided(s: Session, batch_id: str) -> str | None:
    """The batch's budget request still to take effect: open, or decided and not yet
    applied (the answer task is on its way). A run past the batch's budget waits on it;
    asking again would ask a person twice for one batch."""
    return s.exec(
        select(RequestRow.id)
        .join(RunRow, col(RunRow.id) == col(RequestRow.run_id))
        .where(
            RunRow.batch_id == batch_id,
            RequestRow.kind == "budget",
            col(RequestRow.status).in_(("open", "answered", "expired")),
            col(RequestRow.applied).is_(False),
        )
        .limit(1)
    ).first()


def end_over_budget(s: Session, run: RunRow, now: datetime, why: str) -> None:
    """End a run the caller has locked `over_budget`, saying why."""
    run_id, agent = run.id, run.agent
    move(s, run, "over_budget", now=now, error=why)
    cancel_requests(s, [run_id])
    emit(s, "run.finished", run_id=run_id, now=now, agent=agent, status="over_budget")


def budget_answered(s: Session, row: RequestRow, run: RunRow) -> list[OutboxRow]:
    """Apply the decision on `budget` request `row` (answered or expired) to its run, which
    the caller has locked pending: raise the budget and queue the run, or end it."""
    now = utcnow()
    request = request_of(row)
    scope = request.data.get("scope")
    asked = Budget.model_validate(request.data["budget"])
    answer = Answer.model_validate(row.answer) if row.answer else None
    batch = s.get(BatchRow, run.batch_id, with_for_update=True) if scope == "batch" else None
    if row.status != "answered" or answer is None or not answer.ok:
        why = _declined(row, answer)
        if batch is not None:
            batch.over_budget = True
        for waiting in [run, *waiters_of(s, [row.id])]:
            end_over_budget(s, waiting, now, why)
        return []
    allowed = raised(request, answer.data, asked).to_wire()
    if batch is not None:
        batch.budget = allowed
        move(s, run, "queued", now=now)
    else:
        move(s, run, "queued", now=now, budget=allowed)
    next_turn = enqueue_turn(s, run.id, run.version, label=label_of(run))
    return [next_turn, *release_waiters(s, [row.id], now)]


def _declined(row: RequestRow, answer: Answer | None) -> str:
    what = "its batch's budget" if (row.data or {}).get("scope") == "batch" else "its budget"
    if row.status == "expired":
        return f"over {what}: request {row.id} expired undecided"
    reason = (answer.reason or "").strip() if answer is not None else ""
    by = f" by {row.answered_by}" if row.answered_by else ""
    return f"over {what}: raising it was declined{by}" + (f": {reason}" if reason else "")
