"""A request as the store keeps it (`StoredRequest`) and as hosts see it (`Request`),
each read from its row."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from relayq import Answer, Request
from relayq.relay import RELAY_KIND
from store.models import RequestRow

__all__ = ["StoredRequest", "request_of", "stored_request"]


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


def stored_request(row: RequestRow) -> StoredRequest:
    """The StoredRequest a row stands for: what every reader of requests gets."""
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
