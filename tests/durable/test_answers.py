"""Answers through the durable client: each request is answered once and resumes its run once."""

from __future__ import annotations

import asyncio

import pytest

from relayq import Answer, ResumeError, RunResult
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer
from tasks import DurableClient

from .conftest import Durable


def _run_id(res: RunResult) -> str:
    assert res.run_id is not None
    return res.run_id


async def test_a_second_answer_to_an_answered_request_is_refused_and_the_run_resumes_once(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a run halted on a relay call, and its answer submitted
    halted = await client.run("lookup", prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    req = halted.pending
    await client.submit_answer(answer_output(req.id, "found"))

    # When the same request is answered again
    with pytest.raises(ResumeError, match="already answered"):
        await client.submit_answer(answer_output(req.id, "found again"))

    # Then the run resumed once, with the first answer
    res = await client.result(_run_id(halted), wait=True, timeout=30)
    assert res.status == "done", res.error
    assert res.text == "found"
    assert durable.count("model", prompt) == 2


async def test_of_two_concurrent_answers_exactly_one_is_taken(durable: Durable, prompt: str):
    # Given a run halted on a relay call, and two hosts that both answer it
    one = DurableClient(settings=durable.settings)
    two = DurableClient(settings=durable.settings)
    try:
        halted = await one.run("lookup", prompt, timeout=30)
        assert halted.pending is not None
        req = halted.pending

        # When both answers are submitted at once
        outcomes = await asyncio.gather(
            one.submit_answer(answer_output(req.id, "from one")),
            two.submit_answer(answer_output(req.id, "from two")),
            return_exceptions=True,
        )

        # Then one is taken, the other refused, and the run resumes once with the winner
        taken = [i for i, o in enumerate(outcomes) if isinstance(o, str)]
        refused = [o for o in outcomes if isinstance(o, ResumeError)]
        assert len(taken) == 1, outcomes
        assert len(refused) == 1, outcomes
        res = await one.result(_run_id(halted), wait=True, timeout=30)
        assert res.status == "done", res.error
        assert res.text == ("from one", "from two")[taken[0]]
        assert durable.count("model", prompt) == 2
    finally:
        one.close()
        two.close()


async def test_partial_answers_keep_the_run_pending_until_the_last_result_arrives(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a run halted on three relay calls in one request
    halted = await client.run("seed-three", prompt, timeout=30)
    assert halted.pending is not None
    req = halted.pending
    run_id = _run_id(halted)

    # When the results come one at a time, out of call order
    for call_id, output in (("c3", "gamma-out"), ("c1", "alpha-out")):
        await client.submit_answer(
            relay_answer(req.id, [RelayResult(id=call_id, output=output)]), partial=True
        )
        # Then, while a call has no result, the run waits on the same open request
        waiting = await client.result(run_id)
        assert waiting.status == "pending"
        assert waiting.pending is not None
        assert waiting.pending.id == req.id
        assert [r.status for r in await client.requests(status=None, run_id=run_id)] == ["open"]
        assert durable.count("model", prompt) == 1

    await client.submit_answer(
        relay_answer(req.id, [RelayResult(id="c2", output="beta-out")]), partial=True
    )

    # Then the last result resumes the run, every result in call order
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error
    assert res.text == "alpha-out,beta-out,gamma-out"
    assert [c.output for c in res.tool_calls] == ["alpha-out", "beta-out", "gamma-out"]
    assert durable.count("model", prompt) == 2


async def test_who_answered_a_request_is_stored_with_it(client: DurableClient, prompt: str):
    halted = await client.run("lookup", prompt, timeout=30)
    assert halted.pending is not None
    run_id = _run_id(halted)

    await client.submit_answer(answer_output(halted.pending.id, "found"), answered_by="ops@dana")
    res = await client.result(run_id, wait=True, timeout=30)

    assert res.status == "done", res.error
    (stored,) = await client.requests(status="answered", run_id=run_id)
    assert stored.answered_by == "ops@dana"
    assert stored.answered_at is not None
    assert stored.request.id == halted.pending.id


async def test_an_approved_tool_is_called_again_with_the_answer_on_the_worker(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a tool that asks for approval before it deploys
    halted = await client.run("approvals", prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    assert halted.pending.kind == "approval"
    run_id = _run_id(halted)
    assert durable.count("tool", f"deploy {run_id}") == 0

    # When the host approves it
    approval = Answer(id=halted.pending.id, ok=True, data={"by": "dana"})
    res = await client.run_with_answer(halted.pending, approval, timeout=30)

    # Then the tool runs once, seeing the answer, and the run finishes
    assert res.status == "done", res.error
    assert res.text == "deployed, approved by dana"
    assert durable.count("tool", f"deploy {run_id}") == 1
    assert durable.count("model", prompt) == 2


async def test_a_declined_approval_skips_the_tool_and_the_run_goes_on_with_an_error_result(
    durable: Durable, client: DurableClient, prompt: str
):
    halted = await client.run("approvals", prompt, timeout=30)
    assert halted.pending is not None
    run_id = _run_id(halted)

    res = await client.run_with_answer(
        halted.pending, answer_declined(halted.pending.id, "not on a friday"), timeout=30
    )

    assert res.status == "done", res.error
    assert durable.count("tool", f"deploy {run_id}") == 0
    (call,) = res.tool_calls
    assert call.is_error
    assert "not on a friday" in call.output
    assert res.text == call.output
