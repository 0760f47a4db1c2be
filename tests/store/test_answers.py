"""Rules 7 to 10: accepting an answer once, partial answers, applying them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import delete, event
from sqlmodel import col

from relayq import Answer, ResumeError
from relayq import transcript as tx
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer
from store import (
    Database,
    accept_answer,
    apply_answer_of,
    cancel_run,
    expire_requests,
    get_request,
    get_run,
    list_requests,
    settled,
    transcript,
)
from store.models import MessageRow, utcnow

from .driver import (
    ANSWER_TASK,
    TURN_TASK,
    halt_on_relay,
    model_of,
    outbox_rows,
    relay_kit,
    relay_turn,
    request_rows,
    run_turn,
    snapshot,
    start,
)

T = TypeVar("T")


def results(request_id: str, **outputs: str) -> Answer:
    return relay_answer(request_id, [RelayResult(id=k, output=v) for k, v in outputs.items()])


def tool_results(db: Database) -> list[tuple[str, str, bool]]:
    return [
        (m["tool_call_id"], m["content"], bool(m.get("relayq", {}).get("is_error")))
        for m in transcript(db, "run_1")
        if m["role"] == "tool"
    ]


def race(n: int, fn: Callable[[int], T]) -> list[T | Exception]:
    """Run `fn(0..n-1)` in n threads released together; each returns its value or its error."""
    barrier = threading.Barrier(n)

    def one(k: int) -> T | Exception:
        barrier.wait()
        try:
            return fn(k)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


# Rule 7


async def test_an_answer_to_an_unknown_request_is_refused_and_changes_nothing(db: Database):
    await halt_on_relay(db, "c1")
    before = snapshot(db)

    with pytest.raises(ResumeError, match="unknown request id 'req_nope'"):
        accept_answer(db, answer_output("req_nope", "x"))

    assert snapshot(db) == before


MISFITS: dict[str, Callable[[str], Answer]] = {
    "unknown call id": lambda rid: results(rid, c1="one", c9="nine"),
    "two results for a call": lambda rid: relay_answer(
        rid, [RelayResult(id="c1", output="a"), RelayResult(id="c1", output="b")]
    ),
    "shorthand for two calls": lambda rid: answer_output(rid, "one for all"),
    "results not a list of results": lambda rid: Answer(id=rid, data={"results": [{"x": 1}]}),
}


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
@pytest.mark.parametrize("misfit", MISFITS.values(), ids=MISFITS.keys())
async def test_an_answer_that_does_not_fit_is_refused_and_changes_nothing(
    db: Database, misfit: Callable[[str], Answer], partial: bool
):
    # Given a request for two calls
    _, _, turn = await halt_on_relay(db, "c1", "c2")
    assert turn.pending is not None
    before = snapshot(db)

    # When an answer that does not fit it comes
    with pytest.raises(ResumeError):
        accept_answer(db, misfit(turn.pending.id), answered_by="host", partial=partial)

    # Then the request is still open, unanswered, and nothing was queued
    assert snapshot(db) == before
    [row] = request_rows(db)
    assert (row.status, row.answer, row.answered_by) == ("open", None, None)
    assert outbox_rows(db, ANSWER_TASK) == []


async def test_a_misfit_after_a_partial_answer_keeps_the_partial_results(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", "c2")
    assert turn.pending is not None
    accept_answer(db, results(turn.pending.id, c1="one"), partial=True)
    before = snapshot(db)

    with pytest.raises(ResumeError, match="c9"):
        accept_answer(db, results(turn.pending.id, c9="nine"), partial=True)

    assert snapshot(db) == before


async def test_a_second_answer_to_a_request_is_refused_as_already_answered(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    accept_answer(db, answer_output(turn.pending.id, "first"), answered_by="alice")
    before = snapshot(db)

    with pytest.raises(ResumeError, match="already answered"):
        accept_answer(db, answer_output(turn.pending.id, "second"), answered_by="bob")

    assert snapshot(db) == before
    assert get_request(db, turn.pending.id).answered_by == "alice"


async def test_an_answer_after_the_request_expired_is_refused(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", request_ttl=timedelta(microseconds=1))
    assert turn.pending is not None
    before = snapshot(db)

    with pytest.raises(ResumeError, match="expired"):
        accept_answer(db, answer_output(turn.pending.id, "too late"))

    assert snapshot(db) == before


async def test_an_answer_to_a_request_the_sweeper_expired_is_refused(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", request_ttl=timedelta(minutes=1))
    assert turn.pending is not None
    expire_requests(db, now=utcnow() + timedelta(minutes=2))

    with pytest.raises(ResumeError, match="expired"):
        accept_answer(db, answer_output(turn.pending.id, "too late"))


async def test_an_answer_to_a_request_of_a_cancelled_run_is_refused(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    cancel_run(db, "run_1")
    before = snapshot(db)

    with pytest.raises(ResumeError, match="cancelled"):
        accept_answer(db, answer_output(turn.pending.id, "anyone?"))

    assert snapshot(db) == before


async def test_an_accepted_answer_records_who_answered_and_when(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    t0 = utcnow()

    accepted = accept_answer(db, answer_output(turn.pending.id, "42"), answered_by="alice")

    t1 = utcnow()
    assert (accepted.run_id, accepted.complete) == ("run_1", True)
    stored = get_request(db, turn.pending.id)
    assert (stored.status, stored.answered_by) == ("answered", "alice")
    assert stored.answered_at is not None
    assert t0 <= stored.answered_at <= t1
    assert stored.answer == answer_output(turn.pending.id, "42")
    [sent] = outbox_rows(db, ANSWER_TASK)
    assert [r.id for r in accepted.outbox] == [sent.id]
    assert (sent.args, sent.run_id, sent.queue) == ([turn.pending.id], "run_1", "relayq.answers")
    assert list_requests(db) == [], "no request is open any more"
    assert [r.request.id for r in list_requests(db, status="answered")] == [turn.pending.id]
    assert settled(db, "run_1") == ("pending", False), "an answer is on its way in"


# Rule 8


async def test_of_eight_concurrent_answers_to_one_request_exactly_one_is_accepted(db: Database):
    # Given a pending request and eight hosts, each with its own connection to the store
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    request_id = turn.pending.id
    hosts = [Database(db.url) for _ in range(8)]
    try:
        # When they all answer at once
        outcomes = race(
            8,
            lambda k: accept_answer(
                hosts[k], answer_output(request_id, f"answer {k}"), answered_by=f"host-{k}"
            ),
        )
    finally:
        for host in hosts:
            host.dispose()

    # Then one is accepted, the others are told it was already answered
    won = [k for k, o in enumerate(outcomes) if not isinstance(o, Exception)]
    lost = [o for o in outcomes if isinstance(o, Exception)]
    assert len(won) == 1, outcomes
    assert all(isinstance(o, ResumeError) and "already answered" in str(o) for o in lost), lost
    assert len(outbox_rows(db, ANSWER_TASK)) == 1
    stored = get_request(db, request_id)
    assert stored.answered_by == f"host-{won[0]}"
    assert stored.answer == answer_output(request_id, f"answer {won[0]}")


async def test_of_concurrent_applications_of_one_answer_exactly_one_queues_a_turn(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    request_id = turn.pending.id
    accept_answer(db, answer_output(request_id, "42"))
    newest = max(r.id or 0 for r in outbox_rows(db))
    workers = [Database(db.url) for _ in range(4)]
    try:
        outcomes = race(4, lambda k: apply_answer_of(workers[k], request_id))
    finally:
        for worker in workers:
            worker.dispose()

    assert sorted(len(o) for o in outcomes if isinstance(o, list)) == [0, 0, 0, 1], outcomes
    assert len([r for r in outbox_rows(db, TURN_TASK) if (r.id or 0) > newest]) == 1
    assert tool_results(db) == [("c1", "42", False)]


# Rule 9


@pytest.mark.parametrize("last_partial", [True, False], ids=["last-partial", "last-whole"])
async def test_partial_answers_accumulate_until_every_call_has_a_result(
    db: Database, last_partial: bool
):
    # Given a request for three calls
    _, _, turn = await halt_on_relay(db, "c1", "c2", "c3")
    assert turn.pending is not None
    rid = turn.pending.id

    # When the host answers them one at a time, out of order
    second = accept_answer(db, results(rid, c2="two"), partial=True)
    assert (second.complete, second.outbox) == (False, [])
    first = accept_answer(db, results(rid, c1="one"), partial=True)
    assert (first.complete, first.outbox) == (False, [])

    # Then the request stays open with the results so far, and nothing is queued
    [row] = request_rows(db)
    assert row.status == "open"
    assert row.answer is not None
    assert [(r["id"], r["output"]) for r in row.answer["data"]["results"]] == [
        ("c1", "one"),
        ("c2", "two"),
    ]
    assert outbox_rows(db, ANSWER_TASK) == []
    assert settled(db, "run_1") == ("pending", True)

    # And a second result for a call is refused, changing nothing
    before = snapshot(db)
    with pytest.raises(ResumeError, match="c2"):
        accept_answer(db, results(rid, c2="two again"), partial=True)
    assert snapshot(db) == before

    # And the last call's result closes the request
    last = accept_answer(db, results(rid, c3="three"), partial=last_partial)
    assert last.complete
    [row] = request_rows(db)
    assert row.status == "answered"
    assert len(outbox_rows(db, ANSWER_TASK)) == 1 == len(last.outbox)

    # And applying it writes all three results, in call order
    apply_answer_of(db, rid)
    assert tool_results(db) == [("c1", "one", False), ("c2", "two", False), ("c3", "three", False)]


async def test_a_decline_after_partial_results_keeps_them_and_declines_the_rest(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", "c2", "c3")
    assert turn.pending is not None
    rid = turn.pending.id
    accept_answer(db, results(rid, c2="two"), partial=True)

    declined = accept_answer(db, answer_declined(rid, "no thanks"))

    assert declined.complete
    assert request_rows(db)[0].status == "answered"
    apply_answer_of(db, rid)
    assert tool_results(db) == [
        ("c1", "declined: no thanks", True),
        ("c2", "two", False),
        ("c3", "declined: no thanks", True),
    ]


async def test_a_partial_answer_with_every_result_closes_the_request(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", "c2")
    assert turn.pending is not None

    accepted = accept_answer(db, results(turn.pending.id, c2="b", c1="a"), partial=True)

    assert accepted.complete
    apply_answer_of(db, turn.pending.id)
    assert tool_results(db) == [("c1", "a", False), ("c2", "b", False)]


# Rule 10


def tool_messages_per_call(messages: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in messages:
        if m["role"] == "tool":
            out[m["tool_call_id"]] = out.get(m["tool_call_id"], 0) + 1
    return out


async def test_applying_an_answer_replaces_the_placeholders_and_queues_the_next_turn(
    db: Database,
):
    # Given an accepted answer to a request of three calls
    kit, model, turn = await halt_on_relay(db, "c1", "c2", "c3", final="finished")
    assert turn.pending is not None
    accept_answer(db, results(turn.pending.id, c1="one", c2="two", c3="three"))
    version = get_run(db, "run_1").version

    # When it is applied
    sent = apply_answer_of(db, turn.pending.id)

    # Then every call has exactly one result, none waits, and the run goes on
    messages = transcript(db, "run_1")
    assert tool_messages_per_call(messages) == {"c1": 1, "c2": 1, "c3": 1}
    assert tx.open_requests(messages) == []
    run = get_run(db, "run_1")
    assert (run.status, run.version) == ("queued", version + 1)
    # (the outbox keeps only the new message: the run's earlier ones have had their effect)
    [row] = outbox_rows(db)
    assert [r.id for r in sent] == [row.id]
    assert row.args == ["run_1", version + 1]
    assert request_rows(db)[0].applied
    # And the next turn finishes the run
    assert (await run_turn(db, "run_1", kit, model)).status == "done"
    assert get_run(db, "run_1").text == "finished"


async def test_accepting_an_answer_reads_no_transcript_it_is_applied_once_by_the_task(
    db: Database,
):
    # Given a run halted on a request of two calls
    _, _, turn = await halt_on_relay(db, "c1", "c2")
    assert turn.pending is not None
    halted = transcript(db, "run_1")
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    # When an answer is accepted (checked against the request's calls, by id)
    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        accept_answer(db, results(turn.pending.id, c1="one", c2="two"))
        with pytest.raises(ResumeError):
            accept_answer(db, results(turn.pending.id, c9="unknown"))
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", seen)

    # Then the transcript was neither read nor written: however long the
    # conversation, an answer costs the same, and only the task applies it
    assert statements
    assert not [s for s in statements if "relayq_messages" in s]
    assert transcript(db, "run_1") == halted
    apply_answer_of(db, turn.pending.id)
    assert [(i, out) for i, out, _ in tool_results(db)] == [("c1", "one"), ("c2", "two")]


async def test_an_answer_its_transcript_no_longer_fits_fails_the_run_saying_why(db: Database):
    # Given an accepted answer, and a transcript changed behind the store's back
    # (the placeholders it would replace are gone)
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    accept_answer(db, answer_output(turn.pending.id, "42"))
    with db.write() as s:
        s.execute(delete(MessageRow).where(col(MessageRow.role) == "tool"))

    # When the answer task runs
    sent = apply_answer_of(db, turn.pending.id)

    # Then the run fails with the reason, rather than wait for an answer it has
    run = get_run(db, "run_1")
    assert sent == []
    assert run.status == "failed"
    assert run.error is not None
    assert run.error.startswith(f"answer to {turn.pending.id} not applied: ")
    assert request_rows(db)[0].applied
    assert apply_answer_of(db, turn.pending.id) == []


async def test_applying_an_answer_twice_queues_one_turn(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    accept_answer(db, answer_output(turn.pending.id, "42"))
    apply_answer_of(db, turn.pending.id)
    before = snapshot(db)

    assert apply_answer_of(db, turn.pending.id) == []
    assert snapshot(db) == before


async def test_a_redelivered_answer_task_does_nothing_once_the_run_halted_again(db: Database):
    # Given an answer applied, and a next turn that halted on a new request
    kit = await relay_kit("lookup")
    model = model_of(relay_turn(("c1", "lookup")), relay_turn(("c2", "lookup")))
    start(db)
    first = await run_turn(db, "run_1", kit, model)
    assert first.pending is not None
    accept_answer(db, answer_output(first.pending.id, "one"))
    apply_answer_of(db, first.pending.id)
    second = await run_turn(db, "run_1", kit, model)
    assert second.pending is not None
    assert get_run(db, "run_1").status == "pending"
    before = snapshot(db)

    # When the first answer's task is delivered again
    sent = apply_answer_of(db, first.pending.id)

    # Then it changes nothing
    assert sent == []
    assert snapshot(db) == before


async def test_an_answer_to_a_run_cancelled_before_it_was_applied_is_not_applied(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    accept_answer(db, answer_output(turn.pending.id, "42"))
    cancel_run(db, "run_1")
    messages = transcript(db, "run_1")
    sent_before = outbox_rows(db)

    assert apply_answer_of(db, turn.pending.id) == []

    assert transcript(db, "run_1") == messages
    assert outbox_rows(db) == sent_before
    assert get_run(db, "run_1").status == "cancelled"


@pytest.mark.parametrize("request_id", ["open", "req_unknown"])
async def test_an_unanswered_or_unknown_request_is_not_applied(db: Database, request_id: str):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    before = snapshot(db)

    rid = turn.pending.id if request_id == "open" else request_id
    assert apply_answer_of(db, rid) == []

    assert snapshot(db) == before
