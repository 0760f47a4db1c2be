"""`/healthz` and `/readyz`: no token, cheap, and a 503 that names the part that failed."""

from __future__ import annotations

from dataclasses import replace

from store import Database
from tests.ports import free_port

from .conftest import ApiServer, Durable, serving


async def test_the_api_is_alive_and_ready_without_a_token(api: ApiServer):
    async with api.http() as http:
        alive = await http.get("/healthz")
        ready = await http.get("/readyz")

    assert alive.status_code == 200
    assert alive.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "store": "ok", "broker": "ok"}
    assert "content-security-policy" in alive.headers  # the API's security headers too


async def test_a_broker_that_does_not_answer_makes_the_api_unready_naming_it_and_no_secret(
    durable: Durable,
):
    # Given an API whose broker URL, password and all, points where nothing listens
    broker = f"redis://:pa55-w0rd-x@127.0.0.1:{free_port()}/0"
    settings = replace(durable.settings, broker_url=broker)

    with serving(settings) as api:
        async with api.http() as http:
            alive = await http.get("/healthz")
            ready = await http.get("/readyz")

    # Then it is alive, not ready, says the broker failed, and shows nothing of its URL
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.json() == {"status": "unready", "store": "ok", "broker": "ConnectionError"}
    assert "pa55" not in ready.text
    assert str(settings.broker_url.split("@")[1]) not in ready.text


async def test_a_store_that_does_not_answer_makes_the_api_unready_naming_it(durable: Durable):
    with serving(durable.settings) as api:
        client = api.app.state.client
        working = client.db
        # The store goes away under the running API.
        client.db = Database(f"postgresql+psycopg://relayq:pw@127.0.0.1:{free_port()}/gone")
        try:
            async with api.http() as http:
                ready = await http.get("/readyz")
                alive = await http.get("/healthz")
        finally:
            client.db.dispose()
            client.db = working

    assert alive.status_code == 200
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unready"
    assert body["store"] == "StoreUnavailable"
    assert body["broker"] == "ok"
    assert "pw@" not in ready.text
