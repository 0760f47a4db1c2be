"""Bodies the API takes in: never larger than the store takes, never a 500.

An answer (or a prompt) may be `RELAYQ_MAX_ANSWER_BYTES` of JSON. A body
declaring more than `body_limit` of that in Content-Length is refused with 413
before a byte of it is read; a body without one (chunked) is read only up to
that many bytes. So a 100 MB upload costs the API no more memory than the
limit, whoever sends it and however.

A body that does not validate is a 422 whatever it holds: the errors go back
without the input they quote (it may be megabytes, hold a NaN, or a lone
surrogate that no UTF-8 response can carry).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relayq.limits import problem_of

__all__ = [
    "AsciiJSON",
    "BodyLimit",
    "Keepable",
    "TooLarge",
    "body_limit",
    "invalid_body",
    "keepable_url",
]

# Room for the envelope ({"ok": ..., "partial": ...}) and for JSON escapes:
# an escaped character (`\u00e9`, or a surrogate pair for an emoji) makes a body
# up to 3x the UTF-8 answer it carries (12 bytes for a 4-byte character).
# Above the limit but within this, the store says 413.
_ESCAPES = 3
_ENVELOPE = 64 * 1024


def body_limit(max_answer_bytes: int) -> int:
    """The largest request body the API reads for answers of at most `max_answer_bytes`."""
    return _ESCAPES * max_answer_bytes + _ENVELOPE


class TooLarge(HTTPException):
    """413: FastAPI lets an HTTPException raised while it reads the body through, as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over {limit} bytes; answers and prompts may be at most "
            "RELAYQ_MAX_ANSWER_BYTES of JSON",
        )
        self.limit = limit


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, without reading what is over it."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(TooLarge(self.max_bytes), scope, receive, send)
            return
        seen = 0
        started = False

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise TooLarge(self.max_bytes)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped, sending)
        except TooLarge as exc:  # raised where no route turned it into its response
            if started:
                raise
            await _refuse(exc, scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    try:
        return int(Headers(scope=scope)["content-length"])
    except (KeyError, ValueError):
        return None


async def _refuse(exc: TooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    # The client may still be sending: close the connection rather than read the rest.
    headers = {"Connection": "close"}
    response = JSONResponse({"detail": exc.detail}, status_code=413, headers=headers)
    await response(scope, receive, send)


class AsciiJSON(JSONResponse):
    """JSON with every non-ASCII character escaped: text a client sent with a lone
    surrogate in it (JSON's `\\udce9`) comes back escaped rather than failing the response."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


async def invalid_body(request: Request, exc: Exception) -> Response:
    """422 for a request that does not validate, its errors without the input they quote."""
    assert isinstance(exc, RequestValidationError)
    errors = [{k: v for k, v in e.items() if k != "input"} for e in exc.errors()]
    return AsciiJSON({"detail": jsonable_encoder(errors)}, status_code=422)


async def keepable_url(request: Request) -> None:  # async: no thread hop (api._auth)
    """A path or query value no store can hold (a NUL character: `%00`) is a 422 naming
    it, before any route looks it up; the store refuses what comes in by a body."""
    values = [*request.path_params.items(), *request.query_params.multi_items()]
    for name, value in values:
        problem = problem_of(value)
        if problem is not None:
            raise HTTPException(422, f"{name} {problem}")


def _keepable(text: str) -> str:
    problem = problem_of(text)
    if problem is not None:
        raise ValueError(f"it {problem}")
    return text


Keepable = Annotated[str, AfterValidator(_keepable)]
"""A body's id or name: one no store can hold is a 422 on every store alike (SQLite
would keep a NUL, PostgreSQL not)."""
