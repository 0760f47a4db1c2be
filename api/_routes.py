"""The JSON API under `/api`."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict, Field

from api._answers import AnswerBody, answer_request, stored_request
from api._approvals import decider_of
from api._auth import Answerer, Reader, Submitter
from api._errors import refusals
from api._events import event_stream
from api._limits import Keepable
from api._state import client_of
from relayq import Budget, RunResult
from relayq.agents import get_agent
from relayq.wire import CamelModel
from store import BadQuery, RequestPage, RequestQuery, StoredRequest
from store.paging import DEFAULT_PAGE, MAX_PAGE
from store.queries import RunSummary
from store.requests import RequestSort, SortOrder, age_of, read_statuses
from store.transitions import RunStatus

__all__ = ["router"]

RunStatusQuery = RunStatus


class NewRun(CamelModel):
    model_config = ConfigDict(extra="forbid")

    agent: Keepable = Field(min_length=1)
    """A registered agent's name."""
    prompt: str = Field(min_length=1)
    batch_id: Keepable | None = Field(default=None, min_length=1, max_length=200)
    """The batch the run is a job of, if any: shown with its requests in the inbox."""
    job_id: Keepable | None = Field(default=None, min_length=1, max_length=200)
    """The job's id within its batch."""
    budget: Budget | None = None
    """What the run may spend, in place of its agent's budget."""


class Created(BaseModel):
    id: str


class Cancelled(CamelModel):
    id: str
    status: str
    """`cancelled`, a finished status, or `running` until the run's next boundary."""


router = APIRouter(prefix="/api", tags=["api"], responses=refusals(401, 403, 422, 503))


@router.post("/runs", status_code=201, responses=refusals(400, 403, 404, 409, 413))
async def create_run(body: NewRun, request: Request, who: Submitter) -> Created:
    """Start a run of `agent` on `prompt`.

    404: no such agent. 409: its batch already has a run of `jobId`. 413: the
    prompt is over the size limit. 422: it holds what the store cannot keep (a
    NUL character, a lone surrogate).
    """
    # Refusals (UnknownAgent, InputTooLarge, ...) answer by their type: see api._errors.
    client = client_of(request)
    run_id = await client.start(
        get_agent(body.agent),
        body.prompt,
        started_by=who.name,
        batch_id=body.batch_id,
        job_id=body.job_id,
        budget=body.budget,
    )
    return Created(id=run_id)


@router.get("/runs")
async def list_runs(
    request: Request,
    who: Reader,
    status: Annotated[
        RunStatusQuery | Literal[""] | None, Query(description="one status; empty: any")
    ] = None,
    agent: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[RunSummary]:
    """Runs, newest first (an empty filter is no filter, as in every listing)."""
    rows = await client_of(request).runs(status, agent=agent, limit=limit)
    return [RunSummary.of(r) for r in rows]


@router.get("/runs/{run_id}", responses=refusals(404))
async def get_run(run_id: str, request: Request, who: Reader) -> RunResult:
    """The run as stored, with its transcript (`messages`) and the request it waits on."""
    return await client_of(request).result(run_id)


@router.post("/runs/{run_id}/cancel", responses=refusals(403, 404, 409))
async def cancel_run(run_id: str, request: Request, who: Submitter) -> Cancelled:
    """Cancel a run: at once if queued or pending, else at its next boundary."""
    status = await client_of(request).cancel(run_id)
    return Cancelled(id=run_id, status=status)


@router.get("/requests")
async def list_requests(
    request: Request,
    who: Reader,
    status: Annotated[
        list[str] | None,
        Query(
            description="open (the default), answered, expired, cancelled, or all; "
            "repeat it or comma-separate"
        ),
    ] = None,
    agent: str | None = None,
    tool: str | None = None,
    kind: str | None = None,
    group: Annotated[str | None, Query(description="an approver group the request names")] = None,
    run_id: str | None = None,
    q: Annotated[
        str | None,
        Query(max_length=500, description="text in the prompt or the arguments, any case"),
    ] = None,
    created_after: Annotated[datetime | None, Query(description="at or after; with zone")] = None,
    created_before: Annotated[datetime | None, Query(description="before; with zone")] = None,
    older_than: Annotated[
        str | None, Query(max_length=20, description="at least this old: 90s, 15m, 2h, 3d, 1w")
    ] = None,
    newer_than: Annotated[
        str | None, Query(max_length=20, description="at most this old: 90s, 15m, 2h, 3d, 1w")
    ] = None,
    sort: RequestSort = "age",
    order: SortOrder = "asc",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    cursor: Annotated[
        str | None, Query(max_length=2048, description="the nextCursor of the page before")
    ] = None,
) -> RequestPage:
    """A page of requests, oldest first (open ones unless `status` is given: as the CLI
    and the inbox list them; an empty value is no filter), with
    `total`, all that match, and `nextCursor`, the `cursor` of the next page (null on
    the last). 422: an unknown status, sort or order, a time without a zone, or a
    cursor that was edited or made for another sort.
    """
    _known_parameters(request, list_requests)
    try:
        query = RequestQuery(
            status=read_statuses(status),
            agent=agent,
            tool=tool,
            kind=kind,
            group=group,
            run_id=run_id,
            search=q,
            created_after=created_after,
            created_before=created_before,
            sort=sort,
            order=order,
            limit=limit,
            cursor=cursor,
        ).aged(
            age_of(older_than, "older_than") if older_than else None,
            age_of(newer_than, "newer_than") if newer_than else None,
        )
        page = await client_of(request).query_requests(query)
    except BadQuery as exc:  # the caller's query, not the server: 422 with the store's reason
        raise HTTPException(422, str(exc)) from None
    return RequestPage.of(page)


def _known_parameters(request: Request, route: Callable[..., Any]) -> None:
    """422 for a query parameter the route does not take: a misspelt filter (`search=`
    for `q=`) would otherwise be ignored, and list everything."""
    taken = set(inspect.signature(route).parameters) - {"request", "who"}
    unknown = sorted(set(request.query_params) - taken)
    if unknown:
        takes = ", ".join(sorted(taken))
        raise HTTPException(422, f"unknown query parameter {unknown[0]!r}; one of {takes}")


@router.get("/requests/{request_id}", responses=refusals(404))
async def get_request(request_id: str, request: Request, who: Reader) -> StoredRequest:
    return await stored_request(client_of(request), request_id)


@router.post("/requests/{request_id}/answer", responses=refusals(400, 403, 404, 409, 413))
async def answer(
    request_id: str, body: AnswerBody, request: Request, who: Answerer
) -> StoredRequest:
    """Answer a request once; returns it as stored after (still `open` after a partial answer).

    404: no such request. 409: it is answered, expired or cancelled, or a call
    already has a result. 413: the answer is over the size limit. 422: it does
    not fit the request's calls, or holds what the store cannot keep.
    """
    return await answer_request(
        client_of(request),
        body.answer(request_id),
        decider=decider_of(who, "api"),
        partial=body.partial,
    )


@router.get("/events", response_class=EventSourceResponse)
async def events(
    request: Request, who: Reader, run_id: str | None = None
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events: `ready` once, then `run` and `request` whenever one changes."""
    state: Any = request.app.state
    state.event_streams += 1
    try:
        async for event in event_stream(client_of(request), run_id=run_id):
            yield event
    finally:
        state.event_streams -= 1
