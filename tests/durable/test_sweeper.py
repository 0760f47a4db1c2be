"""The sweeper: a run whose message was never sent, or whose worker vanished, still finishes."""

from __future__ import annotations

from datetime import datetime, timedelta

from relayq import new_id
from store import (
    Database,
    Recovery,
    RunRow,
    RunSpec,
    WorkerRow,
    beat,
    claim_turn,
    create_run,
    get_run,
    sweep,
)
from store.models import utcnow
from store.outbox import mark_published
from tasks import DurableClient
from tasks.broker.publish import publish
from tasks.runner.loopwatch import EXIT_STALLED

from . import store_outage_agents  # noqa: F401  (the host knows the stall agent)
from .conftest import SQLITE_ONLY, Durable, Eventually, SpareWorkers
from .test_hangs import held_by
from .test_store_outage import all_finished


async def test_a_run_whose_first_message_was_never_sent_is_started_by_a_sweep(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a run committed with its outbox row, whose message was never published
    run_id = new_id("run")
    row = create_run(client.db, RunSpec("recall"), run_id=run_id, prompt=prompt)
    assert get_run(client.db, run_id).status == "queued"

    # When the sweeper looks for unsent messages
    report = sweep(client.db, recovery=Recovery(outbox_grace=timedelta(0)))
    publish(client.app, client.db, report.outbox)

    # Then it sends the lost one again and the run completes on the worker
    assert row.id in [r.id for r in report.outbox]
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error
    assert res.text == prompt
    assert durable.count("model", prompt) == 1


async def test_a_run_left_running_by_a_vanished_worker_is_requeued_by_a_sweep(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a run claimed by a worker on another host, whose last heartbeat was just now
    # (so that the live worker's own sweeps leave it alone for this test's sweep)
    run_id = new_id("run")
    row = create_run(client.db, RunSpec("recall"), run_id=run_id, prompt=prompt)
    mark_published(client.db, [row])  # the ghost received it
    ghost = f"ghost-{run_id}"
    beat(client.db, ghost, hostname="a-host-that-vanished", pid=1)
    claim = claim_turn(client.db, run_id, 0, task_id="ghost", lease=timedelta(0), worker=ghost)
    assert claim is not None
    assert get_run(client.db, run_id).status == "running"

    # When a sweep runs after its heartbeat is overdue
    timeout = durable.settings.recovery.worker_timeout
    report = sweep(client.db, now=utcnow() + timeout + timedelta(seconds=1))
    publish(client.app, client.db, report.outbox)

    # Then the run is queued again and completes on a live worker
    assert run_id in report.requeued
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error
    assert res.text == prompt
    assert durable.count("model", prompt) == 1


async def test_a_live_workers_heartbeat_keeps_a_long_turn_from_being_swept_from_under_it(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a worker taken for dead 1.5 s after its last heartbeat, sweeping every 0.3 s
    spare = spare_workers.start(
        RELAYQ_HEARTBEAT_EVERY="0.3", RELAYQ_WORKER_TIMEOUT="1.5", RELAYQ_SWEEP_EVERY="0.3"
    )
    timeout = spare.settings.recovery.worker_timeout
    async with DurableClient(settings=spare.settings) as client:
        run_id = await client.start("holding", prompt)
        release = durable.log / f"release-{run_id}"
        try:
            await eventually(lambda: durable.count("tool", f"hold {run_id}") == 1, what="the tool")
            started = utcnow()

            # When its tool runs for three times that, the worker beating meanwhile
            # (the wait is the behaviour under test: a turn outlasting the timeout)
            await eventually(
                lambda: _heartbeat_of_holder(client.db, run_id) >= started + 3 * timeout,
                timeout=20,
                what="the holding worker to beat three timeouts into the turn",
            )
            # ... and a sweep with the worker's own bounds looks at the run then
            report = sweep(client.db, recovery=spare.settings.recovery.bounds())
            publish(client.app, client.db, report.outbox)
            assert run_id not in report.requeued
        finally:
            release.touch()
        res = await client.result(run_id, wait=True, timeout=30)

    # Then nobody took the turn over: the tool ran once, the model was asked twice
    assert res.status == "done", res.error
    assert durable.count("tool", f"hold {run_id}") == 1
    assert durable.count("model", prompt) == 2


QUICK = {
    "RELAYQ_HEARTBEAT_EVERY": "0.3",
    "RELAYQ_WORKER_TIMEOUT": "1.5",
    "RELAYQ_SWEEP_EVERY": "0.3",
    "RELAYQ_AGENTS": "tests.durable.agents,tests.durable.store_outage_agents",
}
"""Workers that take a worker silent for 1.5 s for dead, and sweep every 0.3 s."""


@SQLITE_ONLY  # the subject is the worker's loop watch, not the store
async def test_a_worker_whose_event_loop_is_blocked_within_the_stall_bound_keeps_its_turns(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given two quick workers, whose loops count as stalled after 8 s, and a tool that
    # blocks its worker's event loop for 4 s
    quick = {**QUICK, "RELAYQ_TEST_STALL": "4", "RELAYQ_LOOP_STALL": "8"}
    stalling = spare_workers.start(**quick)
    spare_workers.start(**quick)  # the other, sweeping the same store

    # When a run's tool blocks the first worker's loop for longer than the timeout
    async with DurableClient(settings=stalling.settings) as client:
        run_id = await client.start("stall", prompt)
        res = await client.result(run_id, wait=True, timeout=60)
        crashes = get_run(client.db, run_id).crashes

    # Then its heartbeat went on: no worker took the run over, and the tool ran once
    assert res.status == "done", res.error
    assert durable.count("tool", f"stall {run_id} attempt 1") == 1
    assert durable.count("tool", f"stall {run_id} attempt 2") == 0
    assert crashes == 0


@SQLITE_ONLY  # the subject is the worker's loop watch, not the store
async def test_a_worker_whose_event_loop_stays_blocked_hands_its_runs_over_and_ends(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
    eventually: Eventually,
):
    # Given two quick workers on a store no other worker sweeps, A's loop counted stalled
    # after 1 s and its process ended 12 s in, and a tool that blocks A's loop for 10
    # minutes on its first attempt
    quick = {**QUICK, "RELAYQ_DATABASE_URL": private_database}
    stalling = spare_workers.start(
        **quick, RELAYQ_TEST_STALL="600", RELAYQ_LOOP_STALL="1", RELAYQ_LOOP_STALL_EXIT="12"
    )
    spare_workers.start(**quick)
    async with DurableClient(settings=stalling.settings) as client:
        # ... with 10 healthy runs on A beside it
        healthy = await client.start_many("outlast", [f"{prompt} {i}" for i in range(10)])
        await eventually(lambda: held_by(client.db, stalling.worker), what="A holding runs")

        # When a run's tool blocks A's loop
        run_id = await client.start("stall", prompt)
        await eventually(
            lambda: durable.count("tool", f"stall {run_id} attempt 1") == 1, what="the block"
        )

        # Then A beats no more: the other worker takes every run A holds while A still
        # stands, stalled, and finishes them all (the blocking tool's second try returns)
        await eventually(
            lambda: not held_by(client.db, stalling.worker), timeout=10, what="A's runs taken"
        )
        assert stalling.worker.proc is not None
        assert stalling.worker.proc.poll() is None, "A ended before its runs were taken"
        every = [*healthy, run_id]
        await eventually(lambda: all_finished(client.db, every), timeout=90, what="all done")
        runs = [get_run(client.db, r) for r in every]
        assert {r.status for r in runs} == {"done"}, {r.error for r in runs}
        assert durable.count("tool", f"stall {run_id} attempt 2") == 1

    # ... and A ends, for its supervisor to start another, exiting 70
    assert stalling.worker.proc.wait(timeout=30) == EXIT_STALLED
    # ... its log naming the blocking function, the tool, the run and its agent, and
    # never the prompt
    log = stalling.worker.logfile.read_text()
    assert "the event loop has not turned" in log, log[-3000:]
    assert "in block\n" in log, log[-3000:]
    assert f"tool block (call c1), in a turn of run {run_id} (agent stall)" in log, log[-3000:]
    assert prompt not in log


def _heartbeat_of_holder(db: Database, run_id: str) -> datetime:
    """The last heartbeat of the worker holding the run's claim."""
    with db.read() as s:
        run = s.get(RunRow, run_id)
        assert run is not None
        assert run.worker is not None, f"the run is {run.status}, not claimed by a worker"
        worker = s.get(WorkerRow, run.worker)
        assert worker is not None, "the worker holding the run is registered"
        return worker.heartbeat_at
