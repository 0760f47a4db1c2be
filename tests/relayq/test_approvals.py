"""Structured approvals, in-process: typed decisions, edited arguments, declines with reasons."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from relayq import (
    Answer,
    AnswerMismatch,
    BuiltinsConfig,
    InProcessResponse,
    InProcessToolCall,
    Request,
    RunResult,
    Tool,
    ToolContext,
    ToolkitError,
    create_in_process_client,
    create_toolkit,
    define_tool,
    pending,
)
from relayq.approvals import (
    APPROVAL_KIND,
    EscalationStep,
    approve,
    arguments_digest,
    decision_of,
    decline,
    diff_arguments,
    edit,
    policy_of,
    requires_approval,
)
from relayq.relay import relay_tool

from .scripted import Script, call, echo_tool_outputs

SCHEMA = {
    "type": "object",
    "properties": {"order": {"type": "string"}, "amount": {"type": "number", "maximum": 1000}},
    "required": ["order", "amount"],
    "additionalProperties": False,
}


def refund_tool(ran: list[dict[str, Any]]) -> Tool:
    def refund(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(args)
        return f"refunded {args['amount']} on {args['order']}"

    return define_tool("refund", "Refund an order", SCHEMA, refund)


async def halted_on_refund(ran: list[dict[str, Any]], **policy: Any) -> tuple[Any, Any, RunResult]:
    tk = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[requires_approval(refund_tool(ran), **policy)]
    )
    model = Script(
        [
            _reply(call("c1", "refund", {"order": "17", "amount": 500})),
            echo_tool_outputs,
        ]
    )
    client = create_in_process_client(generate=model)
    halted = await client.run("refund order 17", tk)
    return client, tk, halted


def _reply(*tool_calls: InProcessToolCall) -> InProcessResponse:
    return InProcessResponse(tool_calls=list(tool_calls))


async def test_a_call_suspends_with_one_approval_request_and_the_tool_does_not_run():
    ran: list[dict[str, Any]] = []
    _, _, halted = await halted_on_refund(ran, approvers=["finance"], quorum=2)

    assert halted.status == "pending"
    assert halted.pending is not None
    request = halted.pending
    assert request.kind == APPROVAL_KIND
    assert request.data["tool"] == "refund"
    assert request.data["arguments"] == {"order": "17", "amount": 500}
    assert request.data["schema"] == SCHEMA
    assert request.data["policy"]["approvers"] == ["finance"]
    assert request.data["policy"]["quorum"] == 2
    assert request.prompt == "Approve refund: Refund an order"
    assert ran == []


async def test_approving_runs_the_tool_with_the_models_arguments():
    ran: list[dict[str, Any]] = []
    client, tk, halted = await halted_on_refund(ran)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, approve(halted.pending.id)
    )

    assert ran == [{"order": "17", "amount": 500}]
    assert done.text == "refunded 500 on 17"


async def test_an_edit_runs_the_tool_with_the_edited_arguments_and_tells_the_model():
    ran: list[dict[str, Any]] = []
    client, tk, halted = await halted_on_refund(ran)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, edit(halted.pending.id, {"order": "17", "amount": 50})
    )

    assert ran == [{"order": "17", "amount": 50}]
    assert done.tool_calls[0].output == (
        "[The approver changed the arguments before refund ran: amount: 500 -> 50]\n"
        "refunded 50 on 17"
    )


async def test_a_decline_does_not_run_the_tool_and_the_model_gets_the_reason():
    ran: list[dict[str, Any]] = []
    client, tk, halted = await halted_on_refund(ran)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, decline(halted.pending.id, "order already refunded")
    )

    assert ran == []
    assert done.tool_calls[0].is_error
    assert "order already refunded" in done.tool_calls[0].output


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (Answer(id="r", data={"output": "NO, do not refund"}), "is a decision"),
        (Answer(id="r", data={"decision": "maybe"}), "is a decision"),
        (Answer(id="r", data={"decision": "approve", "arguments": {}}), "takes no arguments"),
        (Answer(id="r", data={"decision": "edit"}), "takes an arguments object"),
        (Answer(id="r", data={"decision": "edit", "arguments": {"order": "17"}}), "schema"),
        (
            Answer(id="r", data={"decision": "edit", "arguments": {"order": "17", "amount": 5000}}),
            "amount",
        ),
        (
            Answer(id="r", data={"decision": "edit", "arguments": {"order": 17, "amount": 5}}),
            "order",
        ),
        (Answer(id="r", ok=False), "takes a reason"),
        (Answer(id="r", ok=False, reason="   "), "takes a reason"),
    ],
)
async def test_anything_but_a_typed_decision_is_refused_and_changes_nothing(
    answer: Answer, says: str
):
    ran: list[dict[str, Any]] = []
    client, tk, halted = await halted_on_refund(ran)
    assert halted.pending is not None
    wrong = answer.model_copy(update={"id": halted.pending.id})
    before = list(halted.messages)

    with pytest.raises(AnswerMismatch, match=says):
        await client.run_with_answer(tk, halted.messages, halted.pending, wrong)

    assert halted.messages == before
    assert ran == []


def test_a_decision_is_read_from_its_answer():
    request = Request(id="r", kind=APPROVAL_KIND, prompt="p", data={"schema": SCHEMA})
    assert decision_of(request, approve("r")).kind == "approve"
    edited = decision_of(request, edit("r", {"order": "1", "amount": 2}))
    assert (edited.kind, edited.arguments) == ("edit", {"order": "1", "amount": 2})
    declined = decision_of(request, decline("r", " too much "))
    assert (declined.kind, declined.reason) == ("decline", "too much")


def _ctx() -> ToolContext:
    return ToolContext(run_id="run", call_id="c1", tool_name="refund", base_dir=Path("."))


async def test_the_policy_round_trips_through_the_request():
    tool = requires_approval(
        refund_tool([]),
        approvers=["finance", "ops"],
        quorum=2,
        declines=2,
        forbid_self_approval=True,
        expires_in=timedelta(hours=1),
        remind_before=timedelta(minutes=10),
        on_expiry="escalate",
        escalation=[EscalationStep(approvers=("leads",), expires_in=timedelta(hours=2))],
    )
    request = await tool.invoke({"order": "1", "amount": 1}, _ctx())
    assert isinstance(request, Request)
    policy = policy_of(request)
    assert policy.approvers == ("finance", "ops")
    assert (policy.quorum, policy.declines, policy.forbid_self_approval) == (2, 2, True)
    assert policy.remind_before == timedelta(minutes=10)
    assert policy.on_expiry == "escalate"
    assert policy.escalation == (
        EscalationStep(approvers=("leads",), expires_in=timedelta(hours=2)),
    )
    assert request.expires_at is not None


@pytest.mark.parametrize(
    "bad",
    [
        {"quorum": 0},
        {"declines": 0},
        {"on_expiry": "explode"},
        {"on_expiry": "escalate"},
        {"remind_before": timedelta(minutes=1)},
        {"approvers": [""]},
        {"decisions": ()},
        {"decisions": ("approve", "shrug")},
        {"decisions": ("approve", "approve")},
    ],
)
def test_a_policy_that_cannot_hold_is_refused_when_the_tool_is_defined(bad: dict[str, Any]):
    with pytest.raises(ToolkitError):
        requires_approval(refund_tool([]), **bad)


def test_a_relay_tool_cannot_require_approval():
    with pytest.raises(ToolkitError, match="relay tool"):
        requires_approval(relay_tool("lookup", "host looks up"))


async def test_a_wrapped_tool_that_suspends_again_gets_an_error_not_a_second_request():
    def asks(args: dict[str, Any], ctx: ToolContext) -> Request:
        return pending("question", "and then?")

    tool = requires_approval(define_tool("asks", "asks", None, asks))
    out = await tool.invoke({}, dataclasses.replace(_ctx(), answer=approve("r")))
    assert not isinstance(out, Request)
    assert out.is_error
    assert "cannot suspend again" in out.output


def test_an_edit_diff_names_each_changed_key_and_the_digest_is_stable():
    assert diff_arguments({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {
        "b": [2, 3],
        "c": [None, 4],
    }
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})


async def test_the_approvals_relay_contract_holds_with_two_gated_calls_in_one_turn():
    ran: list[dict[str, Any]] = []
    tk = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[requires_approval(refund_tool(ran))]
    )
    model = Script(
        [
            _reply(
                call("c1", "refund", {"order": "1", "amount": 10}),
                call("c2", "refund", {"order": "2", "amount": 20}),
            ),
            echo_tool_outputs,
        ]
    )
    client = create_in_process_client(generate=model)
    first = await client.run("two refunds", tk)
    assert first.pending is not None
    second = await client.run_with_answer(
        tk, first.messages, first.pending, approve(first.pending.id)
    )
    assert second.pending is not None, "each gated call asks on its own"
    done = await client.run_with_answer(
        tk, second.messages, second.pending, decline(second.pending.id, "not this one")
    )

    assert ran == [{"order": "1", "amount": 10}]
    assert [c.is_error for c in done.tool_calls] == [False, True]


async def test_a_prompt_function_runs_on_a_thread_not_on_the_loop(tmp_path: Path):
    # Given an approval whose prompt is a function of the arguments
    called_on: list[int] = []

    def line(args: dict[str, Any]) -> str:
        called_on.append(threading.get_ident())
        return f"refund {args['amount']} on {args['order']}?"

    gated = requires_approval(refund_tool([]), prompt=line)
    ctx = ToolContext(run_id="run_1", call_id="c1", tool_name="refund", base_dir=tmp_path)

    # When the call asks for its approval
    asked = await gated.invoke({"order": "A1", "amount": 5}, ctx)

    # Then the request carries the line, made on another thread than the loop's
    assert isinstance(asked, Request)
    assert asked.prompt == "refund 5 on A1?"
    assert called_on
    assert called_on[0] != threading.get_ident()


async def test_the_decisions_a_tool_offers_travel_with_its_request_and_bound_what_is_taken():
    tool = requires_approval(refund_tool([]), decisions=("approve", "decline"))
    request = await tool.invoke({"order": "1", "amount": 5}, _ctx())
    assert isinstance(request, Request)
    assert policy_of(request).decisions == ("approve", "decline")
    assert decision_of(request, approve(request.id)).kind == "approve"
    assert decision_of(request, decline(request.id, "no")).kind == "decline"
    with pytest.raises(AnswerMismatch, match="by approve, decline only, not edit"):
        decision_of(request, edit(request.id, {"order": "1", "amount": 1}))


class RefundAtMost100(BaseModel):
    order: str
    amount: float = Field(le=100)


def at_most_1000(args: dict[str, Any]) -> None:
    if args["amount"] > 1000:
        raise ValueError("refunds over 1000 need a ticket")


@pytest.mark.parametrize(
    ("validate", "misfit"),
    [
        (RefundAtMost100, "amount: Input should be less than or equal to 100"),
        (lambda args: at_most_1000({"amount": args["amount"] * 10}),
         "ValueError: refunds over 1000 need a ticket"),
    ],
)  # fmt: skip
async def test_arguments_that_do_not_fit_go_back_to_the_model_and_no_person_is_asked(
    validate: Any, misfit: str
):
    ran: list[dict[str, Any]] = []
    _, _, done = await halted_on_refund(ran, validate=validate)

    assert done.status == "done"
    assert done.pending is None
    assert ran == []
    assert done.tool_calls[0].output == (
        f"refund was not called: its arguments do not fit ({misfit}); "
        "correct them and call it again"
    )


def open_order(args: dict[str, Any]) -> None:
    if args["order"] == "99":
        raise ValueError("order 99 is closed")


async def test_arguments_that_fit_are_asked_about_as_before():
    ran: list[dict[str, Any]] = []
    _, _, halted = await halted_on_refund(ran, validate=open_order)
    assert halted.pending is not None
    assert ran == []


async def test_an_edit_that_does_not_fit_is_not_run():
    ran: list[dict[str, Any]] = []
    client, tk, halted = await halted_on_refund(ran, validate=open_order)
    assert halted.pending is not None

    closed = edit(halted.pending.id, {"order": "99", "amount": 50})
    done = await client.run_with_answer(tk, halted.messages, halted.pending, closed)

    assert ran == []
    assert done.tool_calls[0].output == (
        "refund did not run: the approver's edit of its arguments does not fit "
        "(ValueError: order 99 is closed)"
    )
