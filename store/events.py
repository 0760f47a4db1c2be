"""Events for the webhooks, written in the transaction that made them happen.

An event is a fact (`request.opened`, `run.finished`, ...) with ids and a few
plain fields: never a prompt, a transcript or a tool's arguments, which stay
behind the API's tokens. Each is delivered at least once to every configured
endpoint (`store.webhooks`); its id lets a receiver drop duplicates.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypeAlias

from sqlalchemy import Connection
from sqlmodel import Session

from store.models import EventRow, RequestRow, utcnow

__all__ = ["EVENT_TYPES", "EventType", "emit", "emit_about", "emit_many"]

EventType: TypeAlias = Literal[
    "request.opened",
    "request.reminder",
    "request.escalated",
    "request.decided",
    "request.expired",
    "run.finished",
    "run.failed",
]
EVENT_TYPES: tuple[EventType, ...] = (
    "request.opened",
    "request.reminder",
    "request.escalated",
    "request.decided",
    "request.expired",
    "run.finished",
    "run.failed",
)

_EVENTS = EventRow.__table__  # type: ignore[attr-defined]


def emit(
    s: Session | Connection,
    type: EventType,
    *,
    run_id: str | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
    **fields: Any,
) -> str:
    """Record one event in the caller's transaction; returns its id."""
    event_id = f"evt_{uuid.uuid4().hex}"
    s.execute(
        _EVENTS.insert().values(
            id=event_id,
            type=type,
            run_id=run_id,
            request_id=request_id,
            payload={"runId": run_id, "requestId": request_id, **fields},
            created_at=now or utcnow(),
        )
    )
    return event_id


def emit_many(
    s: Session | Connection, type: EventType, about: Sequence[dict[str, Any]], *, now: datetime
) -> None:
    """Record one event of `type` for each of `about` (its `run_id`, `request_id` and
    fields), in one statement: `emit`, for many at once."""
    if not about:
        return
    rows = []
    for fields in about:
        run_id, request_id = fields.get("run_id"), fields.get("request_id")
        rest = {k: v for k, v in fields.items() if k not in ("run_id", "request_id")}
        rows.append(
            {
                "id": f"evt_{uuid.uuid4().hex}",
                "type": type,
                "run_id": run_id,
                "request_id": request_id,
                "payload": {"runId": run_id, "requestId": request_id, **rest},
                "created_at": now,
            }
        )
    s.execute(_EVENTS.insert(), rows)


def emit_about(
    s: Session | Connection, type: EventType, row: RequestRow, *, now: datetime, **fields: Any
) -> str:
    """An event about a request, with what every such event says: no prompt, no arguments."""
    return emit(
        s,
        type,
        run_id=row.run_id,
        request_id=row.id,
        now=now,
        agent=row.agent,
        kind=row.kind,
        tool=row.tool,
        approvers=row.approvers or [],
        **fields,
    )
