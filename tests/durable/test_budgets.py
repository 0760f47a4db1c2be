"""Budgets: a run (or a batch) about to spend past its budget asks a person, through a
`budget` request decided like an approval; a decline ends it `over_budget`.

Eager clients run the workers' turn code in the test's process against the session's
store (SQLite and PostgreSQL); the worker tests at the end go through Celery."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from typer.testing import CliRunner

from cli.main import app as cli_app
from relayq import (
    Agent,
    AnswerMismatch,
    Budget,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    NotAnApprover,
    RunResult,
    Usage,
    define_tool,
    pricing,
)
from relayq.approvals import approve, decline, edit
from relayq.budgets import BUDGET_KIND
from store import Database
from store.audit import Decider
from store.models import BatchRow, OutboxRow, RunRow
from tasks import DurableClient, Settings
from tests.durable.test_eager import NO_BROKER
from tests.provider_server import API_KEY, ProviderServer, Reply, openai_calls, openai_text

from .conftest import ApiServer, Durable, Eventually, Worker, serve_api
from .desk import DESK_TOKENS, GIL, SUE, VAL, inbox_session
from .test_api import open_request

ONE_LANE = True  # tests/conftest.py: the priced worker, once per database

CALL = Usage(prompt_tokens=800, completion_tokens=200, total_tokens=1000)
"""What each model call of these agents spends."""


def stepping(steps: int):
    """A model that calls `step` until it has seen `steps` results, then answers; every
    call spends `CALL`."""

    def generate(request: InProcessRequest) -> InProcessResponse:
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        if done >= steps:
            return InProcessResponse(content=f"finished after {done} steps", usage=CALL)
        return InProcessResponse(
            tool_calls=[InProcessToolCall(id=f"c{done}", name="step", arguments={})], usage=CALL
        )

    return generate


STEP = define_tool(
    "step", "Take one step", {"type": "object", "properties": {}}, lambda args, ctx: "ok"
)

STEPPER = Agent("budget-stepper", stepping(5), tools=[STEP], max_turns=20)
"""Six calls, 6,000 tokens, when no budget stops it."""
GUARDED = Agent(
    "budget-guarded",
    stepping(5),
    tools=[STEP],
    max_turns=20,
    budget=Budget(tokens=2500, approvers=["finance"]),
)
ENDING = Agent(
    "budget-ending",
    stepping(5),
    tools=[STEP],
    max_turns=20,
    budget=Budget(tokens=2500, on_exceed="end"),
)

ANN = Decider(name="ann", groups=("finance",))
SAM = Decider(name="sam", groups=("support",))


@pytest.fixture
def eager_settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_BROKER_URL": NO_BROKER,
        }
    )


@pytest.fixture
async def eager(eager_settings: Settings) -> AsyncIterator[DurableClient]:
    client = DurableClient(eager=True, settings=eager_settings)
    yield client
    client.close()


@pytest.fixture
def priced() -> Iterator[None]:
    """A cent per thousand prompt tokens, two per thousand completion tokens."""
    pricing.set_cost_function(
        lambda agent, usage: (usage.prompt_tokens * 0.01 + usage.completion_tokens * 0.02) / 1000
    )
    yield
    pricing.set_cost_function(pricing.provider_prices)


def _run(db: Database, run_id: str) -> RunRow:
    with db.read() as s:
        run = s.get(RunRow, run_id)
        assert run is not None
        return run


def _prompt() -> str:
    return f"walk {uuid.uuid4().hex[:8]}"


# -- a run's own budget -------------------------------------------------------------------------


async def test_a_run_about_to_pass_its_budget_asks_and_goes_on_once_allowed(eager: DurableClient):
    # Given a run allowed 2,500 tokens, each call spending 1,000
    halted = await eager.run(GUARDED, _prompt())

    # Then it stops before its third call (2,000 spent, the next about 1,000): one budget request
    assert halted.status == "pending", halted.error
    request = halted.pending
    assert request is not None
    assert request.kind == BUDGET_KIND
    assert request.data["scope"] == "run"
    assert request.data["spent"] == {"tokens": 2000, "cost": 0.0}
    assert request.data["nextCall"]["tokens"] == 1000
    assert request.data["arguments"] == {"tokens": 5000}  # approving allows as much again
    assert "2,000 tokens spent" in request.prompt
    assert "2,500 tokens" in request.prompt
    assert halted.usage.total_tokens == 2000
    assert _run(eager.db, halted.run_id or "").status == "pending"

    # When a finance approver approves it
    await eager.submit_answer(approve(request.id), decider=ANN)

    # Then the run goes on under 5,000 tokens, and stops again before its sixth call
    again = await eager.result(halted.run_id or "", wait=True, timeout=30)
    assert again.status == "pending"
    assert again.pending is not None
    assert again.pending.kind == BUDGET_KIND
    assert again.pending.id != request.id
    assert again.usage.total_tokens == 5000
    assert _run(eager.db, halted.run_id or "").budget == {
        "tokens": 5000,
        "onExceed": "ask",
        "approvers": ["finance"],
    }

    # When the approver edits the limit to 6,000 instead, the run finishes within it
    await eager.submit_answer(edit(again.pending.id, {"tokens": 6000}), decider=ANN)
    done = await eager.result(halted.run_id or "", wait=True, timeout=30)
    assert done.status == "done", done.error
    assert done.text == "finished after 5 steps"
    assert done.usage.total_tokens == 6000


async def test_a_declined_budget_ends_the_run_over_budget_saying_who_and_why(eager: DurableClient):
    halted = await eager.run(GUARDED, _prompt())
    assert halted.pending is not None

    await eager.submit_answer(decline(halted.pending.id, "enough for today"), decider=ANN)

    ended = await eager.result(halted.run_id or "", wait=True, timeout=30)
    assert ended.status == "over_budget"
    assert ended.error == "over its budget: raising it was declined by ann: enough for today"
    assert ended.usage.total_tokens == 2000  # the third call was never made


async def test_only_the_budgets_approvers_may_allow_more_and_an_edit_must_leave_room(
    eager: DurableClient,
):
    halted = await eager.run(GUARDED, _prompt())
    assert halted.pending is not None
    rid = halted.pending.id

    with pytest.raises(NotAnApprover):
        await eager.submit_answer(approve(rid), decider=SAM)
    # A limit below what is spent and the next call's guess is refused, naming the field
    with pytest.raises(AnswerMismatch, match="tokens"):
        await eager.submit_answer(edit(rid, {"tokens": 2500}), decider=ANN)
    with pytest.raises(AnswerMismatch, match=r"budget's limits.*'cost' was unexpected"):
        await eager.submit_answer(edit(rid, {"tokens": 9000, "cost": 1.0}), decider=ANN)
    # A budget request takes a decision, not free text
    with pytest.raises(AnswerMismatch):
        await eager.submit_answer({"id": rid, "data": {"output": "fine"}}, decider=ANN)

    # Nothing changed: still pending on the same request, at the same budget
    still = await eager.result(halted.run_id or "")
    assert still.status == "pending"
    assert still.pending is not None
    assert still.pending.id == rid
    assert _run(eager.db, halted.run_id or "").budget is None  # the agent's budget applies

    await eager.submit_answer(decline(rid, "test over"), decider=ANN)


async def test_a_run_configured_to_end_at_its_budget_ends_at_once(eager: DurableClient):
    ended = await eager.run(ENDING, _prompt(), timeout=30)

    assert ended.status == "over_budget"
    assert ended.pending is None
    assert ended.error == (
        "over its budget of 2,500 tokens: 2,000 tokens spent, the next call about 1,000 tokens"
    )
    assert await eager.requests("open", run_id=ended.run_id) == []


async def test_a_budget_given_to_the_run_replaces_its_agents(eager: DurableClient):
    # The stepper has no budget; this run gets one, and one that is large enough elsewhere
    halted = await eager.run(STEPPER, _prompt(), budget=Budget(tokens=1500))
    roomy = await eager.run(GUARDED, _prompt(), budget=Budget(tokens=10_000))

    assert halted.status == "pending"
    assert halted.pending is not None
    assert halted.usage.total_tokens == 1000
    assert roomy.status == "done"
    assert roomy.usage.total_tokens == 6000
    await eager.submit_answer(decline(halted.pending.id, "test over"))


async def test_costs_come_from_the_prices_and_a_cost_budget_asks_too(
    eager: DurableClient, priced: None
):
    # Each call costs 0.8 * 0.01 + 0.2 * 0.02 = 0.012; the run may spend 0.03
    halted = await eager.run(STEPPER, _prompt(), budget=Budget(cost=0.03))

    assert halted.status == "pending"
    assert halted.pending is not None
    assert halted.pending.data["spent"]["cost"] == pytest.approx(0.024)
    assert halted.pending.data["arguments"] == {"cost": 0.06}
    assert _run(eager.db, halted.run_id or "").cost == pytest.approx(0.024)

    # Approved up to 0.06: five calls (0.06) and the sixth would pass it; approved again, done
    await eager.submit_answer(approve(halted.pending.id))
    again = await eager.result(halted.run_id or "", wait=True, timeout=30)
    assert again.pending is not None
    assert again.pending.data["spent"]["cost"] == pytest.approx(0.06)
    await eager.submit_answer(approve(again.pending.id))
    done = await eager.result(halted.run_id or "", wait=True, timeout=30)
    assert done.status == "done"
    assert _run(eager.db, halted.run_id or "").cost == pytest.approx(0.072)


# -- a batch's budget ---------------------------------------------------------------------------


def _batch(db: Database, batch_id: str) -> BatchRow:
    with db.read() as s:
        batch = s.get(BatchRow, batch_id)
        assert batch is not None
        return batch


async def _settled(client: DurableClient, run_ids: list[str]) -> list[RunResult]:
    return [await client.result(r, wait=True, timeout=60) for r in run_ids]


async def _batch_of_three(client: DurableClient, budget: Budget) -> tuple[str, list[str]]:
    jobs = [(f"j{n}", _prompt()) for n in range(3)]
    started = await client.start_batch(STEPPER, jobs, budget=budget)
    return started.batch_id, [started.runs[job] for job, _ in jobs]


async def test_a_batch_past_its_budget_asks_once_for_all_its_runs_and_a_decline_ends_them(
    eager: DurableClient,
):
    # Given a batch of three jobs that together may spend 4,500 tokens (each would take 6,000)
    batch_id, runs = await _batch_of_three(eager, Budget(tokens=4500))
    results = await _settled(eager, runs)

    # Then the batch spent what its runs spent, and every run waits on one budget request
    assert [r.status for r in results] == ["pending"] * 3
    asked = {r.pending.id for r in results if r.pending is not None}
    assert len(asked) == 1
    open_budget = await eager.requests("open", kind=BUDGET_KIND, search=batch_id)
    assert [stored.request.id for stored in open_budget] == list(asked)
    request = open_budget[0].request
    assert request.data["scope"] == "batch"
    assert request.data["batch"] == batch_id
    assert "Allow batch " + batch_id in request.prompt
    batch = _batch(eager.db, batch_id)
    assert batch.spent_tokens == sum(r.usage.total_tokens for r in results) == 4000

    # When it is declined, the batch is over budget and every run ends over budget
    await eager.submit_answer(decline(request.id, "the batch costs too much"), decider=ANN)
    ended = await _settled(eager, runs)
    assert _batch(eager.db, batch_id).over_budget
    assert [r.status for r in ended] == ["over_budget"] * 3
    assert {r.error for r in ended} == {
        "over its batch's budget: raising it was declined by ann: the batch costs too much"
    }


async def test_an_approved_batch_budget_lets_every_waiting_run_go_on(eager: DurableClient):
    batch_id, runs = await _batch_of_three(eager, Budget(tokens=4500))
    first = (await _settled(eager, runs))[0].pending
    assert first is not None

    # Approving allows as much again (9,000): the runs go on and ask again at 9,000
    await eager.submit_answer(approve(first.id))
    again = await _settled(eager, runs)
    second = {r.pending.id for r in again if r.pending is not None}
    assert [r.status for r in again] == ["pending"] * 3
    assert len(second) == 1
    assert first.id not in second
    assert _batch(eager.db, batch_id).spent_tokens == 9000

    # An edit allows 20,000: every job finishes
    await eager.submit_answer(edit(second.pop(), {"tokens": 20_000}))
    done = await _settled(eager, runs)
    assert [r.status for r in done] == ["done"] * 3
    batch = _batch(eager.db, batch_id)
    assert batch.spent_tokens == 18_000
    assert batch.budget == {"tokens": 20_000, "onExceed": "ask", "approvers": []}


async def test_when_the_run_asking_for_its_batch_is_cancelled_the_others_go_back_to_look_again(
    eager: DurableClient,
):
    batch_id, runs = await _batch_of_three(eager, Budget(tokens=4500))
    await _settled(eager, runs)
    (asking,) = await eager.requests("open", kind=BUDGET_KIND, search=batch_id)

    # When the run that asked is cancelled, its request closes with it
    assert await eager.cancel(asking.run_id) == "cancelled"

    # Then the runs that waited on it are queued again, their turns in the outbox for the
    # sweeper to send; none is left waiting on a closed request
    others = [r for r in runs if r != asking.run_id]
    for run_id in others:
        run = _run(eager.db, run_id)
        assert (run.status, run.waiting_on) == ("queued", None)
    with eager.db.read() as s:
        waiting = s.exec(
            select(OutboxRow).where(
                col(OutboxRow.run_id).in_(others), col(OutboxRow.published_at).is_(None)
            )
        ).all()
    assert sorted(str(row.run_id) for row in waiting) == sorted(others)
    for run_id in others:
        await eager.cancel(run_id)


# -- through Celery: a worker, the provider's prices, the API, the inbox and the CLI -----------


def _walk(dialect: str, body: dict[str, Any]) -> Reply:
    """Three `step` calls, then an answer; each call spends 800 + 200 tokens."""
    steps = sum(1 for m in body["messages"] if m.get("role") == "tool")
    reply = (
        openai_text(f"walked {steps} steps", model="budget-model")
        if steps >= 3
        else openai_calls((f"s{steps}", "step", {}), model="budget-model")
    )
    assert isinstance(reply.body, dict)
    reply.body["usage"] = {"prompt_tokens": 800, "completion_tokens": 200, "total_tokens": 1000}
    return reply


@pytest.fixture(scope="module")
def priced_worker(durable: Durable, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Durable]:
    """A worker of its own serving the `priced` agent against a local provider."""
    with ProviderServer(_walk) as server:
        env = {
            **durable.env,
            "RELAYQ_KEY_PREFIX": durable.broker.new_prefix(),
            "RELAYQ_AGENTS": "tests.durable.budget_agents",
            "RELAYQ_TEST_BUDGET_URL": server.openai_url,
            "RELAYQ_TEST_BUDGET_KEY": API_KEY,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        worker = Worker(env, tmp_path_factory.mktemp("priced") / "worker.log").start()
        try:
            yield Durable(env, Settings.from_env(env), durable.log, worker, durable.broker)
        finally:
            worker.stop()


@pytest.fixture(scope="module")
def api(priced_worker: Durable) -> Iterator[ApiServer]:
    yield from serve_api(priced_worker, DESK_TOKENS)


async def test_a_workers_run_prices_its_calls_and_asks_through_the_inbox_api_and_cli(
    priced_worker: Durable, api: ApiServer, eventually: Eventually
):
    # Given a run of `priced` (0.012 a call, 0.03 allowed) started through the API
    async with api.http(SUE) as http:
        res = await http.post("/api/runs", json={"agent": "priced", "prompt": _prompt()})
    assert res.status_code == 201, res.text
    run_id = res.json()["id"]

    # Then it stops before its third call with a budget request, listed like any other
    stored = await open_request(api, run_id, eventually, token=VAL)
    request = stored["request"]
    assert request["kind"] == "budget"
    assert request["data"]["spent"] == {"tokens": 2000, "cost": pytest.approx(0.024)}
    assert request["data"]["arguments"] == {"cost": 0.06}
    assert stored["approvers"] == ["finance"]
    async with api.http(VAL) as http:
        listed = (
            await http.get("/api/requests", params={"kind": "budget", "run_id": run_id})
        ).json()
        summary = next(r for r in (await http.get("/api/runs")).json() if r["id"] == run_id)
    assert [item["request"]["id"] for item in listed["items"]] == [request["id"]]
    assert summary["status"] == "pending"
    assert summary["cost"] == pytest.approx(0.024)
    assert summary["totalTokens"] == 2000

    # The CLI lists it with the others
    runner = CliRunner()
    args = ["pending", "--kind", "budget", "--json"]
    shown = await asyncio.to_thread(
        runner.invoke, cli_app, args, env=priced_worker.env, catch_exceptions=False
    )
    assert shown.exit_code == 0, shown.output
    assert request["id"] in {item["request"]["id"] for item in json.loads(shown.stdout)["items"]}

    # The inbox's page shows what was spent and the limits a finance approver may set
    async with inbox_session(api, GIL) as (http, _):
        page = await http.get(f"/requests/{request['id']}")
    assert page.status_code == 200, page.text
    assert "Allow run " + run_id in unescape(page.text)
    assert 'name="arg:cost" value="0.06"' in page.text

    # When a finance approver allows up to 1.0 instead, through the API
    async with api.http(GIL) as http:
        decided = await http.post(
            f"/api/requests/{request['id']}/decision",
            json={"decision": "edit", "arguments": {"cost": 1.0}},
        )
    assert decided.status_code == 200, decided.text

    # Then the run finishes: four calls, their cost from the provider's prices
    async with DurableClient(settings=priced_worker.settings) as client:
        done = await client.result(run_id, wait=True, timeout=60)
        row = _run(client.db, run_id)
    assert done.status == "done", done.error
    assert done.text == "walked 3 steps"
    assert row.cost == pytest.approx(0.048)
    assert row.budget == {"cost": 1.0, "onExceed": "ask", "approvers": ["finance"]}


async def test_a_bad_budget_is_refused_by_the_api_and_starts_nothing(
    priced_worker: Durable, api: ApiServer
):
    prompt = _prompt()
    async with api.http(SUE) as http:
        for budget in ({"tokens": 0}, {"cost": 1, "spend": "all"}, {}, {"onExceed": "shrug"}):
            body = {"agent": "priced", "prompt": prompt, "budget": budget}
            res = await http.post("/api/runs", json=body)
            assert res.status_code == 422, res.text
        runs = (await http.get("/api/runs", params={"agent": "priced", "limit": 1000})).json()
        good = {"agent": "priced", "prompt": prompt, "budget": {"tokens": 500, "onExceed": "end"}}
        started = await http.post("/api/runs", json=good)
    assert started.status_code == 201, started.text
    assert started.json()["id"] not in {r["id"] for r in runs}
    async with DurableClient(settings=priced_worker.settings) as client:
        ended = await client.result(started.json()["id"], wait=True, timeout=60)
    # The first call (1,000 tokens) is never stopped; the second would pass 500
    assert ended.status == "over_budget"
    assert ended.usage.total_tokens == 1000


async def test_the_cli_allows_more_with_an_edit_for_a_finance_approver(
    priced_worker: Durable, api: ApiServer, eventually: Eventually
):
    async with DurableClient(settings=priced_worker.settings) as client:
        run_id = await client.start("priced", _prompt())
        halted = await client.result(run_id, wait=True, timeout=60)
        assert halted.pending is not None
        assert halted.pending.kind == BUDGET_KIND
        rid = halted.pending.id

        def answer(*args: str) -> Any:
            command = ["answer", rid, *args, "--as", "fin", "--group", "finance"]
            return CliRunner().invoke(cli_app, command, env=priced_worker.env)

        # An edit that leaves no room for the next call is one line, and changes nothing
        refused = await asyncio.to_thread(answer, "--edit", "cost=0.03")
        assert refused.exit_code == 1
        assert "do not fit the budget's limits" in refused.stderr
        allowed = await asyncio.to_thread(answer, "--edit", "cost=0.05")
        assert allowed.exit_code == 0, allowed.output

        done = await client.result(run_id, wait=True, timeout=60)
        assert done.status == "done", done.error
        assert _run(client.db, run_id).budget == {
            "cost": 0.05, "onExceed": "ask", "approvers": ["finance"]
        }  # fmt: skip
