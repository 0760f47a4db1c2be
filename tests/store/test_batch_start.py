"""Issue 19: a batch starts in chunks, each its own transaction, never a job twice.

A start of 100,000 jobs in one transaction held SQLite's write lock for 26 s, and
every other run's turns waited on it. Each chunk now commits on its own, its
messages handed on as it does; a start that dies between chunks leaves what it
committed, and the same start run again starts only the jobs still missing.
"""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import event
from sqlmodel import select

from store import (
    Database,
    JobChanged,
    OutboxRow,
    RunRow,
    RunSpec,
    batch_status,
    create_runs,
    start_batch,
)
from store.runs import CHUNK


def jobs(n: int, tag: str = "job") -> list[tuple[str, str]]:
    return [(f"j{i}", f"{tag} {i}") for i in range(n)]


def runs_per_job(db: Database, batch_id: str) -> Counter[str]:
    with db.read() as s:
        found = s.exec(select(RunRow.job_id).where(RunRow.batch_id == batch_id)).all()
    return Counter(str(job) for job in found)


class Died(Exception):
    """The starter's death, between two chunks."""


def commits(db: Database) -> list[int]:
    """A list that counts the store's commits while the test runs."""
    seen: list[int] = []
    for engine in db.engines:
        event.listen(engine, "commit", lambda conn: seen.append(1))
    return seen


def test_a_batch_starts_a_chunk_a_transaction_handing_on_each_chunks_messages(db: Database):
    committed = commits(db)
    handed: list[list[OutboxRow]] = []

    started = start_batch(
        db, RunSpec("agent", batch_id="b1"), jobs(10), chunk=3, on_chunk=handed.append
    )

    # The plan (the batch's row), then 3 + 3 + 3 + 1 jobs, each chunk on its own
    assert len(committed) == 1 + 4
    assert [len(rows) for rows in handed] == [3, 3, 3, 1]
    assert [row.args[0] for rows in handed for row in rows] == [
        started.runs[job] for job, _ in jobs(10)
    ]
    assert batch_status(db, "b1").total == 10
    assert runs_per_job(db, "b1") == Counter({f"j{i}": 1 for i in range(10)})


def test_a_start_that_dies_between_chunks_starts_the_missing_jobs_once_when_run_again(
    db: Database,
):
    # Given a start that dies once its second chunk has committed
    handed: list[list[OutboxRow]] = []

    def die_after_two(rows: list[OutboxRow]) -> None:
        handed.append(rows)
        if len(handed) == 2:
            raise Died

    with pytest.raises(Died):
        start_batch(db, RunSpec("agent", batch_id="b1"), jobs(10), chunk=3, on_chunk=die_after_two)
    assert sum(runs_per_job(db, "b1").values()) == 6

    # When the same start is run again
    again = start_batch(db, RunSpec("agent", batch_id="b1"), jobs(10), chunk=3)

    # Then it starts the four jobs still missing, and every job has one run
    assert sorted(again.started) == ["j6", "j7", "j8", "j9"]
    assert runs_per_job(db, "b1") == Counter({f"j{i}": 1 for i in range(10)})
    assert batch_status(db, "b1").batch.jobs == 10


def test_a_changed_prompt_is_refused_before_any_chunk_starts(db: Database):
    start_batch(db, RunSpec("agent", batch_id="b1"), jobs(4), chunk=2)
    changed = [*jobs(4), ("j4", "new"), ("j5", "new")]
    changed[1] = ("j1", "another prompt")

    with pytest.raises(JobChanged) as refused:
        start_batch(db, RunSpec("agent", batch_id="b1"), changed, chunk=2)

    assert refused.value.jobs == ["j1"]
    assert sum(runs_per_job(db, "b1").values()) == 4, "nothing was started"


def test_a_changed_prompt_started_anew_replaces_its_run_in_its_chunk(db: Database):
    first = start_batch(db, RunSpec("agent", batch_id="b1"), jobs(4), chunk=2)
    changed = jobs(4)
    changed[3] = ("j3", "another prompt")

    again = start_batch(db, RunSpec("agent", batch_id="b1"), changed, chunk=2, restart_changed=True)

    assert again.started == ["j3"]
    assert again.runs["j3"] != first.runs["j3"]
    with db.read() as s:
        old = s.get(RunRow, first.runs["j3"])
        assert old is not None
        assert old.replaced_by == again.runs["j3"]
    assert batch_status(db, "b1").batch.jobs == 4


def test_many_runs_started_at_once_are_written_a_chunk_a_transaction(db: Database):
    committed = commits(db)
    runs = [(f"run_{i}", f"prompt {i}") for i in range(CHUNK + 5)]

    rows = create_runs(db, RunSpec("agent"), runs)

    assert len(committed) == 2
    assert [row.args[0] for row in rows] == [run_id for run_id, _ in runs]
