"""The seed's examples 2 and 3 against a worker in another process: only the client differs."""

from __future__ import annotations

from relayq import Request
from relayq.relay import RelayResult, answer_declined, relay_answer, relay_calls_of
from tasks import DurableClient

from .conftest import Durable


async def test_example_2_three_relay_calls_ride_one_stored_request(client: DurableClient):
    halted = await client.run("seed-three", "do all three", timeout=30)
    assert halted.status == "pending", "expected a durable halt"
    assert halted.pending is not None
    req = halted.pending
    calls = relay_calls_of(req)
    names = [c.name for c in calls]
    assert names == ["alpha", "beta", "gamma"], "all 3 on ONE request, tool-call order preserved"

    # The host executes each call and answers them together, keyed by call id.
    results = [RelayResult(id=c.id, output=f"{c.name}-done") for c in calls]
    done = await client.run_with_answer(req, relay_answer(req.id, results), timeout=30)
    assert done.text == "alpha-done,beta-done,gamma-done"
    assert done.status == "done"
    assert done.run_id == halted.run_id


async def test_example_3_a_real_tool_runs_on_the_worker_and_a_decline_does_not_abort(
    durable: Durable,
):
    def wait_for(req: Request):
        return answer_declined(req.id, "")

    client = DurableClient(settings=durable.settings, wait_for=wait_for)
    try:
        res = await client.run("seed-decline", "do both", timeout=30)
    finally:
        client.close()

    assert res.run_id is not None
    assert durable.count("tool", f"real_tool {res.run_id}") == 1, "the ordinary tool ran once"
    assert res.status == "done", "a declined relay must not abort the run"
    assert res.tool_calls[1].is_error, "the declined relay is an error tool result"
    assert res.text == "handled the decline"


async def test_a_batch_of_runs_starts_in_one_call_and_each_finishes(client: DurableClient):
    prompts = [f"batch item {i}" for i in range(12)]

    ids = await client.start_many("seed-three", prompts)
    results = [await client.result(i, wait=True, timeout=30) for i in ids]

    assert len(set(ids)) == 12
    assert [r.status for r in results] == ["pending"] * 12
    assert [r.messages[0]["content"] for r in results] == prompts, "in input order"
