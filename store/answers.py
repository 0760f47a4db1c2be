"""Answers: accept one (once), apply it to the transcript, expire and cancel requests.

Accepting and applying are two transactions. `accept_answer` runs where the
host is: it checks the answer against the stored request (its calls, matched
by id), moves the request `open -> answered` under the run's lock (so of two
concurrent answers exactly one wins) and queues the answer task.
`apply_answer_of` runs in that task: it applies the answer to the transcript,
once, replacing the placeholders, and queues the next turn.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from relayq import (
    Answer,
    BulkRefused,
    CallAnswered,
    NotAnApproval,
    Request,
    RequestClosed,
    ResumeError,
    UnknownRequest,
)
from relayq.approvals import APPROVAL_KIND, BUDGET_KIND, is_approval
from relayq.grants import GrantTerms
from relayq.limits import check_answer
from relayq.loop import apply_answer
from relayq.relay import (
    RELAY_KIND,
    RelayResult,
    declined_result,
    is_relay_request,
    relay_answer,
    relay_calls_of,
    relay_results_of,
)
from store.audit import SYSTEM, Decider, DecisionOutcome, record_decision
from store.budgets import budget_answered
from store.db import Database
from store.events import emit_about
from store.grants import GrantRefused, grant_with_decision
from store.messages import conversation, write_messages
from store.models import OutboxRow, RelayCallRow, RequestRow, RunRow, VoteRow, utcnow
from store.outbox import enqueue_answer, enqueue_turn
from store.paging import MAX_PAGE
from store.requests import (
    RequestQuery,
    StoredRequest,
    query_requests,
    release_waiters,
    request_of,
)
from store.runs import cancel_locked, fail_locked, label_of
from store.transitions import move
from store.votes import check_may_answer, vote, votes_on

__all__ = [
    "MAX_BULK",
    "Accepted",
    "BulkChoice",
    "accept_answer",
    "accept_in",
    "accept_many",
    "apply_answer_of",
    "bulk_choice",
    "expire_and_count",
    "expire_requests",
    "remind_due",
]


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
    decider: Decider | None = None,
    decision: bool = False,
    max_bytes: int | None = None,
    grant: GrantTerms | None = None,
) -> Accepted:
    """Validate `answer` and record it; ResumeError, with nothing changed, if it does not fit.

    What the store cannot keep is refused first (`relayq.limits.check_answer`), an answer
    over `max_bytes` among it (the caller's `Settings.max_answer_bytes`; by default
    RELAYQ_MAX_ANSWER_BYTES): this is the one place an answer's size is checked.

    `decider` is who answers, as the audit trail keeps it (by default `answered_by`,
    through Python). An approval's answer is that decider's vote (`store.votes`).
    With `decision` the answer was given as a decision (approve, edit, decline):
    NotAnApproval for a request that is not an approval. With `grant`, the decider's
    approval also makes a standing grant, in the same transaction (`store.grants`):
    GrantRefused, with nothing changed, where it may not.
    """
    who = decider or Decider(name=answered_by or "anonymous")
    check_answer(answer, answered_by=who.name, max_bytes=max_bytes)
    with db.write() as s:
        return _accept(
            s, answer, who, partial=partial, now=utcnow(), decision=decision, grant=grant
        )


MAX_BULK = 1000
"""Requests one bulk decision may name: it is one write transaction, about 3.3 ms a
request on SQLite, and every worker's turn waits for SQLite's write lock meanwhile."""


@dataclass(frozen=True, kw_only=True)
class BulkChoice:
    """What one bulk decision over a listing takes: its oldest matches, at most MAX_BULK.

    choice = bulk_choice(db, RequestQuery(search="refund"), "approve")
    choice.items       # the oldest 1,000 approvals that match, oldest first
    choice.matching    # 9,649: every one that could take the decision
    choice.left_out    # 12: relay requests, which take an answer, not a decision
    """

    items: list[StoredRequest]
    """What it decides, the oldest first: at most MAX_BULK."""
    matching: int
    """Every match that could take the decision; more than `items` past the cap."""
    left_out: int = 0
    """Matches an approval leaves out: requests that are not approvals."""
    relay: int = 0
    """How many of `left_out` are relay tools' requests (the rest, other kinds)."""

    @property
    def capped(self) -> bool:
        return self.matching > len(self.items)


def bulk_choice(
    db: Database, query: RequestQuery, decision: Literal["approve", "decline"]
) -> BulkChoice:
    """The oldest requests `query` matches that can take `decision`, at most MAX_BULK,
    whatever the query's own sort: the inbox's "the oldest 1,000 matching" and
    `relayq bulk`. An approval takes approvals only: the others are counted, left out.
    Reads the pages only as far as the cap."""
    oldest = replace(query, sort="age", order="asc", cursor=None, limit=MAX_PAGE)

    def count(kind: str) -> int:
        if query.kind not in (None, kind):
            return 0
        return query_requests(db, replace(oldest, kind=kind, limit=1)).total

    takes = is_approval if decision == "approve" else (lambda _: True)
    items: list[StoredRequest] = []
    page = query_requests(db, oldest)
    while True:
        items += [s for s in page.items if takes(s.request)][: MAX_BULK - len(items)]
        if page.next_cursor is None or len(items) >= MAX_BULK:
            break
        page = query_requests(db, replace(oldest, cursor=page.next_cursor))
    if decision == "decline":
        return BulkChoice(items=items, matching=max(page.total, len(items)))
    approvals = count(APPROVAL_KIND) + count(BUDGET_KIND)
    left_out = max(page.total - approvals, 0)
    relay = min(count(RELAY_KIND), left_out) if left_out else 0
    return BulkChoice(
        items=items, matching=max(approvals, len(items)), left_out=left_out, relay=relay
    )


def accept_many(
    db: Database,
    answers: list[tuple[Answer, int | None]],
    *,
    decider: Decider,
    max_bytes: int | None = None,
) -> list[Accepted]:
    """Accept every answer, or none: one transaction; BulkRefused, with nothing changed,
    naming each request that was refused and why.

    Each answer may carry the request's `revision` as the decider saw it (a
    preview): a request decided or voted on since is refused, not decided blind.
    """
    if len(answers) > MAX_BULK:
        raise ResumeError(
            f"a bulk decision takes at most {MAX_BULK} requests (got {len(answers)}); "
            "decide them in parts, or narrow the filter"
        )
    for answer, _ in answers:
        check_answer(answer, answered_by=decider.name, max_bytes=max_bytes)
    refused: list[tuple[str, str]] = []
    accepted: list[Accepted] = []
    now = utcnow()
    # Read and lock in a few statements, not a few per request: a bulk decision is
    # up to MAX_BULK of them, and each round trip to the store counts.
    with db.write() as s, s.no_autoflush:
        held = _lock_many(s, [answer.id for answer, _ in answers])
        cast = votes_on(s, list(held))
        for answer, seen in sorted(answers, key=lambda pair: pair[0].id):
            row, run = held.get(answer.id, (None, None))
            try:
                _check_revision(row, seen)
                taken = _accept(
                    s, answer, decider, partial=False, now=now, decision=False, held=(row, run),
                    cast=cast.get(answer.id, []),
                )  # fmt: skip
                accepted.append(taken)
            except ResumeError as exc:
                refused.append((answer.id, str(exc)))
        if refused:
            raise BulkRefused(tuple(refused))
    return accepted


def _check_revision(row: RequestRow | None, seen: int | None) -> None:
    if row is not None and seen is not None and row.revision != seen:
        raise RequestClosed(row.id, "changed", f"request {row.id} was decided or voted on since")


def _lock_many(s: Session, request_ids: list[str]) -> dict[str, tuple[RequestRow, RunRow | None]]:
    """Each request (at most MAX_BULK) and its run, locked runs first as `_lock` locks
    one, and in one order, so two bulk decisions lock their runs without deadlock."""
    ids = sorted(request_ids)
    run_ids = s.exec(select(RequestRow.run_id).where(col(RequestRow.id).in_(ids))).all()
    locked = select(RunRow).where(col(RunRow.id).in_(set(run_ids))).with_for_update()
    runs = {run.id: run for run in s.exec(locked.order_by(col(RunRow.id)))}
    rows = select(RequestRow).where(col(RequestRow.id).in_(ids)).with_for_update()
    return {
        row.id: (row, runs.get(row.run_id)) for row in s.exec(rows.order_by(col(RequestRow.id)))
    }


def _accept(
    s: Session,
    answer: Answer,
    who: Decider,
    *,
    partial: bool,
    now: datetime,
    decision: bool,
    held: tuple[RequestRow | None, RunRow | None] | None = None,
    cast: list[VoteRow] | None = None,
    grant: GrantTerms | None = None,
) -> Accepted:
    """Accept `answer`; `held`: its request and run where the caller locked them already,
    `cast`: the request's votes so far, where it read them (a bulk decision)."""
    row, run = _lock(s, answer.id) if held is None else held
    if row is None:
        raise UnknownRequest(answer.id)
    _check_open(s, row, now)
    assert run is not None
    request = request_of(row)
    if decision and not is_approval(request):
        raise NotAnApproval(row.id, row.kind)
    check_may_answer(row, run, who)
    if is_approval(request):
        resolved = vote(s, row, run, request, answer, who, partial=partial, now=now, cast=cast)
        if grant is not None:
            grant_with_decision(s, row, run, request, answer, who, grant, now)
        row.revision += 1
        if resolved is None:
            return Accepted(run_id=row.run_id, complete=False, outbox=[])
        outbox = _resolve(s, row, resolved.answer, resolved.outcome, who, now)
        return Accepted(run_id=row.run_id, complete=True, outbox=outbox)
    previous = Answer.model_validate(row.answer) if row.answer else None
    if grant is not None:
        raise GrantRefused(
            f"request {row.id} is a {row.kind} request: a grant is made approving a gated "
            "tool's call"
        )
    merged = _merge(request, previous, answer)
    complete = _complete(request, merged, partial=partial)
    outcome: DecisionOutcome = "answered" if answer.ok else "declined"
    given = _given(request, answer)
    record_decision(s, row, who, outcome, now=now, reason=answer.reason, call_ids=given)
    if given:
        # Hosts lease those calls no more, and a lease held on one ends (`store.leases`).
        _have_results(s, row.id, relay_results_of(request, merged, partial=True))
    row.revision += 1
    if not complete:
        row.answer = merged.model_dump(mode="json")
        row.answered_by = who.name
        return Accepted(run_id=row.run_id, complete=False, outbox=[])
    outbox = _resolve(s, row, merged, outcome, who, now)
    return Accepted(run_id=row.run_id, complete=True, outbox=outbox)


def accept_in(
    s: Session,
    answer: Answer,
    who: Decider,
    *,
    partial: bool,
    now: datetime,
    max_bytes: int | None = None,
) -> Accepted:
    """`accept_answer` in the caller's write transaction (a leased call's result)."""
    check_answer(answer, answered_by=who.name, max_bytes=max_bytes)
    return _accept(s, answer, who, partial=partial, now=now, decision=False)


def _given(request: Request, answer: Answer) -> list[str] | None:
    """The calls a relay request's answer gives results to (a decline: every call)."""
    if not is_relay_request(request):
        return None
    if not answer.ok:
        return [c.id for c in relay_calls_of(request)]
    return list(relay_results_of(request, answer, partial=True))


def _have_results(s: Session, request_id: str, results: Collection[str]) -> None:
    s.exec(
        update(RelayCallRow)
        .where(col(RelayCallRow.request_id) == request_id, col(RelayCallRow.call_id).in_(results))
        .values(answered=True, lease_id=None, holder=None, lease_until=None)
    )


def _resolve(
    s: Session,
    row: RequestRow,
    answer: Answer,
    outcome: DecisionOutcome,
    who: Decider,
    now: datetime,
) -> list[OutboxRow]:
    """Close the request with its answer, and queue the task that applies it."""
    row.answer = answer.model_dump(mode="json")
    row.answered_by = who.name
    row.status = "answered"
    row.answered_at = now
    row.outcome = outcome
    emit_about(s, "request.decided", row, now=now, outcome=outcome, decidedBy=who.name)
    return [enqueue_answer(s, row.id, row.run_id)]


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
    # A deadline that escalates, or leaves the request open, still takes answers.
    closes = row.on_expiry in ("error", "cancel")
    if closes and row.expires_at is not None and now >= row.expires_at:
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
            # Its run ended meanwhile; runs of its batch waiting on it look again.
            return release_waiters(s, [row.id], utcnow()) if row.kind == BUDGET_KIND else []
        if row.kind == BUDGET_KIND:
            return budget_answered(s, row, run)  # the transcript is not touched
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
            fail_locked(s, run, utcnow(), f"answer to {row.id} not applied: {exc}")
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
    """`expire_requests`, and how many requests reached their deadline.

    What a deadline does is the request's `on_expiry`: `error` closes it with error
    results saying `expired` (an approval's decline at its deadline, recorded as
    expired, never as a person's), `cancel` cancels its run, `escalate` hands it to
    the next step's approver groups with a new deadline (and, past the last step,
    closes it as `error` does), `stay_open` leaves it open, noticed overdue once.
    """
    moment = now or utcnow()
    outbox: list[OutboxRow] = []
    with db.write() as s:
        due = s.exec(
            select(RequestRow)
            .where(
                RequestRow.status == "open",
                col(RequestRow.expires_at) <= moment,
                or_(col(RequestRow.on_expiry) != "stay_open", col(RequestRow.overdue_at).is_(None)),
            )
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
            if row.on_expiry == "stay_open":
                _notice_overdue(s, row, moment)
            elif row.on_expiry == "escalate" and row.escalation:
                _escalate(s, row, moment)
            elif run is not None and row.on_expiry == "cancel":
                _close_expired(s, row, moment)
                row.applied = True  # nothing left to apply: the run is cancelled
                cancel_locked(s, run, moment)
            else:
                _close_expired(s, row, moment)
                request = request_of(row)
                previous = Answer.model_validate(row.answer) if row.answer else None
                assert row.expires_at is not None
                reason = f"expired: request {row.id} had no answer by {row.expires_at.isoformat()}"
                declined = Answer(id=row.id, ok=False, reason=reason)
                row.answer = _merge(request, previous, declined).model_dump(mode="json")
                outbox.append(enqueue_answer(s, row.id, row.run_id))
    return outbox, len(due)


def _close_expired(s: Session, row: RequestRow, now: datetime) -> None:
    row.status = "expired"
    row.outcome = "expired"
    row.answered_at = now
    row.answered_by = SYSTEM.name
    record_decision(s, row, SYSTEM, "expired", now=now)
    emit_about(s, "request.expired", row, now=now)


def _escalate(s: Session, row: RequestRow, now: datetime) -> None:
    """Hand the request to the next step's groups, with the step's deadline."""
    step, *rest = row.escalation or []
    row.approvers = list(step["approvers"])
    row.escalation = rest
    row.step += 1
    row.expires_at = now + timedelta(seconds=float(step["expiresIn"]))
    remind = (row.data or {}).get("policy", {}).get("remindBefore")
    row.remind_at = None if remind is None else row.expires_at - timedelta(seconds=float(remind))
    row.reminded_at = None
    if not rest:
        row.on_expiry = "error"  # past the last step, the deadline declines
    record_decision(s, row, SYSTEM, "escalated", now=now, reason=", ".join(row.approvers))
    expires = row.expires_at.isoformat()
    emit_about(s, "request.escalated", row, now=now, step=row.step, expiresAt=expires)


def _notice_overdue(s: Session, row: RequestRow, now: datetime) -> None:
    row.overdue_at = now
    record_decision(s, row, SYSTEM, "overdue", now=now)
    emit_about(s, "request.expired", row, now=now, stillOpen=True)


def remind_due(db: Database, *, now: datetime | None = None, limit: int = 500) -> int:
    """Send `request.reminder` for open requests whose reminder time has come; how many."""
    moment = now or utcnow()
    with db.write() as s:
        due = s.exec(
            select(RequestRow)
            .where(
                RequestRow.status == "open",
                col(RequestRow.remind_at) <= moment,
                col(RequestRow.reminded_at).is_(None),
            )
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        for row in due:
            row.reminded_at = moment
            expires = None if row.expires_at is None else row.expires_at.isoformat()
            emit_about(s, "request.reminder", row, now=moment, expiresAt=expires)
        return len(due)
