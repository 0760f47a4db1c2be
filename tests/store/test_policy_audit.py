"""What an approval policy decides without a person, in the audit trail: one row a call."""

from __future__ import annotations

from typing import Any

from relayq import ToolContext, define_tool
from relayq.approvals import approve, requires_approval
from relayq.policies import PolicyNote
from store import Database, accept_answer
from store.audit import AuditQuery, Decider, decisions_of, list_decisions, note_policy
from tests.relayq.scripted import echo_tool_outputs

from .driver import model_of, run_turn, start
from .test_approvals import SCHEMA, _kit, _refund_call


class Refund:
    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []
        self.seen: list[ToolContext] = []

    def refund(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.ran.append(args)
        return "refunded"

    async def turn(self, db: Database, **policy: Any) -> Any:
        kit = await _kit(
            requires_approval(define_tool("refund", "Refund", SCHEMA, self.refund), **policy)
        )
        start(db, started_by="carol", conversation_id="conv_1")
        return await run_turn(db, "run_1", kit, model_of(_refund_call(), echo_tool_outputs))


async def test_a_call_run_unasked_is_audited_through_the_policy_without_a_request(db: Database):
    refund = Refund()

    def when(args: dict[str, Any], ctx: ToolContext) -> bool:
        refund.seen.append(ctx)
        return False

    turn = await refund.turn(db, when=when)

    assert turn.status == "next"
    assert refund.ran == [{"order": "17", "amount": 500}]
    [ctx] = refund.seen
    assert (ctx.agent, ctx.conversation_id, ctx.started_by) == ("agent", "conv_1", "carol")
    rows, _ = list_decisions(db, AuditQuery(through="policy"))
    [row] = rows
    assert row.request_id is None
    assert (row.outcome, row.actor, row.via, row.tool) == (
        "approved",
        "relayq:policy",
        "system",
        "refund",
    )
    assert row.call_ids == ["c1"]
    assert row.call_key == ctx.idempotency_key
    assert row.run_id == "run_1"
    assert row.agent == "agent"
    assert row.arguments_hash


async def test_a_denied_call_is_audited_as_denied(db: Database):
    refund = Refund()
    turn = await refund.turn(db, deny=["amount > 100"])
    assert turn.status == "next"
    assert refund.ran == []
    [row] = list_decisions(db, AuditQuery(outcome="denied"))[0]
    assert (row.through, row.reason) == ("policy", "amount > 100")


async def test_a_policy_that_failed_is_audited_on_the_request_it_asked(db: Database):
    refund = Refund()
    turn = await refund.turn(db, when=lambda args, ctx: args["nope"])
    assert turn.pending is not None
    assert refund.ran == []

    [row] = decisions_of(db, turn.pending.id)
    assert (row.outcome, row.through) == ("asked", "policy")
    assert row.reason == "its when= predicate raised KeyError: 'nope': a person decides"


async def test_a_call_run_again_adds_no_second_row(db: Database):
    note = PolicyNote(
        run_id="run_1",
        call_id="c1",
        call_key="run_1:1:c1",
        agent="agent",
        tool="refund",
        outcome="approved",
        through="policy",
        reason="when= was false: no person needed",
        arguments_hash="x",
    )
    note_policy(db, note)
    note_policy(db, note)
    assert len(list_decisions(db, AuditQuery(through="policy"))[0]) == 1


async def test_a_persons_decision_is_through_person(db: Database):
    refund = Refund()
    turn = await refund.turn(db)
    assert turn.pending is not None
    accept_answer(db, approve(turn.pending.id), decider=Decider(name="alice", via="api"))
    [row] = decisions_of(db, turn.pending.id)
    assert row.through == "person"
