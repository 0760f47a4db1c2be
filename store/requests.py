"""Requests: opened when a turn halts, read by hosts, closed with their run."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlmodel import Session, col, select

from relayq import Answer, Request, UnknownRequest
from relayq.relay import RELAY_KIND, is_relay_request, relay_calls_of
from store.db import Database
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
    s.add(
        RequestRow(
            id=request.id,
            run_id=run.id,
            agent=run.agent,
            kind=storable_text(request.kind),
            prompt=storable_text(request.prompt),
            url=None if request.url is None else storable_text(request.url),
            data={k: v for k, v in request.data.items() if not (relay and k == "calls")},
            calls=[c.model_dump(mode="json") for c in relay_calls_of(request)],
            status="open",
            expires_at=expires_at,
            on_expiry=on_expiry,
            created_at=now,
        )
    )


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
        .values(status="cancelled")
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
