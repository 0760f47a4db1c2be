"""Eager mode: `DurableClient(eager=True)` runs each turn in the test's own process, with the
workers' code, against the same store; no broker, no worker, the same results."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import kombu
import pytest

import tasks.broker.publish
import tasks.runner.housekeeping
import tasks.runner.runtime
from relayq import Agent, Answer, InProcessRequest, InProcessResponse, Request, RunResult
from relayq.relay import RelayResult, is_relay_request, relay_answer, relay_calls_of
from tasks import DurableClient, Settings
from tests.durable.agents import count, overloaded_model, prompt_of
from tests.ports import free_port

from .conftest import Durable

NO_BROKER = f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture
def eager_settings(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings for an eager client on the session's database, with no broker reachable."""
    monkeypatch.setenv("RELAYQ_TEST_LOG", str(tmp_path / "log"))
    return Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_BROKER_URL": NO_BROKER,
            "RELAYQ_RETRY_BASE": "0.01",
            "RELAYQ_MODEL_RETRIES": "2",
        }
    )


@pytest.fixture
async def eager(eager_settings: Settings) -> AsyncIterator[DurableClient]:
    client = DurableClient(eager=True, settings=eager_settings)
    yield client
    client.close()


def answer_for(request: Request) -> Answer:
    """What the host answers, the same for both clients."""
    if is_relay_request(request):
        calls = relay_calls_of(request)
        return relay_answer(
            request.id, [RelayResult(id=c.id, output=f"{c.name}-answered") for c in calls]
        )
    return Answer(id=request.id, ok=True, data={"by": "ann"})


async def run_through(client: DurableClient, agent: str, prompt: str) -> RunResult:
    res = await client.run(agent, prompt, timeout=30)
    while res.status == "pending":
        assert res.pending is not None
        res = await client.run_with_answer(res.pending, answer_for(res.pending), timeout=30)
    return res


def summary(res: RunResult) -> dict[str, Any]:
    return {
        "status": res.status,
        "text": res.text,
        "tool_calls": [(c.id, c.name, c.arguments, c.output, c.is_error) for c in res.tool_calls],
        "turns": res.turns,
        "error": res.error,
    }


# -- the same results as on a worker --------------------------------------------------------------


@pytest.mark.parametrize("agent", ["two-step", "lookup", "approvals", "seed-three", "seed-decline"])
async def test_an_agent_gives_the_same_result_eagerly_as_on_a_worker(
    durable: Durable, client: DurableClient, agent: str, prompt: str
):
    # Given a run of the agent on the session's worker, every request answered
    on_worker = await run_through(client, agent, prompt)

    # When the same agent runs on the same prompt eagerly, on the same store
    eager = DurableClient(eager=True, settings=durable.settings, broker_url=NO_BROKER)
    try:
        in_process = await run_through(eager, agent, prompt)
    finally:
        eager.close()

    # Then the results are the same, but for the run's id
    assert on_worker.status in ("done", "failed")
    assert summary(in_process) == summary(on_worker)
    assert in_process.run_id != on_worker.run_id


@pytest.mark.parametrize("agent", ["flaky", "overloaded", "refusing"])
async def test_model_errors_end_a_run_the_same_way_eagerly_as_on_a_worker(
    durable: Durable, client: DurableClient, agent: str
):
    on_worker = await client.run(agent, f"worker {uuid.uuid4().hex}", timeout=30)

    eager = DurableClient(eager=True, settings=durable.settings, broker_url=NO_BROKER)
    try:
        in_process = await eager.run(agent, f"eager {uuid.uuid4().hex}", timeout=30)
    finally:
        eager.close()

    assert summary(in_process) == summary(on_worker)


# -- no broker, no worker -------------------------------------------------------------------------


async def test_an_eager_client_builds_no_celery_app_and_opens_no_broker_connection(
    eager_settings: Settings, monkeypatch: pytest.MonkeyPatch, prompt: str
):
    # Given no broker at the configured URL, and anything that would reach one made to fail
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("eager mode reached for the broker")

    monkeypatch.setattr(kombu.Connection, "__init__", refuse)
    monkeypatch.setattr(tasks.broker.publish, "sender_app", refuse)
    monkeypatch.setattr(tasks.runner.housekeeping, "QueuePeek", refuse)
    monkeypatch.setattr(tasks.runner.runtime.Runtime, "sender", property(refuse))

    # When a run goes through a relay request and its answer
    client = DurableClient(eager=True, settings=eager_settings)
    try:
        res = await run_through(client, "lookup", prompt)

        # Then it is done, and the client has no app to send with
        assert (res.status, res.text) == ("done", "lookup-answered")
        with pytest.raises(RuntimeError, match="eager"):
            client.app  # noqa: B018
    finally:
        client.close()


def test_an_eager_client_takes_no_celery_app(eager_settings: Settings):
    from celery import Celery

    with pytest.raises(ValueError, match="no Celery app"):
        DurableClient(eager=True, settings=eager_settings, app=Celery(set_as_current=False))


# -- the verbs ------------------------------------------------------------------------------------


async def test_start_returns_once_the_run_has_settled(eager: DurableClient, prompt: str):
    run_id = await eager.start("two-step", prompt)

    # No waiting: the turns ran inside `start`
    res = await eager.result(run_id)
    assert (res.status, res.text, res.turns) == ("done", "stepped", 2)


async def test_submit_answer_applies_the_answer_and_runs_the_run_on(
    eager: DurableClient, prompt: str
):
    # Given a run waiting on a relay request
    run_id = await eager.start("lookup", prompt)
    [stored] = await eager.requests("open", run_id=run_id)
    request = stored.request

    # When the host answers it
    answered = await eager.submit_answer(answer_for(request), answered_by="ann")

    # Then the run has gone on to its end by the time submit_answer returns
    assert answered == run_id
    res = await eager.result(run_id)
    assert (res.status, res.text) == ("done", "lookup-answered")
    assert await eager.requests("open", run_id=run_id) == []


async def test_partial_answers_keep_the_run_pending_until_every_call_has_a_result(
    eager: DurableClient, prompt: str
):
    halted = await eager.run("seed-three", prompt)
    assert halted.pending is not None
    first, *rest = relay_calls_of(halted.pending)
    req_id = halted.pending.id

    await eager.submit_answer(
        relay_answer(req_id, [RelayResult(id=first.id, output="a")]), partial=True
    )
    assert (await eager.result(halted.run_id or "")).status == "pending"

    await eager.submit_answer(
        relay_answer(req_id, [RelayResult(id=c.id, output="b") for c in rest])
    )
    res = await eager.result(halted.run_id or "")
    assert (res.status, res.text) == ("done", "a,b,b")


async def test_wait_for_answers_each_request_as_it_comes(eager_settings: Settings, prompt: str):
    client = DurableClient(eager=True, settings=eager_settings, wait_for=answer_for)
    try:
        res = await client.run("approvals", prompt)
    finally:
        client.close()

    assert (res.status, res.text) == ("done", "deployed, approved by ann")


async def test_a_pending_run_is_cancelled_at_once(eager: DurableClient, prompt: str):
    halted = await eager.run("lookup", prompt)
    assert halted.run_id is not None

    assert await eager.cancel(halted.run_id) == "cancelled"
    assert (await eager.result(halted.run_id)).status == "cancelled"


async def test_a_conversation_goes_on_eagerly(eager: DurableClient):
    first = await eager.run("recall", "one", conversation_id=None)
    assert first.run_id is not None

    second = await eager.run("recall", "two", conversation_id=first.run_id)

    assert second.text == "one | two"


async def test_an_unregistered_agent_object_runs_eagerly(eager: DurableClient, prompt: str):
    agent = Agent(
        f"unlisted-{uuid.uuid4().hex[:6]}",
        lambda req: InProcessResponse(content="hi"),
        register=False,
    )

    res = await eager.run(agent, prompt)

    assert (res.status, res.text) == ("done", "hi")


async def test_start_many_runs_every_run_of_the_batch(eager: DurableClient):
    ids = await eager.start_many("two-step", ["a", "b", "c"])

    results = [await eager.result(i) for i in ids]
    assert [(r.status, r.text) for r in results] == [("done", "stepped")] * 3


# -- retries and time limits, inline --------------------------------------------------------------


async def test_a_rate_limited_model_is_retried_inline_after_its_backoff(
    eager: DurableClient, prompt: str
):
    # Given a model rate limited twice, asking for 0.05 s each time
    started = time.monotonic()

    res = await eager.run("flaky", prompt)

    # Then it is retried after each wait, here, and the run ends with its answer
    assert (res.status, res.text, res.error) == ("done", "finally", None)
    assert count("model", prompt) == 3
    assert time.monotonic() - started >= 0.1


async def test_a_model_that_stays_overloaded_fails_once_the_workers_retries_are_spent(
    eager: DurableClient, prompt: str
):
    res = await eager.run("overloaded", prompt)

    assert res.status == "failed"
    assert res.error is not None
    assert "gave up after 3 tries" in res.error
    assert count("model", prompt) == 3


async def test_an_agents_own_retries_replace_the_workers(eager: DurableClient, prompt: str):
    # Given an agent that takes no retries, on a worker that takes two
    impatient = Agent(
        f"impatient-{uuid.uuid4().hex[:6]}", overloaded_model, retries=0, register=False
    )

    res = await eager.run(impatient, prompt)

    assert res.status == "failed"
    assert res.error is not None
    assert "gave up after 1 tries" in res.error
    assert count("model", prompt) == 1


async def slow_model(req: InProcessRequest) -> InProcessResponse:
    await asyncio.sleep(2)
    return InProcessResponse(content=prompt_of(req))


async def test_an_agents_own_turn_time_limit_stops_a_slow_turn(eager: DurableClient, prompt: str):
    hasty = Agent(
        f"hasty-{uuid.uuid4().hex[:6]}",
        slow_model,
        turn_time_limit=timedelta(milliseconds=100),
        retries=1,
        register=False,
    )
    started = time.monotonic()

    res = await eager.run(hasty, prompt)

    assert res.status == "failed"
    assert res.error == "gave up after 2 tries: the turn ran out of time"
    assert time.monotonic() - started < 1.5


async def test_a_turn_time_limit_not_below_the_workers_fails_the_run_saying_why(
    eager: DurableClient, prompt: str
):
    limit = eager.settings.turns.time_limit
    slow = Agent(f"slow-{uuid.uuid4().hex[:6]}", slow_model, turn_time_limit=limit, register=False)

    res = await eager.run(slow, prompt)

    assert res.status == "failed"
    assert res.error is not None
    assert "must stay below" in res.error
