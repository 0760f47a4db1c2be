"""`GET /metrics`: Prometheus's text format, of the store and the broker as they are
now (`tasks.observability.gauges`) and of this process (`tasks.observability.metrics`,
prometheus_client's default registry: the Python process's own series among them).

Without `RELAYQ_METRICS_TOKEN` it takes no token, as scrapers expect: serve the
API where only the scraper reaches `/metrics`, or set the variable, and the
scraper sends `Authorization: Bearer <token>` (Prometheus: `authorization:
{credentials: ...}`). The series hold names and counts: agents, statuses,
queues, providers; never a prompt, an answer or a key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import REGISTRY
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from api._auth import refuse_tokens_in_url, unauthorized
from api._errors import refusals
from api._state import client_of
from relayq.agents import registered_agents
from relayq.ratelimit import ProviderLimits
from tasks import DurableClient
from tasks.observability.gauges import BrokerView, StoreGauges
from tasks.settings import QUEUES

__all__ = ["METRICS_TOKEN_ENV", "router"]

METRICS_TOKEN_ENV = "RELAYQ_METRICS_TOKEN"


def _queues() -> list[str]:
    """relayq's queues, and those of the agents this process knows (`StoreGauges` adds the
    active batches' queues, as the store names them)."""
    return [*QUEUES, *sorted({a.queue for a in registered_agents().values()} - set(QUEUES))]


def _providers() -> list[ProviderLimits]:
    """The providers of the agents this process knows, whose circuits `/metrics` shows."""
    agents = registered_agents().values()
    return [ProviderLimits.of(a.provider.config) for a in agents if a.provider is not None]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    client: DurableClient = app.state.client  # the app's own lifespan made it
    broker = BrokerView(client.settings)
    app.state.store_gauges = StoreGauges(
        client.db,
        broker,
        queues=_queues,
        providers=_providers,
        worker_timeout=client.settings.recovery.worker_timeout,
    )
    try:
        yield
    finally:
        broker.close()


router = APIRouter(tags=["operations"], lifespan=_lifespan)


class _Scrape:
    """What one scrape shows: this process's registry, then the store's and broker's."""

    def __init__(self, read: Iterable[Metric]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.read


_SCRAPE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The text format, or OpenMetrics where the scraper asks for it.",
        "content": {
            "text/plain": {"schema": {"type": "string"}},
            "application/openmetrics-text": {"schema": {"type": "string"}},
        },
    },
    **refusals(401),
}


@router.get("/metrics", response_class=Response, responses=_SCRAPE)
async def metrics(request: Request) -> Response:
    """Prometheus metrics; a bearer token only when `RELAYQ_METRICS_TOKEN` is set."""
    _check_token(request)
    gauges: StoreGauges = request.app.state.store_gauges
    # The store and the broker are read on a thread: a slow one never stalls the API.
    read = await client_of(request).store.offload(lambda: list(gauges.collect()))
    # The format the scraper asks for (OpenMetrics, or the text format), as
    # prometheus_client's own server chooses it.
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await asyncio.to_thread(encode, _Scrape(read))
    return Response(body, headers={"Content-Type": content_type})


def _check_token(request: Request) -> None:
    expected = os.environ.get(METRICS_TOKEN_ENV, "")
    if not expected:
        return
    refuse_tokens_in_url(request)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(given), _digest(expected)):
        raise unauthorized()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
