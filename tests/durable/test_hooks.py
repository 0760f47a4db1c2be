"""Hooks (`tasks.hooks`) seeing real runs: the turn, the answer and the cancel emit what
happened, on an eager host (on the session's stores) and on a worker. The hooks on their own
(order, failures, names, checks): tests/tasks/test_hooks.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relayq import Answer
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from tasks import DurableClient, Settings
from tasks.hooks import TurnOutcome
from tests.durable import hook_agents
from tests.durable.hook_agents import Broken, Recorder, hooked_agent
from tests.waiting import until

from .conftest import SpareWorkers


@pytest.fixture
async def eager(database_url: str, tmp_path: Path) -> AsyncIterator[DurableClient]:
    settings = Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_HOOKS": "tests.durable.hook_agents:tokens_per_tenant",
        }
    )
    client = DurableClient(eager=True, settings=settings)
    yield client
    client.close()


def confirmed(request: Any) -> Answer:
    return relay_answer(
        request.id, [RelayResult(id=c.id, output="yes") for c in relay_calls_of(request)]
    )


async def test_an_agent_s_hooks_see_its_turns_model_calls_tools_and_settling(eager):
    seen: list[tuple[str, str, Any]] = []
    tenant = f"acme{uuid.uuid4().hex[:6]}"
    agent = hooked_agent(f"{tenant}.support", hooks=[Recorder("agent", seen)], register=False)
    before = dict(hook_agents.tokens_per_tenant.tokens)

    first = await eager.run(agent, "stamp then confirm", timeout=30)
    assert first.status == "pending"
    assert first.pending is not None
    done = await eager.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
    assert done.status == "done"

    methods = [method for _, method, _ in seen]
    assert methods == [
        # turn 1: the local tool ran, the next turn is queued
        "before_turn", "before_model_call", "after_model_call", "after_tool", "after_turn",
        # turn 2: the relay call suspends the run
        "before_turn", "before_model_call", "after_model_call", "after_turn",
        "after_run_settled",
        # turn 3, after the answer: done
        "before_turn", "before_model_call", "after_model_call", "after_turn",
        "after_run_settled",
    ]  # fmt: skip
    ended = [e for _, m, e in seen if m == "after_turn"]
    assert [e.outcome for e in ended] == [TurnOutcome.NEXT, TurnOutcome.PENDING, TurnOutcome.DONE]
    assert [e.turn for e in ended] == [1, 2, 3]
    assert ended[1].request_id == first.pending.id
    settled = [e for _, m, e in seen if m == "after_run_settled"]
    assert [e.status for e in settled] == ["pending", "done"]
    assert {e.run_id for e in settled} == {first.run_id}
    calls = [e for _, m, e in seen if m == "after_model_call"]
    assert {(c.result, c.provider, c.usage.prompt_tokens) for c in calls} == {
        ("ok", "in-process", 10)
    }
    tool = next(e for _, m, e in seen if m == "after_tool")
    assert (tool.call_id, tool.is_error) == ("s1", False)
    # RELAYQ_HOOKS' hook saw the same calls: the docs' tokens-per-tenant example.
    assert hook_agents.tokens_per_tenant.tokens[tenant] - before.get(tenant, 0) == 3 * 13


async def test_a_failing_hook_fails_no_run(eager):
    agent = hooked_agent("broken-hooks", hooks=[Broken()], register=False)
    first = await eager.run(agent, "stamp then confirm", timeout=30)
    assert first.pending is not None
    done = await eager.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
    assert (done.status, done.text) == ("done", "confirmed")


async def test_a_worker_s_hooks_named_in_its_settings_see_its_turns(
    spare_workers: SpareWorkers, tmp_path: Path
):
    log = tmp_path / "hooklog"
    spare = spare_workers.start(
        RELAYQ_AGENTS="tests.durable.hook_agents",
        RELAYQ_HOOKS="tests.durable.hook_agents:FileHook",
        RELAYQ_TEST_LOG=str(log),
    )
    client = DurableClient(settings=spare.settings)
    try:
        first = await client.run("hooked", "stamp then confirm", timeout=30)
        assert first.pending is not None
        done = await client.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
        assert done.status == "done"
    finally:
        client.close()

    def lines() -> list[dict[str, Any]]:
        path = log / "hooks.log"
        found = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, found) if e["run"] == first.run_id]

    # The last event is written after the run's result is stored.
    until(lambda: any(e.get("status") == "done" for e in lines()), what="the run to settle")
    kinds = [e["kind"] for e in lines()]
    # A turn's end is told after its next turn's message went: that turn may start first.
    assert sorted(kinds) == sorted(
        ["before_turn"] * 3 + ["after_model_call"] * 3 + ["after_turn"] * 3
        + ["after_tool", "after_request_opened"] + ["after_run_settled"] * 2
    )  # fmt: skip
    ended = sorted((e["turn"], e["outcome"]) for e in lines() if e["kind"] == "after_turn")
    assert ended == [(1, "next"), (2, "pending"), (3, "done")]
    assert [e["status"] for e in lines() if e["kind"] == "after_run_settled"] == [
        "pending", "done",
    ]  # fmt: skip
    assert [e["turn"] for e in lines() if e["kind"] == "before_turn"] == [1, 2, 3]
    assert kinds.index("after_tool") < kinds.index("after_request_opened")
    assert [e["tokens"] for e in lines() if e["kind"] == "after_model_call"] == [13, 13, 13]
    opened = next(e for e in lines() if e["kind"] == "after_request_opened")
    assert opened["request_kind"] == "tool_call"


async def test_a_cancel_by_the_client_settles_the_run_for_its_hooks_once(eager):
    # Given a run waiting on its relay call, its agent's hooks and the client's watching
    seen: list[tuple[str, str, Any]] = []
    agent = hooked_agent("cancelled-hooks", hooks=[Recorder("agent", seen)], register=False)
    eager.hooks.add(Recorder("client", seen))
    first = await eager.run(agent, "stamp then confirm", timeout=30)
    assert first.status == "pending"
    seen.clear()

    # When the client cancels it, and then cancels it again
    assert await eager.cancel(first.run_id) == "cancelled"
    assert await eager.cancel(first.run_id) == "cancelled"

    # Then both heard the run settle, cancelled, once: as every other end of a run
    settled = [(who, e.run_id, e.agent, e.status) for who, m, e in seen]
    assert settled == [
        ("agent", first.run_id, "cancelled-hooks", "cancelled"),
        ("client", first.run_id, "cancelled-hooks", "cancelled"),
    ]


async def test_a_batch_cancelled_by_the_client_settles_each_run_it_ended_for_its_hooks_once(eager):
    # Given a batch of three runs, each waiting on its relay call, and hooks watching
    seen: list[tuple[str, str, Any]] = []
    name = "cancelled-batch-hooks"
    agent = hooked_agent(name, hooks=[Recorder("agent", seen)], register=False)
    eager.hooks.add(Recorder("client", seen))
    jobs = [(f"job-{n}", "stamp then confirm") for n in range(3)]
    started = await eager.start_batch(agent, jobs)
    for run_id in started.runs.values():
        assert (await eager.result(run_id, wait=True, timeout=30)).status == "pending"
    seen.clear()

    # When the client cancels the batch, and then cancels it again
    asked = await eager.cancel_batch(started.batch_id)
    again = await eager.cancel_batch(started.batch_id)

    # Then the first ended all three, the second none, and the hooks heard each run
    # settle, cancelled, once: as every other end of a run
    assert dict(asked) == {"pending": 3}
    assert dict(again) == {}
    settled = sorted((who, e.run_id, e.agent, e.status) for who, m, e in seen)
    assert settled == sorted(
        (who, run_id, name, "cancelled")
        for run_id in started.runs.values()
        for who in ("agent", "client")
    )
