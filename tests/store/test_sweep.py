"""Rule 13: the sweeper leaves nothing stuck or lost. Time is passed in, never slept."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    Recovery,
    RunSpec,
    accept_answer,
    apply_answer_of,
    beat,
    claim_turn,
    create_run,
    get_request,
    get_run,
    sweep,
)
from store.models import OutboxRow, utcnow
from store.outbox import ANSWER_QUEUE, TURN_QUEUE, mark_published, task_id_of
from store.workers import HOSTNAME

from .driver import ANSWER_TASK, LEASE, TURN_TASK, halt_on_relay, outbox_rows, start

GRACE = Recovery().outbox_grace
REDELIVER = Recovery().redeliver_after


def published(db: Database) -> list[OutboxRow]:
    """Mark every row sent so far as published; the rows as they are now."""
    mark_published(db, outbox_rows(db))
    return outbox_rows(db)


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
    # ... and counted as sent: if that send is lost too, the lost-message rule applies
    assert sweep(db, now=row.created_at + 2 * GRACE).outbox == []
    later = row.created_at + GRACE + REDELIVER + timedelta(seconds=2)
    [once_more] = sweep(db, now=later, waiting={TURN_QUEUE: None}).outbox
    assert once_more.sends == 2
    assert len({first_id, task_id_of(again), task_id_of(once_more)}) == 3
    assert outbox_rows(db)[0].sends == 2


def test_a_published_message_is_not_sent_again(db: Database):
    start(db)
    published(db)

    report = sweep(db, now=utcnow() + GRACE * 2)

    assert report.outbox == []


def test_a_queued_run_whose_message_left_an_empty_queue_is_sent_again_when_overdue(
    db: Database,
):
    # Given a queued run whose message was published, then lost (a broker restarted
    # empty, or a worker that died holding it): the broker's queue is empty
    start(db)
    [lost] = published(db)
    assert lost.published_at is not None
    run = get_run(db, "run_1")
    empty = {TURN_QUEUE: None}

    # When the sweeper looks before and after the redelivery bound
    early = sweep(db, now=lost.published_at + REDELIVER - timedelta(seconds=1), waiting=empty)
    report = sweep(db, now=lost.published_at + REDELIVER + timedelta(seconds=1), waiting=empty)

    # Then (and only then) the same message goes again, under a new task id
    assert early.resent == []
    assert report.resent == ["run_1"]
    [again] = report.outbox
    assert (again.id, again.task, again.args, again.sends) == (
        lost.id,
        TURN_TASK,
        ["run_1", run.version],
        1,
    )
    assert task_id_of(again) != task_id_of(lost)
    assert get_run(db, "run_1").version == run.version
    assert claim_turn(db, "run_1", run.version, task_id=task_id_of(again), lease=LEASE)


def test_a_queued_run_whose_message_still_waits_behind_a_backlog_is_not_sent_again(
    db: Database,
):
    # Given a queued run whose message was published a long time ago, and the
    # broker's oldest waiting message was sent before it: it waits in the queue
    start(db)
    [row] = published(db)
    assert row.published_at is not None
    oldest_waiting = row.published_at - timedelta(seconds=1)

    # When the sweeper looks much later
    report = sweep(
        db, now=row.published_at + timedelta(hours=1), waiting={TURN_QUEUE: oldest_waiting}
    )

    # Then it leaves it waiting
    assert (report.resent, report.outbox) == ([], [])


def test_without_a_look_into_the_broker_no_sent_message_is_taken_for_lost(db: Database):
    start(db)
    [row] = published(db)
    assert row.published_at is not None

    report = sweep(db, now=row.published_at + timedelta(hours=1), waiting=None)

    assert (report.resent, report.outbox) == ([], [])


def test_a_retry_message_is_not_taken_for_lost_before_its_countdown_is_over(db: Database):
    # Given a queued run whose message was sent with a 60 s countdown
    start(db)
    with db.write() as s:
        row = s.get(OutboxRow, outbox_rows(db)[0].id)
        assert row is not None
        row.countdown = 60.0
    [row] = published(db)
    assert row.published_at is not None
    empty = {TURN_QUEUE: None}

    # Then it is lost only once the countdown and the bound are both over
    soon = row.published_at + REDELIVER + timedelta(seconds=5)
    late = row.published_at + timedelta(seconds=60) + REDELIVER + timedelta(seconds=1)
    assert sweep(db, now=soon, waiting=empty).resent == []
    assert sweep(db, now=late, waiting=empty).resent == ["run_1"]


def test_a_queued_run_whose_message_is_still_unsent_is_not_sent_twice(db: Database):
    start(db)
    [row] = outbox_rows(db)

    report = sweep(db, now=row.created_at + timedelta(minutes=1), waiting={TURN_QUEUE: None})

    assert report.resent == []
    assert [(r.id, r.sends) for r in report.outbox] == [(row.id, 1)]


async def test_an_accepted_answer_whose_task_was_lost_is_applied_by_a_sweep(db: Database):
    # Given an answer accepted, its answer task sent, and then lost
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    accept_answer(db, relay_answer(turn.pending.id, [RelayResult(id="c1", output="ok")]))
    published(db)
    [task] = outbox_rows(db, ANSWER_TASK)
    assert task.published_at is not None
    empty = {ANSWER_QUEUE: None}

    # When the sweeper looks after the bound
    early = sweep(db, now=task.published_at + REDELIVER - timedelta(seconds=1), waiting=empty)
    report = sweep(db, now=task.published_at + REDELIVER + timedelta(seconds=1), waiting=empty)

    # Then the answer task goes again, and applying it moves the run on, once
    assert early.reapplied == []
    assert report.reapplied == [turn.pending.id]
    [again] = report.outbox
    assert (again.id, again.sends) == (task.id, 1)
    assert len(apply_answer_of(db, turn.pending.id)) == 1
    assert get_run(db, "run_1").status == "queued"
    assert apply_answer_of(db, turn.pending.id) == [], "a duplicate is a no-op"
    later = sweep(db, now=utcnow() + timedelta(hours=1), waiting=empty)
    assert later.reapplied == [], "an applied answer is never sent again"


def test_a_run_held_by_a_live_worker_is_never_taken_over_however_long_its_turn(db: Database):
    # Given a run claimed by a worker whose heartbeat is fresh
    start(db)
    beat(db, "w-live", hostname="elsewhere", pid=1)
    claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-live")
    published(db)

    # When the sweeper looks, the claim hours old but the heartbeat fresh
    report = sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))

    assert report.requeued == []
    assert get_run(db, "run_1").status == "running"


def test_a_run_held_by_a_worker_whose_heartbeat_stopped_is_queued_again(db: Database):
    # Given a run held alone (a prefork child) by a worker whose heartbeat then stops
    start(db)
    beat(db, "w-gone", hostname="elsewhere", pid=1)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-gone", alone=True)
    assert held is not None
    published(db)
    timeout = timedelta(seconds=10)

    early = sweep(db, now=utcnow() + timeout / 2, recovery=Recovery(worker_timeout=timeout))
    late = sweep(
        db, now=utcnow() + timeout + timedelta(seconds=1), recovery=Recovery(worker_timeout=timeout)
    )

    assert early.requeued == []
    assert late.requeued == ["run_1"]
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.worker, run.crashes) == (
        "queued",
        held.version + 1,
        None,
        1,
    )


def test_a_run_held_by_a_dead_process_on_this_host_is_queued_again_at_once(db: Database):
    # Given a run claimed by a process of this host that has exited, heartbeat fresh
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start(db)
    beat(db, "w-exited", hostname=HOSTNAME, pid=gone.pid)
    claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-exited")
    published(db)

    # When the sweeper looks right away
    report = sweep(db)

    # Then it does not wait for the heartbeat to go stale
    assert report.requeued == ["run_1"]


def test_a_redelivered_message_does_not_take_a_run_from_a_live_worker(db: Database):
    # Given a run claimed by a live worker through task message "t"
    start(db)
    beat(db, "w-live", hostname="elsewhere", pid=1)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-live")
    assert held is not None

    # When the broker hands the same message out again (a connection lost and restored)
    again = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-other")

    # Then the live worker keeps its turn
    assert again is None
    assert get_run(db, "run_1").worker == "w-live"


def test_a_redelivered_message_takes_over_a_run_whose_worker_died(db: Database):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start(db)
    beat(db, "w-exited", hostname=HOSTNAME, pid=gone.pid)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-exited", alone=True)
    assert held is not None

    again = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w-other")

    assert again is not None
    assert (again.taken_over, again.crashes, again.attempts) == (True, 1, 0)
    assert get_run(db, "run_1").worker == "w-other"


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


def test_a_turn_on_an_agents_own_queue_is_judged_by_that_queue_alone(db: Database):
    # Given a queued run whose turn went to an agent's queue, long ago
    create_run(db, RunSpec("vip", queue="relayq.turns.vip"), run_id="run_1", prompt="go")
    [row] = published(db)
    assert row.published_at is not None
    later = row.published_at + REDELIVER + timedelta(seconds=1)

    # When only relayq.turns was looked into, nothing is taken for lost
    assert sweep(db, now=later, waiting={TURN_QUEUE: None}).resent == []
    # When its own queue is empty, its message is lost and goes again
    assert sweep(db, now=later, waiting={TURN_QUEUE: None, "relayq.turns.vip": None}).resent == [
        "run_1"
    ]
