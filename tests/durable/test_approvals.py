"""Approvals through real workers: a quorum of two, an edited amount, the starter refused."""

from __future__ import annotations

import pytest

from relayq import AlreadyVoted, NotAnApprover
from relayq.approvals import APPROVAL_KIND, approve, decline, edit
from store import Decider, decisions_of
from tasks import DurableClient

from .conftest import Durable

ANNA = Decider(name="anna", role="approver", groups=("finance",), via="api")
BEN = Decider(name="ben", role="approver", groups=("finance",), via="inbox")
SAM = Decider(name="sam", role="approver", groups=("support",), via="api")


async def test_two_approvers_resolve_a_refund_and_it_runs_once_with_the_edited_amount(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a refund run started by anna, waiting on an approval by two of finance
    run_id = await client.start("refunds", prompt, started_by="anna")
    halted = await client.result(run_id, wait=True, timeout=30)
    assert halted.pending is not None
    request = halted.pending
    assert request.kind == APPROVAL_KIND
    assert request.prompt == "Refund 500 on order 17?"

    # When anna (who asked) tries to approve, sam (support) tries, ben edits the
    # amount to 50, and carol approves that
    with pytest.raises(NotAnApprover):
        await client.submit_answer(approve(request.id), decider=ANNA)
    with pytest.raises(NotAnApprover):
        await client.submit_answer(approve(request.id), decider=SAM)
    await client.submit_answer(edit(request.id, {"order": "17", "amount": 50}), decider=BEN)
    with pytest.raises(AlreadyVoted):
        await client.submit_answer(approve(request.id), decider=BEN)
    still = await client.result(run_id)
    assert still.status == "pending", "one approval of two"
    carol = Decider(name="carol", role="approver", groups=("finance",), via="api")
    await client.submit_answer(approve(request.id), decider=carol)

    # Then the refund ran once, with 50, and the model was told of the change
    done = await client.result(run_id, wait=True, timeout=30)
    assert done.status == "done", done.error
    assert durable.count("tool", f"refund {run_id} 50") == 1
    assert durable.count("tool", f"refund {run_id} 500") == 0
    assert done.text == (
        "[The approver changed the arguments before refund ran: amount: 500 -> 50]\n"
        "refunded 50 on order 17"
    )
    trail = decisions_of(client.db, request.id)
    assert [(d.actor, d.outcome) for d in trail] == [("ben", "edited"), ("carol", "approved")]


async def test_a_decline_never_runs_the_refund_and_the_model_gets_the_reason(
    durable: Durable, client: DurableClient, prompt: str
):
    run_id = await client.start("refunds", prompt)
    halted = await client.result(run_id, wait=True, timeout=30)
    assert halted.pending is not None

    await client.submit_answer(decline(halted.pending.id, "already refunded"), decider=BEN)

    done = await client.result(run_id, wait=True, timeout=30)
    assert done.status == "done", done.error
    assert durable.count("tool", f"refund {run_id} 500") == 0
    assert done.tool_calls[0].is_error
    assert "already refunded" in done.tool_calls[0].output
