"""Probes for a supervisor: `GET /healthz` (the process is up) and `GET /readyz` (it can
serve: the store and the broker answer). Neither takes a token, and neither says more
than which part failed and the error's type.

    GET /healthz -> 200 {"status": "ok"}
    GET /readyz  -> 200 {"status": "ready", "store": "ok", "broker": "ok"}
                    503 {"status": "unready", "store": "ok", "broker": "ConnectionError"}
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from tasks import DurableClient
from tasks.observability.gauges import BrokerView, store_answers

__all__ = ["PROBE_TIMEOUT", "router"]

PROBE_TIMEOUT = 3.0
"""Seconds each part may take to answer before it counts as down."""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    client: DurableClient = app.state.client  # the app's own lifespan made it
    app.state.ready_broker = BrokerView(client.settings, timeout=PROBE_TIMEOUT)
    try:
        yield
    finally:
        app.state.ready_broker.close()


router = APIRouter(tags=["operations"], lifespan=_lifespan)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: answers while the process serves requests; reads nothing."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the store or the broker is down"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the store answers a `SELECT 1` and the broker a `PING`; else 503,
    naming the part that failed."""
    state: Any = request.app.state
    client: DurableClient = state.client
    broker: BrokerView = state.ready_broker
    store, ping = await asyncio.gather(
        _probe(client.store.offload(store_answers, client.db)),
        _probe(asyncio.to_thread(broker.ping)),  # a broker call, not the store's: its own thread
    )
    body = {
        "status": "ready" if store == ping == "ok" else "unready",
        "store": store,
        "broker": ping,
    }
    return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)


async def _probe(check: Awaitable[object]) -> str:
    """ "ok", or the type of what went wrong (never its message: it may hold a URL)."""
    try:
        await asyncio.wait_for(check, PROBE_TIMEOUT)
    except TimeoutError:
        return "timeout"
    except Exception as exc:
        return type(exc).__name__
    return "ok"
