"""The demo agent: look up, ask for approval, report; offline unless a real model is named."""

from __future__ import annotations

import json

import pytest

from relayq import create_in_process_client
from relayq.approvals import approve, arguments_of, decline, edit, policy_of
from relayq.demo import (
    QUORUM_ABOVE,
    _model,
    demo,
    demo_model,
    demo_refunds,
    lookup_order,
    order_of,
    order_record,
    refunds_model,
)
from relayq.providers import ProviderConfig
from relayq.relay import RelayResult, answer_declined, relay_answer, relay_calls_of


async def test_a_job_looks_the_order_up_then_waits_for_approval_with_its_amount():
    client = create_in_process_client(generate=demo_model)

    halted = await client.run("refund order 1042", await demo.toolkit())

    assert halted.status == "pending"
    assert halted.pending is not None
    [call] = relay_calls_of(halted.pending)
    looked_up = json.loads(lookup_order({"order": "1042"}, None))  # type: ignore[arg-type]
    assert call.name == "approve_refund"
    assert call.input["order"] == "1042"
    assert call.input["amount"] == looked_up["amount"]
    assert [r.name for r in halted.tool_calls] == ["lookup_order"]  # the approval is still open


@pytest.mark.parametrize(
    ("approve", "expected"),
    [(True, "Order 7: refund made (ok by ann)."), (False, "Order 7: refund not made")],
)
async def test_the_answer_decides_what_the_job_reports(approve: bool, expected: str):
    client = create_in_process_client(generate=demo_model)
    toolkit = await demo.toolkit()
    halted = await client.run("refund order 7", toolkit)
    assert halted.pending is not None
    [call] = relay_calls_of(halted.pending)
    answer = (
        relay_answer(halted.pending.id, [RelayResult(id=call.id, output="ok by ann")])
        if approve
        else answer_declined(halted.pending.id, "too old")
    )

    done = await client.run_with_answer(toolkit, halted.messages, halted.pending, answer)

    assert done.status == "done"
    assert done.text.startswith(expected)
    assert done.turns == 3


@pytest.mark.parametrize(
    ("order", "tool", "quorum"), [("1001", "refund", 1), ("1003", "refund_large", 2)]
)
async def test_a_refund_asks_finance_with_the_tool_its_amount_calls_for(
    order: str, tool: str, quorum: int
):
    client = create_in_process_client(generate=refunds_model)

    halted = await client.run(f"refund order {order}", await demo_refunds.toolkit())

    assert halted.status == "pending"
    assert halted.pending is not None
    amount = order_record(order)["amount"]
    assert (amount <= QUORUM_ABOVE) == (quorum == 1)
    assert halted.pending.data["tool"] == tool
    assert arguments_of(halted.pending)["amount"] == amount
    policy = policy_of(halted.pending)
    assert (policy.approvers, policy.quorum) == (("finance",), quorum)
    assert halted.pending.prompt == f"Refund {amount} on order {order}?"


async def test_an_edited_refund_runs_with_the_edited_amount_and_the_reply_says_so():
    client = create_in_process_client(generate=refunds_model)
    toolkit = await demo_refunds.toolkit()
    halted = await client.run("refund order 1001", toolkit)
    assert halted.pending is not None
    proposed = arguments_of(halted.pending)

    answer = edit(halted.pending.id, {**proposed, "amount": 50})
    done = await client.run_with_answer(toolkit, halted.messages, halted.pending, answer)

    assert done.status == "done"
    assert done.tool_calls[-1].output.endswith("refunded 50.00 on order 1001")
    assert done.text == (
        "Refunded 50.00 on order 1001. [The approver changed the arguments before refund "
        f"ran: amount: {proposed['amount']} -> 50]"
    )


async def test_a_declined_refund_does_not_run_and_an_approved_one_runs_as_proposed():
    client = create_in_process_client(generate=refunds_model)
    toolkit = await demo_refunds.toolkit()
    halted = await client.run("refund order 1003", toolkit)
    assert halted.pending is not None
    amount = arguments_of(halted.pending)["amount"]

    declined = await client.run_with_answer(
        toolkit, halted.messages, halted.pending, decline(halted.pending.id, "a duplicate")
    )
    approved = await client.run_with_answer(
        toolkit, halted.messages, halted.pending, approve(halted.pending.id)
    )

    assert declined.text.startswith("Order 1003: not refunded")
    assert "a duplicate" in declined.text
    assert "refunded" not in declined.tool_calls[-1].output
    assert approved.text == f"Refunded {amount:.2f} on order 1003."


def test_an_order_number_comes_from_the_prompt_or_stably_from_its_text():
    assert json.loads(lookup_order({"order": "1042"}, None)) == order_record("1042")  # type: ignore[arg-type]
    assert order_of("refund order 1042 please") == "1042"
    # The same in every process and release: a salted hash() would differ between runs.
    assert order_of("refund my lamp") == "2029"


def test_the_model_is_offline_unless_a_real_one_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RELAYQ_MODEL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert _model() is demo_model
    assert _model(refunds_model) is refunds_model

    monkeypatch.setenv("RELAYQ_MODEL", "gpt-4.1-mini")
    monkeypatch.setenv("RELAYQ_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    chosen = _model()
    assert isinstance(chosen, ProviderConfig)
    assert (chosen.model, chosen.base_url, chosen.style) == (
        "gpt-4.1-mini",
        "http://127.0.0.1:9/v1",
        "openai",
    )

    monkeypatch.delenv("RELAYQ_MODEL")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert isinstance(_model(), ProviderConfig)
