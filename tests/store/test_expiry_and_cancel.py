"""Rules 11 and 12: requests that expire, runs that are cancelled."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    UnknownRun,
    accept_answer,
    apply_answer_of,
    cancel_requested,
    cancel_run,
    claim_turn,
    expire_requests,
    fail_run,
    finish_cancelled,
    get_request,
    get_run,
    settled,
    transcript,
)
from store.models import utcnow
from tests.relayq.scripted import echo_tool_outputs, text

from .driver import (
    ANSWER_TASK,
    LEASE,
    halt_on_relay,
    local_kit,
    model_of,
    outbox_rows,
    request_rows,
    run_turn,
    snapshot,
    start,
)

TTL = timedelta(minutes=10)


def tool_results(db: Database) -> list[tuple[str, str, bool]]:
    return [
        (m["tool_call_id"], m["content"], bool(m.get("relayq", {}).get("is_error")))
        for m in transcript(db, "run_1")
        if m["role"] == "tool"
    ]


# Rule 11


async def test_an_open_request_is_not_expired_before_its_time(db: Database):
    await halt_on_relay(db, "c1", request_ttl=TTL)
    [row] = request_rows(db)
    assert row.expires_at is not None
    before = snapshot(db)

    assert expire_requests(db, now=row.expires_at - timedelta(seconds=1)) == []

    assert snapshot(db) == before


async def test_an_expired_request_gives_its_calls_error_results_and_the_run_goes_on(
    db: Database,
):
    # Given a run halted on two calls, with a request that expires in ten minutes
    kit, _, turn = await halt_on_relay(db, "c1", "c2", request_ttl=TTL, on_expiry="error")
    assert turn.pending is not None
    [row] = request_rows(db)
    assert row.expires_at is not None

    # When the sweeper looks after it expired
    sent = expire_requests(db, now=row.expires_at + timedelta(seconds=1))

    # Then the request is expired and its answer task queued
    stored = get_request(db, turn.pending.id)
    assert (stored.status, stored.answered_by) == ("expired", "relayq:expiry")
    [answer_task] = outbox_rows(db, ANSWER_TASK)
    assert [r.id for r in sent] == [answer_task.id]
    assert answer_task.args == [turn.pending.id]
    # And applying it gives each call an error result saying it expired
    apply_answer_of(db, turn.pending.id)
    results = tool_results(db)
    assert [(call_id, is_error) for call_id, _, is_error in results] == [
        ("c1", True),
        ("c2", True),
    ]
    assert all("expired" in output for _, output, _ in results), results
    assert get_run(db, "run_1").status == "queued"
    # And the model sees them on the next turn
    turn = await run_turn(db, "run_1", kit, model_of(echo_tool_outputs))
    assert turn.status == "done"
    assert "expired" in turn.text


async def test_an_expired_request_keeps_the_partial_results_it_had(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", "c2", request_ttl=TTL)
    assert turn.pending is not None
    answer = relay_answer(turn.pending.id, [RelayResult(id="c2", output="two")])
    accept_answer(db, answer, partial=True)

    expire_requests(db, now=utcnow() + 2 * TTL)
    apply_answer_of(db, turn.pending.id)

    [(c1, out1, err1), (c2, out2, err2)] = tool_results(db)
    assert (c1, err1, "expired" in out1) == ("c1", True, True)
    assert (c2, out2, err2) == ("c2", "two", False)


async def test_an_expired_request_whose_expiry_cancels_cancels_the_run(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", request_ttl=TTL, on_expiry="cancel")
    assert turn.pending is not None
    sent = expire_requests(db, now=utcnow() + 2 * TTL)

    assert sent == []
    assert outbox_rows(db) == [], "a cancelled run's messages are all spent"
    assert get_request(db, turn.pending.id).status == "expired"
    run = get_run(db, "run_1")
    assert (run.status, run.cancel_requested) == ("cancelled", True)
    assert apply_answer_of(db, turn.pending.id) == []
    assert settled(db, "run_1") == ("cancelled", True)


# Rule 12


async def test_cancelling_a_queued_run_cancels_it_at_once(db: Database):
    start(db)

    assert cancel_run(db, "run_1") == "cancelled"

    run = get_run(db, "run_1")
    assert (run.status, run.cancel_requested) == ("cancelled", True)
    assert claim_turn(db, "run_1", 0, task_id="t", lease=LEASE) is None, "its message is stale"
    assert get_run(db, "run_1").status == "cancelled"


async def test_cancelling_a_pending_run_cancels_it_and_its_open_request(db: Database):
    _, _, turn = await halt_on_relay(db, "c1", "c2")
    assert turn.pending is not None

    assert cancel_run(db, "run_1") == "cancelled"

    assert get_run(db, "run_1").status == "cancelled"
    assert get_request(db, turn.pending.id).status == "cancelled"
    assert settled(db, "run_1") == ("cancelled", True)


async def test_cancelling_a_running_run_asks_its_worker_to_stop_at_the_next_boundary(
    db: Database,
):
    # Given a run a worker is running
    start(db)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    assert not cancel_requested(db, "run_1")

    # When it is cancelled
    assert cancel_run(db, "run_1") == "running"

    # Then it runs on, flagged, until its worker sees the flag and stops it
    run = get_run(db, "run_1")
    assert (run.status, run.cancel_requested, run.version) == ("running", True, held.version)
    assert cancel_requested(db, "run_1")
    finish_cancelled(db, held)
    assert get_run(db, "run_1").status == "cancelled"


async def _done(db: Database) -> None:
    start(db)
    await run_turn(db, "run_1", await local_kit(), model_of(text("done")))


async def _failed(db: Database) -> None:
    start(db)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    fail_run(db, held, "model gone")


async def _cancelled(db: Database) -> None:
    start(db)
    cancel_run(db, "run_1")


FINISHED: dict[str, Callable[[Database], Awaitable[None]]] = {
    "done": _done,
    "failed": _failed,
    "cancelled": _cancelled,
}


@pytest.mark.parametrize("finish", FINISHED.values(), ids=FINISHED.keys())
async def test_cancelling_a_finished_run_leaves_it_as_it_is(
    db: Database, finish: Callable[[Database], Awaitable[None]]
):
    await finish(db)
    status = get_run(db, "run_1").status
    before = snapshot(db)

    assert cancel_run(db, "run_1") == status

    assert snapshot(db) == before


def test_cancelling_an_unknown_run_is_an_unknown_run_error(db: Database):
    with pytest.raises(UnknownRun) as raised:
        cancel_run(db, "run_nope")

    assert raised.value.run_id == "run_nope"
    assert "run_nope" in str(raised.value)
