"""HTTP status codes from relayq's error types alone: no second look at the store.

A second look could race (another answer winning meanwhile) and costs a query;
the store's refusal already says what happened.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from relayq import (
    AgentError,
    AlreadyVoted,
    AnswerTooLarge,
    BulkRefused,
    CallAnswered,
    ConversationBusy,
    ConversationPurged,
    InputTooLarge,
    NotAnApproval,
    NotAnApprover,
    RelayqError,
    RequestClosed,
    ResumeError,
    UnknownAgent,
    UnknownRequest,
    UnstorableInput,
)
from store import JobChanged, JobExists, StoreUnavailable, UnknownBatch, UnknownRun
from store.grants import GrantRefused, UnknownGrant
from store.leases import LeaseLost, LeaseRefused, UnknownLease
from store.paging import BadQuery

__all__ = [
    "FieldError",
    "Refusal",
    "document_refusals",
    "http_error",
    "refusals",
    "refused",
    "status_of",
]

# Most specific first: the first type an error is an instance of decides.
_STATUS: tuple[tuple[type[RelayqError], int], ...] = (
    (UnknownRequest, 404),
    (UnknownRun, 404),
    (UnknownBatch, 404),
    (JobChanged, 409),
    (JobExists, 409),
    (UnknownLease, 404),
    (UnknownGrant, 404),
    (LeaseLost, 409),
    (LeaseRefused, 403),
    (UnknownAgent, 404),
    (NotAnApprover, 403),
    (NotAnApproval, 409),
    (RequestClosed, 409),
    (AlreadyVoted, 409),
    (BulkRefused, 409),
    (CallAnswered, 409),
    (ConversationBusy, 409),
    (ConversationPurged, 409),
    (AnswerTooLarge, 413),
    (InputTooLarge, 413),
    (ResumeError, 422),
    (UnstorableInput, 422),
    (BadQuery, 422),
    (GrantRefused, 422),  # 403 where `.forbidden`: `status_of`
    (AgentError, 422),
    (StoreUnavailable, 503),
)


def status_of(exc: RelayqError) -> int:
    """The status an error answers with; 500 for one no client could have caused."""
    if isinstance(exc, GrantRefused) and exc.forbidden:
        return 403
    return next((status for kind, status in _STATUS if isinstance(exc, kind)), 500)


def headers_of(exc: RelayqError) -> dict[str, str] | None:
    """What the answer says beside its status: when to try again, for a store outage."""
    if isinstance(exc, StoreUnavailable):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return None


def http_error(exc: RelayqError) -> HTTPException:
    return HTTPException(status_of(exc), str(exc), headers=headers_of(exc))


async def refused(request: Request, exc: Exception) -> JSONResponse:
    """The app's handler for every RelayqError a route lets through."""
    assert isinstance(exc, RelayqError)
    return JSONResponse({"detail": str(exc)}, status_code=status_of(exc), headers=headers_of(exc))


class FieldError(BaseModel):
    """One part of a request that does not validate (the input it quoted left out)."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class Refusal(BaseModel):
    """The body of every 4xx and 503: a sentence saying what was wrong, or for a
    request that does not validate, one entry per field."""

    detail: str | list[FieldError]


_MEANS = {
    400: "The body is not JSON in UTF-8.",
    401: "No API token, or one that is not known (a token in the URL is refused too).",
    403: "The token's role may not do this, or its holder is in none of the request's groups.",
    404: "No such run, request, batch or agent.",
    409: "The state it names has moved on: answered, decided, cancelled or taken already.",
    413: "The body is over the size limit.",
    422: "The request does not validate, or holds what the store cannot keep.",
    503: "The store is unreachable for now; Retry-After says when to try again.",
}


_REFUSAL = {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}}


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that may refuse with these statuses: JSON
    whatever the route's own media type (an event stream's 401 is JSON too)."""
    return {status: {"description": _MEANS[status], "content": _REFUSAL} for status in statuses}


def document_refusals(openapi: dict[str, Any]) -> dict[str, Any]:
    """Add the schemas `refusals` names to an OpenAPI document's components."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    refusal = Refusal.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(refusal.pop("$defs"))
    schemas["Refusal"] = refusal
    return openapi
