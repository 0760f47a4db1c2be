"""Approvals in the store: who may decide, one vote each, quorum, deadlines, the audit trail."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import col, select

from relayq import (
    AlreadyVoted,
    Answer,
    AnswerMismatch,
    BuiltinsConfig,
    BulkRefused,
    InProcessResponse,
    NotAnApprover,
    RequestClosed,
    ResumeError,
    Tool,
    ToolContext,
    Toolkit,
    create_toolkit,
    define_tool,
)
from relayq.approvals import EscalationStep, approve, decline, edit, requires_approval
from relayq.relay import answer_output
from store import Database, accept_answer, accept_many, apply_answer_of, get_run, sweep
from store.answers import MAX_BULK
from store.audit import AuditQuery, Decider, decisions_of, list_decisions
from store.models import EventRow, RequestRow, VoteRow, utcnow
from tests.relayq.scripted import call, echo_tool_outputs

from .driver import halt_on_relay, model_of, outbox_rows, run_turn, snapshot, start
from .test_answers import ANSWER_TASK

SCHEMA = {
    "type": "object",
    "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order", "amount"],
}

ALICE = Decider(name="alice", role="approver", groups=("finance",), via="inbox")
BOB = Decider(name="bob", role="approver", groups=("finance",), via="api")
CAROL = Decider(name="carol", role="approver", groups=("finance", "leads"), via="cli", os_user="c")
DAN = Decider(name="dan", role="approver", groups=("support",), via="api")
LEAD = Decider(name="lee", role="approver", groups=("leads",), via="inbox")


class Refunds:
    """A run halted on one gated `refund` call; the tool's executions are kept."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def refund(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.ran.append(args)
        return f"refunded {args['amount']}"

    async def halt(self, db: Database, *, started_by: str | None = None, **policy: Any) -> str:
        self.tool = requires_approval(
            define_tool("refund", "Refund", SCHEMA, self.refund), **policy
        )
        self.kit = await _kit(self.tool)
        self.model = model_of(_refund_call(), echo_tool_outputs)
        start(db, started_by=started_by)
        turn = await run_turn(db, "run_1", self.kit, self.model)
        assert turn.pending is not None
        return turn.pending.id

    async def finish(self, db: Database, request_id: str) -> Any:
        apply_answer_of(db, request_id)
        turn = await run_turn(db, "run_1", self.kit, self.model)  # the tool's turn
        while turn.status == "next":
            turn = await run_turn(db, "run_1", self.kit, self.model)
        return turn


async def _kit(*tools: Tool) -> Toolkit:
    return await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=list(tools))


def _refund_call() -> InProcessResponse:
    return InProcessResponse(tool_calls=[call("c1", "refund", {"order": "17", "amount": 500})])


def votes(db: Database, request_id: str) -> list[tuple[str, str]]:
    with db.read() as s:
        rows = s.exec(
            select(VoteRow).where(VoteRow.request_id == request_id).order_by(col(VoteRow.at))
        )
        return [(v.voter, v.decision) for v in rows]


def request_row(db: Database, request_id: str) -> RequestRow:
    with db.read() as s:
        row = s.get(RequestRow, request_id)
    assert row is not None
    return row


def events(db: Database, kind: str) -> list[EventRow]:
    with db.read() as s:
        return list(s.exec(select(EventRow).where(EventRow.type == kind)))


# Quorum


async def test_a_quorum_of_two_resolves_on_the_second_distinct_approval(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, approvers=["finance"], quorum=2)

    first = accept_answer(db, approve(rid), decider=ALICE)
    assert (first.complete, request_row(db, rid).status) == (False, "open")
    second = accept_answer(db, approve(rid), decider=BOB)

    assert second.complete
    row = request_row(db, rid)
    assert (row.status, row.outcome, row.answered_by) == ("answered", "approved", "bob")
    assert votes(db, rid) == [("alice", "approve"), ("bob", "approve")]
    assert [t.task for t in outbox_rows(db, ANSWER_TASK)] == [ANSWER_TASK]
    [decided] = events(db, "request.decided")
    assert decided.payload["outcome"] == "approved"
    # and the tool runs once, with the model's arguments
    done = await refunds.finish(db, rid)
    assert done.status == "done"
    assert refunds.ran == [{"order": "17", "amount": 500}]


async def test_the_same_person_cannot_vote_twice(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, quorum=2)
    accept_answer(db, approve(rid), decider=ALICE)
    before = snapshot(db)

    with pytest.raises(AlreadyVoted):
        accept_answer(db, approve(rid), decider=ALICE)
    with pytest.raises(AlreadyVoted):
        accept_answer(db, decline(rid, "changed my mind"), decider=ALICE)

    assert snapshot(db) == before
    assert votes(db, rid) == [("alice", "approve")]


async def test_an_edit_becomes_what_later_approvals_approve(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, quorum=2)

    accept_answer(db, approve(rid), decider=ALICE)  # approved 500
    edited = accept_answer(db, edit(rid, {"order": "17", "amount": 50}), decider=BOB)
    assert not edited.complete, "alice approved 500, not 50: one approval of 50 so far"
    accept_answer(db, approve(rid), decider=CAROL)

    row = request_row(db, rid)
    assert (row.status, row.outcome) == ("answered", "edited")
    done = await refunds.finish(db, rid)
    assert refunds.ran == [{"order": "17", "amount": 50}]
    assert "amount: 500 -> 50" in done.messages[-2]["content"]
    [bob] = [d for d in decisions_of(db, rid) if d.actor == "bob"]
    assert bob.diff == {"amount": [500, 50]}


async def test_one_decline_resolves_unless_the_policy_asks_for_more(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, quorum=2, declines=2)

    assert not accept_answer(db, decline(rid, "too much"), decider=ALICE).complete
    assert accept_answer(db, decline(rid, "no receipt"), decider=BOB).complete

    row = request_row(db, rid)
    assert (row.status, row.outcome) == ("answered", "declined")
    done = await refunds.finish(db, rid)
    assert refunds.ran == []
    assert done.messages[-2]["relayq"].get("is_error") or "declined" in done.messages[-2]["content"]
    assert "too much; no receipt" in done.messages[-2]["content"]


# Who may decide


async def test_only_members_of_the_approver_groups_may_decide(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, approvers=["finance"])
    before = snapshot(db)

    with pytest.raises(NotAnApprover) as refused:
        accept_answer(db, approve(rid), decider=DAN)

    assert refused.value.why == "group"
    assert snapshot(db) == before
    assert accept_answer(db, approve(rid), decider=ALICE).complete


async def test_self_approval_can_be_forbidden(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, started_by="alice", forbid_self_approval=True)

    with pytest.raises(NotAnApprover) as refused:
        accept_answer(db, approve(rid), decider=ALICE)

    assert refused.value.why == "self"
    assert accept_answer(db, approve(rid), decider=BOB).complete


async def test_a_free_text_answer_to_an_approval_is_refused(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db)
    before = snapshot(db)

    with pytest.raises(AnswerMismatch):
        accept_answer(db, answer_output(rid, "NO, do not refund"), decider=ALICE)
    with pytest.raises(AnswerMismatch, match="schema"):
        accept_answer(db, edit(rid, {"order": "17"}), decider=ALICE)

    assert snapshot(db) == before


# Deadlines


async def test_an_approval_past_its_deadline_is_expired_by_the_system_not_declined(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, expires_in=timedelta(minutes=5))

    sweep(db, now=utcnow() + timedelta(minutes=6))

    row = request_row(db, rid)
    assert (row.status, row.outcome) == ("expired", "expired")
    [expired] = decisions_of(db, rid)
    assert (expired.actor, expired.via, expired.outcome) == ("relayq:expiry", "system", "expired")
    assert len(events(db, "request.expired")) == 1
    done = await refunds.finish(db, rid)
    assert refunds.ran == []
    assert "expired" in done.messages[-2]["content"]
    with pytest.raises(RequestClosed):
        accept_answer(db, approve(rid), decider=ALICE)


async def test_an_escalation_hands_the_request_to_the_next_groups_with_a_new_deadline(
    db: Database,
):
    refunds = Refunds()
    rid = await refunds.halt(
        db,
        approvers=["finance"],
        expires_in=timedelta(minutes=5),
        on_expiry="escalate",
        escalation=[EscalationStep(approvers=("leads",), expires_in=timedelta(hours=1))],
    )
    later = utcnow() + timedelta(minutes=6)

    sweep(db, now=later)

    row = request_row(db, rid)
    assert (row.status, row.approvers, row.step) == ("open", ["leads"], 1)
    assert row.expires_at is not None
    assert row.expires_at > later + timedelta(minutes=59)
    assert [d.outcome for d in decisions_of(db, rid)] == ["escalated"]
    assert len(events(db, "request.escalated")) == 1
    with pytest.raises(NotAnApprover):
        accept_answer(db, approve(rid), decider=ALICE)
    # past the last step, the deadline declines
    sweep(db, now=later + timedelta(hours=2))
    assert request_row(db, rid).outcome == "expired"


async def test_a_request_that_stays_open_is_noticed_overdue_once_and_still_takes_a_decision(
    db: Database,
):
    refunds = Refunds()
    rid = await refunds.halt(db, expires_in=timedelta(minutes=5), on_expiry="stay_open")
    later = utcnow() + timedelta(minutes=6)

    sweep(db, now=later)
    sweep(db, now=later + timedelta(minutes=1))

    row = request_row(db, rid)
    assert (row.status, row.overdue_at is not None) == ("open", True)
    [overdue] = events(db, "request.expired")
    assert overdue.payload["stillOpen"] is True
    assert accept_answer(db, approve(rid), decider=ALICE).complete


async def test_a_reminder_goes_out_once_before_the_deadline(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, expires_in=timedelta(hours=1), remind_before=timedelta(minutes=10))

    early = sweep(db, now=utcnow() + timedelta(minutes=30))
    due = sweep(db, now=utcnow() + timedelta(minutes=51))
    again = sweep(db, now=utcnow() + timedelta(minutes=52))

    assert (early.reminded, due.reminded, again.reminded) == (0, 1, 0)
    [reminder] = events(db, "request.reminder")
    assert reminder.request_id == rid


# The audit trail


async def test_every_vote_and_answer_is_in_the_trail_with_who_and_how(db: Database):
    refunds = Refunds()
    rid = await refunds.halt(db, quorum=2)
    accept_answer(db, approve(rid), decider=ALICE)
    accept_answer(db, edit(rid, {"order": "17", "amount": 50}), decider=CAROL)
    accept_answer(db, approve(rid), decider=BOB)

    trail = decisions_of(db, rid)
    assert [(d.actor, d.via, d.outcome) for d in trail] == [
        ("alice", "inbox", "approved"),
        ("carol", "cli", "edited"),
        ("bob", "api", "approved"),
    ]
    assert trail[1].os_user == "c"
    assert trail[1].groups == ["finance", "leads"]
    assert trail[0].arguments_hash != trail[2].arguments_hash, "bob saw the edited arguments"
    page, more = list_decisions(db, AuditQuery(actor="carol"))
    assert [d.outcome for d in page] == ["edited"]
    assert more is None


async def test_a_relay_answer_is_in_the_trail_too(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None

    accept_answer(db, answer_output(turn.pending.id, "42"), decider=DAN)

    [answered] = decisions_of(db, turn.pending.id)
    assert (answered.actor, answered.outcome, answered.call_ids) == ("dan", "answered", ["c1"])


async def test_the_application_never_updates_or_deletes_a_decision(db: Database):
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.lower())

    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        refunds = Refunds()
        rid = await refunds.halt(
            db, quorum=2, expires_in=timedelta(minutes=5), on_expiry="escalate",
            escalation=[EscalationStep(approvers=(), expires_in=timedelta(minutes=5))],
        )  # fmt: skip
        accept_answer(db, approve(rid), decider=ALICE)
        sweep(db, now=utcnow() + timedelta(minutes=6))
        accept_answer(db, approve(rid), decider=BOB)
        await refunds.finish(db, rid)
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", seen)

    touching = [s for s in statements if "relayq_decisions" in s]
    assert touching, "the trail was written"
    assert all(s.lstrip().startswith(("insert", "select")) for s in touching), touching
    assert get_run(db, "run_1").status == "done"


# Bulk decisions


async def _three_halted(db: Database) -> tuple[Refunds, list[str]]:
    return await _halted(db, 3)


async def _halted(db: Database, count: int, **policy: Any) -> tuple[Refunds, list[str]]:
    refunds = Refunds()
    ids = []
    for n in range(count):
        refund = define_tool("refund", "Refund", SCHEMA, refunds.refund)
        kit = await _kit(requires_approval(refund, **policy))
        start(db, run_id=f"run_{n}")
        turn = await run_turn(db, f"run_{n}", kit, model_of(_refund_call(), echo_tool_outputs))
        assert turn.pending is not None
        ids.append(turn.pending.id)
    return refunds, ids


async def test_a_bulk_approval_decides_every_request_in_one_go(db: Database):
    _, ids = await _three_halted(db)
    seen = {rid: request_row(db, rid).revision for rid in ids}

    accepted = accept_many(db, [(approve(rid), seen[rid]) for rid in ids], decider=ALICE)

    assert [a.complete for a in accepted] == [True, True, True]
    assert [request_row(db, rid).outcome for rid in ids] == ["approved"] * 3
    assert len(outbox_rows(db, ANSWER_TASK)) == 3


async def test_a_bulk_decision_reads_its_requests_in_as_many_statements_for_40_as_for_4(
    db: Database,
):
    # A back-office bulk decision is up to 1,000 requests: a few reads per request
    # made it seconds long on PostgreSQL, and past a client's patience under load.
    _, ids = await _halted(db, 44, quorum=2)
    reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().lower().startswith("select"):
            reads.append(statement)

    def reads_of(chosen: list[str]) -> int:
        reads.clear()
        for engine in db.engines:
            event.listen(engine, "before_cursor_execute", seen)
        try:
            accept_many(db, [(approve(rid), None) for rid in chosen], decider=ALICE)
        finally:
            for engine in db.engines:
                event.remove(engine, "before_cursor_execute", seen)
        return len(reads)

    assert reads_of(ids[:4]) == reads_of(ids[4:]) > 0
    assert {r[0] for r in votes_of_all(db, ids)} == {"alice"}
    assert all(request_row(db, rid).status == "open" for rid in ids)  # a quorum of 2


def votes_of_all(db: Database, ids: list[str]) -> list[tuple[str, str]]:
    return [vote for rid in ids for vote in votes(db, rid)]


async def test_a_bulk_decision_names_at_most_so_many_requests_and_says_so(db: Database):
    _, ids = await _three_halted(db)
    before = snapshot(db)
    too_many: list[tuple[Answer, int | None]] = [
        (approve(ids[n % 3]), None) for n in range(MAX_BULK + 1)
    ]

    with pytest.raises(ResumeError, match=f"at most {MAX_BULK} requests \\(got {MAX_BULK + 1}\\)"):
        accept_many(db, too_many, decider=ALICE)

    assert snapshot(db) == before


async def test_a_refused_bulk_decision_names_the_first_few_and_counts_the_rest():
    refused = BulkRefused(tuple((f"req_{n}", "why") for n in range(8)))
    assert str(refused) == (
        "nothing was decided: 8 request(s) refused it "
        "(req_0, req_1, req_2, req_3, req_4 and 3 more)"
    )
    assert len(refused.refused) == 8


async def test_a_bulk_decision_is_all_or_nothing_and_names_what_was_decided_meanwhile(
    db: Database,
):
    _, ids = await _three_halted(db)
    seen = {rid: request_row(db, rid).revision for rid in ids}
    accept_answer(db, decline(ids[1], "no"), decider=BOB)  # decided after the preview
    before = snapshot(db)

    with pytest.raises(BulkRefused) as refused:
        accept_many(db, [(approve(rid), seen[rid]) for rid in ids], decider=ALICE)

    assert [rid for rid, _ in refused.value.refused] == [ids[1]]
    assert snapshot(db) == before
    assert [request_row(db, rid).status for rid in (ids[0], ids[2])] == ["open", "open"]
