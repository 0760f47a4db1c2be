"""The approvals inbox: server-rendered pages and plain form posts, no build step.

`GET /` shows the login form until the browser holds a token cookie, then
the open requests, newest first, each with an approve and a decline form.
The forms post and redirect back, so the page works without JavaScript; a
few lines of script refresh the list on request events from `/api/events`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from api._answers import answer_request, approval, stored_request
from api._auth import COOKIE, Answerer, Permission, Principal, Reader
from relayq import Answer
from relayq.relay import answer_declined, relay_calls_of
from store import StoredRequest
from tasks import DurableClient

__all__ = ["router"]

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
# Jinja2Templates autoescapes .html templates; say so, since the pages show model-made text.
templates.env.autoescape = True

# The inbox must not be framed by another site (clickjacking an approve button).
_HEADERS = {"Content-Security-Policy": "frame-ancestors 'none'", "Cache-Control": "no-store"}

router = APIRouter(include_in_schema=False)


def _client(request: Request) -> DurableClient:
    client: DurableClient = request.app.state.client
    return client


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _item(stored: StoredRequest) -> dict[str, Any]:
    calls = relay_calls_of(stored.request)
    return {
        "id": stored.request.id,
        "run_id": stored.run_id,
        "agent": stored.agent,
        "kind": stored.request.kind,
        "prompt": stored.request.prompt,
        "created_at": stored.created_at,
        "expires_at": stored.request.expires_at,
        "calls": [{"id": c.id, "name": c.name, "arguments": _pretty(c.input)} for c in calls],
        # Other kinds (an approval, a question) show their data instead of calls.
        "data": None if calls else _pretty(stored.request.data),
    }


def _login(request: Request, *, error: str | None = None, status: int = 200) -> Response:
    response = templates.TemplateResponse(
        request, "login.html", {"error": error}, status_code=status, headers=_HEADERS
    )
    if error is not None:
        response.delete_cookie(COOKIE)
    return response


async def _inbox(
    request: Request, who: Principal, *, error: str | None = None, status: int = 200
) -> Response:
    stored = await _client(request).requests("open", limit=200)
    context = {
        "who": who,
        "can_answer": who.may(Permission.ANSWER),
        "requests": [_item(s) for s in stored],
        "error": error,
    }
    return templates.TemplateResponse(
        request, "inbox.html", context, status_code=status, headers=_HEADERS
    )


@router.get("/", response_class=HTMLResponse)
async def inbox(request: Request) -> Response:
    token = request.cookies.get(COOKIE)
    if not token:
        return _login(request)
    who = request.app.state.tokens.lookup(token)
    if who is None:
        return _login(request, error="That token is not valid; log in again.", status=401)
    return await _inbox(request, who)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, token: Annotated[str, Form()]) -> Response:
    if request.app.state.tokens.lookup(token) is None:
        return _login(request, error="Unknown token.", status=401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
async def logout(who: Reader) -> Response:
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE)
    return response


async def _answer(request: Request, who: Principal, answer: Answer) -> Response:
    try:
        await answer_request(_client(request), answer, answered_by=who.name)
    except HTTPException as exc:
        return await _inbox(request, who, error=str(exc.detail), status=exc.status_code)
    return RedirectResponse("/", status_code=303)


@router.post("/requests/{request_id}/approve")
async def approve(
    request_id: str,
    request: Request,
    who: Answerer,
    output: Annotated[str, Form()] = "approved",
) -> Response:
    try:
        stored = await stored_request(_client(request), request_id)
    except HTTPException as exc:
        return await _inbox(request, who, error=str(exc.detail), status=exc.status_code)
    return await _answer(request, who, approval(stored, output))


@router.post("/requests/{request_id}/decline")
async def decline(
    request_id: str,
    request: Request,
    who: Answerer,
    reason: Annotated[str, Form()] = "declined",
) -> Response:
    return await _answer(request, who, answer_declined(request_id, reason or "declined"))
