"""What the app holds for its routes: the one host client, made by the app's lifespan, and
whether the server is closing."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import Request

from tasks import DurableClient

__all__ = ["Closing", "client_of", "closing"]


class Closing:
    """Whether the server is asked to stop, set from a signal handler (`api.server`), hence
    thread-safe. Setting it answers the hosts' waiting lease requests at once
    (`DurableClient.stop_lease_waits`), rather than each at its next look."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()
        client: DurableClient | None = getattr(self._state, "client", None)
        if client is not None:
            client.stop_lease_waits()

    def is_set(self) -> bool:
        return self._event.is_set()


def client_of(request: Request) -> DurableClient:
    """The app's `DurableClient`: its store, its store calls (`client.store`), its sends."""
    client: DurableClient = request.app.state.client
    return client


def closing(request: Request) -> bool:
    """Whether the server has been asked to stop (`api.server`): a long poll answers now,
    as it would at the end of its wait, rather than being cut off when the grace ends."""
    return request.app.state.closing.is_set()
