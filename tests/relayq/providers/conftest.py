"""One provider server for the whole folder, emptied before and after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import pytest

from relayq.providers import ProviderClient, Style, create_client
from tests.provider_server import API_KEY, ProviderServer, Reply, error

from .wire import url_of


def unscripted(dialect: str, body: dict[str, Any]) -> Reply:
    # Not retryable, so a test that scripted too few replies fails at once and says why.
    return error(418, "the test scripted no reply for this request")


@pytest.fixture(scope="package")
def shared_server() -> Iterator[ProviderServer]:
    with ProviderServer(unscripted) as server:
        yield server


@pytest.fixture(autouse=True)
def direct_to_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport honours proxy variables; the local server must be reached directly."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def server(shared_server: ProviderServer) -> Iterator[ProviderServer]:
    shared_server.script.clear()
    shared_server.seen.clear()
    yield shared_server
    shared_server.script.clear()
    shared_server.seen.clear()


class Closable(Protocol):
    async def aclose(self) -> None: ...


@pytest.fixture
async def close_later() -> AsyncIterator[Callable[[Any], Any]]:
    """Register a client or model whose connection pool must close with the test's loop."""
    made: list[Closable] = []

    def register(thing: Any) -> Any:
        made.append(thing)
        return thing

    yield register
    for thing in made:
        await thing.aclose()


@pytest.fixture
def connect(
    server: ProviderServer, close_later: Callable[[Any], Any]
) -> Callable[..., ProviderClient]:
    """`connect(style, **options)`: a client on the local server, model "m", the right key."""

    def make(style: Style, **options: Any) -> ProviderClient:
        options.setdefault("api_key", API_KEY)
        client: ProviderClient = close_later(
            create_client(url_of(server, style), style, "m", **options)
        )
        return client

    return make
