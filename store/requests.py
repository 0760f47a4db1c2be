"""Requests: opened when a turn halts, read by hosts, closed with their run."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlmodel import Session, col, select

from relayq import Answer, Request, UnknownRequest
from relayq.approvals import Policy, is_approval, policy_of
from relayq.relay import RELAY_KIND, is_relay_request, relay_calls_of
from store.db import Database
from store.events import emit
from store.messages import storable_text
from store.models import RequestRow, RunRow

__all__ = [
    "StoredRequest",
    "cancel_requests",
    "get_request",
    "list_requests",
    "open_request",
    "request_of",
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


def open_request(
    s: Session,
    run: RunRow,
    request: Request,
    now: datetime,
    *,
    ttl: timedelta | None,
    on_expiry: str,
) -> None:
    if s.get(RequestRow, request.id) is not None:
        return
    expires_at = request.expires_at or (now + ttl if ttl is not None else None)
    relay = is_relay_request(request)
    calls = relay_calls_of(request)
    row = RequestRow(
        id=request.id,
        run_id=run.id,
        agent=run.agent,
        kind=storable_text(request.kind),
        prompt=storable_text(request.prompt),
        url=None if request.url is None else storable_text(request.url),
        data={k: v for k, v in request.data.items() if not (relay and k == "calls")},
        calls=[c.model_dump(mode="json") for c in calls],
        status="open",
        expires_at=expires_at,
        on_expiry=on_expiry,
        created_at=now,
        tool=calls[0].name if calls else None,
    )
    if is_approval(request):
        _apply_policy(row, policy_of(request))
    s.add(row)
    s.flush()
    emit(
        s,
        "request.opened",
        run_id=run.id,
        request_id=row.id,
        now=now,
        agent=run.agent,
        kind=row.kind,
        tool=row.tool,
        approvers=row.approvers or [],
        expiresAt=None if expires_at is None else expires_at.isoformat(),
    )


def _apply_policy(row: RequestRow, policy: Policy) -> None:
    """An approval's policy, in the columns the store enforces it from."""
    row.tool = str(row.data.get("tool") or "") or None
    row.approvers = list(policy.approvers)
    row.quorum = policy.quorum
    row.declines = policy.declines
    row.forbid_self = policy.forbid_self_approval
    row.escalation = [step.to_wire() for step in policy.escalation]
    # Declining at the deadline is the `error` expiry every request has.
    row.on_expiry = {"decline": "error"}.get(policy.on_expiry, policy.on_expiry)
    if row.expires_at is not None and policy.remind_before is not None:
        row.remind_at = row.expires_at - policy.remind_before


def request_of(row: RequestRow) -> Request:
    """The Request a stored row stands for, in the wire shape hosts see."""
    data = dict(row.data or {})
    if row.kind == RELAY_KIND:
        data["calls"] = row.calls or []
    return Request(
        id=row.id,
        kind=row.kind,
        prompt=row.prompt,
        url=row.url,
        data=data,
        expires_at=row.expires_at,
    )


def cancel_requests(s: Session, run_id: str) -> None:
    # Compare-and-swap: only requests still open; an answered one stays answered.
    table = RequestRow.__table__  # type: ignore[attr-defined]
    s.execute(
        table.update()
        .where(table.c.run_id == run_id, table.c.status == "open")
        .values(status="cancelled", outcome="cancelled")
    )


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
