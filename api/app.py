"""`create_app`: the JSON API under `/api` and the approvals inbox at `/`.

    app = create_app()  # reads RELAYQ_* and RELAYQ_API_TOKENS from the environment

| permission | routes |
|---|---|
| none | `GET /` (the login form, without a cookie), `POST /login`, `/docs`, `/openapi.json` |
| read (any role) | `GET /` (the inbox), `GET /api/runs`, `GET /api/runs/{id}`, |
| | `GET /api/requests`, `GET /api/requests/{id}`, `GET /api/events`, `POST /logout` |
| answer (`approver`) | `POST /api/requests/{id}/answer`, |
| | `POST /requests/{id}/approve`, `POST /requests/{id}/decline` |
| submit (`submitter`) | `POST /api/runs`, `POST /api/runs/{id}/cancel` |
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from api._access import install as hide_secrets_from_access_log
from api._auth import Tokens
from api._errors import refused
from api._inbox import router as inbox_router
from api._limits import BodyLimit, body_limit, invalid_body
from api._routes import router as api_router
from relayq import RelayqError
from relayq.agents import load_agents
from tasks import DurableClient, Settings

__all__ = ["create_app"]

log = logging.getLogger("relayq.api")


def create_app(settings: Settings | None = None, *, tokens: str | None = None) -> FastAPI:
    """The API app; `tokens` is `name:role:token,...` (default: `RELAYQ_API_TOKENS`).

    One DurableClient (the store and the sender app) serves the app's whole life.
    """
    settings = settings or Settings.from_env()
    parsed = Tokens.parse(os.environ.get("RELAYQ_API_TOKENS", "") if tokens is None else tokens)
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
    )
    app.state.tokens = parsed
    app.state.event_streams = 0
    # A body larger than any answer the store takes is refused before it is read.
    app.add_middleware(BodyLimit, max_bytes=body_limit(settings.max_answer_bytes))
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(RelayqError, refused)
    app.include_router(api_router)
    app.include_router(inbox_router)
    return app
