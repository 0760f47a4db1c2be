"""Decisions on approvals, and the audit trail, over HTTP.

    POST /api/requests/{id}/decision   {"decision": "approve"}
                                       {"decision": "edit", "arguments": {...}}
                                       {"decision": "decline", "reason": "..."}
    POST /api/requests/decisions       {"decision": "approve" | "decline", "reason": "...",
                                        "requests": [{"id": "...", "revision": 3}, ...]}
    GET  /api/requests/{id}/decisions  every decision and vote on the request
    GET  /api/audit                    the trail: ?since=&until=&actor=&agent=&outcome=&cursor=

A decision is recorded with the token's name, role and groups, `via: api`. Who
may decide is the store's to say (`store.votes`): 403 outside the request's
approver groups or for the run's own starter where self-approval is forbidden,
409 for a second vote, 422 for edited arguments that do not fit the tool's schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from api._answers import stored_request
from api._auth import Answerer, Principal, Reader
from api._errors import http_error, refusals
from api._limits import Keepable
from api._state import client_of
from relayq import Answer, BulkRefused, NotAnApproval, ResumeError, ToolkitError
from relayq.grants import MAX_USES, GrantScope, GrantTerms, parse_duration
from relayq.replies import Decided, answer_to
from relayq.wire import CamelModel
from store import AuditQuery, Decider, StoredRequest
from store.answers import MAX_BULK
from store.models import DecisionRow

__all__ = ["BulkBody", "DecisionBody", "GrantBody", "DecisionOut", "decider_of", "router"]

router = APIRouter(prefix="/api", tags=["api"], responses=refusals(401, 403, 422, 503))


class GrantBody(BaseModel):
    """The grant a decision makes: `{scope, for, max_uses, match}`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    scope: GrantScope = "run"
    lasts: float | str = Field(validation_alias=AliasChoices("for", "lasts"))
    """How long it lasts: seconds, or `"8h"`, `"30m"`, `"2d"`."""
    max_uses: int | None = Field(
        default=None, ge=1, le=MAX_USES, validation_alias=AliasChoices("max_uses", "maxUses")
    )
    match: Literal["exact"] | list[Annotated[str, Field(max_length=500)]] = "exact"
    """`exact`: the arguments decided; or constraints every covered call meets."""

    @model_validator(mode="after")
    def _fits(self) -> GrantBody:
        try:
            self.terms()
        except ToolkitError as exc:
            raise ValueError(str(exc)) from None
        return self

    def terms(self) -> GrantTerms:
        return GrantTerms(
            scope=self.scope,
            lasts=parse_duration(self.lasts),
            max_uses=self.max_uses,
            match="exact" if self.match == "exact" else tuple(self.match),
        )


class DecisionBody(BaseModel):
    """One person's decision on an approval request."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "edit", "decline"]
    arguments: dict[str, Any] | None = None
    """The edited arguments (`edit` only), checked against the tool's schema."""
    reason: Keepable | None = Field(default=None, max_length=2000)
    """Why it is declined (`decline` only, required there)."""
    grant: GrantBody | None = None
    """With an approval: approve the same for calls to come, `{scope, for, max_uses,
    match}` (`api._grants`)."""

    @model_validator(mode="after")
    def _fits(self) -> DecisionBody:
        self.reply()  # what does not go together, a 422 here
        return self

    def reply(self) -> Decided:
        return Decided(self.decision, self.arguments, self.reason)

    def answer(self, request_id: str) -> Answer:
        """The wire Answer (`relayq.replies.answer_to`)."""
        return answer_to(request_id, self.reply())


class DecisionOut(CamelModel):
    """One row of the audit trail."""

    id: int
    request_id: str | None
    """None for a call its policy decided without asking."""
    run_id: str
    agent: str
    tool: str | None
    call_ids: list[str]
    actor: str
    role: str | None
    groups: list[str]
    via: str
    os_user: str | None
    outcome: str
    reason: str | None
    arguments_hash: str | None
    diff: dict[str, Any] | None
    through: str
    """person, system, policy or grant:<id>: what decided."""
    at: datetime

    @classmethod
    def of(cls, row: DecisionRow) -> DecisionOut:
        assert row.id is not None
        return cls(
            id=row.id,
            request_id=row.request_id,
            run_id=row.run_id,
            agent=row.agent,
            tool=row.tool,
            call_ids=list(row.call_ids or []),
            actor=row.actor,
            role=row.role,
            groups=list(row.groups or []),
            via=row.via,
            os_user=row.os_user,
            outcome=row.outcome,
            reason=row.reason,
            arguments_hash=row.arguments_hash,
            diff=row.diff,
            through=row.through,
            at=row.at,
        )


class AuditPage(CamelModel):
    items: list[DecisionOut]
    next_cursor: str | None
    """Pass as `cursor` for the next (older) page; null on the last."""


class BulkItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Keepable
    revision: int | None = None
    """The request's `revision` as listed (the preview): decided or voted on since, it
    is refused. Leave out to decide it as it is now."""


class BulkBody(BaseModel):
    """One decision on many approval requests, applied all or nothing."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "decline"]
    reason: Keepable | None = Field(default=None, max_length=2000)
    requests: list[BulkItem] = Field(min_length=1, max_length=MAX_BULK)

    @model_validator(mode="after")
    def _fits(self) -> BulkBody:
        if self.decision == "decline" and not (self.reason or "").strip():
            raise ValueError("declining takes a reason")
        if self.decision == "approve" and self.reason is not None:
            raise ValueError("a reason goes with decision 'decline', and only with it")
        ids = [item.id for item in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("each request may be named once")
        return self


class BulkDone(CamelModel):
    decided: list[str]
    """Every request named: each took the decision (as a vote, where a quorum needs more)."""
    resumed: list[str]
    """The runs that resume now."""


def refused_body(exc: BulkRefused) -> dict[str, Any]:
    """A refused bulk decision's 409: what was refused, request by request."""
    return {"detail": str(exc), "refused": [{"id": i, "why": why} for i, why in exc.refused]}


def decider_of(who: Principal, via: Literal["inbox", "api"]) -> Decider:
    """The audit trail's view of a token's holder."""
    return Decider(name=who.name, role=who.role, groups=tuple(who.groups), via=via)


@router.post("/requests/{request_id}/decision", responses=refusals(400, 403, 404, 409, 413))
async def decide(
    request_id: str, body: DecisionBody, request: Request, who: Answerer
) -> StoredRequest:
    """Approve, edit or decline an approval request, as the token's holder (409 for a
    request that is not an approval: its answer goes to `/answer`)."""
    client = client_of(request)
    try:
        await client.submit_answer(
            body.answer(request_id),
            decider=decider_of(who, "api"),
            decision=True,
            grant=None if body.grant is None else body.grant.terms(),
        )
    except NotAnApproval as exc:
        raise HTTPException(
            409, f"{exc}: answer it with POST /api/requests/{request_id}/answer"
        ) from exc
    except ResumeError as exc:
        raise http_error(exc) from exc
    return await stored_request(client, request_id)


@router.post(
    "/requests/decisions", response_model=BulkDone, responses=refusals(400, 403, 404, 409, 413)
)
async def decide_many(body: BulkBody, request: Request, who: Answerer) -> BulkDone | JSONResponse:
    """Approve or decline many approval requests at once, all or nothing: if any of
    them cannot take the decision (decided or voted on since its listed revision, not
    an approval, not the caller's to decide), nothing is applied and the 409 names
    each one and why."""
    revisions = {item.id: item.revision for item in body.requests}
    try:
        resumed = await client_of(request).decide_many(
            revisions, body.decision, decider=decider_of(who, "api"), reason=body.reason
        )
    except BulkRefused as exc:
        return JSONResponse(refused_body(exc), status_code=409)
    except ResumeError as exc:
        raise http_error(exc) from exc
    return BulkDone(decided=list(revisions), resumed=resumed)


@router.get("/requests/{request_id}/decisions", responses=refusals(404))
async def decisions(request_id: str, request: Request, who: Reader) -> list[DecisionOut]:
    """Every decision and vote on the request, oldest first (404 for an unknown request)."""
    client = client_of(request)
    await stored_request(client, request_id)
    rows = await client.store.decisions_of(request_id)
    return [DecisionOut.of(r) for r in rows]


@router.get("/audit")
async def audit(
    request: Request,
    who: Reader,
    since: datetime | None = None,
    until: datetime | None = None,
    actor: str | None = None,
    agent: str | None = None,
    outcome: str | None = None,
    through: str | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """The audit trail, newest first, filtered, a page at a time; `nextCursor` carries
    the filters, so `?cursor=` alone gives the next page of the same trail."""
    client = client_of(request)
    query = AuditQuery(
        since=since,
        until=until,
        actor=actor,
        agent=agent,
        outcome=outcome,
        through=through,
        cursor=cursor,
        limit=limit,
    )
    rows, more = await client.store.list_decisions(query)
    return AuditPage(items=[DecisionOut.of(r) for r in rows], next_cursor=more)
