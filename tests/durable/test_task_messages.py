"""What goes over the broker: ids and a turn number, never the prompt."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tasks import DurableClient

from .conftest import Durable


@pytest.fixture
def unconsumed(durable: Durable) -> Iterator[tuple[DurableClient, str]]:
    """A client on a fresh key prefix that no worker consumes, and that prefix."""
    prefix = durable.broker.new_prefix()
    client = DurableClient(settings=replace(durable.settings, key_prefix=prefix))
    yield client, prefix
    client.close()


async def test_a_turn_message_carries_the_run_id_and_version_and_never_the_prompt(
    durable: Durable, prompt: str, unconsumed: tuple[DurableClient, str]
):
    # Given a client whose messages stay in Redis for the test to read
    client, prefix = unconsumed
    secret = f"{prompt}: the customer's card is 4242 4242 4242 4242"

    # When it starts a run
    run_id = await client.start("lookup", secret)

    # Then the message names the run by id and version, and the prompt is nowhere in it
    conn = durable.broker.client()
    raw = conn.lrange(prefix + "relayq.turns", 0, -1)
    conn.close()
    assert len(raw) == 1
    assert secret.encode() not in raw[0]
    message = json.loads(raw[0])
    body = base64.b64decode(message["body"])
    assert secret.encode() not in body
    args, kwargs, _ = json.loads(body)
    assert args == [run_id, 0]
    assert kwargs == {}
    headers = message["headers"]
    assert headers["task"] == "relayq.run_turn"
    assert run_id in headers["argsrepr"]
    assert "agent=lookup" in headers["argsrepr"]
    assert prompt not in headers["argsrepr"]
    assert headers["kwargsrepr"] == "{}"
    await client.cancel(run_id)
