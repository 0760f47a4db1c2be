"""A run halted on a relay tool that its agent no longer declares fails clearly on resume."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest

from relayq import Agent
from relayq.relay import answer_output
from store import accept_answer, apply_answer_of, get_run
from store.outbox import mark_published
from tasks import DurableClient
from tasks.runner.runtime import Runtime
from tasks.runner.turn.task import TurnFailed, drive_turn
from tests.durable.agents import lookup_model

from .conftest import Durable


async def _drive_turn(rt: Runtime, run_id: str, version: int) -> object:
    """`drive_turn` as a host would call it, without a task: awaited when it is a coroutine."""
    outcome: object = drive_turn(rt, None, run_id, version)
    return await outcome if inspect.isawaitable(outcome) else outcome


@pytest.fixture
def without_relay_tools(durable: Durable) -> Iterator[Runtime]:
    """A worker's runtime, in this process, whose `lookup` agent has lost its relay tool."""
    rt = Runtime(
        durable.settings, agents={"lookup": Agent("lookup", lookup_model, tools=[], register=False)}
    )
    # It claims turns on the session worker's store: its heartbeat says it lives, or that
    # worker's sweeper may take its claim for a dead worker's (as it did under load).
    rt.heartbeat.start()
    yield rt
    rt.heartbeat.stop()
    rt.db.dispose()


async def test_resuming_a_run_whose_relay_tool_was_removed_fails_it_with_a_clear_error(
    durable: Durable,
    client: DurableClient,
    prompt: str,
    without_relay_tools: Runtime,
):
    # Given a run halted on the worker on a `lookup` relay call, and its answer applied
    halted = await client.run("lookup", prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    assert halted.run_id is not None
    run_id = halted.run_id
    rt = without_relay_tools
    accepted = accept_answer(rt.db, answer_output(halted.pending.id, "found"))
    outbox = apply_answer_of(rt.db, halted.pending.id)
    mark_published(rt.db, [*accepted.outbox, *outbox])  # this test is the worker now
    version = get_run(rt.db, run_id).version

    # When a worker whose agent no longer declares `lookup` takes the turn
    with pytest.raises(TurnFailed) as failed:
        await _drive_turn(rt, run_id, version)

    # Then the run fails with an error naming the missing relay tool, not a crash
    assert failed.value.run_id == run_id
    res = await client.result(run_id)
    assert res.status == "failed"
    assert res.error is not None
    assert "relay tool(s) lookup" in res.error
    assert res.error in str(failed.value)
    assert durable.count("model", prompt) == 1, "the model is not called with a broken toolkit"
