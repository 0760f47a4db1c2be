"""The approvals inbox's core: the session cookie, CSRF, confirmations, page rendering.

The inbox is server-rendered pages and plain form posts, no build step: the
lists (`api._inbox_lists`), a request's and a run's pages (`api._inbox_pages`)
and the forms that decide (`api._inbox_forms`). `/static/inbox.js` only
refreshes what changed, on the events of `/events` (the inbox's own stream:
the API's takes no cookie); every page works without it.

The cookie is the session: HttpOnly, SameSite=Strict, holding the token. Each
form post must also carry the CSRF token the page was rendered with, bound to
that cookie (the login form's, to a nonce cookie of its own); without it the
post is a 403 and changes nothing (see `api._security`). After an action the
redirected page says what was done, from a signed, short-lived flash cookie.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.templating import Jinja2Templates

from api._auth import Permission, Principal, Tokens, forbidden, refuse_tokens_in_url, unauthorized
from api._events import event_stream
from api._security import Signer
from api._state import client_of
from relayq.approvals import APPROVAL_KIND
from relayq.authority import refusal

__all__ = [
    "COOKIE",
    "CSRF_FIELD",
    "CSRF_REFUSED",
    "FLASH_COOKIE",
    "LOGIN_COOKIE",
    "Answering",
    "Viewing",
    "login_page",
    "page_session",
    "redirect_after",
    "render",
    "router",
    "safe_next",
    "templates",
]

COOKIE = "relayq_token"
"""The session: HttpOnly, SameSite=Strict, holding the token itself."""
LOGIN_COOKIE = "relayq_login"
"""A nonce the login form's CSRF token is bound to, before there is a session."""
FLASH_COOKIE = "relayq_flash"
"""What the last action did, signed; read once by the page it redirects to."""
CSRF_FIELD = "csrf_token"
CSRF_REFUSED = (
    "this form did not come from this inbox's page (no valid CSRF token); nothing was "
    "changed. Reload the inbox and try again."
)

# What a confirmation says, by kind; the subject is the server's own text (ids, counts).
_FLASHES = {
    "approved": "Approved {}.",
    "edited": "Approved {} with the edited arguments.",
    "declined": "Declined {}.",
    "answered": "Answered {}.",
    "voted": "Your vote on {} is recorded.",
    "granted": "Approved {}, and the same for calls to come: see Grants.",
    "revoked": "Revoked {}: the calls it covered ask a person again.",
    "bulk_approved": "Approved {}.",
    "bulk_declined": "Declined {}.",
    "logged_out": "Logged out.",
}
_FLASH_SECONDS = 60

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
# Jinja2Templates autoescapes .html templates; say so, since the pages show model-made text.
templates.env.autoescape = True

# The security headers come from api._security.SecurityHeaders; pages are personal: no cache.
_HEADERS = {"Cache-Control": "no-store"}

router = APIRouter(include_in_schema=False)


def _signer(request: Request) -> Signer:
    signer: Signer = request.app.state.signer
    return signer


def _set_cookie(request: Request, response: Response, name: str, value: str, **kw: Any) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
        **kw,
    )


def _flash(request: Request) -> str | None:
    """The message the last action left, if the server signed it."""
    value = request.cookies.get(FLASH_COOKIE)
    found = _signer(request).read_flash(value) if value else None
    if found is None or found[0] not in _FLASHES:
        return None
    kind, subject = found
    return _FLASHES[kind].format(subject)


def safe_next(location: str | None) -> str:
    """Where to go after an action: a path of this inbox only (never another site's)."""
    if not location or not location.startswith("/") or location.startswith(("//", "/\\")):
        return "/"
    return location


def redirect_after(request: Request, kind: str, subject: str = "", to: str = "/") -> Response:
    """The 303 after an action, carrying its confirmation to the page it leads to."""
    response = RedirectResponse(safe_next(to), status_code=303)
    flash = _signer(request).flash(kind, subject)
    _set_cookie(request, response, FLASH_COOKIE, flash, max_age=_FLASH_SECONDS)
    return response


def render(
    request: Request,
    who: Principal,
    name: str,
    context: dict[str, Any],
    *,
    status: int = 200,
    error: str | None = None,
) -> Response:
    """A page for a logged-in user: who they are, the CSRF token its forms carry (bound
    to the cookie this request came with: the page holds the only copy), and the
    confirmation the last action left, shown once."""
    common = {
        "who": who,
        # The list's bulk forms decide approvals: shown to those who may decide one.
        "can_answer": who.may(Permission.ANSWER)
        and refusal(who.role, APPROVAL_KIND, starter=False) is None,
        "csrf": _signer(request).csrf_token(request.cookies[COOKIE]),
        "error": error,
        "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
    }
    return _page(request, name, {**common, **context}, status)


def _page(request: Request, name: str, context: dict[str, Any], status: int) -> Response:
    flash = _flash(request)
    response = templates.TemplateResponse(
        request, name, {**context, "flash": flash}, status_code=status, headers=_HEADERS
    )
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(FLASH_COOKIE, path="/")
    return response


def login_page(
    request: Request, *, error: str | None = None, status: int = 200, next: str = "/"
) -> Response:
    """The login form; after logging in, the browser goes on to `next` (a path here)."""
    # Kept while it lasts, so that two tabs showing the login form both work.
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
    csrf = _signer(request).csrf_token(nonce)
    context = {"error": error, "csrf": csrf, "next": safe_next(next)}
    response = _page(request, "login.html", context, status)
    _set_cookie(request, response, LOGIN_COOKIE, nonce)
    if error is not None:
        response.delete_cookie(COOKIE, path="/")
    return response


def page_session(request: Request) -> Principal | Response:
    """The cookie's principal, for a page: without a valid session, the login form
    (401; 200 for the inbox's front page), which comes back here after logging in."""
    refuse_tokens_in_url(request)
    tokens: Tokens = request.app.state.tokens
    token = request.cookies.get(COOKIE)
    who = tokens.lookup(token) if token else None
    if who is not None:
        return who
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if token:
        return login_page(request, error="That token is not valid; log in again.", status=401)
    return login_page(request, status=200 if here == "/" else 401, next=here)


def _session_of(request: Request) -> Principal:
    """The cookie's principal; 401 without one (a bearer token is no session here)."""
    refuse_tokens_in_url(request)
    tokens: Tokens = request.app.state.tokens
    token = request.cookies.get(COOKIE)
    who = tokens.lookup(token) if token else None
    if who is None:
        raise unauthorized()
    return who


def _session(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the cookie's principal (401), with `permission` (403)."""

    async def dependency(request: Request) -> Principal:  # async: no thread hop (api._auth)
        who = _session_of(request)
        if not who.may(permission):
            raise forbidden(who, permission)
        return who

    return dependency


def _form(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """As `_session`, for a form post: 403 unless it carries its page's CSRF token."""

    async def dependency(request: Request, csrf_token: Annotated[str, Form()] = "") -> Principal:
        who = _session_of(request)
        if not _signer(request).csrf_valid(request.cookies.get(COOKIE), csrf_token):
            raise HTTPException(403, CSRF_REFUSED)
        if not who.may(permission):
            raise forbidden(who, permission)
        return who

    return dependency


async def _login_form(request: Request, csrf_token: Annotated[str, Form()] = "") -> None:
    """403 for a login post that did not come from the login page this browser was shown."""
    if not _signer(request).csrf_valid(request.cookies.get(LOGIN_COOKIE), csrf_token):
        raise HTTPException(403, CSRF_REFUSED)


Viewing = Annotated[Principal, Depends(_session(Permission.READ))]
Posting = Annotated[Principal, Depends(_form(Permission.READ))]
Answering = Annotated[Principal, Depends(_form(Permission.ANSWER))]


@router.post("/login", response_class=HTMLResponse, dependencies=[Depends(_login_form)])
async def login(
    request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/"
) -> Response:
    who = request.app.state.tokens.lookup(token)
    if who is None:
        return login_page(request, error="Unknown token.", status=401, next=next)
    if not who.may(Permission.READ):
        # A host's token serves relay calls over the API; it opens no inbox.
        return login_page(request, error="This token cannot open the inbox.", status=403, next=next)
    response = RedirectResponse(safe_next(next), status_code=303)
    _set_cookie(request, response, COOKIE, token)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@router.post("/logout")
async def logout(request: Request, who: Posting) -> Response:
    response = redirect_after(request, "logged_out")
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/events", response_class=EventSourceResponse)
async def events(request: Request, who: Viewing) -> AsyncIterator[ServerSentEvent]:
    """The API's event stream, for the inbox's pages: they have the cookie, not a bearer token."""
    state: Any = request.app.state
    state.event_streams += 1
    try:
        async for event in event_stream(client_of(request)):
            yield event
    finally:
        state.event_streams -= 1
