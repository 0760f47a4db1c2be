"""Runs in one conversation: a later run sees the earlier ones; one run at a time."""

from __future__ import annotations

import uuid

import pytest

from relayq import ResumeError
from tasks import DurableClient

from .conftest import Durable


async def test_a_run_in_a_conversation_sees_the_messages_of_the_runs_before_it(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a finished run in a conversation
    cid = f"conv-{uuid.uuid4().hex}"
    first, second = f"{prompt} (first)", f"{prompt} (second)"
    earlier = await client.run("recall", first, conversation_id=cid, timeout=30)
    assert earlier.status == "done", earlier.error
    assert earlier.text == first

    # When another run asks in the same conversation
    res = await client.run("recall", second, conversation_id=cid, timeout=30)

    # Then the model is given both user messages, and the run keeps its own id
    assert res.status == "done", res.error
    assert res.text == f"{first} | {second}"
    assert res.run_id != earlier.run_id
    assert durable.count("model", first) == 1
    assert durable.count("model", second) == 1


async def test_a_run_cannot_start_in_a_conversation_whose_run_is_pending(
    client: DurableClient, prompt: str
):
    # Given a conversation whose run waits on the host
    cid = f"conv-{uuid.uuid4().hex}"
    halted = await client.run("lookup", prompt, conversation_id=cid, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.run_id is not None

    # When another run is started in it
    with pytest.raises(ResumeError, match="still pending"):
        await client.start("recall", f"{prompt} (again)", conversation_id=cid)

    # Then the waiting run is untouched
    res = await client.result(halted.run_id)
    assert res.status == "pending"
    assert res.pending == halted.pending
    await client.cancel(halted.run_id)
