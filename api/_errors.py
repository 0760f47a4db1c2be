"""HTTP status codes from relayq's error types alone: no second look at the store.

A second look could race (another answer winning meanwhile) and costs a query;
the store's refusal already says what happened.
"""

from __future__ import annotations

import math

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from relayq import (
    AgentError,
    AlreadyVoted,
    AnswerTooLarge,
    BulkRefused,
    CallAnswered,
    ConversationBusy,
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
from store.paging import BadQuery

__all__ = ["http_error", "refused", "status_of"]

# Most specific first: the first type an error is an instance of decides.
_STATUS: tuple[tuple[type[RelayqError], int], ...] = (
    (UnknownRequest, 404),
    (UnknownRun, 404),
    (UnknownBatch, 404),
    (JobChanged, 409),
    (JobExists, 409),
    (UnknownAgent, 404),
    (NotAnApprover, 403),
    (NotAnApproval, 409),
    (RequestClosed, 409),
    (AlreadyVoted, 409),
    (BulkRefused, 409),
    (CallAnswered, 409),
    (ConversationBusy, 409),
    (AnswerTooLarge, 413),
    (InputTooLarge, 413),
    (ResumeError, 422),
    (UnstorableInput, 422),
    (BadQuery, 422),
    (AgentError, 422),
    (StoreUnavailable, 503),
)


def status_of(exc: RelayqError) -> int:
    """The status an error answers with; 500 for one no client could have caused."""
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
