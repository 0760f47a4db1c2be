"""Standing grants in the store: made with a decision or by an administrator, used once a
call, within their scope, uses and lifetime, revoked from a moment on."""

from __future__ import annotations

import dataclasses
import multiprocessing
from datetime import timedelta
from typing import Any

import pytest

from relayq import ToolContext, define_tool
from relayq.approvals import approve, decline, edit, requires_approval
from relayq.grants import GrantCaps, GrantTerms
from relayq.matching import Matcher, parse_constraints
from relayq.policies import GrantAsk, arguments_digest
from store import Database, accept_answer
from store.audit import AuditQuery, Decider, list_decisions
from store.grants import (
    GrantQuery,
    GrantRefused,
    NewGrant,
    UnknownGrant,
    get_grant,
    list_grants,
    make_grant,
    revoke_grant,
    status_of,
    use_grant,
)
from store.models import GrantRow
from tests.relayq.scripted import echo_tool_outputs

from .driver import model_of, run_turn, snapshot, start
from .test_approvals import SCHEMA, _kit, _refund_call

ALICE = Decider(name="alice", role="approver", groups=("finance",), via="api")
BOB = Decider(name="bob", role="approver", groups=("finance",), via="api")
ADMIN = Decider(name="root", role="admin", via="api")
VIEWER = Decider(name="vic", role="viewer", via="api")
ARGS = {"order": "17", "amount": 500}


class Desk:
    """Runs that each call a gated `refund` once; the tool's executions are kept."""

    def __init__(self, **policy: Any) -> None:
        self.ran: list[dict[str, Any]] = []
        self.policy = policy
        self.n = 0

    def refund(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.ran.append(args)
        return "refunded"

    async def call(
        self,
        db: Database,
        *,
        conversation_id: str | None = None,
        started_by: str | None = "sam",
        agent: str = "agent",
    ) -> Any:
        """One more run's first turn: pending (a person is asked), or next (it ran)."""
        self.n += 1
        tool = requires_approval(
            define_tool("refund", "Refund", SCHEMA, self.refund), **self.policy
        )
        run_id = f"run_{self.n}"
        start(
            db, run_id=run_id, conversation_id=conversation_id, started_by=started_by, agent=agent
        )
        turn = await run_turn(
            db, run_id, await _kit(tool), model_of(_refund_call(), echo_tool_outputs)
        )
        return turn


def terms(**kw: Any) -> GrantTerms:
    return GrantTerms(**{"scope": "agent", "lasts": timedelta(hours=8), **kw})


def grants(db: Database) -> list[GrantRow]:
    return list_grants(db, GrantQuery(limit=500))[0]


async def test_a_grant_made_with_an_approval_approves_the_next_call_unasked(db: Database):
    desk = Desk(approvers=["finance"])
    first = await desk.call(db)
    assert first.pending is not None

    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms(max_uses=20))

    [grant] = grants(db)
    assert (grant.tool, grant.agent, grant.scope, grant.made_by) == (
        "refund",
        "agent",
        "agent",
        "alice",
    )
    assert grant.from_request == first.pending.id
    assert Matcher.from_wire(grant.match) == Matcher(arguments=ARGS)
    second = await desk.call(db)
    assert second.status == "next", "the grant approved it: nobody was asked"
    assert desk.ran == [ARGS]
    assert get_grant(db, grant.id).uses == 1
    [row] = list_decisions(db, AuditQuery(through=f"grant:{grant.id}"))[0]
    assert (row.outcome, row.run_id, row.request_id) == ("approved", "run_2", None)


async def test_the_use_past_max_uses_asks(db: Database):
    desk = Desk()
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms(max_uses=2))

    outcomes = [(await desk.call(db)).status for _ in range(3)]

    assert outcomes == ["next", "next", "pending"]
    [grant] = grants(db)
    assert (grant.uses, status_of(grant)) == (2, "used")


async def test_an_expired_grant_asks(db: Database):
    desk = Desk()
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms())
    [grant] = grants(db)
    with db.write() as s:
        row = s.get(GrantRow, grant.id)
        assert row is not None
        row.expires_at = row.created_at  # its hours have passed

    assert (await desk.call(db)).status == "pending"
    assert status_of(get_grant(db, grant.id)) == "expired"


async def test_a_revoked_grant_asks_from_that_moment(db: Database):
    desk = Desk()
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms())
    [grant] = grants(db)
    assert (await desk.call(db)).status == "next"

    revoked = revoke_grant(db, grant.id, ALICE)

    assert revoked.revoked_by == "alice"
    assert (await desk.call(db)).status == "pending"
    assert get_grant(db, grant.id).uses == 1


async def test_a_grant_covers_only_calls_its_matcher_matches(db: Database):
    desk = Desk()
    make_grant(db, _direct(Matcher(where=parse_constraints(["amount <= 100"]))))
    assert (await desk.call(db)).status == "pending", "the model asks for 500"

    make_grant(db, _direct(Matcher(where=parse_constraints(["amount <= 1000"]))))
    assert (await desk.call(db)).status == "next"


@pytest.mark.parametrize(
    ("scope", "covered", "not_covered"),
    [
        ("run", {"run_id": "run_1"}, {"run_id": "run_2"}),
        ("conversation", {"conversation_id": "conv_1"}, {"conversation_id": "conv_2"}),
        ("principal", {"started_by": "sam"}, {"started_by": "pat"}),
        ("principal", {"started_by": "sam"}, {"started_by": "sam", "agent": "other"}),
        ("agent", {"run_id": "run_9", "started_by": "pat"}, {"agent": "other"}),
        ("all", {"agent": "other"}, {"tool": "wire"}),
    ],
)
async def test_a_grant_covers_the_calls_of_its_scope(
    db: Database, scope: str, covered: dict[str, Any], not_covered: dict[str, Any]
):
    desk = Desk()
    first = await desk.call(db, conversation_id="conv_1", started_by="sam")
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms(scope=scope))
    [grant] = grants(db)
    assert grant.scope_id == {"run": "run_1", "conversation": "conv_1", "principal": "sam"}.get(
        scope
    )

    assert use_grant(db, _ask(call_id="c8", **not_covered)) is None
    assert use_grant(db, _ask(call_id="c9", **covered)) == grant.id


async def test_a_grant_of_a_maker_barred_from_self_approval_skips_their_own_runs(db: Database):
    desk = Desk(forbid_self_approval=True)
    first = await desk.call(db, started_by="sam")
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms())
    assert (await desk.call(db, started_by="alice")).status == "pending"
    assert (await desk.call(db, started_by="sam")).status == "next"


async def test_an_edit_with_a_grant_covers_the_edited_arguments(db: Database):
    desk = Desk()
    first = await desk.call(db)
    accept_answer(
        db, edit(first.pending.id, {"order": "17", "amount": 50}), decider=ALICE, grant=terms()
    )
    [grant] = grants(db)
    assert grant.match == {"arguments": {"order": "17", "amount": 50}}


@pytest.mark.parametrize(
    ("policy", "asked", "says"),
    [
        ({"grantable": False}, terms(), "takes no grants"),
        ({"quorum": 2}, terms(), "lets no grant stand for them"),
        ({"max_grant_scope": "conversation"}, terms(scope="agent"), "at most scope 'conversation'"),
        ({"max_grant_for": timedelta(hours=1)}, terms(), "last at most 1h"),
    ],
)
async def test_a_grant_the_policy_does_not_allow_is_refused_and_the_decision_with_it(
    db: Database, policy: dict[str, Any], asked: GrantTerms, says: str
):
    desk = Desk(**policy)
    first = await desk.call(db)
    before = snapshot(db)

    with pytest.raises(GrantRefused, match=says):
        accept_answer(db, approve(first.pending.id), decider=ALICE, grant=asked)

    assert snapshot(db) == before
    assert grants(db) == []


async def test_a_quorum_tool_takes_a_grant_where_its_policy_says_it_covers_the_quorum(db: Database):
    desk = Desk(quorum=2, grant_covers_quorum=True)
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms())
    assert (await desk.call(db)).status == "next"


async def test_an_ungrantable_tool_is_never_approved_by_a_grant(db: Database):
    desk = Desk(grantable=False)
    make_grant(db, _direct(Matcher()))
    assert (await desk.call(db)).status == "pending"


async def test_a_decline_or_a_relay_answer_makes_no_grant(db: Database):
    desk = Desk()
    first = await desk.call(db)
    with pytest.raises(GrantRefused, match="not with a decline"):
        accept_answer(db, decline(first.pending.id, "no"), decider=ALICE, grant=terms())
    assert grants(db) == []


async def test_only_an_administrator_makes_a_grant_directly(db: Database):
    for who in (ALICE, VIEWER, Decider(name="sam", role="submitter", via="api")):
        with pytest.raises(GrantRefused, match="may not make a grant directly") as refused:
            make_grant(db, _direct(Matcher(), maker=who))
        assert refused.value.forbidden
    assert grants(db) == []
    assert make_grant(db, _direct(Matcher())).made_by == "root"


async def test_a_grant_is_revoked_by_its_maker_or_an_administrator_only(db: Database):
    desk = Desk()
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms())
    [grant] = grants(db)

    with pytest.raises(GrantRefused, match="only its maker or an administrator") as refused:
        revoke_grant(db, grant.id, BOB)
    assert refused.value.forbidden
    assert revoke_grant(db, grant.id, ADMIN).revoked_by == "root"
    assert revoke_grant(db, grant.id, ALICE).revoked_by == "root", "revoked once"
    with pytest.raises(UnknownGrant):
        revoke_grant(db, "grt_nope", ADMIN)


async def test_a_call_run_again_is_approved_by_the_same_use(db: Database):
    make_grant(db, _direct(Matcher(), max_uses=5))
    ask = _ask("run_1", "c1")
    first = use_grant(db, ask)
    again = use_grant(db, ask)  # its worker died before the result was kept
    assert first is not None
    assert again == first
    assert get_grant(db, first).uses == 1


def test_grants_are_listed_by_status_and_paged(db: Database):
    made = [make_grant(db, _direct(Matcher(), max_uses=1)) for _ in range(5)]
    revoke_grant(db, made[0].id, ADMIN)
    assert use_grant(db, _ask("run_1", "c1")) is not None

    assert len(list_grants(db, GrantQuery(status="revoked"))[0]) == 1
    assert len(list_grants(db, GrantQuery(status="used"))[0]) == 1
    assert len(list_grants(db, GrantQuery(status="active"))[0]) == 3
    page, cursor = list_grants(db, GrantQuery(limit=2))
    seen = [g.id for g in page]
    while cursor is not None:
        page, cursor = list_grants(db, GrantQuery(limit=2, cursor=cursor))
        seen += [g.id for g in page]
    assert sorted(seen) == sorted(g.id for g in made)
    assert len(set(seen)) == 5


def _direct(matcher: Matcher, *, maker: Decider = ADMIN, max_uses: int | None = None) -> NewGrant:
    return NewGrant(
        tool="refund",
        agent="agent",
        scope="agent",
        scope_id=None,
        matcher=matcher,
        lasts=timedelta(hours=1),
        max_uses=max_uses,
        maker=maker,
    )


def _ask(
    run_id: str = "run_1",
    call_id: str = "c1",
    *,
    conversation_id: str | None = "conv_1",
    started_by: str | None = "sam",
    agent: str = "agent",
    tool: str = "refund",
) -> GrantAsk:
    return GrantAsk(
        run_id=run_id,
        call_id=call_id,
        call_key=f"{run_id}:1:{call_id}",
        agent=agent,
        tool=tool,
        arguments=ARGS,
        arguments_hash=arguments_digest(ARGS),
        conversation_id=conversation_id,
        started_by=started_by,
        caps=GrantCaps(),
    )


# Racing


def _race(url: str, worker: int, calls: int, go: Any, out: Any) -> None:
    db = Database(url)
    try:
        go.wait()
        used = [use_grant(db, _ask(f"run_{worker}_{n}", "c1")) for n in range(calls)]
        out.put(sum(1 for u in used if u is not None))
    finally:
        db.dispose()


def test_eight_racing_workers_use_a_fifty_use_grant_exactly_fifty_times(db: Database):
    grant = make_grant(db, _direct(Matcher(), max_uses=50))
    spawn = multiprocessing.get_context("spawn")
    go, out = spawn.Event(), spawn.Queue()
    workers = [spawn.Process(target=_race, args=(db.url, w, 25, go, out)) for w in range(8)]
    for w in workers:
        w.start()
    go.set()
    approved = sum(out.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0

    assert approved == 50, "200 calls, 50 uses"
    assert get_grant(db, grant.id).uses == 50
    rows = list_decisions(db, AuditQuery(through=f"grant:{grant.id}", limit=500))[0]
    assert len(rows) == 50


async def test_a_grant_never_covers_a_call_its_maker_could_not_approve(db: Database):
    desk = Desk(approvers=["finance"])
    first = await desk.call(db)
    accept_answer(db, approve(first.pending.id), decider=ALICE, grant=terms(scope="all"))
    [grant] = grants(db)
    assert (grant.agent, grant.maker_groups) == (None, ["finance"])

    leads_only = _ask(call_id="c7", agent="other")
    leads_only = dataclasses.replace(leads_only, approvers=("leads",))
    assert use_grant(db, leads_only) is None, "another agent's refund is for leads to approve"
    finance = dataclasses.replace(leads_only, call_key="run_1:1:c8", approvers=("finance", "x"))
    assert use_grant(db, finance) == grant.id


async def test_a_grant_revoked_while_a_turn_runs_approves_none_of_its_later_calls(db: Database):
    grant = make_grant(db, _direct(Matcher()))

    def revoked_meanwhile(args: dict[str, Any], ctx: ToolContext) -> bool:
        revoke_grant(
            db, grant.id, ADMIN
        )  # the turn has begun; the call has not reached its grant step
        return True

    desk = Desk(when=revoked_meanwhile)
    turn = await desk.call(db)

    assert turn.status == "pending"
    assert desk.ran == []
    assert get_grant(db, grant.id).uses == 0
