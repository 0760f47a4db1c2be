"""What the app holds for its routes: the one host client, made by the app's lifespan, and
whether the server is closing."""

from __future__ import annotations

from fastapi import Request

from tasks import DurableClient

__all__ = ["client_of", "closing"]


def client_of(request: Request) -> DurableClient:
    """The app's `DurableClient`: its store, its store calls (`client.store`), its sends."""
    client: DurableClient = request.app.state.client
    return client


def closing(request: Request) -> bool:
    """Whether the server has been asked to stop (`api.server`): a long poll answers now,
    as it would at the end of its wait, rather than being cut off when the grace ends."""
    return request.app.state.closing.is_set()
