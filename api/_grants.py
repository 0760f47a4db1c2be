"""Standing grants over HTTP (`relayq.grants`, `store.grants`).

    GET  /api/grants               ?tool=&agent=&scope=&status=&madeBy=&cursor=&limit=
    POST /api/grants               an administrator's grant, made directly
    GET  /api/grants/{id}
    POST /api/grants/{id}/revoke   from this moment, no call is approved by it

A grant is also made with a decision: `POST /api/requests/{id}/decision` takes
`{"decision": "approve", "grant": {"scope": "conversation", "for": "8h", "max_uses": 20}}`.
Any reader lists grants; an administrator makes them directly; an administrator or
the grant's maker revokes one (the store says so, whatever the door).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from api._approvals import decider_of
from api._auth import Admin, Answerer, Reader
from api._errors import refusals
from api._limits import Keepable
from api._state import client_of
from relayq import ToolkitError
from relayq.grants import MAX_USES, GrantScope, parse_duration
from relayq.matching import Matcher, parse_constraints
from relayq.wire import CamelModel
from store.grants import GrantQuery, GrantView, NewGrant

__all__ = ["GrantView", "NewGrantBody", "router"]

router = APIRouter(prefix="/api", tags=["api"], responses=refusals(401, 403, 422, 503))


class NewGrantBody(BaseModel):
    """An administrator's grant: a tool, which runs, which calls, how long, how often."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    tool: Keepable = Field(min_length=1, max_length=64)
    agent: Keepable | None = Field(default=None, min_length=1, max_length=200)
    """None: every agent with the tool (scope `all` only)."""
    scope: GrantScope
    scope_id: Keepable | None = Field(
        default=None, max_length=200, validation_alias=AliasChoices("scope_id", "scopeId")
    )
    """The run, conversation or principal covered (scopes run, conversation, principal)."""
    lasts: float | str = Field(validation_alias=AliasChoices("for", "lasts"))
    max_uses: int | None = Field(
        default=None, ge=1, le=MAX_USES, validation_alias=AliasChoices("max_uses", "maxUses")
    )
    match: list[Annotated[str, Field(max_length=500)]] | dict[str, Any] = Field(
        default_factory=list
    )
    """Constraints every covered call meets, or `{"arguments": {...}}` for exact ones."""
    reason: Keepable | None = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def _fits(self) -> NewGrantBody:
        try:
            self.matcher()
            parse_duration(self.lasts)
        except ToolkitError as exc:
            raise ValueError(str(exc)) from None
        return self

    def matcher(self) -> Matcher:
        if isinstance(self.match, dict):
            if set(self.match) != {"arguments"}:
                raise ToolkitError('an exact match is {"arguments": {...}}')
            return Matcher.from_wire(self.match)
        return Matcher(where=parse_constraints(self.match))


class GrantPage(CamelModel):
    items: list[GrantView]
    next_cursor: str | None


@router.get("/grants")
async def grants(
    request: Request,
    who: Reader,
    tool: str | None = None,
    agent: str | None = None,
    scope: str | None = None,
    status: str | None = None,
    made_by: Annotated[str | None, Query(alias="madeBy")] = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> GrantPage:
    """Grants, newest first, filtered, a page at a time."""
    query = GrantQuery(
        tool=tool,
        agent=agent,
        scope=scope,
        made_by=made_by,
        status=status,  # type: ignore[arg-type]  # checked by the store: 422
        cursor=cursor,
        limit=limit,
    )
    rows, more = await client_of(request).store.list_grants(query)
    return GrantPage(items=[GrantView.of(r) for r in rows], next_cursor=more)


@router.post("/grants", status_code=201, responses=refusals(400, 403, 413))
async def make(body: NewGrantBody, request: Request, who: Admin) -> GrantView:
    """An administrator's grant, made directly (403 for any other role)."""
    grant = NewGrant(
        tool=body.tool,
        agent=body.agent,
        scope=body.scope,
        scope_id=body.scope_id,
        matcher=body.matcher(),
        lasts=parse_duration(body.lasts),
        max_uses=body.max_uses,
        maker=decider_of(who, "api"),
        reason=body.reason,
    )
    return GrantView.of(await client_of(request).store.make_grant(grant))


@router.get("/grants/{grant_id}", responses=refusals(404))
async def grant(grant_id: str, request: Request, who: Reader) -> GrantView:
    return GrantView.of(await client_of(request).store.get_grant(grant_id))


@router.post("/grants/{grant_id}/revoke", responses=refusals(400, 403, 404, 413))
async def revoke(grant_id: str, request: Request, who: Answerer) -> GrantView:
    """Revoke a grant from this moment (its maker or an administrator; 403 for others)."""
    row = await client_of(request).store.revoke_grant(grant_id, decider_of(who, "api"))
    return GrantView.of(row)
