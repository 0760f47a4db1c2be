"""Answers: accept one (once), apply it to the transcript, expire and cancel requests.

Accepting and applying are two transactions. `accept_answer` runs where the
host is: it validates against the stored transcript, moves the request
`open -> answered` with a compare-and-swap (so of two concurrent answers
exactly one wins) and queues the answer task. `apply_answer_of` runs in that
task: it writes the results into the transcript and queues the next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlmodel import Session, col, select

from relayq import Answer, CallAnswered, Request, RequestClosed, UnknownRequest
from relayq import _transcript as tx
from relayq.limits import check_answer
from relayq.loop import apply_answer
from relayq.relay import (
    RelayResult,
    declined_result,
    is_relay_request,
    relay_answer,
    relay_calls_of,
    relay_results_of,
)
from store.db import Database
from store.errors import UnknownRun
from store.models import FINISHED, OutboxRow, RequestRow, RunRow, utcnow
from store.outbox import enqueue_answer, enqueue_turn
from store.runs import _cancel, _conversation, _label, _write_messages, request_of
from store.transitions import move

__all__ = [
    "Accepted",
    "StoredRequest",
    "accept_answer",
    "apply_answer_of",
    "cancel_run",
    "expire_requests",
    "get_request",
    "list_requests",
]


class StoredRequest(BaseModel):
    """A request as the store keeps it: the wire Request plus who, when and what became of it."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, frozen=True)

    request: Request
    run_id: str
    agent: str
    status: str
    """open | answered | expired | cancelled"""
    created_at: datetime
    answer: Answer | None = None
    answered_by: str | None = None
    answered_at: datetime | None = None


def _stored(row: RequestRow) -> StoredRequest:
    return StoredRequest(
        request=request_of(row),
        run_id=row.run_id,
        agent=row.agent,
        status=row.status,
        created_at=row.created_at,
        answer=Answer.model_validate(row.answer) if row.answer else None,
        answered_by=row.answered_by,
        answered_at=row.answered_at,
    )


@dataclass(frozen=True, kw_only=True)
class Accepted:
    run_id: str
    complete: bool
    """False for a partial answer that leaves calls without results."""
    outbox: list[OutboxRow]


def accept_answer(
    db: Database,
    answer: Answer,
    *,
    answered_by: str | None = None,
    partial: bool = False,
) -> Accepted:
    """Validate `answer` and record it; ResumeError, with nothing changed, if it does not fit."""
    check_answer(answer, answered_by=answered_by)  # what the store cannot keep, refused first
    now = utcnow()
    with db.write() as s:
        row, run = _lock(s, answer.id)
        if row is None:
            raise UnknownRequest(answer.id)
        _check_open(s, row, now)
        assert run is not None
        request = request_of(row)
        previous = Answer.model_validate(row.answer) if row.answer else None
        merged = _merge(request, previous, answer)
        after = apply_answer(
            _conversation(s, run.conversation_id), request, merged, partial=partial, now=now
        )
        complete = all(r.id != row.id for r in tx.open_requests(after))
        row.answer = merged.model_dump(mode="json")
        row.answered_by = answered_by
        row.revision += 1
        outbox = []
        if complete:
            row.status = "answered"
            row.answered_at = now
            outbox.append(enqueue_answer(s, row.id, row.run_id))
        return Accepted(run_id=row.run_id, complete=complete, outbox=outbox)


def _lock(s: Session, request_id: str) -> tuple[RequestRow | None, RunRow | None]:
    """The request and its run, locked run first, as cancelling and expiring lock them.

    Whoever locks the run first wins: an answer and a cancel racing end with
    the request answered or cancelled, never answered and then overwritten.
    """
    run_id = s.exec(select(RequestRow.run_id).where(RequestRow.id == request_id)).first()
    if run_id is None:
        return None, None
    run = s.get(RunRow, run_id, with_for_update=True)
    return s.get(RequestRow, request_id, with_for_update=True), run


def _check_open(s: Session, row: RequestRow, now: datetime) -> None:
    if row.status != "open":
        raise RequestClosed(row.id, row.status)
    if row.expires_at is not None and now >= row.expires_at:
        raise RequestClosed(
            row.id,
            "expired",
            f"request {row.id} expired at {row.expires_at.isoformat()}; it takes no answer",
        )
    run = s.get(RunRow, row.run_id)
    if run is None:
        raise UnknownRequest(row.id, f"run {row.run_id} of request {row.id} no longer exists")
    if run.status != "pending" or run.cancel_requested:
        # A run that stopped closed its requests with it (or is about to).
        state = "cancelled" if run.cancel_requested else run.status
        raise RequestClosed(row.id, "cancelled", f"run {row.run_id} of request {row.id} is {state}")


def _merge(request: Request, previous: Answer | None, answer: Answer) -> Answer:
    """One answer from earlier partial results and this one; a call answered twice is refused."""
    if previous is None or not is_relay_request(request):
        return answer
    earlier = relay_results_of(request, previous, partial=True)
    if answer.ok:
        now = relay_results_of(request, answer, partial=True)
        twice = sorted(earlier.keys() & now.keys())
        if twice:
            raise CallAnswered(
                f"call(s) {', '.join(twice)} of request {request.id} already have a result",
                request.id,
                tuple(twice),
            )
    else:
        # A decline after partial results keeps them and declines the rest.
        now = {
            c.id: declined_result(answer) for c in relay_calls_of(request) if c.id not in earlier
        }
    results = earlier | now
    return relay_answer(
        request.id,
        [
            RelayResult(id=c.id, output=results[c.id].output, is_error=results[c.id].is_error)
            for c in relay_calls_of(request)
            if c.id in results
        ],
    )


def apply_answer_of(db: Database, request_id: str) -> list[OutboxRow]:
    """Write an accepted (or expired) request's answer into the transcript; queue the next turn."""
    with db.write() as s:
        row, run = _lock(s, request_id)
        if row is None or row.applied or row.status not in ("answered", "expired"):
            return []
        row.applied = True
        if run is None or run.status != "pending":
            return []
        before = _conversation(s, run.conversation_id)
        # The answer was accepted in time; its moment of acceptance is what counts.
        moment = row.created_at
        after = apply_answer(before, request_of(row), Answer.model_validate(row.answer), now=moment)
        _write_messages(s, run, before, after)
        move(s, run, "queued", now=utcnow())
        return [enqueue_turn(s, run.id, run.version, label=_label(run))]


def expire_requests(
    db: Database, *, now: datetime | None = None, limit: int = 500
) -> list[OutboxRow]:
    """Expire overdue open requests: the run goes on with error results, or is cancelled.

    Returns the answer tasks to send.
    """
    return expire_and_count(db, now=now, limit=limit)[0]


def expire_and_count(
    db: Database, *, now: datetime | None = None, limit: int = 500
) -> tuple[list[OutboxRow], int]:
    """`expire_requests`, and how many requests it expired (cancelled runs send nothing)."""
    moment = now or utcnow()
    outbox: list[OutboxRow] = []
    with db.write() as s:
        due = s.exec(
            select(RequestRow)
            .where(RequestRow.status == "open", col(RequestRow.expires_at) <= moment)
            .limit(limit)
            # A request an answer is being accepted for right now is not overdue.
            .with_for_update(skip_locked=True)
        ).all()
        for row in due:
            # The run is locked second here: skip it rather than wait on a cancel
            # that holds it and waits on this request (the next sweep expires it).
            run = s.exec(
                select(RunRow).where(RunRow.id == row.run_id).with_for_update(skip_locked=True)
            ).first()
            if run is None and s.get(RunRow, row.run_id) is not None:
                continue
            if run is not None and row.on_expiry == "cancel":
                _cancel(s, run, moment)
                row.status = "expired"
                row.applied = True  # nothing left to apply: the run is cancelled
                continue
            assert row.expires_at is not None
            reason = f"expired: request {row.id} had no answer by {row.expires_at.isoformat()}"
            request = request_of(row)
            previous = Answer.model_validate(row.answer) if row.answer else None
            row.answer = _merge(
                request, previous, Answer(id=row.id, ok=False, reason=reason)
            ).model_dump(mode="json")
            row.status = "expired"
            row.answered_at = moment
            row.answered_by = "relayq:expiry"
            outbox.append(enqueue_answer(s, row.id, row.run_id))
    return outbox, len(due)


def cancel_run(db: Database, run_id: str) -> str:
    """Ask a run to stop. Queued and pending runs stop now; a running one at its next boundary."""
    now = utcnow()
    with db.write() as s:
        run = s.get(RunRow, run_id, with_for_update=True)
        if run is None:
            raise UnknownRun(run_id)
        if run.status in FINISHED:
            return run.status
        run.cancel_requested = True
        run.updated_at = now
        if run.status in ("queued", "pending"):
            _cancel(s, run, now)
        return run.status


def get_request(db: Database, request_id: str) -> StoredRequest:
    with db.read() as s:
        row = s.get(RequestRow, request_id)
    if row is None:
        raise UnknownRequest(request_id)
    return _stored(row)


def list_requests(
    db: Database,
    *,
    status: str | None = "open",
    run_id: str | None = None,
    agent: str | None = None,
    kind: str | None = None,
    limit: int = 100,
) -> list[StoredRequest]:
    """Requests, newest first."""
    query = select(RequestRow)
    filters: dict[str, Any] = {"status": status, "run_id": run_id, "agent": agent, "kind": kind}
    for name, value in filters.items():
        if value is not None:
            query = query.where(getattr(RequestRow, name) == value)
    query = query.order_by(col(RequestRow.created_at).desc()).limit(limit)
    with db.read() as s:
        return [_stored(row) for row in s.exec(query)]
