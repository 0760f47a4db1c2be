"""What the app holds for its routes: the one host client, made by the app's lifespan."""

from __future__ import annotations

from fastapi import Request

from tasks import DurableClient

__all__ = ["client_of"]


def client_of(request: Request) -> DurableClient:
    """The app's `DurableClient`: its store, its store calls (`client.store`), its sends."""
    client: DurableClient = request.app.state.client
    return client
