"""A batch's budget in the store.

A batch run's claim reads whether its batch has a budget, in the claim's own statement:
a batch without one costs its turns no read of the batch, and a batch given one (a
rerun's) stops its runs at their next call. A batch asks a person once: a run past its
budget while the answer to the batch's request is on its way waits on that request, and
runs waiting on a request whose own run ended go back to look again."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from relayq import Agent, Budget, InProcessResponse, InProcessToolCall, Usage
from relayq.approvals import approve
from relayq.budgets import BUDGET_KIND, Spent
from store import (
    Database,
    RunSpec,
    accept_answer,
    apply_answer_of,
    cancel_run,
    get_run,
    start_batch,
)
from store.budgets import budget_gate
from store.models import RequestRow
from store.turns import claim_turn
from tasks.runner.turn.task import drive_turn

from .driver import local_kit, model_of, runtime, statements

SPENT = Usage(prompt_tokens=60, completion_tokens=40, total_tokens=100)
LEASE = timedelta(seconds=60)


def work(call_id: str) -> InProcessResponse:
    """A reply calling the local tool, spending 100 tokens."""
    call = InProcessToolCall(id=call_id, name="work", arguments={})
    return InProcessResponse(tool_calls=[call], usage=SPENT)


async def _agent(*replies: InProcessResponse) -> Agent:
    kit = await local_kit()
    return Agent("agent", model_of(*replies), tools=kit.tools, register=False)


def _batch(db: Database, budget: Budget | None = None) -> str:
    started = start_batch(
        db,
        RunSpec("agent", batch_id="batch_1"),
        [("job-1", "go")],
        batch_budget=None if budget is None else budget.to_wire(),
    )
    return started.runs["job-1"]


def _reads_of_batches(seen: list[str]) -> list[str]:
    return [
        s
        for s in seen
        if s.lstrip().upper().startswith("SELECT") and "relayq_batches" in s.split("WHERE")[0]
    ]


def test_the_claim_says_whether_the_batch_has_a_budget(db: Database):
    without = _batch(db)
    claim = claim_turn(db, without, get_run(db, without).version, task_id="t1", lease=LEASE)
    assert claim is not None
    assert claim.batch_id == "batch_1"
    assert claim.batch_budgeted is False

    with_budget = start_batch(
        db,
        RunSpec("agent", batch_id="batch_2"),
        [("job-1", "go")],
        batch_budget=Budget(tokens=1000).to_wire(),
    ).runs["job-1"]
    claim = claim_turn(db, with_budget, get_run(db, with_budget).version, task_id="t2", lease=LEASE)
    assert claim is not None
    assert claim.batch_budgeted is True


async def test_a_turn_of_a_batch_without_a_budget_reads_nothing_of_its_batch(db: Database):
    run_id = _batch(db)
    agent = await _agent(work("c1"), InProcessResponse(content="done", usage=SPENT))
    rt = runtime(db, agent)
    with statements(db) as seen:
        outcome = await drive_turn(rt, None, run_id, get_run(db, run_id).version)
    assert outcome.summary == "next"
    assert _reads_of_batches(seen) == [], "the claim's statement says there is no budget"


async def test_a_budget_given_to_the_batch_later_stops_its_run_at_the_next_call(db: Database):
    run_id = _batch(db)
    agent = await _agent(work("c1"), work("c2"), InProcessResponse(content="done", usage=SPENT))
    rt = runtime(db, agent)
    await drive_turn(rt, None, run_id, get_run(db, run_id).version)
    # A rerun gives the batch a budget smaller than the next call (its spending counts from
    # then on).
    _batch(db, Budget(tokens=50, on_exceed="end"))

    outcome = await drive_turn(rt, None, run_id, get_run(db, run_id).version)
    run = get_run(db, run_id)
    assert run.status == "over_budget", outcome.summary
    assert run.total_tokens == 100, "the call past the batch's budget was not made"


def _running_batch(db: Database, jobs: int) -> list[str]:
    """A batch of `jobs` runs with a budget of 100 tokens, each run claimed by a turn."""
    started = start_batch(
        db,
        RunSpec("agent", batch_id="batch_1"),
        [(f"job-{n}", "go") for n in range(jobs)],
        batch_budget=Budget(tokens=100).to_wire(),
    )
    for n, run_id in enumerate(started.runs.values()):
        claim_turn(db, run_id, get_run(db, run_id).version, task_id=f"t{n}", lease=LEASE)
    return list(started.runs.values())


def _past_the_budget(db: Database, run_id: str) -> tuple[str, str]:
    """The gate's verdict, and the request its run waits on, for a call of 200 tokens."""
    gate = budget_gate(
        db, run_id, get_run(db, run_id).version, default=None, next_call=Spent(tokens=200)
    )
    return gate.verdict, get_run(db, run_id).waiting_on or ""


def _budget_requests(db: Database) -> list[str]:
    with db.read() as s:
        return list(s.exec(select(RequestRow.id).where(RequestRow.kind == BUDGET_KIND)).all())


def test_a_run_past_the_batchs_budget_while_its_answer_is_on_the_way_waits_on_it(db: Database):
    first, second = _running_batch(db, 2)
    assert _past_the_budget(db, first)[0] == "asked"
    [asked] = _budget_requests(db)

    # The approval is accepted; the task that applies it has not run yet
    accept_answer(db, approve(asked))
    verdict, waits_on = _past_the_budget(db, second)

    assert (verdict, waits_on) == ("waiting", asked), "not a second request for the batch"
    assert _budget_requests(db) == [asked]
    queued = apply_answer_of(db, asked)
    assert sorted(str(row.run_id) for row in queued) == sorted([first, second])
    assert {get_run(db, r).status for r in (first, second)} == {"queued"}


def test_runs_waiting_on_a_decided_request_whose_run_was_cancelled_look_again(db: Database):
    first, second, third = _running_batch(db, 3)
    assert _past_the_budget(db, first)[0] == "asked"
    [asked] = _budget_requests(db)
    assert _past_the_budget(db, second) == ("waiting", asked)
    accept_answer(db, approve(asked))
    assert _past_the_budget(db, third) == ("waiting", asked)

    # The run that asked is cancelled before its answer is applied
    cancel_run(db, first)
    queued = apply_answer_of(db, asked)

    assert sorted(str(row.run_id) for row in queued) == sorted([second, third]), "none stranded"
    assert get_run(db, second).status == "queued"
    assert get_run(db, third).status == "queued"
