"""A batch's turns go to a queue of its own, named when the batch starts, from the first turn
to the last: whichever queue the worker names, after an answer, a retry, a wait for the
provider, a takeover. A batch is active while a run of it has a turn to take."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import event, insert

from relayq.relay import RelayResult, relay_answer
from store import (
    BatchRow,
    Database,
    RunRow,
    RunSpec,
    accept_answer,
    apply_answer_of,
    batch_status,
    cancel_batch,
    claim_turn,
    create_run,
    retry_turn,
    start_batch,
    sweep,
)
from store.batch_queues import active_batch_queues, batch_queue_name, is_batch_queue_of
from store.models import utcnow
from store.turns import requeue_turn
from tests.relayq.scripted import text

from .driver import LEASE, local_kit, model_of, relay_kit, relay_turn, run_turn

VIP = "relayq.turns.vip"


def queue_of_batch(db: Database, batch_id: str) -> str | None:
    with db.read() as s:
        batch = s.get(BatchRow, batch_id)
    assert batch is not None
    return batch.queue


def test_a_batch_is_named_a_queue_of_its_own_from_its_agents_queue(db: Database):
    started = start_batch(db, RunSpec("a", batch_id="batch_1"), [("j1", "p"), ("j2", "p")])
    on_vip = start_batch(db, RunSpec("a", queue=VIP, batch_id="batch_2"), [("j1", "p")])

    assert queue_of_batch(db, "batch_1") == "relayq.turns.batch.batch_1"
    assert {row.queue for row in started.outbox} == {"relayq.turns.batch.batch_1"}
    assert queue_of_batch(db, "batch_2") == batch_queue_name(VIP, "batch_2")
    assert {row.queue for row in on_vip.outbox} == {"relayq.turns.vip.batch.batch_2"}
    assert is_batch_queue_of(VIP, "relayq.turns.vip.batch.batch_2")
    assert not is_batch_queue_of("relayq.turns", "relayq.turns.vip.batch.batch_2")


def test_a_rerun_keeps_the_queue_the_batch_started_with(db: Database):
    start_batch(db, RunSpec("a", queue=VIP, batch_id="batch_1"), [("j1", "p")])

    # The agent has moved to another queue since: the batch stays where it started
    again = start_batch(db, RunSpec("a", batch_id="batch_1"), [("j1", "p"), ("j2", "q")])

    assert again.started == ["j2"]
    assert {row.queue for row in again.outbox} == {batch_queue_name(VIP, "batch_1")}
    assert queue_of_batch(db, "batch_1") == batch_queue_name(VIP, "batch_1")


async def test_every_turn_of_a_batch_run_stays_on_its_batch_queue_whatever_queue_is_named(
    db: Database,
):
    # Given a batch on the vip agent's queue
    started = start_batch(db, RunSpec("a", queue=VIP, batch_id="batch_1"), [("j1", "p")])
    own = batch_queue_name(VIP, "batch_1")
    run_id = started.runs["j1"]

    # When a worker finishes a turn naming the agent's queue (the driver's agent: relayq.turns)
    turn = await run_turn(db, run_id, await local_kit(), model_of(relay_turn(("c1", "work"))))
    assert turn.status == "next"
    version = _version(db, run_id)

    # ... retries the next turn and requeues it for its provider, naming the agent's queue
    claim = claim_turn(db, run_id, version, task_id="t1", lease=LEASE)
    assert claim is not None
    retried = retry_turn(db, claim, error="429", countdown=0.1, queue=VIP)
    claim = claim_turn(db, run_id, retried.args[1], task_id="t2", lease=LEASE)
    assert claim is not None
    waiting = requeue_turn(db, claim, countdown=0.1, queue="relayq.turns")

    # ... and its worker dies holding the turn after that, so the sweeper takes it over
    assert claim_turn(db, run_id, waiting.args[1], task_id="t3", lease=timedelta(0)) is not None
    report = sweep(db, now=utcnow() + timedelta(seconds=5))

    # Then every one of those turns went to the batch's queue
    assert report.requeued == [run_id]
    queues = {retried.queue, waiting.queue, *(row.queue for row in report.outbox)}
    assert queues == {own}
    assert _turn_queues(db, run_id) == {own}


async def test_the_turn_after_an_answer_goes_to_the_batch_queue(db: Database):
    started = start_batch(db, RunSpec("a", batch_id="batch_1"), [("j1", "p")])
    run_id = started.runs["j1"]
    kit = await relay_kit("lookup")
    turn = await run_turn(db, run_id, kit, model_of(relay_turn(("c1", "lookup")), text("done")))
    assert turn.pending is not None

    accept_answer(db, relay_answer(turn.pending.id, [RelayResult(id="c1", output="x")]))
    [row] = apply_answer_of(db, turn.pending.id)

    assert row.queue == "relayq.turns.batch.batch_1"


def test_a_run_of_no_batch_goes_to_the_queue_named(db: Database):
    row = create_run(db, RunSpec("a", queue=VIP), run_id="run_1", prompt="p")
    claim = claim_turn(db, "run_1", 0, task_id="t1", lease=LEASE)
    assert claim is not None

    assert row.queue == VIP
    assert retry_turn(db, claim, error="429", countdown=0.1, queue="other").queue == "other"


def test_a_batch_is_active_while_a_run_of_it_has_a_turn_to_take(db: Database):
    # Given two batches on relayq's queue and one on the vip agent's
    one = start_batch(db, RunSpec("a", batch_id="batch_1"), [("j1", "p"), ("j2", "p")])
    start_batch(db, RunSpec("a", batch_id="batch_2"), [("j1", "p")])
    start_batch(db, RunSpec("a", queue=VIP, batch_id="batch_3"), [("j1", "p")])
    every = [batch_queue_name(q, b) for q, b in [("relayq.turns", "batch_1"),
             ("relayq.turns", "batch_2"), (VIP, "batch_3")]]  # fmt: skip

    assert active_batch_queues(db) == sorted(every)
    assert active_batch_queues(db, under=["relayq.turns"]) == every[:2]
    assert active_batch_queues(db, under=[VIP]) == every[2:]

    # When one of batch 1's runs finishes, it is still active; when both have, it is not
    _finish(db, one.runs["j1"])
    assert every[0] in active_batch_queues(db)
    _finish(db, one.runs["j2"])
    assert every[0] not in active_batch_queues(db)

    # And a cancelled batch, whose waiting runs are cancelled at once, is not either
    cancel_batch(db, "batch_2")
    assert active_batch_queues(db) == every[2:]


def test_a_cancelled_batch_stays_active_while_a_running_turn_of_it_ends(db: Database):
    # A running run finishes its cancel at its next boundary, or, if its model call failed,
    # on its next turn: that turn must still find a worker on the batch's queue
    started = start_batch(db, RunSpec("a", batch_id="batch_1"), [("j1", "p")])
    claim = claim_turn(db, started.runs["j1"], 0, task_id="t1", lease=LEASE)
    assert claim is not None
    cancel_batch(db, "batch_1")

    row = retry_turn(db, claim, error="429", countdown=0.1)

    assert row.queue == "relayq.turns.batch.batch_1"
    assert active_batch_queues(db) == ["relayq.turns.batch.batch_1"]
    assert claim_turn(db, started.runs["j1"], row.args[1], task_id="t2", lease=LEASE) is None
    assert batch_status(db, "batch_1").counts == {"cancelled": 1}
    assert active_batch_queues(db) == []


RUNS = 100_000
BATCHES = 200


def test_the_active_batches_are_read_by_the_status_index_among_100k_runs(db: Database):
    # Given 100,000 runs in 200 batches, all finished but 30 runs of three batches
    now = utcnow()
    batches = [
        {"id": f"batch_{n}", "agent": "a", "jobs": RUNS // BATCHES, "options": {},
         "created_at": now, "queue": batch_queue_name("relayq.turns", f"batch_{n}")}
        for n in range(BATCHES)
    ]  # fmt: skip
    runs = [
        {"id": f"run_{n}", "agent": "a", "conversation_id": f"run_{n}",
         "status": "queued" if n % (RUNS // BATCHES) < 10 and n < 3 * RUNS // BATCHES else "done",
         "batch_id": f"batch_{n // (RUNS // BATCHES)}", "job_id": str(n),
         "created_at": now, "updated_at": now}
        for n in range(RUNS)
    ]  # fmt: skip
    with db.write() as s:
        s.execute(insert(BatchRow.__table__), batches)  # type: ignore[attr-defined]
        for first in range(0, RUNS, 5000):
            s.execute(insert(RunRow.__table__), runs[first : first + 5000])  # type: ignore[attr-defined]

    # When a worker looks for them, as it does every two seconds
    seen: list[tuple[str, Any]] = []
    note = lambda conn, cursor, sql, params, *rest: seen.append((sql, params))  # noqa: E731
    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", note)
    try:
        found = active_batch_queues(db, under=["relayq.turns"])
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", note)

    # Then it finds the three, in one statement that reads the runs by their status index:
    # the unfinished ones only, never the 99,970 finished
    assert found == [batch_queue_name("relayq.turns", f"batch_{n}") for n in range(3)]
    queries = [(sql, params) for sql, params in seen if not sql.startswith("BEGIN")]
    assert len(queries) == 1, queries
    assert plan_of_runs(db, *queries[0]) == "index", queries[0]


def plan_of_runs(db: Database, sql: str, params: Any) -> str:
    """How the store's planner reads relayq_runs for the statement: "index" or "scan"."""
    with db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cursor = raw.cursor()
        if db.is_sqlite:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            steps = [str(row[-1]) for row in cursor.fetchall() if "relayq_runs" in str(row[-1])]
            assert steps, "the statement does not read relayq_runs"
            return "scan" if any(step.startswith("SCAN") for step in steps) else "index"
        cursor.execute("ANALYZE relayq_runs")  # the planner's figures for the rows just written
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        [plan] = cursor.fetchone() or [None]
        nodes = [n for n in _plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "relayq_runs"]
        assert nodes, "the statement does not read relayq_runs"
        return "scan" if any(n["Node Type"] == "Seq Scan" for n in nodes) else "index"


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]


def _version(db: Database, run_id: str) -> int:
    with db.read() as s:
        run = s.get(RunRow, run_id)
    assert run is not None
    return run.version


def _turn_queues(db: Database, run_id: str) -> set[str]:
    from .driver import outbox_rows

    return {row.queue for row in outbox_rows(db) if row.run_id == run_id}


def _finish(db: Database, run_id: str) -> None:
    with db.write() as s:
        run = s.get(RunRow, run_id)
        assert run is not None
        run.status = "done"
