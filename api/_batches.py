"""Batches over HTTP: start one, see where it stands, cancel it, export its results.

    POST /api/batches                {agent, jobs: [{id, prompt}], batchId?, name?, restartChanged?}
    GET  /api/batches                ?agent=&limit=&before=   newest first
    GET  /api/batches/{id}           counts, open requests, tokens, rate, ETA
    POST /api/batches/{id}/cancel
    GET  /api/batches/{id}/results   JSON lines in the input's order

Starting is idempotent per job: posting the same batch again starts only its
jobs that have no run (409 naming the jobs whose prompt changed, unless
`restartChanged`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api._auth import Reader, Submitter
from api._errors import refusals
from api._limits import Keepable
from api._state import client_of
from relayq import Budget
from relayq.agents import get_agent
from relayq.wire import CamelModel
from store import result_of

__all__ = ["MAX_JOBS", "NewBatch", "router"]

MAX_JOBS = 10_000
"""Jobs one request may start; more go in further posts of the same batch id."""

router = APIRouter(prefix="/api", tags=["api"], responses=refusals(401, 403, 422, 503))


class NewJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Keepable = Field(min_length=1, max_length=200)
    prompt: str = Field(min_length=1)


class NewBatch(CamelModel):
    model_config = ConfigDict(extra="forbid")

    agent: Keepable = Field(min_length=1)
    jobs: list[NewJob] = Field(min_length=1, max_length=MAX_JOBS)
    batch_id: Keepable | None = Field(default=None, min_length=1, max_length=200)
    """Post more jobs to it, or post it again after a failure: no job starts twice."""
    name: Keepable | None = Field(default=None, min_length=1, max_length=200)
    """What a new batch is known by (`relayq batch` finds a batch by its name)."""
    restart_changed: bool = False
    budget: Budget | None = None
    """What all the batch's runs together may spend (a later post's replaces it)."""
    run_budget: Budget | None = None
    """What each run may spend."""

    @model_validator(mode="after")
    def _unique(self) -> NewBatch:
        ids = [job.id for job in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("each job id may appear once")
        return self


@router.post("/batches", status_code=201, responses=refusals(400, 403, 404, 409, 413))
async def start(body: NewBatch, request: Request, who: Submitter) -> dict[str, Any]:
    """Start the batch's jobs that have no run yet; returns every job's run."""
    started = await client_of(request).start_batch(
        get_agent(body.agent),
        [(job.id, job.prompt) for job in body.jobs],
        batch_id=body.batch_id,
        name=body.name,
        started_by=who.name,
        restart_changed=body.restart_changed,
        budget=body.budget,
        run_budget=body.run_budget,
    )
    return {"id": started.batch_id, "runs": started.runs, "started": started.started}


@router.get("/batches", responses=refusals(404))
async def batches(
    request: Request,
    who: Reader,
    agent: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: str | None = None,
) -> dict[str, Any]:
    """Batches, newest first; `before`: the last id of the page before."""
    client = client_of(request)
    found = await client.store.list_batches(agent=agent, limit=limit, before=before)
    now = datetime.now(UTC)
    return {"items": [b.to_wire(now) for b in found]}


@router.get("/batches/{batch_id}", responses=refusals(404))
async def status(batch_id: str, request: Request, who: Reader) -> dict[str, Any]:
    client = client_of(request)
    found = await client.store.batch_status(batch_id)
    return found.to_wire(datetime.now(UTC))


@router.post("/batches/{batch_id}/cancel", responses=refusals(403, 404))
async def cancel(batch_id: str, request: Request, who: Submitter) -> dict[str, Any]:
    """Cancel every unfinished run; `cancelled` counts them by the status they were in."""
    client = client_of(request)
    asked = await client.cancel_batch(batch_id)
    return {"id": batch_id, "cancelled": dict(asked)}


_LINES = {
    "description": "One JSON line per job, in the input's order.",
    "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
}


@router.get(
    "/batches/{batch_id}/results", response_class=Response, responses={200: _LINES, **refusals(404)}
)
async def results(batch_id: str, request: Request, who: Reader) -> Response:
    """One JSON line per job, in the input's order: {id, run_id, status, text, error}."""
    client = client_of(request)
    rows = await client.store.batch_results(batch_id)
    lines = (json.dumps(result_of(r), ensure_ascii=False) for r in rows)
    return Response("".join(f"{line}\n" for line in lines), media_type="application/x-ndjson")
