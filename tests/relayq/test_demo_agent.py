"""The demo agent: look up, ask for approval, report; offline unless a real model is named."""

from __future__ import annotations

import json

import pytest

from relayq import create_in_process_client
from relayq.demo import _model, demo, demo_model, lookup_order, order_of
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


def test_an_order_number_comes_from_the_prompt_or_stably_from_its_text():
    assert order_of("refund order 1042 please") == "1042"
    assert order_of("refund my lamp") == order_of("refund my lamp")
    assert order_of("refund my lamp").isdigit()


def test_the_model_is_offline_unless_a_real_one_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RELAYQ_MODEL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert _model() is demo_model

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
