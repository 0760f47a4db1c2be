"""Starting a batch: many runs of one agent, one per job, started together.

A batch starts in chunks (`CHUNK` jobs a transaction, a short pause between
them on SQLite), so that no start holds the store's write lock for long: a
start of 100,000 jobs must not stop the turns of every other run meanwhile.
Each chunk starts its jobs and records which run does which job in one
transaction, and a unique index holds one current run per (batch, job): a
rerun, two racing starters, or a crash between chunks can never start a job
twice, and a rerun after a crash starts only the jobs still missing. A rerun
whose prompt for a job changed is refused, naming the job, before anything
starts, unless asked to start it anew: then the old run is cancelled and
marked replaced, and a new one takes the job.

Where a batch stands once started, its results, and cancelling it: `store.batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import and_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from relayq import RelayqError, new_id
from relayq.limits import check_run_input
from store.batch_queues import batch_queue_name
from store.db import Database
from store.models import FINISHED, BatchRow, MessageRow, OutboxRow, RunRow, utcnow
from store.outbox import TURN_QUEUE
from store.runs import CHUNK, RunSpec, cancel_locked, chunked, insert_runs

__all__ = ["JobChanged", "Started", "batch_prompts", "start_batch"]


class JobChanged(RelayqError):
    """A rerun gives jobs a prompt other than the one their runs started with (or the
    batch is another agent's); nothing was started."""

    def __init__(self, batch_id: str, jobs: list[str], message: str | None = None) -> None:
        super().__init__(batch_id, jobs)
        self.batch_id = batch_id
        self.jobs = jobs
        shown = ", ".join(repr(j) for j in jobs[:5]) + (" ..." if len(jobs) > 5 else "")
        self.message = message or (
            f"batch {batch_id}: job(s) {shown} already ran with another prompt; "
            "nothing was started. Restore the prompt, or ask to start changed jobs anew"
        )

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, kw_only=True)
class Started:
    """What starting a batch's jobs did."""

    batch_id: str
    runs: dict[str, str]
    """Every job's current run, by job id, in the input's order."""
    started: list[str]
    """The jobs started now (new ones, and changed ones started anew)."""
    outbox: list[OutboxRow] = field(default_factory=list)


T = TypeVar("T")


def start_batch(
    db: Database,
    spec: RunSpec,
    jobs: list[tuple[str, str]],
    *,
    name: str | None = None,
    options: dict[str, Any] | None = None,
    restart_changed: bool = False,
    batch_budget: dict[str, Any] | None = None,
    chunk: int = CHUNK,
    on_chunk: Callable[[list[OutboxRow]], None] | None = None,
    max_bytes: int | None = None,
) -> Started:
    """Start the jobs (`(job id, prompt)`, in input order) of batch `spec.batch_id` (a new
    batch if None or unknown) that have no run yet, as `spec` says; the others keep theirs.

    JobChanged, starting nothing, for a job whose prompt changed since its run
    started, unless `restart_changed`; or for a batch of another agent.
    Every turn of the batch's runs goes to the batch's own queue, named from
    `spec.queue` (the agent's, by default `relayq.turns`) when the batch is new
    (`store.batch_queues`). `batch_budget` (`relayq.budgets.Budget` wire) is what all
    the batch's runs together may spend (a rerun's, if given, replaces it); `spec.budget`
    what each run it starts may. `name` is what a new batch is known by (`find_batch`).

    The jobs start `chunk` at a time, each chunk in a transaction of its own; after
    each commits, `on_chunk` gets its first turns' messages to send (a start that
    dies between chunks leaves the rest to a rerun with the same batch id).
    """
    check_run_input(agent=spec.agent, prompts=[prompt for _, prompt in jobs], max_bytes=max_bytes)
    ids = [job for job, _ in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("a batch names each job once")
    if chunk < 1:
        raise ValueError(f"a chunk holds at least one job, not {chunk}")
    spec = replace(spec, batch_id=spec.batch_id or new_id("batch"))
    plan = _retried(partial(_plan, db, spec, jobs, options, restart_changed, batch_budget, name))
    current = dict(plan.current)
    started: list[str] = []
    outbox: list[OutboxRow] = []
    for part in chunked(db, plan.todo, chunk):
        runs, made, rows = _retried(partial(_start_chunk, db, plan, part))
        current |= runs
        started += made
        outbox += rows
        if on_chunk is not None and rows:
            on_chunk(rows)
    mapping = {job: current[job] for job in ids}
    return Started(batch_id=plan.batch_id, runs=mapping, started=started, outbox=outbox)


def _retried(step: Callable[[], T]) -> T:
    for attempt in range(3):
        try:
            return step()
        except IntegrityError:
            # Another starter of the same batch won the race to create it (or a job's
            # run): now the batch row exists and its lock puts us in line.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _Plan:
    """What a start will do, decided before any job starts."""

    spec: RunSpec
    """How its runs start: with the batch's id, and its queue, where their turns go."""
    current: dict[str, str]
    """Each job's run before the start, for the jobs that had one."""
    changed: frozenset[str]
    """Jobs started anew: their prompt changed, and the start was asked to."""
    todo: list[tuple[int, str, str]]
    """(place in the input, job, prompt) of each job to start, in input order."""

    @property
    def batch_id(self) -> str:
        assert self.spec.batch_id is not None, "a plan is of one batch"
        return self.spec.batch_id


def _plan(
    db: Database,
    spec: RunSpec,
    jobs: list[tuple[str, str]],
    options: dict[str, Any] | None,
    restart_changed: bool,
    budget: dict[str, Any] | None,
    name: str | None,
) -> _Plan:
    """The batch, made or checked (its agent, its new budget), and what the start will do;
    JobChanged before anything starts."""
    now = utcnow()
    agent, batch_id, queue = spec.agent, spec.batch_id, spec.queue
    assert batch_id is not None, "the start named the batch"
    with db.write() as s:
        batch = s.get(BatchRow, batch_id, with_for_update=True)
        if batch is None:
            batch = BatchRow(
                id=batch_id,
                agent=agent,
                name=name,
                started_by=spec.started_by,
                options=options or {},
                created_at=now,
                queue=batch_queue_name(queue or TURN_QUEUE, batch_id),
            )
            s.add(batch)
        elif batch.agent != agent:
            message = (
                f"batch {batch_id} runs agent {batch.agent!r}, not {agent!r}; nothing was started"
            )
            raise JobChanged(batch_id, [], message)
        current = _current_runs(s, batch_id)
        changed = [job for job, prompt in jobs if job in current and current[job][1] != prompt]
        if changed and not restart_changed:
            raise JobChanged(batch_id, changed)
        if budget is not None:
            batch.budget = budget
        todo = [
            (n, job, prompt)
            for n, (job, prompt) in enumerate(jobs)
            if job not in current or job in changed
        ]
        # A rerun keeps the queue the batch started with (a batch older than batch
        # queues has none: its runs go to their agent's).
        return _Plan(
            spec=replace(spec, queue=batch.queue or queue),
            current={job: run_id for job, (run_id, _) in current.items()},
            changed=frozenset(changed),
            todo=todo,
        )


def _start_chunk(
    db: Database,
    plan: _Plan,
    part: Sequence[tuple[int, str, str]],
) -> tuple[dict[str, str], list[str], list[OutboxRow]]:
    """Start one chunk's jobs in one transaction: those still without a current run, or
    with the run the plan found and means to replace. Returns each of the chunk's jobs'
    current run, the jobs started, and their first turns' messages."""
    now = utcnow()
    with db.write() as s:
        batch = s.get(BatchRow, plan.batch_id, with_for_update=True)
        assert batch is not None, "the plan made it"
        # A racing starter, or this start's own try before a lost commit, may have
        # started some already: they keep their run.
        runs_now = _runs_of_jobs(s, plan.batch_id, [job for _, job, _ in part])
        todo = [
            (n, job, prompt)
            for n, job, prompt in part
            if job not in runs_now or (job in plan.changed and runs_now[job] == plan.current[job])
        ]
        runs = [(new_id("run"), prompt) for _, _, prompt in todo]
        for (_, job, _), (run_id, _) in zip(todo, runs, strict=True):
            if job in runs_now:
                _replace(s, runs_now[job], run_id, now)
        s.flush()
        written = insert_runs(
            s.connection(), plan.spec, runs, jobs=[(n, job) for n, job, _ in todo]
        )
        batch.jobs += sum(1 for _, job, _ in todo if job not in runs_now)
    made = {job: run_id for (_, job, _), (run_id, _) in zip(todo, runs, strict=True)}
    return runs_now | made, list(made), written.rows()


def _runs_of_jobs(s: Session, batch_id: str, jobs: Iterable[str]) -> dict[str, str]:
    """The current run of each of these jobs that has one."""
    rows = s.exec(
        select(RunRow.job_id, RunRow.id).where(
            RunRow.batch_id == batch_id,
            col(RunRow.job_id).in_(list(jobs)),
            col(RunRow.replaced_by).is_(None),
        )
    ).all()
    return {str(job): run_id for job, run_id in rows}


def _current_runs(s: Session, batch_id: str) -> dict[str, tuple[str, str]]:
    """Each job's current run and the prompt it started with."""
    prompt = and_(
        col(MessageRow.conversation_id) == col(RunRow.conversation_id),
        col(MessageRow.seq) == col(RunRow.start_seq),
    )
    rows = s.exec(
        select(RunRow.job_id, RunRow.id, MessageRow.body)
        .join(MessageRow, prompt)
        .where(RunRow.batch_id == batch_id, col(RunRow.replaced_by).is_(None))
    ).all()
    return {str(job): (run_id, str((body or {}).get("content"))) for job, run_id, body in rows}


def _replace(s: Session, run_id: str, by: str, now: datetime) -> None:
    run = s.get(RunRow, run_id, with_for_update=True)
    assert run is not None
    if run.status not in FINISHED:
        run.cancel_requested = True
        if run.status in ("queued", "pending"):
            cancel_locked(s, run, now)
    run.replaced_by = by


def batch_prompts(db: Database, batch_id: str) -> dict[str, str]:
    """The prompt each job of the batch has its current run for, by job id."""
    with db.read() as s:
        return {job: prompt for job, (_, prompt) in _current_runs(s, batch_id).items()}
