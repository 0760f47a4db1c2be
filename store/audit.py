"""The audit trail: who decided what, when, through which door. Appended, never changed.

Every decision on a request is one row: a person's approval, edit, decline or
answer (each vote of a quorum too), and the system's expiries and
escalations; and every call an approval policy decided without asking
(`through: "policy"` or `"grant:<id>"`, `relayq.policies`), one row a call. Nothing in
relayq updates or deletes a row here (a test holds every statement the application
runs to that).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from sqlalchemy import bindparam
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from relayq.policies import PolicyNote
from store.db import Database
from store.models import DecisionRow, RequestRow, utcnow
from store.paging import BadQuery, decode_cursor, encode_cursor

__all__ = [
    "SYSTEM",
    "AuditQuery",
    "Decider",
    "DecisionOutcome",
    "Via",
    "decisions_of",
    "list_decisions",
    "note_policy",
    "noted",
    "policy_row",
    "record_decision",
]

Via: TypeAlias = Literal["inbox", "api", "cli", "python", "system"]
DecisionOutcome: TypeAlias = Literal[
    "approved", "edited", "declined", "answered", "expired", "escalated", "overdue"
]
POLICY = "relayq:policy"
"""The actor of a row an approval policy wrote."""


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
    outcome: DecisionOutcome,
    *,
    now: datetime | None = None,
    reason: str | None = None,
    arguments_hash: str | None = None,
    diff: dict[str, Any] | None = None,
    call_ids: Sequence[str] | None = None,
) -> None:
    """Append one decision on `row` to the trail, in the caller's transaction; `call_ids`:
    the relay calls it gives results to (by default every call of the request)."""
    s.add(
        DecisionRow(
            request_id=row.id,
            run_id=row.run_id,
            agent=row.agent,
            tool=row.tool,
            call_ids=(
                list(call_ids)
                if call_ids is not None
                else [str(c.get("id")) for c in row.calls or []]
            ),
            actor=decider.name,
            role=decider.role,
            groups=list(decider.groups),
            via=decider.via,
            os_user=decider.os_user,
            outcome=outcome,
            reason=reason,
            arguments_hash=arguments_hash,
            diff=diff,
            through="system" if decider.via == "system" else "person",
            at=now or utcnow(),
        )
    )


def policy_row(note: PolicyNote, *, now: datetime | None = None) -> DecisionRow:
    """The trail's row for a call its policy decided."""
    return DecisionRow(
        request_id=note.request_id,
        run_id=note.run_id,
        agent=note.agent,
        tool=note.tool,
        call_ids=[note.call_id],
        actor=POLICY,
        role="system",
        via="system",
        outcome=note.outcome,
        reason=note.reason,
        arguments_hash=note.arguments_hash,
        through=note.through,
        call_key=note.call_key,
        at=now or utcnow(),
    )


def note_policy(db: Database, note: PolicyNote) -> None:
    """Append what a policy decided on a call, once: a call run again (its worker died)
    finds its row kept and adds none."""
    # IntegrityError: another execution of the call noted it in between.
    with contextlib.suppress(IntegrityError), db.write() as s:
        if noted(s, note.call_key) is None:
            s.add(policy_row(note))


_NOTED = select(DecisionRow).where(col(DecisionRow.call_key) == bindparam("key"))


def noted(s: Session, call_key: str) -> DecisionRow | None:
    """The trail's row a policy wrote for the call of `call_key`, if any."""
    return s.exec(_NOTED, params={"key": call_key}).first()


def decisions_of(db: Database, request_id: str | Sequence[str]) -> list[DecisionRow]:
    """A request's decisions (or several requests'), oldest first."""
    ids = [request_id] if isinstance(request_id, str) else list(request_id)
    found: list[DecisionRow] = []
    with db.read() as s:
        for at in range(0, len(ids), 500):  # SQLite caps a statement's bound parameters
            query = select(DecisionRow).where(col(DecisionRow.request_id).in_(ids[at : at + 500]))
            found.extend(s.exec(query))
    return sorted(found, key=lambda row: row.id or 0)


@dataclass(frozen=True, kw_only=True)
class AuditQuery:
    """Which decisions to list, newest first, and which page of them.

    AuditQuery(actor="carol", since=datetime(2026, 12, 1, tzinfo=UTC))
    """

    since: datetime | None = None
    """Decided at or after this moment (an aware datetime)."""
    until: datetime | None = None
    """Decided before this moment."""
    actor: str | None = None
    agent: str | None = None
    outcome: str | None = None
    """approved, edited, declined, answered, expired, escalated, overdue, denied or asked."""
    through: str | None = None
    """person, system, policy, or grant:<id>."""
    cursor: str | None = None
    """The cursor of the page before, for the page after it; it carries that page's
    filters, which then stand in for these."""
    limit: int = 100

    def filters_json(self) -> dict[str, Any]:
        moments = {"since": self.since, "until": self.until}
        return {
            **{k: None if v is None else v.isoformat() for k, v in moments.items()},
            "actor": self.actor,
            "agent": self.agent,
            "outcome": self.outcome,
            "through": self.through,
        }


def list_decisions(
    db: Database, query: AuditQuery | None = None
) -> tuple[list[DecisionRow], str | None]:
    """Decisions, newest first, filtered; and the cursor of the next page (None: last).

    Paged by id, which only grows: a page is stable however many rows come in. The
    cursor carries the filters of its page, as every listing's does (`store.request_listing`):
    `--cursor` alone, or `?cursor=` alone, pages on through the same trail.
    """
    filters = query or AuditQuery()
    limit = filters.limit
    before_id = None
    if filters.cursor:
        before_id, filters = _carried(filters.cursor)
    listing = select(DecisionRow).order_by(col(DecisionRow.id).desc())
    if filters.since is not None:
        listing = listing.where(col(DecisionRow.at) >= filters.since)
    if filters.until is not None:
        listing = listing.where(col(DecisionRow.at) < filters.until)
    for name in _TEXTS:
        value = getattr(filters, name)
        if value:  # an empty value is no filter, as in every listing
            listing = listing.where(getattr(DecisionRow, name) == value)
    if before_id is not None:
        listing = listing.where(col(DecisionRow.id) < before_id)
    with db.read() as s:
        rows = list(s.exec(listing.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    after = None
    if more and rows:
        after = encode_cursor([rows[-1].id, filters.filters_json()], scope=_AUDIT)
    return rows, after


_AUDIT = "audit"
_TEXTS = ("actor", "agent", "outcome", "through")
"""The filters of text, each an exact match."""


def _carried(cursor: str) -> tuple[int, AuditQuery]:
    before_id, raw = decode_cursor(cursor, scope=_AUDIT, size=2)
    try:
        if not isinstance(before_id, int) or not isinstance(raw, dict):
            raise ValueError(raw)
        texts: dict[str, Any] = {k: raw.get(k) for k in _TEXTS}
        if not all(v is None or isinstance(v, str) for v in texts.values()):
            raise ValueError(texts)
        since, until = (
            None if raw[k] is None else datetime.fromisoformat(str(raw[k]))
            for k in ("since", "until")
        )
        return before_id, AuditQuery(since=since, until=until, **texts)
    except (ValueError, KeyError, TypeError):
        raise BadQuery("bad cursor: its filters are not the audit trail's", "cursor") from None
