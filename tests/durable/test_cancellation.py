"""Cancelling: a waiting run stops at once, a running one at its next boundary."""

from __future__ import annotations

import pytest

from relayq import ResumeError
from relayq.relay import answer_output
from tasks import DurableClient

from .conftest import Durable, Eventually


async def test_cancelling_a_pending_run_cancels_it_and_its_request_at_once(
    client: DurableClient, prompt: str
):
    # Given a run halted on a relay call
    halted = await client.run("lookup", prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    assert halted.run_id is not None

    # When it is cancelled
    status = await client.cancel(halted.run_id)

    # Then it is cancelled now, with its request, which takes no answer
    assert status == "cancelled"
    res = await client.result(halted.run_id)
    assert res.status == "cancelled"
    assert res.pending is None
    (stored,) = await client.requests(status=None, run_id=halted.run_id)
    assert stored.status == "cancelled"
    with pytest.raises(ResumeError, match="cancelled"):
        await client.submit_answer(answer_output(halted.pending.id, "too late"))


async def test_a_run_cancelled_while_its_tool_runs_stops_before_the_next_model_call(
    durable: Durable, client: DurableClient, prompt: str, eventually: Eventually
):
    # Given a run whose tool is running on the worker
    run_id = await client.start("holding", prompt)
    release = durable.log / f"release-{run_id}"
    try:
        await eventually(
            lambda: durable.count("tool", f"hold {run_id}") == 1, what="the tool to start"
        )

        # When the run is cancelled, and then the tool finishes
        status = await client.cancel(run_id)
        assert status == "running", "a running run stops at its next boundary"
    finally:
        release.touch()

    # Then the run ends cancelled without calling the model again
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "cancelled"
    assert res.text == ""
    assert durable.count("model", prompt) == 1
    assert durable.count("tool", f"hold {run_id}") == 1
    assert durable.count("tool", f"hold {run_id} released") == 1, "the tool was let go"
