"""Turns: claim a run, journal the reply, finish, retry or fail.

A turn message carries `(run_id, version)`. Claiming is a compare-and-swap:
the run must be `queued` at that version (or `running` under a claim by the
very same task message, which a broker redelivers only when the worker that
held it died). Every later write of the turn checks the claim still holds,
so a turn that lost its run writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlmodel import Session, select

from relayq import Usage
from relayq import transcript as tx
from relayq.loop import Turn
from store import statements as sql
from store.db import Database
from store.errors import StaleClaim
from store.events import emit
from store.ledger import LedgerEntry, ledger_values, write_entries
from store.messages import conversation, storable_text, write_messages
from store.models import BatchRow, OutboxRow, RunRow, utcnow
from store.outbox import enqueue_turn, turn_label
from store.requests import open_request
from store.runs import cancel_locked, fail_locked, label_of
from store.transitions import ONE_MORE_ATTEMPT, ONE_MORE_CRASH, SPENT_MESSAGES, died_holding, move
from store.workers import WORKER_TIMEOUT, holder_alive

__all__ = [
    "Charge",
    "Claim",
    "cancel_requested",
    "claim_turn",
    "fail_run",
    "finish_cancelled",
    "finish_turn",
    "requeue_turn",
    "retry_turn",
    "save_reply",
]


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A turn's hold on its run, valid while the run stays at `version`."""

    run_id: str
    version: int
    agent: str
    conversation_id: str
    tools_digest: str | None
    attempts: int
    """Failed model calls of this turn so far."""
    crashes: int
    """Workers that died holding this turn so far."""
    turns: int
    total_tokens: int = 0
    """Tokens the run's model calls have spent so far."""
    cost: float = 0.0
    """What they cost, by the provider's prices."""
    budget: dict[str, Any] | None = None
    """The run's own budget (`relayq.budgets.Budget` wire), if it has one."""
    batch_id: str | None = None
    batch_budgeted: bool = False
    """The run's batch had a budget when the turn was claimed."""
    taken_over: bool = False
    """This delivery took the run over from one whose worker died."""
    suspect: bool = False
    """The run's worker died holding it beside other turns: it runs alone until a turn ends."""
    alone: bool = False
    """The claimant's process runs this turn alone: its death counts as the turn's."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation's transcript as the claim found it."""
    started_by: str | None = None
    """Who started the run (a tool's `ToolContext.started_by`)."""


def claim_turn(
    db: Database,
    run_id: str,
    version: int,
    *,
    task_id: str | None,
    lease: timedelta,
    worker: str | None = None,
    worker_timeout: timedelta = WORKER_TIMEOUT,
    kept: list[dict[str, Any]] | None = None,
    heartbeats_steady: Callable[[], bool] = lambda: True,
    alone: bool = False,
    apart: bool = False,
) -> Claim | None:
    """Take the run for one turn, or None if this message is stale or a duplicate.

    A claim made by `worker` lasts while that worker's heartbeat does; one
    made with no worker lasts `lease`. `kept` is the transcript this process
    left the run with at `version`: a claim at that version proves nothing has
    changed it since, so it is not read again. A redelivered message takes its
    run over from a worker whose heartbeat is stale only while
    `heartbeats_steady()` (see `store.maintenance`). `alone`: the claimant's process runs
    no other turn while this one runs (a prefork child); `apart`: the claimant runs a
    suspect run's turn in a child process, and counts that child's death itself; where it
    cannot, a suspect run's claim is held alone too (`store.statements.HELD_ALONE`).
    """
    now = utcnow()
    until = None if worker is not None else now + lease
    # The common case in one statement: a queued run at this version. With the transcript
    # kept, that statement is the whole claim, sent alone (`Database.single`); without, the
    # transcript is read in the claim's transaction, so that a failed read undoes the claim.
    with db.single() if kept is not None else db.transaction() as conn:
        took = conn.execute(
            sql.CLAIM,
            {
                "rid": run_id,
                "v": version,
                "claimed_by": task_id,
                "worker": worker,
                "lease_until": until,
                "now": now,
                "alone": alone,
                "apart": apart,
            },
        ).first()
        if took is not None:
            messages = kept if kept is not None else conversation(conn, took.conversation_id)
            return _claim_of(run_id, took, messages, batch_budgeted=bool(took.batch_budget))
    with db.write() as s:
        run = s.get(RunRow, run_id, with_for_update=True)
        if run is None:
            return None
        fresh = run.status == "queued" and run.version == version
        # The broker delivers the same message again when the process holding it
        # died (a prefork child lost), or when it lost its connection and put its
        # messages back: only the first may take the run over.
        taken_over = (
            run.status == "running"
            and task_id is not None
            and run.claimed_by == task_id
            # A worker never takes over its own claim: the task it gave that claim to
            # still runs, or its sweeper frees the run.
            and (worker is None or run.worker != worker)
            and not holder_alive(
                s, run, now=now, timeout=worker_timeout if heartbeats_steady() else None
            )
        )
        if not (fresh or taken_over):
            return None
        if run.cancel_requested:
            cancel_locked(s, run, now)
            return None
        move(
            s,
            run,
            "running",
            now=now,
            claimed_by=task_id,
            worker=worker,
            lease_until=until,
            # As `store.statements.HELD_ALONE`; a run taken over is suspect from now.
            held_alone=alone or ((run.suspect or taken_over) and not apart),
            **(died_holding(run) if taken_over else {}),
        )
        budgeted = run.batch_id is not None and bool(
            s.exec(select(BatchRow.budget).where(BatchRow.id == run.batch_id)).first()
        )
        return _claim_of(
            run_id,
            run,
            conversation(s, run.conversation_id),
            taken_over=taken_over,
            batch_budgeted=budgeted,
        )


def _claim_of(
    run_id: str,
    run: Any,
    messages: list[dict[str, Any]],
    *,
    taken_over: bool = False,
    batch_budgeted: bool = False,
) -> Claim:
    """A Claim from the run as claimed: a RunRow or a row of the claim's RETURNING."""
    return Claim(
        run_id=run_id,
        version=run.version,
        agent=run.agent,
        conversation_id=run.conversation_id,
        tools_digest=run.tools_digest,
        attempts=run.attempts,
        crashes=run.crashes,
        turns=run.turns,
        total_tokens=run.total_tokens,
        cost=run.cost,
        budget=run.budget,
        batch_id=run.batch_id,
        batch_budgeted=batch_budgeted,
        taken_over=taken_over,
        suspect=bool(run.suspect),
        alone=bool(run.held_alone),
        messages=messages,
        started_by=run.started_by,
    )


def _hold(s: Session, claim: Claim) -> RunRow:
    run = s.get(RunRow, claim.run_id, with_for_update=True)
    if run is None or run.version != claim.version or run.status != "running":
        raise StaleClaim(claim.run_id, claim.version)
    return run


def save_reply(
    db: Database,
    claim: Claim,
    messages: list[dict[str, Any]],
    *,
    cost: float = 0.0,
    charge_batch: str | None = None,
) -> bool:
    """Keep the model's reply (the last message) before any of its tools run, and count
    each of its calls as started once (`ctx.attempt` 1), in the same transaction.

    The reply's tokens (its usage) and `cost` are added to the run's totals, and to
    batch `charge_batch`'s spending (a batch with a budget), and the run's turns
    counted: once, as the reply is kept once. Returns whether the run has been asked
    to cancel meanwhile.
    """
    at = len(messages) - 1
    now = utcnow()
    usage = tx.usage_in(messages[at])
    with db.transaction() as conn:
        cancel = conn.execute(
            sql.REPLY_SAVED,
            {
                "rid": claim.run_id,
                "v": claim.version,
                "prompt": usage.prompt_tokens,
                "completion": usage.completion_tokens,
                "total": usage.total_tokens,
                "cost": cost,
            },
        ).scalar_one_or_none()
        if cancel is None:
            raise StaleClaim(claim.run_id, claim.version)
        if charge_batch is not None:
            spent = {"bid": charge_batch, "tokens": usage.total_tokens, "spent": cost}
            conn.execute(sql.CHARGE_BATCH, spent)
        write_messages(conn, claim.conversation_id, claim.run_id, messages[:-1], messages)
        starts = [
            ledger_values(claim.run_id, at, call.id, "", None, executions=1, now=now)
            for call in tx.calls_of(messages[at])
        ]
        if starts:
            conn.execute(sql.ledger_insert(conn.dialect.name), starts)
        return bool(cancel)


def cancel_requested(db: Database, run_id: str) -> bool:
    with db.read() as s:
        run = s.get(RunRow, run_id)
        return run is None or run.cancel_requested


@dataclass(frozen=True)
class Charge:
    """What a reply first written with its turn's end spent (`save_reply` counts the rest)."""

    usage: Usage
    cost: float = 0.0
    batch: str | None = None
    """The batch whose spending it adds to (a batch with a budget), if any."""


def finish_turn(
    db: Database,
    claim: Claim,
    before: list[dict[str, Any]],
    turn: Turn,
    *,
    tools_digest: str,
    request_ttl: timedelta | None = None,
    on_expiry: str = "error",
    queue: str | None = None,
    charge: Charge | None = None,
    entries: Sequence[LedgerEntry] = (),
) -> list[OutboxRow]:
    """Persist what a turn did and what comes next, in one transaction.

    `before` is the transcript as stored (with the model's reply if it was saved);
    the next turn goes to `queue` (by default where this one came from). A reply
    saved before its tools ran was counted then (`save_reply`); one written here
    comes with its `charge`. `entries` are tool outcomes not yet in the ledger.
    A run asked to cancel while its turn ran does not open its request: it is
    cancelled.
    """
    now = utcnow()
    turns = claim.turns + (1 if turn.model_called else 0)
    status = "queued" if turn.status == "next" else turn.status
    values: dict[str, Any] = {
        "rid": claim.run_id,
        "v": claim.version,
        "digest": tools_digest,
        "now": now,
        "text": storable_text(turn.text) if turn.status == "done" else None,
    }
    if charge is not None:
        usage = charge.usage
        values |= {
            "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens,
            "total": usage.total_tokens,
            "cost": charge.cost,
        }
    # Only opening a request needs the ORM; every other ending is plain statements.
    scope = db.write() if turn.status == "pending" else db.transaction()
    with scope as s:
        # The claim check and the run's new state in one statement.
        held = s.execute(sql.finish(status, charged=charge is not None), values).first()
        if held is None:
            raise StaleClaim(claim.run_id, claim.version)
        if charge is not None and charge.batch is not None:
            spent = {"bid": charge.batch, "tokens": charge.usage.total_tokens, "spent": charge.cost}
            s.execute(sql.CHARGE_BATCH, spent)
        write_entries(
            s.connection() if isinstance(s, Session) else s, claim.run_id, entries, now=now
        )
        write_messages(s, claim.conversation_id, claim.run_id, before, turn.messages)
        if turn.status == "next":
            label = turn_label(claim.run_id, claim.agent, turns + 1)
            return [enqueue_turn(s, claim.run_id, claim.version + 1, label=label, queue=queue)]
        if turn.status == "pending":
            assert turn.pending is not None
            assert isinstance(s, Session)
            run = s.get(RunRow, claim.run_id)
            assert run is not None
            if held.cancel_requested:
                cancel_locked(s, run, now)
            else:
                open_request(s, run, turn.pending, now, ttl=request_ttl, on_expiry=on_expiry)
            return []
        s.execute(SPENT_MESSAGES, {"rid": claim.run_id})
        emit(s, "run.finished", run_id=claim.run_id, now=now, agent=claim.agent, status=status)
        return []


def retry_turn(
    db: Database, claim: Claim, *, error: str, countdown: float, queue: str | None = None
) -> OutboxRow:
    """Give the run back to `queue` (by default its last) after a retryable failure."""
    with db.write() as s:
        run = _hold(s, claim)
        move(s, run, "queued", now=utcnow(), attempts=ONE_MORE_ATTEMPT, error=error)
        return enqueue_turn(
            s, run.id, run.version, label=label_of(run), countdown=countdown, queue=queue
        )


def requeue_turn(
    db: Database,
    claim: Claim,
    *,
    countdown: float,
    queue: str | None = None,
    died: bool = False,
) -> OutboxRow:
    """Give the run back to `queue` to wait for its provider: `retry_turn` without a failed
    try counted or an error stored. `died`: the child process that ran the turn alone died
    (`tasks.runner.alone`): the death is the turn's, counted."""
    with db.write() as s:
        run = _hold(s, claim)
        deaths = {"crashes": ONE_MORE_CRASH, "suspect": True} if died else {}
        move(s, run, "queued", now=utcnow(), **deaths)
        return enqueue_turn(
            s, run.id, run.version, label=label_of(run), countdown=countdown, queue=queue
        )


def fail_run(db: Database, claim: Claim, error: str) -> None:
    with db.write() as s:
        run = _hold(s, claim)
        fail_locked(s, run, utcnow(), error)


def finish_cancelled(db: Database, claim: Claim) -> None:
    with db.write() as s:
        cancel_locked(s, _hold(s, claim), utcnow())
