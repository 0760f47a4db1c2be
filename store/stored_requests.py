"""A request as the store keeps it (`StoredRequest`) and as hosts see it (`Request`),
each read from its row; with the hosts that hold its relay calls now (`CallHold`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from pydantic import ConfigDict, Field
from sqlmodel import Session, col, select

from relayq import Answer, Request
from relayq.relay import RELAY_KIND
from relayq.wire import CamelModel
from store.models import RelayCallRow, RequestRow, utcnow

__all__ = [
    "IDS_PER_QUERY",
    "CallHold",
    "StoredRequest",
    "request_of",
    "stored_request",
    "stored_requests",
]


class CallHold(CamelModel):
    """A relay call a host holds now (`store.leases`): who, until when, which try."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    host: str
    """The host token's name."""
    until: datetime
    """When the lease lapses unless the host heartbeats; the call is offered again then."""
    attempt: int


class StoredRequest(CamelModel):
    """A request as the store keeps it: the wire Request plus who, when and what became of it."""

    model_config = ConfigDict(frozen=True)

    request: Request
    run_id: str
    agent: str
    status: str
    """open | answered | expired | cancelled"""
    created_at: datetime
    answer: Answer | None = None
    answered_by: str | None = None
    answered_at: datetime | None = None
    tool: str | None = None
    """The tool it is about: an approval's tool, a relay request's (first) call's."""
    approvers: list[str] = Field(default_factory=list)
    """The groups that may decide it now; empty: anyone who may answer."""
    quorum: int = 1
    """Approvals it takes (an approval request's policy; 1 for every other kind)."""
    outcome: str | None = None
    """How it was resolved: approved, edited, declined, answered, expired, cancelled."""
    revision: int = 0
    """Bumped by every answer or vote: a bulk decision names the revision it previewed."""
    holds: list[CallHold] = Field(default_factory=list)
    """Its relay calls that hosts hold now, in call order (an open request's only)."""


def stored_requests(s: Session, rows: Sequence[RequestRow]) -> list[StoredRequest]:
    """The StoredRequests these rows stand for, with their holds: what every reader of
    requests gets. One query for the holds of them all, and none where no row is an open
    relay request."""
    held = _holds(s, [r.id for r in rows if r.kind == RELAY_KIND and r.status == "open"])
    return [stored_request(row, held.get(row.id, ())) for row in rows]


def _holds(s: Session, request_ids: list[str]) -> dict[str, list[CallHold]]:
    found: dict[str, list[CallHold]] = defaultdict(list)
    now = utcnow()
    for at in range(0, len(request_ids), IDS_PER_QUERY):
        held = select(RelayCallRow).where(
            col(RelayCallRow.request_id).in_(request_ids[at : at + IDS_PER_QUERY]),
            col(RelayCallRow.holder).is_not(None),
            col(RelayCallRow.lease_until) > now,
            col(RelayCallRow.answered).is_(False),
        )
        for call in s.exec(held):
            assert call.holder is not None  # as the query asked
            assert call.lease_until is not None
            found[call.request_id].append(
                CallHold(
                    call_id=call.call_id,
                    host=call.holder,
                    until=call.lease_until,
                    attempt=call.attempt,
                )
            )
    return found


IDS_PER_QUERY = 500
"""Ids a statement matches at most: SQLite caps a statement's bound parameters."""


def stored_request(row: RequestRow, holds: Sequence[CallHold] = ()) -> StoredRequest:
    """The StoredRequest a row stands for, holding `holds` (`stored_requests` finds them)."""
    order = {call.get("id"): n for n, call in enumerate(row.calls or [])}
    return StoredRequest(
        request=request_of(row),
        run_id=row.run_id,
        agent=row.agent,
        status=row.status,
        created_at=row.created_at,
        answer=Answer.model_validate(row.answer) if row.answer else None,
        answered_by=row.answered_by,
        answered_at=row.answered_at,
        tool=row.tool,
        approvers=row.approvers or [],
        quorum=row.quorum,
        outcome=row.outcome,
        revision=row.revision,
        holds=sorted(holds, key=lambda h: order.get(h.call_id, len(order))),
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
