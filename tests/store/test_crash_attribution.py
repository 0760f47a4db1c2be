"""A crash is counted against the turn that caused it: a worker that died holding a run
beside other turns marks the run suspect (no crash counted), and a death of a turn held
alone counts (`store.transitions.died_holding`)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from store import Database, claim_turn, get_run, sweep
from store.maintenance import Recovery
from store.turns import requeue_turn
from store.workers import HOSTNAME, beat
from tests.relayq.scripted import text

from .driver import LEASE, local_kit, model_of, run_turn, start


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _died(db: Database, *, alone: bool) -> None:
    """run_1 claimed by a worker of this host that then died."""
    beat(db, "w-dead", hostname=HOSTNAME, pid=_dead_pid())
    version = get_run(db, "run_1").version
    assert claim_turn(db, "run_1", version, task_id="t", lease=LEASE, worker="w-dead", alone=alone)


@pytest.mark.parametrize(("alone", "crashes"), [(True, 1), (False, 0)])
def test_the_sweeper_counts_a_death_only_against_a_turn_that_ran_alone(
    db: Database, alone: bool, crashes: int
):
    # Given a run claimed alone (a prefork child) or beside other turns (the asyncio pool)
    start(db)
    _died(db, alone=alone)

    # When the sweeper finds its worker dead
    report = sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))

    # Then the run is queued again, suspect either way, its death counted only if alone
    assert report.requeued == ["run_1"]
    run = get_run(db, "run_1")
    assert (run.status, run.crashes, run.suspect, run.held_alone) == (
        "queued",
        crashes,
        True,
        None,
    )


@pytest.mark.parametrize(("alone", "crashes"), [(True, 1), (False, 0)])
def test_a_redelivery_counts_a_death_only_against_a_turn_that_ran_alone(
    db: Database, alone: bool, crashes: int
):
    # Given a run whose worker died holding it
    start(db)
    _died(db, alone=alone)

    # When the broker hands its message to a worker that shares its process
    again = claim_turn(db, "run_1", 1, task_id="t", lease=LEASE, worker="w-other")

    # Then that worker takes it over, the run now suspect, and its claim held alone: the
    # worker runs it in a process of its own, so its next death is its own
    assert again is not None
    assert (again.taken_over, again.crashes, again.suspect, again.alone) == (
        True,
        crashes,
        True,
        True,
    )


def test_a_suspect_run_is_claimed_alone_until_a_turn_of_it_ends(db: Database):
    # Given a suspect run: its worker died holding it beside other turns
    start(db)
    _died(db, alone=False)
    sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))

    # When a worker that shares its process claims it, it is held alone
    claim = claim_turn(db, "run_1", 2, task_id="t2", lease=LEASE, worker="w-live")
    assert claim is not None
    assert (claim.suspect, claim.alone, claim.crashes) == (True, True, 0)

    # And when that turn's process dies too, the death counts
    requeue_turn(db, claim, countdown=0.0, died=True)
    run = get_run(db, "run_1")
    assert (run.status, run.crashes, run.suspect) == ("queued", 1, True)


async def test_a_turn_that_ends_clears_the_suspect_mark_and_the_crashes(db: Database):
    # Given a suspect run with a death counted
    start(db)
    _died(db, alone=True)
    sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))
    assert (get_run(db, "run_1").suspect, get_run(db, "run_1").crashes) == (True, 1)

    # When a turn of it ends
    kit = await local_kit()
    await run_turn(db, "run_1", kit, model_of(text("done")))

    # Then it is no longer suspect and its next claim is shared again
    run = get_run(db, "run_1")
    assert (run.status, run.suspect, run.crashes, run.held_alone) == ("done", False, 0, None)


def test_a_claim_of_a_healthy_run_is_shared_unless_its_process_runs_it_alone(db: Database):
    start(db, run_id="run_1")
    start(db, run_id="run_2")
    shared = claim_turn(db, "run_1", 0, task_id="a", lease=LEASE, worker="w")
    alone = claim_turn(db, "run_2", 0, task_id="b", lease=LEASE, worker="w", alone=True)
    assert shared is not None
    assert alone is not None
    assert (shared.alone, alone.alone) == (False, True)
    assert (get_run(db, "run_1").held_alone, get_run(db, "run_2").held_alone) == (False, True)


def test_a_turn_given_back_without_a_death_counts_none(db: Database):
    start(db)
    claim = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE, worker="w", alone=True)
    assert claim is not None
    requeue_turn(db, claim, countdown=0.0)
    run = get_run(db, "run_1")
    assert (run.crashes, run.suspect) == (0, False)


def test_a_worker_that_runs_a_suspect_turn_apart_counts_no_death_of_its_own(db: Database):
    # Given a suspect run, claimed by a worker that runs such turns in a child process
    start(db)
    _died(db, alone=False)
    sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))
    beat(db, "w-apart", hostname=HOSTNAME, pid=_dead_pid())
    claim = claim_turn(db, "run_1", 2, task_id="t2", lease=LEASE, worker="w-apart", apart=True)
    assert claim is not None
    assert (claim.suspect, claim.alone) == (True, False)

    # When that worker dies (its child with it, whatever the child ran)
    sweep(db, recovery=Recovery(worker_timeout=timedelta(seconds=10)))

    # Then no death is counted against the turn: the worker's death was not its doing
    run = get_run(db, "run_1")
    assert (run.status, run.crashes, run.suspect) == ("queued", 0, True)
