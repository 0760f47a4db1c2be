"""A run's turns go to its agent's queue: given when the run is created (or a turn is
finished or retried), and followed where the store queues a turn on its own."""

from __future__ import annotations

from datetime import timedelta

from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    RunSpec,
    accept_answer,
    apply_answer_of,
    claim_turn,
    create_run,
    create_runs,
    retry_turn,
    sweep,
)
from store.models import utcnow
from store.outbox import TURN_QUEUE, resend_turns, task_id_of
from store.turns import requeue_turn
from tests.relayq.scripted import text

from .driver import LEASE, model_of, relay_kit, relay_turn, run_turn

VIP = "relayq.turns.vip"


def test_a_new_run_goes_to_the_queue_given_else_to_the_turn_queue(db: Database):
    vip = create_run(db, RunSpec("a", queue=VIP), run_id="run_v", prompt="p")
    plain = create_run(db, RunSpec("a"), run_id="run_p", prompt="p")
    batch = create_runs(db, RunSpec("a", queue=VIP), [("run_b1", "p"), ("run_b2", "p")])

    assert (vip.queue, plain.queue) == (VIP, TURN_QUEUE)
    assert {row.queue for row in batch} == {VIP}


def test_a_retried_turn_goes_to_the_queue_given_else_where_the_run_went(db: Database):
    create_run(db, RunSpec("a", queue=VIP), run_id="run_1", prompt="p")
    claim = claim_turn(db, "run_1", 0, task_id="t1", lease=LEASE)
    assert claim is not None

    row = retry_turn(db, claim, error="429", countdown=0.1)

    assert row.queue == VIP
    again = claim_turn(db, "run_1", row.args[1], task_id="t2", lease=LEASE)
    assert again is not None
    assert retry_turn(db, again, error="429", countdown=0.1, queue="other").queue == "other"


def test_a_run_taken_over_from_a_dead_worker_stays_on_its_queue(db: Database):
    create_run(db, RunSpec("a", queue=VIP), run_id="run_1", prompt="p")
    assert claim_turn(db, "run_1", 0, task_id="t", lease=timedelta(seconds=1)) is not None

    report = sweep(db, now=utcnow() + timedelta(seconds=5))

    assert report.requeued == ["run_1"]
    assert {row.queue for row in report.outbox} == {VIP}


async def test_the_turn_after_an_answer_goes_where_the_run_went(db: Database):
    # Given a run on its agent's queue, halted on a relay request
    create_run(db, RunSpec("a", queue=VIP), run_id="run_1", prompt="p")
    kit = await relay_kit("lookup")
    turn = await run_turn(db, "run_1", kit, model_of(relay_turn(("c1", "lookup")), text("done")))
    assert turn.pending is not None

    # When the answer is applied (the store knows no agent there)
    accept_answer(db, relay_answer(turn.pending.id, [RelayResult(id="c1", output="x")]))
    [row] = apply_answer_of(db, turn.pending.id)

    # Then the next turn goes to the run's queue
    assert row.queue == VIP


def test_runs_woken_from_a_wait_are_sent_again_at_once_and_only_those_still_queued(db: Database):
    # Given two runs waiting out a countdown for their provider, and one that is running
    for run_id in ("run_w1", "run_w2", "run_r"):
        create_run(db, RunSpec("a", queue=VIP), run_id=run_id, prompt="p")
    waiting = []
    for run_id in ("run_w1", "run_w2"):
        claim = claim_turn(db, run_id, 0, task_id=f"t-{run_id}", lease=LEASE)
        assert claim is not None
        waiting.append(requeue_turn(db, claim, countdown=200.0))
    assert claim_turn(db, "run_r", 0, task_id="t-run_r", lease=LEASE) is not None

    # When they are woken
    rows = resend_turns(db, ["run_w1", "run_w2", "run_r", "run_unknown"], chunk=1)

    # Then each waiting run's turn message goes again now, as a new send on its queue,
    # and the claim it names is the one the countdown's message names
    assert sorted(str(r.run_id) for r in rows) == ["run_w1", "run_w2"]
    assert {(r.countdown, r.queue, r.sends) for r in rows} == {(0.0, VIP, 1)}
    assert sorted(r.args for r in rows) == sorted(w.args for w in waiting)
    assert {task_id_of(r) for r in rows}.isdisjoint(task_id_of(w) for w in waiting)
