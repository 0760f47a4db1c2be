"""An approval policy's order, in-process: deny, validate, when, grants, then a person."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from relayq import (
    AnswerMismatch,
    BuiltinsConfig,
    InProcessResponse,
    RunResult,
    ToolContext,
    ToolkitError,
    create_in_process_client,
    create_toolkit,
    define_tool,
)
from relayq.approvals import decision_of, edit, requires_approval
from relayq.policies import Gatekeeper, GrantAsk, PolicyNote

from .scripted import Script, call, echo_tool_outputs

SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string"},
        "amount": {"type": "number"},
        "currency": {"type": "string"},
    },
    "required": ["order", "amount"],
}


class Kept(Gatekeeper):
    """Keeps what the policy tells it, and holds the grants a test gives it."""

    def __init__(self, grant: str | None = None) -> None:
        self.notes: list[PolicyNote] = []
        self.asked: list[GrantAsk] = []
        self.grant = grant

    async def note(self, note: PolicyNote) -> None:
        self.notes.append(note)

    async def use_grant(self, ask: GrantAsk) -> str | None:
        self.asked.append(ask)
        return self.grant


async def refund_once(
    args: dict[str, Any], gatekeeper: Gatekeeper | None = None, **policy: Any
) -> tuple[RunResult, list[dict[str, Any]]]:
    ran: list[dict[str, Any]] = []

    def refund(a: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(a)
        return f"refunded {a['amount']}"

    tool = requires_approval(define_tool("refund", "Refund", SCHEMA, refund), **policy)
    tk = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[tool])
    model = Script([InProcessResponse(tool_calls=[call("c1", "refund", args)]), echo_tool_outputs])
    client = create_in_process_client(generate=model, gatekeeper=gatekeeper)
    return await client.run("refund", tk), ran


BIG = {"order": "17", "amount": 20_000, "currency": "EUR"}
SMALL = {"order": "18", "amount": 20, "currency": "EUR"}


async def test_a_denied_call_is_refused_never_asked_and_audited():
    kept = Kept(grant="g1")
    done, ran = await refund_once(BIG, kept, deny=["amount > 10000"])

    assert done.status == "done"
    assert done.pending is None
    assert ran == []
    assert done.tool_calls[0].is_error
    assert done.tool_calls[0].output == (
        "refund was not called: its policy refuses it (amount > 10000)"
    )
    [noted] = kept.notes
    assert (noted.outcome, noted.through, noted.reason) == ("denied", "policy", "amount > 10000")
    assert kept.asked == [], "a denied call never reaches the grants"


async def test_a_deny_predicate_gives_its_reason():
    kept = Kept()
    done, ran = await refund_once(
        BIG, kept, deny=lambda args, ctx: args["amount"] > 10_000 and "over the desk's limit"
    )
    assert ran == []
    assert done.tool_calls[0].output.endswith("(over the desk's limit)")
    assert kept.notes[0].reason == "over the desk's limit"


async def test_deny_comes_before_validate():
    class Small(BaseModel):
        order: str
        amount: float = Field(le=100)

    done, _ = await refund_once(BIG, Kept(), deny=["amount > 10000"], validate=Small)
    assert "its policy refuses it" in done.tool_calls[0].output


async def test_validate_comes_before_when():
    kept = Kept()
    done, ran = await refund_once(
        {"order": "17", "amount": "lots"},
        kept,
        validate=lambda args: float(args["amount"]),
        when=lambda args, ctx: False,
    )
    assert ran == [], "a misfit never runs, whatever when= says"
    assert "its arguments do not fit" in done.tool_calls[0].output
    assert kept.notes == []


async def test_when_false_runs_unasked_and_is_audited_through_the_policy():
    kept = Kept(grant="g1")
    done, ran = await refund_once(SMALL, kept, when=lambda args, ctx: args["amount"] > 100)

    assert done.status == "done"
    assert ran == [SMALL]
    assert done.tool_calls[0].output == "refunded 20"
    [noted] = kept.notes
    assert (noted.outcome, noted.through, noted.call_id) == ("approved", "policy", "c1")
    assert kept.asked == [], "when= false needs no grant"


async def test_when_true_asks_a_person():
    done, ran = await refund_once(BIG, Kept(), when=lambda args, ctx: args["amount"] > 100)
    assert done.status == "pending"
    assert ran == []


async def test_when_sees_the_calls_context():
    seen: list[ToolContext] = []

    async def when(args: dict[str, Any], ctx: ToolContext) -> bool:
        seen.append(ctx)
        return True

    await refund_once(SMALL, Kept(), when=when)
    assert seen[0].call_id == "c1"
    assert seen[0].tool_name == "refund"


@pytest.mark.parametrize(
    "policy",
    [
        {"when": lambda args, ctx: 1 / 0},
        {"deny": lambda args, ctx: args["missing"]},
        {"deny": ["currency < 5"]},  # a string and a number: can't be told
    ],
    ids=["when-raises", "deny-raises", "deny-rule-untold"],
)
async def test_a_policy_that_fails_asks_a_person_and_the_audit_says_why(policy: dict[str, Any]):
    kept = Kept(grant="g1")
    done, ran = await refund_once(SMALL, kept, **policy)

    assert done.status == "pending"
    assert ran == []
    assert done.pending is not None
    [noted] = kept.notes
    assert (noted.outcome, noted.through) == ("asked", "policy")
    assert noted.request_id == done.pending.id
    assert noted.reason.endswith(": a person decides")
    assert kept.asked == [], "a policy that failed is not approved by a grant"


async def test_a_matching_grant_approves_after_when():
    kept = Kept(grant="g7")
    done, ran = await refund_once(BIG, kept, when=lambda args, ctx: True)
    assert done.status == "done"
    assert ran == [BIG]
    [ask] = kept.asked
    assert (ask.tool, ask.arguments, ask.call_id) == ("refund", BIG, "c1")


async def test_no_grant_asks_a_person():
    kept = Kept(grant=None)
    done, ran = await refund_once(BIG, kept)
    assert done.status == "pending"
    assert ran == []
    assert len(kept.asked) == 1


async def test_an_ungrantable_tool_never_asks_for_a_grant():
    kept = Kept(grant="g1")
    done, ran = await refund_once(BIG, kept, grantable=False)
    assert done.status == "pending"
    assert ran == []
    assert kept.asked == []


async def test_an_edit_meeting_a_deny_rule_is_refused_at_the_door():
    done, _ = await refund_once(SMALL, Kept(), deny=["amount > 10000"])
    assert done.pending is not None
    with pytest.raises(AnswerMismatch, match="refused by the tool's policy: amount > 10000"):
        decision_of(done.pending, edit(done.pending.id, {**SMALL, "amount": 50_000}))
    decision_of(done.pending, edit(done.pending.id, {**SMALL, "amount": 5}))


async def test_an_edit_misfitting_a_pydantic_validate_is_refused_at_the_door():
    class Small(BaseModel):
        order: str
        amount: float = Field(le=100)

    done, _ = await refund_once(SMALL, Kept(), validate=Small)
    assert done.pending is not None
    with pytest.raises(AnswerMismatch, match="do not fit the tool's validation: amount"):
        decision_of(done.pending, edit(done.pending.id, {**SMALL, "amount": 500}))


async def test_an_edit_denied_by_a_predicate_does_not_run():
    ran: list[dict[str, Any]] = []

    def refund(a: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(a)
        return "refunded"

    tool = requires_approval(
        define_tool("refund", "Refund", SCHEMA, refund),
        deny=lambda args, ctx: (
            args["currency"] == "JPY" and "yen refunds go through the Tokyo desk"
        ),
    )
    tk = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[tool])
    model = Script([InProcessResponse(tool_calls=[call("c1", "refund", SMALL)]), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("refund", tk)
    assert halted.pending is not None

    bad = edit(halted.pending.id, {**SMALL, "currency": "JPY"})
    done = await client.run_with_answer(tk, halted.messages, halted.pending, bad)

    assert ran == []
    assert done.tool_calls[0].output == (
        "refund did not run: the approver's edit of its arguments is refused by its policy "
        "(yen refunds go through the Tokyo desk)"
    )


def test_bad_deny_rules_are_refused_when_the_tool_is_wrapped():
    tool = define_tool("refund", "Refund", SCHEMA, lambda a, c: "x")
    with pytest.raises(ToolkitError, match="is not a constraint"):
        requires_approval(tool, deny=["amount is big"])
    with pytest.raises(ToolkitError, match="deny= takes a predicate or a list"):
        requires_approval(tool, deny="amount > 5")
