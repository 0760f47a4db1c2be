"""`create_app`: the JSON API under `/api` and the approvals inbox at `/`.

    app = create_app()  # reads RELAYQ_* and RELAYQ_API_TOKENS from the environment

| permission | routes |
|---|---|
| none | `GET /` (the login form, without a cookie), `POST /login`, `/static/*`, |
| | `/docs`, `/openapi.json`, `GET /healthz`, `GET /readyz`, `GET /metrics` (a |
| | bearer token when `RELAYQ_METRICS_TOKEN` is set: `api._metrics`) |
| read (any role) | `GET /api/runs`, `GET /api/runs/{id}`, `GET /api/requests`, |
| | `GET /api/requests/{id}`, `GET /api/requests/{id}/decisions`, `GET /api/audit`, |
| | `GET /api/events`, `GET /api/batches`, `GET /api/batches/{id}`, |
| | `GET /api/batches/{id}/results`; the inbox's `GET /`, `GET /history`, `GET /requests/{id}`, |
| | `GET /runs/{id}`, `GET /events`, `POST /logout` |
| answer (`approver`) | `POST /api/requests/{id}/answer`, `POST /api/requests/{id}/decision`, |
| | `POST /api/requests/decisions`; the inbox's `POST /requests/{id}/approve`, |
| | `POST /requests/{id}/edit`, `POST /requests/{id}/decline`, `POST /bulk/preview`, |
| | `POST /bulk` |
| submit (`submitter`) | `POST /api/runs`, `POST /api/runs/{id}/cancel`, `POST /api/batches`, |
| | `POST /api/batches/{id}/cancel` |

`/api/...` takes a bearer token only; the inbox's routes take its cookie only,
and its form posts a CSRF token as well (`api._security`). Every response
carries the security headers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry import TelemetryConfig

from api._access import install as hide_secrets_from_access_log
from api._approvals import router as approvals_router
from api._auth import Tokens
from api._batches import router as batches_router
from api._errors import document_refusals, refused
from api._grants import router as grants_router
from api._health import router as health_router
from api._inbox import router as inbox_router
from api._inbox_forms import router as inbox_forms_router
from api._inbox_grants import router as inbox_grants_router
from api._inbox_lists import router as inbox_lists_router
from api._inbox_pages import router as inbox_pages_router
from api._limits import BodyLimit, body_limit, invalid_body, keepable_url
from api._metrics import router as metrics_router
from api._relay import router as relay_router
from api._routes import router as api_router
from api._security import SecurityHeaders, Signer, secret_from
from api._state import Closing
from relayq import RelayqError
from relayq.agents import load_agents
from tasks import DurableClient, Settings
from tasks.observability.tracing import enabled as tracing_enabled

__all__ = ["create_app"]

log = logging.getLogger("relayq.api")

STATIC = Path(__file__).parent / "static"


def create_app(
    settings: Settings | None = None, *, tokens: str | None = None, secret: str | None = None
) -> FastAPI:
    """The API app; `tokens` is `name:role:token[:group|group],...` (default:
    `RELAYQ_API_TOKENS`), `secret` signs the inbox's form tokens and flash cookies
    (default: `RELAYQ_API_SECRET`, else a random one for this process).

    One DurableClient (the store and the sender app) serves the app's whole life.
    """
    settings = settings or Settings.from_env()
    parsed = Tokens.parse(os.environ.get("RELAYQ_API_TOKENS", "") if tokens is None else tokens)
    signer = Signer(secret_from(os.environ.get("RELAYQ_API_SECRET") if secret is None else secret))
    if not parsed:
        log.warning("no API tokens configured (RELAYQ_API_TOKENS): every request will get 401")
    # The host validates agent names, so it must know the agents the workers run.
    load_agents(settings.agents)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hide_secrets_from_access_log()  # uvicorn has set its logging up by now
        app.state.client = DurableClient(settings=settings)
        try:
            yield
        finally:
            app.state.client.close()

    app = FastAPI(
        title="relayq",
        summary="Durable runs of LLM agents, and the requests they wait on.",
        lifespan=lifespan,
        dependencies=[Depends(keepable_url)],
        telemetry=_telemetry(),
    )
    app.state.tokens = parsed
    app.state.signer = signer
    app.state.event_streams = 0
    app.state.closing = Closing(app.state)
    # A body larger than any answer the store takes is refused before it is read.
    app.add_middleware(BodyLimit, max_bytes=body_limit(settings.max_answer_bytes))
    # Added last, so outermost: its headers go on the 413s above too.
    app.add_middleware(SecurityHeaders, docs_paths=_docs_paths(app))
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(RelayqError, refused)
    # First: the routes are matched in order, and the hosts' long polls are most requests.
    app.include_router(relay_router)
    app.include_router(api_router)
    app.include_router(approvals_router)
    app.include_router(grants_router)
    app.include_router(batches_router)
    app.include_router(inbox_router)
    app.include_router(inbox_lists_router)
    app.include_router(inbox_pages_router)
    app.include_router(inbox_forms_router)
    app.include_router(inbox_grants_router)
    app.include_router(health_router)
    app.include_router(metrics_router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _document_refusals(app)
    return app


def _telemetry() -> TelemetryConfig:
    """FastAPI's own OpenTelemetry spans and metrics of each request, with relayq's traces
    (`RELAYQ_OTEL`, `tasks.observability.tracing`): off unless asked for, as those are.
    Left on, it asks OpenTelemetry at every request whether it was set up since (a
    tenth of what a relay host's idle long poll costs the API)."""
    on = tracing_enabled()
    return {"tracing": on, "metrics": on, "logs": on}


def _document_refusals(app: FastAPI) -> None:
    """The refusals' body schema goes into the document the routes' `responses` point to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_refusals(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _docs_paths(app: FastAPI) -> tuple[str, ...]:
    """The Swagger UI and ReDoc pages: the only ones that run inline script (FastAPI's)."""
    paths = (app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
    return tuple(p for p in paths if p)
