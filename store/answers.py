"""Answers: accept one (once), apply it to the transcript, expire and cancel requests.

Accepting and applying are two transactions. `accept_answer` runs where the
host is: it checks the answer against the stored request (its calls, matched
by id), moves the request `open -> answered` under the run's lock (so of two
concurrent answers exactly one wins) and queues the answer task.
`apply_answer_of` runs in that task: it applies the answer to the transcript,
once, replacing the placeholders, and queues the next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, col, select

from relayq import Answer, CallAnswered, Request, RequestClosed, ResumeError, UnknownRequest
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
from store.messages import conversation, write_messages
from store.models import OutboxRow, RequestRow, RunRow, utcnow
from store.outbox import enqueue_answer, enqueue_turn
from store.requests import cancel_requests, request_of
from store.runs import cancel_locked, label_of
from store.transitions import move

__all__ = ["Accepted", "accept_answer", "apply_answer_of", "expire_and_count", "expire_requests"]


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
        complete = _complete(request, merged, partial=partial)
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


def _complete(request: Request, answer: Answer, *, partial: bool) -> bool:
    """Whether `answer` leaves no call of `request` without a result; AnswerMismatch if
    it does not fit the request's calls.

    The request row holds the calls its transcript waits on, so the answer is
    checked here against the row alone, and applied to the transcript only once,
    by the answer task.
    """
    if not is_relay_request(request):
        return True
    results = relay_results_of(request, answer, partial=partial)
    return all(c.id in results for c in relay_calls_of(request))


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
        before = conversation(s, run.conversation_id)
        # The answer was accepted in time; its moment of acceptance is what counts.
        moment = row.created_at
        answer = Answer.model_validate(row.answer)
        try:
            after = apply_answer(before, request_of(row), answer, now=moment)
        except ResumeError as exc:
            # Checked against the request when accepted, so only a transcript
            # changed behind the store's back gets here: the run stops, saying why,
            # rather than wait for an answer it already has.
            move(s, run, "failed", now=utcnow(), error=f"answer to {row.id} not applied: {exc}")
            cancel_requests(s, run.id)
            return []
        write_messages(s, run.conversation_id, run.id, before, after)
        move(s, run, "queued", now=utcnow())
        return [enqueue_turn(s, run.id, run.version, label=label_of(run))]


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
                cancel_locked(s, run, moment)
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
