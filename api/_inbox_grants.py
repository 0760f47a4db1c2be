"""The inbox's standing grants: approve and grant from a request's page, list, revoke.

    POST /requests/{id}/grant   approve, and approve the same for calls to come
    GET  /grants                the grants, newest first (?status=active by default)
    POST /grants/{id}/revoke    its maker or an administrator; others see why, nothing changed

The grant is made with the decision, through the same client call as the API's
(`store.grants`): what the tool's policy refuses is the request's page again, 422,
naming why, with nothing decided.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from api._answers import answer_request, stored_request
from api._approvals import decider_of
from api._auth import Principal
from api._errors import http_error
from api._inbox import Answering, page_session, redirect_after, render
from api._inbox_forms import refused_page
from api._state import client_of
from relayq import RelayqError, ToolkitError
from relayq.grants import GrantTerms
from relayq.matching import Matcher
from relayq.replies import Decided, answer_to
from store.grants import ADMINS, GrantQuery, status_of
from store.models import GrantRow

__all__ = ["GRANTS_SHOWN", "router"]

GRANTS_SHOWN = 200
"""Grants the page lists (the newest that match); the API and `relayq grants` page on."""

router = APIRouter(include_in_schema=False)


@router.post("/requests/{request_id}/grant")
async def approve_and_grant(
    request_id: str,
    request: Request,
    who: Answering,
    scope: Annotated[str, Form()] = "run",
    lasts: Annotated[str, Form(alias="for")] = "8h",
    max_uses: Annotated[str, Form()] = "",
    match: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """Approve, and make a grant for calls to come with the approval."""
    client = client_of(request)
    try:
        terms = _terms(scope, lasts, max_uses, match)
        await stored_request(client, request_id)  # 404 for an unknown request
        answer = answer_to(request_id, Decided("approve"))
        await answer_request(
            client, answer, decider=decider_of(who, "inbox"), decision=True, grant=terms
        )
    except HTTPException as exc:
        return await refused_page(request, who, request_id, exc)
    except ToolkitError as exc:
        return await refused_page(request, who, request_id, HTTPException(422, str(exc)))
    return redirect_after(request, "granted", request_id, next)


def _terms(scope: str, lasts: str, max_uses: str, match: str) -> GrantTerms:
    """The form's fields as a decision's `grant` (`GrantTerms.from_wire` checks them)."""
    uses = max_uses.strip()
    if uses and not uses.isdigit():
        raise ToolkitError(f"at most how many calls is a whole number, not {uses!r}")
    constraints = [line.strip() for line in match.splitlines() if line.strip()]
    wire = {"scope": scope, "for": lasts.strip(), "max_uses": int(uses) if uses else None}
    return GrantTerms.from_wire({**wire, "match": constraints or "exact"})


@router.get("/grants", response_class=HTMLResponse)
async def grants_page(request: Request, status: str = "active", tool: str = "") -> Response:
    """The grants, newest first: what each covers, its uses, and a Revoke button for
    those the user may revoke."""
    who = page_session(request)
    if not isinstance(who, Principal):
        return who
    query = GrantQuery(
        status=None if status == "all" else status,  # type: ignore[arg-type]  # store: 422
        tool=tool or None,
        limit=GRANTS_SHOWN,
    )
    try:
        rows, _ = await client_of(request).store.list_grants(query)
    except RelayqError as exc:
        raise http_error(exc) from exc
    return _listing(request, who, rows, status, tool)


def _listing(
    request: Request,
    who: Principal,
    rows: list[GrantRow],
    status: str,
    tool: str,
    *,
    error: HTTPException | None = None,
) -> Response:
    now = datetime.now(UTC)
    context = {
        "grants": [_shown(r, who, now) for r in rows],
        "status": status,
        "statuses": ["active", "expired", "revoked", "used", "all"],
        "tool": tool,
    }
    if error is None:
        return render(request, who, "grants.html", context)
    return render(
        request, who, "grants.html", context, status=error.status_code, error=str(error.detail)
    )


def _shown(row: GrantRow, who: Principal, now: datetime) -> dict[str, Any]:
    state = status_of(row, now)
    return {
        "id": row.id,
        "tool": row.tool,
        "agent": row.agent or "any agent",
        "scope": row.scope if row.scope_id is None else f"{row.scope} {row.scope_id}",
        "covers": str(Matcher.from_wire(row.match)),
        "uses": f"{row.uses}" if row.max_uses is None else f"{row.uses} of {row.max_uses}",
        "expires": row.expires_at.strftime("%Y-%m-%d %H:%M UTC"),
        "status": state,
        "made_by": row.made_by,
        "reason": row.reason or "",
        "from_request": row.from_request or "",
        "revocable": state != "revoked" and (who.role in ADMINS or who.name == row.made_by),
    }


@router.post("/grants/{grant_id}/revoke")
async def revoke(
    grant_id: str, request: Request, who: Answering, next: Annotated[str, Form()] = "/grants"
) -> Response:
    """Revoke a grant; a user who may not sees the page again, 403, nothing changed."""
    try:
        await client_of(request).store.revoke_grant(grant_id, decider_of(who, "inbox"))
    except RelayqError as exc:
        error = http_error(exc)
        rows, _ = await client_of(request).store.list_grants(GrantQuery(limit=GRANTS_SHOWN))
        return _listing(request, who, rows, "all", "", error=error)
    return redirect_after(request, "revoked", grant_id, next)
