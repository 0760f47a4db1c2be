"""Issue 19: whose claims a sweeper takes, and whose it frees. Time is passed in, never slept.

A worker never takes its own claims for a dead worker's; those of them that no
task of its holds (a task that ended on an error without giving its run back)
it frees at once, counted as a crash (a turn that always ends so must not loop
for ever). A stale heartbeat counts as a death only while the sweeper's own
heartbeats have been steady: after the store was down or locked, no worker
could beat.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from store import Database, beat, claim_turn, get_run, sweep
from store.models import utcnow
from store.workers import HOSTNAME

from .driver import LEASE, start

ME, OTHER = "me:1:aaaa", "other-host:2:bbbb"
TIMEOUT = timedelta(seconds=10)


def claimed_by(db: Database, worker: str, task_id: str = "task-1") -> int:
    """The run, claimed by `worker` (registered with a heartbeat now); its version."""
    start(db)
    # Another host's worker: only its heartbeat says whether it lives.
    beat(db, worker, hostname="other-host" if worker == OTHER else HOSTNAME, pid=2)
    held = claim_turn(
        db, "run_1", 0, task_id=task_id, lease=LEASE, worker=worker, worker_timeout=TIMEOUT
    )
    assert held is not None
    return held.version


def later() -> datetime:
    return utcnow() + TIMEOUT + timedelta(seconds=5)


def test_a_claim_of_the_sweeping_worker_that_a_task_holds_is_left_alone_however_stale(
    db: Database,
):
    claimed_by(db, ME)

    report = sweep(db, now=utcnow() + timedelta(hours=1), worker=ME, working=lambda: {"run_1"})

    assert (report.requeued, report.freed) == ([], [])
    assert get_run(db, "run_1").status == "running"


def test_a_claim_of_the_sweeping_worker_that_no_task_holds_is_freed_as_a_crash(
    db: Database,
):
    version = claimed_by(db, ME)

    report = sweep(db, worker=ME, working=frozenset)

    assert (report.freed, report.requeued) == (["run_1"], [])
    run = get_run(db, "run_1")
    assert (run.status, run.crashes, run.version) == ("queued", 1, version + 1)
    [row] = report.outbox
    assert row.args == ["run_1", version + 1]


def test_a_claim_of_another_live_worker_is_not_freed_by_the_sweeper(db: Database):
    claimed_by(db, OTHER)

    report = sweep(db, worker=ME, working=frozenset)

    assert (report.freed, report.requeued) == ([], [])


def test_a_stale_heartbeat_is_a_death_only_while_the_sweepers_own_beats_are_steady(
    db: Database,
):
    # Given a run claimed by a worker on another host whose heartbeat is now stale
    claimed_by(db, OTHER)
    asked: list[bool] = []

    def steady(answer: bool):
        def ask() -> bool:
            asked.append(answer)
            return answer

        return ask

    # When the sweeper's own beats were late (the store was down or locked), it is kept
    kept = sweep(db, now=later(), worker=ME, heartbeats_steady=steady(False))
    assert (kept.requeued, kept.freed) == ([], [])
    assert get_run(db, "run_1").status == "running"

    # When they have been steady, the silent worker is dead and its run is taken over
    taken = sweep(db, now=later(), worker=ME, heartbeats_steady=steady(True))
    assert taken.requeued == ["run_1"]
    assert get_run(db, "run_1").suspect  # its death noted (a crash, had it run alone)
    assert asked == [False, True]


def test_a_redelivery_to_the_same_worker_never_takes_its_own_claim_over(db: Database):
    # Given a run claimed by this worker, its heartbeat stale (its loop was busy)
    claimed_by(db, ME)

    # When the same message comes back to the same worker
    again = claim_turn(
        db,
        "run_1",
        0,
        task_id="task-1",
        lease=LEASE,
        worker=ME,
        worker_timeout=timedelta(seconds=0),
    )

    # Then it takes nothing: the task it gave the claim to runs, or its sweeper frees it
    assert again is None
    assert get_run(db, "run_1").crashes == 0


def test_a_redelivery_takes_over_from_a_stale_worker_only_while_heartbeats_are_steady(
    db: Database,
):
    claimed_by(db, OTHER)
    stale = timedelta(seconds=0)

    def claim(steady: bool):
        return claim_turn(
            db,
            "run_1",
            0,
            task_id="task-1",
            lease=LEASE,
            worker=ME,
            worker_timeout=stale,
            heartbeats_steady=lambda: steady,
        )

    assert claim(False) is None
    taken = claim(True)
    assert taken is not None
    assert taken.taken_over
