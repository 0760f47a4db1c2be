"""Rules 2 and 3: claiming a turn is a compare-and-swap, and a lost claim writes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from relayq import transcript as tx
from relayq.loop import Turn
from store import (
    Claim,
    Database,
    StaleClaim,
    cancel_requested,
    cancel_run,
    claim_turn,
    fail_run,
    finish_cancelled,
    finish_turn,
    get_run,
    retry_turn,
    save_reply,
    sweep,
    transcript,
)
from store.models import utcnow
from tests.relayq.scripted import text

from .driver import (
    LEASE,
    halt_on_relay,
    local_kit,
    message_rows,
    model_of,
    run_turn,
    snapshot,
    start,
)


def claim(db: Database, version: int, task_id: str | None = "task-1") -> Claim | None:
    return claim_turn(db, "run_1", version, task_id=task_id, lease=LEASE)


def test_a_queued_run_is_claimed_at_its_version(db: Database):
    start(db)

    held = claim(db, 0)

    assert held is not None
    assert (held.run_id, held.version, held.agent, held.conversation_id) == (
        "run_1",
        1,
        "agent",
        "run_1",
    )
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.claimed_by) == ("running", 1, "task-1")
    assert run.lease_until is not None
    assert run.lease_until > utcnow()


@pytest.mark.parametrize("version", [1, 7, -1])
def test_a_message_for_another_version_claims_nothing(db: Database, version: int):
    start(db)

    assert claim(db, version) is None
    assert get_run(db, "run_1").status == "queued"


async def pending_run(db: Database) -> None:
    await halt_on_relay(db, "c1")


async def done_run(db: Database) -> None:
    start(db)
    await run_turn(db, "run_1", await local_kit(), model_of(text("done")))


async def cancelled_run(db: Database) -> None:
    start(db)
    cancel_run(db, "run_1")


NOT_QUEUED: dict[str, Callable[[Database], Awaitable[None]]] = {
    "pending": pending_run,
    "done": done_run,
    "cancelled": cancelled_run,
}


@pytest.mark.parametrize("make", NOT_QUEUED.values(), ids=NOT_QUEUED.keys())
async def test_a_run_that_is_not_queued_is_not_claimed_even_at_its_version(
    db: Database, make: Callable[[Database], Awaitable[None]]
):
    await make(db)
    run = get_run(db, "run_1")
    before = snapshot(db)

    assert claim(db, run.version) is None
    assert snapshot(db) == before


def test_an_unknown_run_claims_nothing(db: Database):
    assert claim_turn(db, "nope", 0, task_id="t", lease=LEASE) is None


@pytest.mark.parametrize("second_task", ["task-2", None])
def test_a_duplicate_message_for_a_claimed_version_claims_nothing(
    db: Database, second_task: str | None
):
    start(db)
    first = claim(db, 0, task_id="task-1")

    second = claim(db, 0, task_id=second_task)

    assert first is not None
    assert second is None
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.claimed_by) == ("running", 1, "task-1")


def test_a_message_without_a_task_id_cannot_take_over_a_run_claimed_without_one(db: Database):
    start(db)
    assert claim(db, 0, task_id=None) is not None

    assert claim(db, 0, task_id=None) is None


def test_a_stale_version_claims_nothing_after_the_run_moved_on(db: Database):
    start(db)
    held = claim(db, 0)
    assert held is not None
    retry_turn(db, held, error="model down", countdown=0)  # queued again, at version 2

    assert claim(db, 0, task_id="task-2") is None
    assert claim(db, 1, task_id="task-2") is None
    assert claim(db, 2, task_id="task-2") is not None


def test_a_redelivery_of_the_same_task_takes_over_a_running_run_with_a_higher_version(
    db: Database,
):
    start(db)
    first = claim(db, 0, task_id="task-1")

    again = claim(db, 0, task_id="task-1")

    assert first is not None
    assert again is not None
    assert again.version > first.version
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.claimed_by) == ("running", again.version, "task-1")


def test_another_task_cannot_take_over_a_running_run(db: Database):
    start(db)
    first = claim(db, 0, task_id="task-1")
    assert first is not None

    assert claim(db, first.version, task_id="task-2") is None
    assert claim(db, 0, task_id="task-2") is None
    assert get_run(db, "run_1").version == first.version


def requeued_by_the_sweeper(db: Database) -> int:
    sweep(db, now=utcnow() + LEASE + timedelta(minutes=1))
    return get_run(db, "run_1").version


def redelivered(db: Database) -> int:
    return 0


@pytest.mark.parametrize("then_claimed_at", [requeued_by_the_sweeper, redelivered])
def test_a_run_asked_to_cancel_is_cancelled_instead_of_claimed(
    db: Database, then_claimed_at: Callable[[Database], int]
):
    # Given a running run that was asked to cancel while its worker held it
    start(db)
    assert claim(db, 0, task_id="task-1") is not None
    assert cancel_run(db, "run_1") == "running"
    assert cancel_requested(db, "run_1")

    # When its turn message comes again (requeued after the lease, or redelivered)
    version = then_claimed_at(db)
    claimed = claim(db, version, task_id="task-1")

    # Then nobody gets the run: it is cancelled
    assert claimed is None
    run = get_run(db, "run_1")
    assert (run.status, run.claimed_by, run.lease_until) == ("cancelled", None, None)


# Rule 3


def _reply(db: Database, held: Claim) -> None:
    msgs = transcript(db, "run_1")
    save_reply(db, held, [*msgs, tx.assistant_message("late reply", [], None)])


def _finish(db: Database, held: Claim) -> None:
    before = transcript(db, "run_1")
    after = [*before, tx.assistant_message("late answer", [], None)]
    turn = Turn(status="done", messages=after, text="late answer", model_called=True)
    finish_turn(db, held, before, turn, tools_digest="d")


def _fail(db: Database, held: Claim) -> None:
    fail_run(db, held, "late failure")


def _retry(db: Database, held: Claim) -> None:
    retry_turn(db, held, error="late", countdown=1)


def _cancelled(db: Database, held: Claim) -> None:
    finish_cancelled(db, held)


LATE_WRITES: dict[str, Callable[[Database, Claim], Any]] = {
    "save_reply": _reply,
    "finish_turn": _finish,
    "fail_run": _fail,
    "retry_turn": _retry,
    "finish_cancelled": _cancelled,
}


@pytest.mark.parametrize("write", LATE_WRITES.values(), ids=LATE_WRITES.keys())
def test_a_turn_that_lost_its_claim_to_a_redelivery_writes_nothing(
    db: Database, write: Callable[[Database, Claim], Any]
):
    # Given a turn whose task was redelivered to another worker, which took the run over
    start(db)
    old = claim(db, 0, task_id="task-1")
    new = claim(db, 0, task_id="task-1")
    assert old is not None
    assert new is not None
    before = snapshot(db)

    # When the first turn tries to write
    with pytest.raises(StaleClaim) as raised:
        write(db, old)

    # Then it is told so, and nothing changed
    assert (raised.value.run_id, raised.value.version) == ("run_1", old.version)
    assert snapshot(db) == before
    assert len(message_rows(db)) == 1


@pytest.mark.parametrize("write", LATE_WRITES.values(), ids=LATE_WRITES.keys())
def test_a_turn_whose_lease_ran_out_writes_nothing_after_the_sweeper_requeued_its_run(
    db: Database, write: Callable[[Database, Claim], Any]
):
    start(db)
    old = claim(db, 0)
    assert old is not None
    requeued_by_the_sweeper(db)
    before = snapshot(db)

    with pytest.raises(StaleClaim):
        write(db, old)

    assert snapshot(db) == before
