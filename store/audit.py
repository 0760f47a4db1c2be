"""The audit trail: who decided what, when, through which door. Appended, never changed.

Every decision on a request is one row: a person's approval, edit, decline or
answer (each vote of a quorum too), and the system's expiries and
escalations. Nothing in relayq updates or deletes a row here (a test holds
every statement the application runs to that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from sqlmodel import Session, col, select

from store.db import Database
from store.models import DecisionRow, RequestRow, utcnow

__all__ = [
    "SYSTEM",
    "Decider",
    "Outcome",
    "Via",
    "decisions_of",
    "list_decisions",
    "record_decision",
]

Via: TypeAlias = Literal["inbox", "api", "cli", "python", "system"]
Outcome: TypeAlias = Literal[
    "approved", "edited", "declined", "answered", "expired", "escalated", "overdue"
]


@dataclass(frozen=True, kw_only=True)
class Decider:
    """Who decides, as the audit trail records it."""

    name: str
    role: str | None = None
    groups: tuple[str, ...] = ()
    via: Via = "python"
    os_user: str | None = None
    """The operating-system user, for decisions made with the CLI."""


SYSTEM = Decider(name="relayq:expiry", role="system", via="system")
"""The sweeper, deciding what a deadline decides."""


def record_decision(
    s: Session,
    row: RequestRow,
    decider: Decider,
    outcome: Outcome,
    *,
    now: datetime | None = None,
    reason: str | None = None,
    arguments_hash: str | None = None,
    diff: dict[str, Any] | None = None,
) -> None:
    """Append one decision on `row` to the trail, in the caller's transaction."""
    s.add(
        DecisionRow(
            request_id=row.id,
            run_id=row.run_id,
            agent=row.agent,
            tool=row.tool,
            call_ids=[str(c.get("id")) for c in row.calls or []],
            actor=decider.name,
            role=decider.role,
            groups=list(decider.groups),
            via=decider.via,
            os_user=decider.os_user,
            outcome=outcome,
            reason=reason,
            arguments_hash=arguments_hash,
            diff=diff,
            at=now or utcnow(),
        )
    )


def decisions_of(db: Database, request_id: str | Sequence[str]) -> list[DecisionRow]:
    """A request's decisions (or several requests'), oldest first."""
    ids = [request_id] if isinstance(request_id, str) else list(request_id)
    found: list[DecisionRow] = []
    with db.read() as s:
        for at in range(0, len(ids), 500):  # SQLite caps a statement's bound parameters
            query = select(DecisionRow).where(col(DecisionRow.request_id).in_(ids[at : at + 500]))
            found.extend(s.exec(query))
    return sorted(found, key=lambda row: row.id or 0)


def list_decisions(
    db: Database,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    actor: str | None = None,
    agent: str | None = None,
    outcome: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> tuple[list[DecisionRow], int | None]:
    """Decisions, newest first, filtered; and the `before_id` of the next page (None: last).

    Paged by id, which only grows: a page is stable however many rows come in.
    """
    query = select(DecisionRow).order_by(col(DecisionRow.id).desc())
    if since is not None:
        query = query.where(col(DecisionRow.at) >= since)
    if until is not None:
        query = query.where(col(DecisionRow.at) < until)
    if actor is not None:
        query = query.where(DecisionRow.actor == actor)
    if agent is not None:
        query = query.where(DecisionRow.agent == agent)
    if outcome is not None:
        query = query.where(DecisionRow.outcome == outcome)
    if before_id is not None:
        query = query.where(col(DecisionRow.id) < before_id)
    with db.read() as s:
        rows = list(s.exec(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)
