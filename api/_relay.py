"""Hosts lease relay calls over HTTP, run them, and give their results.

    POST /api/relay/leases                     {"tools": ["shell"], "max": 10, "wait": 30,
                                                "leaseSeconds": 60}  -> {"leases": [...]}
    POST /api/relay/leases/{leaseId}/heartbeat                          -> {"expiresAt"}
    POST /api/relay/leases/{leaseId}/result    {"output": "...", "isError": false}
    POST /api/relay/leases/{leaseId}/release

Only a `host` token may, and only for the tools its entry names (`api._auth`): any other
tool is a 403. A lease asked for with nothing to offer is held open up to `wait` seconds
and answered as soon as a call arrives. A result, heartbeat or release on a lease that
no longer holds its call (expired, released, superseded, or its request answered,
expired or cancelled meanwhile) is a 409 and changes nothing; an unknown lease, a 404.
The rules are the store's: `store.leases`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import ConfigDict

from api._auth import Host, Principal, forbidden_tools
from api._errors import refusals
from api._limits import Keepable
from api._state import client_of, closing
from relayq.leases import MAX_WAIT, Expiry, LeaseAsk, LeasePage, LeaseResult
from relayq.wire import CamelModel
from store.audit import Decider
from tasks.observability.metrics import hosts_waiting

__all__ = ["MAX_WAIT", "ResultBody", "router"]

router = APIRouter(
    prefix="/api/relay", tags=["relay hosts"], responses=refusals(401, 403, 422, 503)
)

LeaseId = Annotated[str, Path(max_length=100, pattern=r"^lease_[0-9a-f]{32}$")]


class ResultBody(LeaseResult):
    """The leased call's result, its output one the store can keep."""

    output: Keepable


class Recorded(CamelModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str


def _host(who: Principal) -> Decider:
    return Decider(name=who.name, role=who.role, via="api")


NONE = b'{"leases":[]}'
"""Most answers to an idle host: no call to offer."""


@router.post("/leases", response_model=LeasePage, responses=refusals(400))
async def lease_calls(body: LeaseAsk, request: Request, who: Host) -> Response:
    """Lease up to `max` relay calls of these tools, each to this host alone until its
    `expiresAt`; with none to offer, wait up to `wait` seconds for one."""
    forbidden_tools(who, body.tools)

    async def gone() -> bool:
        """Stop waiting: the caller left, or the server is stopping."""
        return closing(request) or await request.is_disconnected()

    with hosts_waiting():
        leases = await client_of(request).lease_calls(
            body.tools,
            holder=who.name,
            limit=body.max,
            wait=body.wait,
            lease=timedelta(seconds=body.lease_seconds),
            gone=gone,
        )
    # Sent as it is, not checked again against the model: a thousand idle hosts ask
    # fifty times a second, and FastAPI's check of what `LeasePage` just built costs more
    # than the rest of the answer.
    if not leases:
        return Response(NONE, media_type="application/json")
    page = LeasePage(leases=leases)
    return Response(page.model_dump_json(by_alias=True), media_type="application/json")


@router.post("/leases/{lease_id}/heartbeat", responses=refusals(404, 409))
async def heartbeat(lease_id: LeaseId, request: Request, who: Host) -> Expiry:
    """Extend the lease by its length."""
    until = await client_of(request).heartbeat_lease(lease_id, holder=who.name, tools=who.tools)
    return Expiry(expires_at=until)


@router.post("/leases/{lease_id}/result", responses=refusals(400, 404, 409, 413))
async def result(lease_id: LeaseId, body: ResultBody, request: Request, who: Host) -> Recorded:
    """Record the call's result; the run goes on once every call of its request has one."""
    run_id = await client_of(request).lease_result(
        lease_id, output=body.output, is_error=body.is_error, host=_host(who), tools=who.tools
    )
    return Recorded(run_id=run_id)


@router.post("/leases/{lease_id}/release", status_code=204, responses=refusals(404, 409))
async def release(lease_id: LeaseId, request: Request, who: Host) -> None:
    """Hand the call back at once: it is offered again."""
    await client_of(request).release_lease(lease_id, holder=who.name, tools=who.tools)
