"""Relay calls leased to hosts (`store.leases`): one host at a time, and every way a lease ends.

Each rule on SQLite and PostgreSQL (the `db` fixture), with runs halted on relay
requests the way a worker halts them (`tests.store.driver`).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import event

from relayq import RequestClosed
from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    Decider,
    RequestPage,
    RequestQuery,
    accept_answer,
    apply_answer_of,
    cancel_run,
    decisions_of,
    get_request,
    get_requests,
    get_run,
    list_requests,
    migrate,
    query_requests,
    transcript,
)
from store.leases import (
    Lease,
    LeaseLost,
    LeaseRefused,
    UnknownLease,
    heartbeat_lease,
    lease_calls,
    lease_result,
    release_lease,
)
from store.migrate import alembic_config
from store.models import utcnow
from tests.relayq.scripted import text

from .driver import model_of, outbox_rows, relay_kit, relay_turn, run_turn, start

MINUTE = timedelta(minutes=1)
HOST = Decider(name="laptop-1", role="host", via="api")


async def halted(
    db: Database, *pairs: tuple[str, str], run_id: str = "run_1", ttl: timedelta | None = None
) -> str:
    """A run halted on one request carrying a relay call per (call id, tool); its id."""
    kit = await relay_kit("shell", "browser_click")
    start(db, run_id=run_id)
    model = model_of(relay_turn(*pairs), text("finished"))
    turn = await run_turn(db, run_id, kit, model, request_ttl=ttl)
    assert turn.pending is not None
    return turn.pending.id


def lease(db: Database, tools: list[str] | None = None, *, limit: int = 10, **kw) -> list[Lease]:
    return lease_calls(
        db, tools=tools, holder=kw.pop("holder", "laptop-1"), limit=limit, lease=MINUTE, **kw
    )


def refusals(db: Database, lease_id: str, now: datetime) -> list[str]:
    """Why a result, a heartbeat and a release on the lease are each refused (LeaseLost)."""
    reasons = []
    for act in (
        lambda: lease_result(db, lease_id, output="x", is_error=False, host=HOST, now=now),
        lambda: heartbeat_lease(db, lease_id, now=now),
        lambda: release_lease(db, lease_id, now=now),
    ):
        with pytest.raises(LeaseLost) as lost:
            act()
        reasons.append(lost.value.reason)
    return reasons


async def test_a_host_leases_the_calls_of_its_tools_each_with_its_arguments_and_attempt_one(
    db: Database,
):
    request_id = await halted(db, ("c1", "shell"), ("c2", "browser_click"), ("c3", "shell"))

    leased = lease(db, ["shell"])

    assert [(x.call_id, x.name, x.attempt) for x in leased] == [
        ("c1", "shell", 1),
        ("c3", "shell", 1),
    ]
    assert {x.request_id for x in leased} == {request_id}
    assert {x.run_id for x in leased} == {"run_1"}
    assert leased[0].arguments == {"n": "c1"}
    assert leased[0].expires_at > utcnow() + timedelta(seconds=50)
    assert len({x.lease_id for x in leased}) == 2
    # the other tool's call is still there for its own host; nothing twice
    assert [x.call_id for x in lease(db, None)] == ["c2"]
    assert lease(db, None) == []


async def test_limit_takes_the_oldest_calls_first(db: Database):
    await halted(db, ("a1", "shell"), run_id="run_a")
    await halted(db, ("b1", "shell"), ("b2", "shell"), run_id="run_b")

    assert [x.call_id for x in lease(db, ["shell"], limit=2)] == ["a1", "b1"]
    assert [x.call_id for x in lease(db, ["shell"], limit=2)] == ["b2"]


async def test_racing_hosts_never_lease_one_call_twice(db: Database):
    for n in range(20):
        await halted(db, *[(f"r{n}c{i}", "shell") for i in range(5)], run_id=f"run_{n}")
    got: list[list[Lease]] = [[] for _ in range(4)]

    def host(i: int) -> None:
        for _ in range(100):  # bounded: a build that offers a leased call again never runs dry
            leased = lease(db, ["shell"], limit=3, holder=f"host-{i}")
            if not leased:
                return
            got[i].extend(leased)

    threads = [threading.Thread(target=host, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    every = [(x.request_id, x.call_id) for leases in got for x in leases]
    assert len(every) == 100
    assert len(set(every)) == 100


async def test_an_expired_lease_offers_the_call_again_with_the_next_attempt(db: Database):
    await halted(db, ("c1", "shell"))
    [first] = lease(db, ["shell"])

    assert lease(db, ["shell"]) == [], "held while the lease holds"
    later = utcnow() + 2 * MINUTE
    [second] = lease(db, ["shell"], now=later, holder="laptop-2")

    assert (second.call_id, second.attempt, second.holder) == ("c1", 2, "laptop-2")
    assert refusals(db, first.lease_id, later) == ["superseded"] * 3


async def test_a_lease_past_its_time_takes_no_result_heartbeat_or_release(db: Database):
    request_id = await halted(db, ("c1", "shell"))
    [held] = lease(db, ["shell"])
    late = held.expires_at + timedelta(seconds=1)

    assert refusals(db, held.lease_id, late) == ["expired"] * 3
    assert get_request(db, request_id).status == "open"
    assert get_request(db, request_id).answer is None


async def test_a_lease_of_a_request_past_its_deadline_takes_no_heartbeat_result_or_release(
    db: Database,
):
    # Given a call leased for a minute, of a request whose deadline is in 5 s (not swept)
    request_id = await halted(db, ("c1", "shell"), ttl=timedelta(seconds=5))
    [held] = lease(db, ["shell"])
    past_deadline = utcnow() + timedelta(seconds=10)
    assert past_deadline < held.expires_at

    # Then past the deadline, the lease ends with its request, whatever the sweep did
    assert refusals(db, held.lease_id, past_deadline) == ["ended"] * 3
    assert get_request(db, request_id).answer is None


async def test_a_heartbeat_extends_the_lease_by_its_length(db: Database):
    await halted(db, ("c1", "shell"))
    [held] = lease(db, ["shell"])
    later = utcnow() + timedelta(seconds=50)

    until = heartbeat_lease(db, held.lease_id, now=later)

    assert until == later + MINUTE
    assert lease(db, ["shell"], now=later + timedelta(seconds=30)) == [], "still held"
    lease_result(db, held.lease_id, output="ok", is_error=False, host=HOST, now=until - MINUTE / 2)


async def test_a_released_call_is_offered_again_at_once_and_its_lease_is_dead(db: Database):
    await halted(db, ("c1", "shell"))
    [held] = lease(db, ["shell"])

    release_lease(db, held.lease_id)

    [again] = lease(db, ["shell"], holder="laptop-2")
    assert again.attempt == 2
    with pytest.raises(LeaseLost) as lost:
        heartbeat_lease(db, held.lease_id)
    assert lost.value.reason == "released"


async def test_the_last_result_answers_the_request_once_and_the_run_goes_on(db: Database):
    request_id = await halted(db, ("c1", "shell"), ("c2", "browser_click"))
    leases = {x.call_id: x for x in lease(db, None)}

    first = lease_result(db, leases["c1"].lease_id, output="ls ok", is_error=False, host=HOST)
    assert not first.accepted.complete
    assert get_request(db, request_id).status == "open"
    assert outbox_rows(db, "relayq.apply_answer") == []
    last = lease_result(db, leases["c2"].lease_id, output="no tab", is_error=True, host=HOST)

    assert last.accepted.complete
    assert get_request(db, request_id).status == "answered"
    assert (last.request_id, last.call_id) == (request_id, "c2")
    assert len(last.accepted.outbox) == 1
    apply_answer_of(db, request_id)
    tools = [m for m in transcript(db, "run_1") if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tools] == [("c1", "ls ok"), ("c2", "no tab")]
    assert get_run(db, "run_1").status == "queued"
    # The audit trail names the host for each result
    decisions = decisions_of(db, request_id)
    assert [(d.actor, d.role, d.call_ids) for d in decisions] == [
        ("laptop-1", "host", ["c1"]),
        ("laptop-1", "host", ["c2"]),
    ]
    with pytest.raises(LeaseLost) as lost:
        lease_result(db, leases["c1"].lease_id, output="again", is_error=False, host=HOST)
    assert lost.value.reason == "done"


async def test_a_person_answering_meanwhile_ends_the_leases(db: Database):
    request_id = await halted(db, ("c1", "shell"), ("c2", "shell"))
    leases = {x.call_id: x for x in lease(db, ["shell"])}

    # A person answers c1 alone (partial), then the rest
    accept_answer(
        db, relay_answer(request_id, [RelayResult(id="c1", output="by hand")]), partial=True
    )
    with pytest.raises(LeaseLost) as lost:
        lease_result(db, leases["c1"].lease_id, output="late", is_error=False, host=HOST)
    assert lost.value.reason == "ended"
    accept_answer(
        db, relay_answer(request_id, [RelayResult(id="c2", output="by hand")]), partial=True
    )
    with pytest.raises(LeaseLost):
        heartbeat_lease(db, leases["c2"].lease_id)

    assert get_request(db, request_id).status == "answered"
    assert lease(db, None) == []


async def test_an_expired_cancelled_or_answered_requests_calls_are_never_offered(db: Database):
    soon = await halted(db, ("e1", "shell"), run_id="run_e", ttl=timedelta(seconds=5))
    await halted(db, ("x1", "shell"), run_id="run_x")
    answered = await halted(db, ("a1", "shell"), run_id="run_a")
    cancel_run(db, "run_x")
    accept_answer(db, relay_answer(answered, [RelayResult(id="a1", output="done")]))

    later = utcnow() + timedelta(seconds=10)
    assert lease(db, None, now=later) == [], "past its deadline, swept or not"
    assert get_request(db, soon).status == "open"


async def test_an_unknown_lease_is_its_own_error_and_a_closed_request_refuses(db: Database):
    request_id = await halted(db, ("c1", "shell"))
    [held] = lease(db, ["shell"])

    with pytest.raises(UnknownLease):
        heartbeat_lease(db, "lease_nope")
    cancel_run(db, "run_1")
    with pytest.raises(LeaseLost) as lost:
        lease_result(db, held.lease_id, output="x", is_error=False, host=HOST)
    assert lost.value.reason == "ended"
    with pytest.raises(RequestClosed):
        accept_answer(db, relay_answer(request_id, [RelayResult(id="c1", output="x")]))


async def test_calls_open_before_the_migration_are_offered_after_it(db: Database):
    # Given a store at the revision before leases, with a request open, one call answered
    request_id = await halted(db, ("c1", "shell"), ("c2", "shell"))
    accept_answer(db, relay_answer(request_id, [RelayResult(id="c1", output="x")]), partial=True)
    command.downgrade(alembic_config(db), "0010")

    # When it is brought to head
    migrate(db)

    # Then the open call is offered, and the answered one is not
    assert [x.call_id for x in lease(db, ["shell"])] == ["c2"]


async def test_only_the_holder_may_use_a_lease_and_only_for_its_tools(db: Database):
    request_id = await halted(db, ("c1", "shell"))
    [held] = lease(db, ["shell"])

    with pytest.raises(LeaseRefused):
        heartbeat_lease(db, held.lease_id, holder="laptop-2")
    with pytest.raises(LeaseRefused):
        release_lease(db, held.lease_id, holder="laptop-1", tools={"browser_click"})
    other = Decider(name="laptop-2", role="host", via="api")
    with pytest.raises(LeaseRefused):
        lease_result(db, held.lease_id, output="x", is_error=False, host=other)

    assert get_request(db, request_id).answer is None
    heartbeat_lease(db, held.lease_id, holder="laptop-1", tools={"shell"})


# -- who holds a call, and until when: every reader of requests shows it -------------------


async def test_every_reader_of_requests_shows_who_holds_each_call_and_until_when(db: Database):
    # Given a request of three calls: c3 held by one host, c1 by another, c2 by none
    request_id = await halted(db, ("c1", "shell"), ("c2", "browser_click"), ("c3", "shell"))
    [c1, c3] = lease(db, ["shell"])
    release_lease(db, c1.lease_id)
    [c1_again] = lease(db, ["shell"], holder="laptop-2")

    # Then each reader shows the two holds, in call order, with the host, lease end and try
    expected = [("c1", "laptop-2", c1_again.expires_at, 2), ("c3", "laptop-1", c3.expires_at, 1)]
    readers = {
        "get_request": get_request(db, request_id),
        "get_requests": get_requests(db, [request_id])[request_id],
        "query_requests": query_requests(db).items[0],
        "list_requests": list_requests(db)[0],
    }
    for reader, stored in readers.items():
        assert [(h.call_id, h.host, h.until, h.attempt) for h in stored.holds] == expected, reader
    # ... and the JSON of the API and `relayq pending --json` carries them in camelCase
    shown = RequestPage.of(query_requests(db)).model_dump(mode="json", by_alias=True)
    assert [h["callId"] for h in shown["items"][0]["holds"]] == ["c1", "c3"]
    assert set(shown["items"][0]["holds"][0]) == {"callId", "host", "until", "attempt"}


async def test_a_lapsed_released_or_answered_lease_is_no_hold(db: Database):
    # Given a call leased long ago (its lease lapsed), one released, and one answered
    request_id = await halted(db, ("c1", "shell"), ("c2", "shell"), ("c3", "shell"))
    assert len(lease(db, ["shell"], now=utcnow() - 2 * MINUTE)) == 3
    [c1, c2] = lease(db, ["shell"], limit=2)
    assert (c1.call_id, c1.attempt) == ("c1", 2)
    release_lease(db, c2.lease_id)
    lease_result(db, c1.lease_id, output="done", is_error=False, host=HOST)

    # Then none of the three shows as held
    assert get_request(db, request_id).holds == []


async def test_a_request_no_host_holds_shows_no_hold_and_costs_no_query(db: Database):
    # Given an open relay request no host leased, an answered one, and the listing's
    # statements counted
    await halted(db, ("c1", "shell"))
    done = await halted(db, ("d1", "shell"), run_id="run_2")
    accept_answer(db, relay_answer(done, [RelayResult(id="d1", output="done")]))
    statements: list[str] = []

    def count(conn: object, cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        # When its answered and open listings are read
        [shown] = query_requests(db).items
        [answered] = query_requests(db, RequestQuery(status="answered")).items
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    # Then neither has holds; and only the page holding an open relay request looked for
    # any: the page of an answered one (no host can hold its calls) did not
    assert shown.holds == answered.holds == []
    assert answered.request.id == done
    assert sum("relayq_relay_calls" in s for s in statements) == 1
