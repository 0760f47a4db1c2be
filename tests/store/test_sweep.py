"""Rule 13: the sweeper leaves nothing stuck or lost. Time is passed in, never slept."""

from __future__ import annotations

from datetime import timedelta

from store import Database, claim_turn, get_request, get_run, sweep
from store.models import OutboxRow, utcnow
from store.outbox import mark_published, task_id_of

from .driver import ANSWER_TASK, LEASE, TURN_TASK, halt_on_relay, outbox_rows, start

GRACE = timedelta(seconds=30)
STALE = timedelta(minutes=15)


def published(db: Database) -> list[OutboxRow]:
    """Mark every row sent so far as published; the rows."""
    rows = outbox_rows(db)
    mark_published(db, rows)
    return rows


def test_a_running_run_whose_lease_ran_out_is_queued_again(db: Database):
    # Given a running run whose worker vanished
    start(db)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    published(db)

    # When the sweeper looks after its lease ran out
    report = sweep(db, now=utcnow() + LEASE + timedelta(seconds=1))

    # Then the run is queued at a new version, with a turn message for that version
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.claimed_by, run.lease_until) == (
        "queued",
        held.version + 1,
        None,
        None,
    )
    assert report.requeued == ["run_1"]
    [row] = report.outbox
    assert (row.task, row.args) == (TURN_TASK, ["run_1", run.version])
    assert outbox_rows(db)[-1].id == row.id
    assert claim_turn(db, "run_1", run.version, task_id="t2", lease=LEASE) is not None


def test_a_running_run_within_its_lease_is_left_alone(db: Database):
    start(db)
    claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    published(db)

    report = sweep(db, now=utcnow() + LEASE - timedelta(seconds=5))

    assert (report.requeued, report.resent, report.outbox, report.expired) == ([], [], [], 0)
    assert get_run(db, "run_1").status == "running"


def test_an_unpublished_message_is_sent_again_after_the_grace_period_under_a_new_task_id(
    db: Database,
):
    # Given a turn message committed but never published
    start(db)
    [row] = outbox_rows(db)
    first_id = task_id_of(row)

    # When the sweeper runs within the grace period, it leaves the message to its sender
    assert sweep(db, now=row.created_at + GRACE - timedelta(seconds=1)).outbox == []

    # When it runs after it, the message is sent again, counted, under another task id
    [again] = sweep(db, now=row.created_at + GRACE + timedelta(seconds=1)).outbox
    assert (again.id, again.task, again.args, again.sends) == (row.id, TURN_TASK, row.args, 1)
    assert task_id_of(again) != first_id
    [once_more] = sweep(db, now=row.created_at + 2 * GRACE).outbox
    assert once_more.sends == 2
    assert len({first_id, task_id_of(again), task_id_of(once_more)}) == 3
    assert outbox_rows(db)[0].sends == 2


def test_a_published_message_is_not_sent_again(db: Database):
    start(db)
    published(db)

    report = sweep(db, now=utcnow() + GRACE * 2)

    assert report.outbox == []


def test_a_queued_run_whose_message_went_missing_gets_a_fresh_turn_message(db: Database):
    # Given a queued run whose message was published, then lost with the broker
    start(db)
    [lost] = published(db)
    run = get_run(db, "run_1")

    # When the sweeper looks after the run sat queued too long
    early = sweep(db, now=run.updated_at + STALE - timedelta(seconds=1), stale_queued=STALE)
    report = sweep(db, now=run.updated_at + STALE + timedelta(seconds=1), stale_queued=STALE)

    # Then (and only then) it sends a new message for the same version
    assert early.resent == []
    assert report.resent == ["run_1"]
    [fresh] = report.outbox
    assert fresh.id != lost.id
    assert (fresh.task, fresh.args) == (TURN_TASK, ["run_1", run.version])
    assert get_run(db, "run_1").version == run.version
    assert claim_turn(db, "run_1", run.version, task_id=task_id_of(fresh), lease=LEASE)


def test_a_queued_run_whose_message_is_still_unsent_is_not_sent_twice(db: Database):
    start(db)
    [row] = outbox_rows(db)

    report = sweep(db, now=row.created_at + STALE + timedelta(minutes=1), stale_queued=STALE)

    assert report.resent == []
    assert [(r.id, r.sends) for r in report.outbox] == [(row.id, 1)]


async def test_an_overdue_request_is_expired_and_its_answer_task_sent_once(db: Database):
    # Given a pending run whose request expires in a minute, every message so far sent
    _, _, turn = await halt_on_relay(db, "c1", request_ttl=timedelta(minutes=1))
    assert turn.pending is not None
    published(db)

    # When the sweeper runs after that
    report = sweep(db, now=utcnow() + timedelta(minutes=2))

    # Then the request is expired and one answer task goes out for it
    assert report.expired == 1
    assert get_request(db, turn.pending.id).status == "expired"
    [row] = outbox_rows(db, ANSWER_TASK)
    assert [(r.id, r.task) for r in report.outbox] == [(row.id, ANSWER_TASK)]
