"""A batch's cancel at volume: a few statements a chunk of runs, not five a run, with every
run ended as one cancelled alone would be (its requests closed, its messages spent, its
`run.finished` event written)."""

from __future__ import annotations

from sqlalchemy import func
from sqlmodel import col, select

from store import Database, RunSpec, cancel_batch, start_batch
from store.models import EventRow, OutboxRow, RequestRow, RunRow, utcnow

from .driver import statements

RUNS = 1200
"""Three chunks of the store's 500 ids a statement."""


def _seeded(db: Database) -> list[str]:
    started = start_batch(
        db, RunSpec("a", batch_id="batch_big"), [(f"j{n}", "p") for n in range(RUNS)]
    )
    ids = list(started.runs.values())
    # A tenth of them wait on a request, as a relay call leaves them.
    with db.write() as s:
        for run_id in ids[::10]:
            run = s.get(RunRow, run_id)
            assert run is not None
            run.status = "pending"
            s.add(RequestRow(id=f"req_{run_id}", run_id=run_id, agent="a", kind="question",
                             prompt="?", status="open", created_at=utcnow()))  # fmt: skip
    return ids


def test_a_batch_of_1200_runs_is_cancelled_in_a_few_statements_a_chunk(db: Database):
    ids = _seeded(db)

    with statements(db) as seen:
        asked = cancel_batch(db, "batch_big")

    assert dict(asked) == {"queued": RUNS - RUNS // 10, "pending": RUNS // 10}
    assert sorted(asked.settled) == sorted(ids)
    assert len(seen) <= 40, f"{len(seen)} statements"
    with db.read() as s:
        statuses = s.exec(select(RunRow.status, func.count()).group_by(RunRow.status)).all()
        assert dict(statuses) == {"cancelled": RUNS}
        opened = s.exec(select(func.count()).where(RequestRow.status == "open")).one()
        assert opened == 0
        spent = s.exec(select(func.count()).where(col(OutboxRow.run_id).in_(ids[:500]))).one()
        assert spent == 0
        finished = s.exec(select(func.count()).where(EventRow.type == "run.finished")).one()
        assert finished == RUNS
