"""Requests with a time to live: once it passes, the sweeper expires them and the run moves on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from relayq import Request, ResumeError, RunResult
from relayq.relay import answer_output
from store import sweep
from tasks import DurableClient
from tasks.broker.publish import publish

from .conftest import Durable, Eventually


async def _halt_until_expired(client: DurableClient, agent: str, prompt: str) -> RunResult:
    halted = await client.run(agent, prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    expires_at = halted.pending.expires_at
    assert expires_at is not None, "the agent's request_ttl sets the expiry"
    # Waiting out the time to live is the behaviour under test, not synchronisation.
    await asyncio.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()) + 0.02)
    return halted


def _pending(res: RunResult) -> Request:
    assert res.pending is not None
    return res.pending


async def test_an_expired_request_refuses_answers_and_the_sweeper_gives_its_call_an_error(
    durable: Durable, client: DurableClient, prompt: str, eventually: Eventually
):
    # Given a run halted on a request whose time to live has passed
    halted = await _halt_until_expired(client, "expiring", prompt)
    req = _pending(halted)
    assert halted.run_id is not None
    run_id = halted.run_id

    # Then an answer is refused, even before the sweeper has run
    with pytest.raises(ResumeError, match="expired"):
        await client.submit_answer(answer_output(req.id, "too late"))

    # When the sweeper runs on the worker
    client.app.send_task("relayq.sweep", queue="relayq.maintenance")

    # Then the run goes on with an error result for the call, and finishes
    async def moved_on() -> bool:
        return (await client.result(run_id)).status != "pending"

    await eventually(moved_on, what="the sweeper to expire the request")
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error
    (call,) = res.tool_calls
    assert call.is_error
    assert "expired" in call.output
    assert durable.count("model", prompt) == 2
    (stored,) = await client.requests(status=None, run_id=run_id)
    assert stored.status == "expired"
    with pytest.raises(ResumeError):
        await client.submit_answer(answer_output(req.id, "much too late"))


async def test_an_expired_request_of_an_agent_that_cancels_on_expiry_cancels_the_run(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a run of an agent with on_expiry="cancel", halted past its request's expiry
    halted = await _halt_until_expired(client, "expiring-cancel", prompt)
    assert halted.run_id is not None

    # When a sweep runs
    report = sweep(client.db)
    publish(client.app, client.db, report.outbox)

    # Then the run is cancelled, and never calls its model again
    res = await client.result(halted.run_id, wait=True, timeout=30)
    assert res.status == "cancelled"
    (stored,) = await client.requests(status=None, run_id=halted.run_id)
    assert stored.status == "expired"
    with pytest.raises(ResumeError):
        await client.submit_answer(answer_output(_pending(halted).id, "too late"))
    assert durable.count("model", prompt) == 1
