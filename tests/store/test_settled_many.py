"""`settled_many`: what a host waiting on many runs reads each time it is woken."""

from __future__ import annotations

from sqlalchemy import update

from relayq.relay import answer_output
from store import Database, RunRow, accept_answer, cancel_run, settled, settled_many
from tests.relayq.scripted import text

from .driver import halt_on_relay, local_kit, model_of, run_turn, start, statements

RUNS = RunRow.__table__  # type: ignore[attr-defined]


async def _runs_in_every_state(db: Database) -> list[str]:
    """A run in each state a waiter can meet."""
    start(db, run_id="queued")
    _, _, asking = await halt_on_relay(db, "c1", run_id="asking")
    _, _, answered = await halt_on_relay(db, "c2", run_id="answered")
    assert asking.pending is not None
    assert answered.pending is not None
    accept_answer(db, answer_output(answered.pending.id, "ok"))
    start(db, run_id="done")
    await run_turn(db, "done", await local_kit(), model_of(text("finished")))
    start(db, run_id="cancelled")
    cancel_run(db, "cancelled")
    # Pending on another run's request (a batch's budget request): settled while it is open.
    start(db, run_id="on_open")
    start(db, run_id="on_closed")
    with db.transaction() as conn:
        for run_id, request_id in (
            ("on_open", asking.pending.id),
            ("on_closed", answered.pending.id),
        ):
            conn.execute(
                update(RUNS)
                .where(RUNS.c.id == run_id)
                .values(status="pending", waiting_on=request_id)
            )
    return ["queued", "asking", "answered", "done", "cancelled", "on_open", "on_closed"]


async def test_many_runs_read_as_each_would_be_read_alone(db: Database):
    runs = await _runs_in_every_state(db)

    many = settled_many(db, list(runs))

    assert many == {run_id: settled(db, run_id) for run_id in runs}
    assert {run_id for run_id, (_, done) in many.items() if done} == {
        "asking",
        "done",
        "cancelled",
        "on_open",
    }


async def test_many_runs_are_read_in_one_statement_and_unknown_ones_are_left_out(db: Database):
    runs = await _runs_in_every_state(db)

    with statements(db) as seen:
        many = settled_many(db, [*runs, "run_nope", "queued"])  # an unknown one, one twice

    assert len([q for q in seen if q.startswith("SELECT")]) == 1  # (SQLite's BEGIN aside)
    assert set(many) == set(runs)
