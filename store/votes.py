"""Decisions on approvals: who may decide, one vote each, and the quorum that resolves them.

A `tool_approval` request (`relayq.approvals`) resolves once `quorum` distinct
approvers approved the same arguments, or `declines` distinct ones declined.
An edit is an approval of the edited arguments: it becomes what later
approvals approve, and approvals of other arguments stop counting towards the
quorum (they approved something else). Every vote is kept, one per person
(the table's key), and every vote is in the audit trail.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from relayq import AlreadyVoted, Answer, AnswerMismatch, NotAnApprover, Request, UnknownRequest
from relayq.approvals import (
    approve,
    arguments_digest,
    arguments_of,
    decision_of,
    diff_arguments,
    edit,
)
from relayq.authority import DECIDING_KINDS, refusal
from store.audit import Decider, DecisionOutcome, record_decision
from store.db import Database
from store.models import RequestRow, RunRow, VoteRow
from store.requests import request_of

__all__ = [
    "Resolution",
    "check_may_answer",
    "current_arguments",
    "proposed_arguments",
    "vote",
    "votes_of",
    "votes_on",
]


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The answer a request resolved with, and what it came to."""

    answer: Answer
    outcome: DecisionOutcome


def check_may_answer(row: RequestRow, run: RunRow, decider: Decider) -> None:
    """NotAnApprover unless `decider`'s role may answer a request of this kind
    (`relayq.authority`), and, for an approval, `decider` is in the request's groups (if
    it names any) and is not the run's starter where self-approval is forbidden. Every
    answer is checked here, whichever door it came through."""
    starter = run.started_by is not None and run.started_by == decider.name
    refused = refusal(decider.role, row.kind, starter=starter)
    if refused is not None:
        raise NotAnApprover(row.id, decider.name, "role", f"{refused} ({row.id})")
    if row.kind not in DECIDING_KINDS:
        return
    groups = row.approvers or []
    if groups and not set(decider.groups) & set(groups):
        raise NotAnApprover(
            row.id,
            decider.name,
            "group",
            f"{decider.name} is not in the approver groups of request {row.id} "
            f"({', '.join(groups)})",
        )
    if row.forbid_self and starter:
        raise NotAnApprover(
            row.id,
            decider.name,
            "self",
            f"{decider.name} started run {run.id} and may not decide its request {row.id}",
        )


def current_arguments(s: Session, row: RequestRow, request: Request) -> dict[str, Any]:
    """What an approval approves now: the latest edit's arguments, else the model's."""
    return _approved_now(votes_on(s, [row.id]).get(row.id, []), request)


def votes_on(s: Session, request_ids: Collection[str]) -> dict[str, list[VoteRow]]:
    """The votes cast on each of `request_ids` (a bulk decision's, at most 1,000), in one
    query."""
    found: dict[str, list[VoteRow]] = {}
    for v in s.exec(select(VoteRow).where(col(VoteRow.request_id).in_(list(request_ids)))):
        found.setdefault(v.request_id, []).append(v)
    return found


def _approved_now(votes: list[VoteRow], request: Request) -> dict[str, Any]:
    edits = [v for v in votes if v.decision == "edit" and v.arguments is not None]
    if edits:
        return dict(max(edits, key=lambda v: v.at).arguments or {})
    return arguments_of(request)


def proposed_arguments(db: Database, request_id: str) -> dict[str, Any]:
    """What approving request `request_id` would approve now (UnknownRequest if none)."""
    with db.read() as s:
        row = s.get(RequestRow, request_id)
        if row is None:
            raise UnknownRequest(request_id)
        return current_arguments(s, row, request_of(row))


def votes_of(db: Database, request_id: str) -> list[VoteRow]:
    """The votes cast on a request, oldest first."""
    with db.read() as s:
        query = select(VoteRow).where(VoteRow.request_id == request_id)
        return list(s.exec(query.order_by(col(VoteRow.at), col(VoteRow.voter))))


def vote(
    s: Session,
    row: RequestRow,
    run: RunRow,
    request: Request,
    answer: Answer,
    decider: Decider,
    *,
    partial: bool,
    now: datetime,
    cast: list[VoteRow] | None = None,
) -> Resolution | None:
    """Record `decider`'s decision; the Resolution once the request is decided, else None.
    `cast`: the request's votes so far, where the caller read them already (in bulk).

    Refused, with nothing changed: a decision that is not one (AnswerMismatch), a second
    vote (AlreadyVoted). Who may vote at all was checked before (`check_may_answer`).
    """
    if partial:
        raise AnswerMismatch(f"approval {row.id} takes a decision, not a partial answer", row.id)
    decision = decision_of(request, answer)
    votes = votes_on(s, [row.id]).get(row.id, []) if cast is None else cast
    if any(v.voter == decider.name for v in votes):
        raise AlreadyVoted(row.id, decider.name)
    seen = _approved_now(votes, request)
    approved = seen if decision.arguments is None else decision.arguments
    mine = VoteRow(
        request_id=row.id,
        voter=decider.name,
        decision=decision.kind,
        arguments=None if decision.kind == "decline" else approved,
        reason=decision.reason,
        step=row.step,
        at=now,
    )
    s.add(mine)
    record_decision(
        s,
        row,
        decider,
        _OUTCOMES[decision.kind],
        now=now,
        reason=decision.reason,
        arguments_hash=arguments_digest(seen),
        diff=diff_arguments(seen, approved) if decision.kind == "edit" else None,
    )
    return _tally([*votes, mine], row, request)


_OUTCOMES: dict[str, DecisionOutcome] = {
    "approve": "approved",
    "edit": "edited",
    "decline": "declined",
}


def _tally(votes: list[VoteRow], row: RequestRow, request: Request) -> Resolution | None:
    declines = [v for v in votes if v.decision == "decline"]
    if len(declines) >= row.declines:
        reasons = "; ".join(v.reason or "declined" for v in declines)
        return Resolution(answer=Answer(id=row.id, ok=False, reason=reasons), outcome="declined")
    current = _approved_now(votes, request)
    approvals = [v for v in votes if v.decision != "decline" and v.arguments == current]
    if len(approvals) < row.quorum:
        return None
    if current == arguments_of(request):
        return Resolution(answer=approve(row.id), outcome="approved")
    return Resolution(answer=edit(row.id, current), outcome="edited")
