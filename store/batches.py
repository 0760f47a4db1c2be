"""Batches once started: where each stands (counts, cost, rate, finish), their results
in the input's order, finding and listing them, and cancelling one.

Starting a batch is `store.batch_start`'s; its names are importable from here too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from relayq import RelayqError
from store.batch_start import JobChanged, Started, batch_prompts, start_batch
from store.db import Database
from store.models import FINISHED, BatchRow, RequestRow, RunRow, utcnow
from store.runs import cancel_many_locked
from store.stored_requests import IDS_PER_QUERY

__all__ = [
    "BatchCancel",
    "BatchStatus",
    "JobChanged",
    "Started",
    "UnknownBatch",
    "batch_prompts",
    "batch_results",
    "batch_status",
    "cancel_batch",
    "find_batch",
    "list_batches",
    "result_of",
    "start_batch",
]


class UnknownBatch(RelayqError):
    """No batch has this id."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(batch_id)
        self.batch_id = batch_id

    def __str__(self) -> str:
        return f"unknown batch id {self.batch_id!r} (never made, or removed with its last run)"


@dataclass(frozen=True, kw_only=True)
class BatchStatus:
    """Where a batch stands."""

    batch: BatchRow
    counts: dict[str, int]
    """Current runs by status."""
    open_requests: int
    tokens: int
    cost: float
    """What its runs' model calls cost, by the provider's prices (0: no price)."""
    finished_at: datetime | None
    """When the last of its runs finished, once all have."""
    last_change: datetime | None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in FINISHED)

    @property
    def waiting_on_people(self) -> int:
        """Runs pending on an open request: none of them moves until someone answers."""
        return self.counts.get("pending", 0)

    @property
    def moving(self) -> int:
        """Runs queued or running: what a worker will take on without anyone's answer."""
        return self.total - self.finished - self.waiting_on_people

    def to_wire(self, now: datetime) -> dict[str, Any]:
        """The batch as the API and `--json` show it."""
        batch, rate, eta = self.batch, self.rate(now), self.eta(now)
        return {
            "id": batch.id,
            "agent": batch.agent,
            "name": batch.name,
            "startedBy": batch.started_by,
            "createdAt": batch.created_at.isoformat(),
            "cancelledAt": None if batch.cancelled_at is None else batch.cancelled_at.isoformat(),
            "jobs": batch.jobs,
            "counts": self.counts,
            "finished": self.finished,
            "openRequests": self.open_requests,
            "waitingOnPeople": self.waiting_on_people,
            "moving": self.moving,
            "tokens": self.tokens,
            "cost": round(self.cost, 6),
            "budget": batch.budget,
            "overBudget": batch.over_budget,
            "perMinute": None if rate is None else round(rate, 2),
            "etaSeconds": None if eta is None else round(eta),
            "finishedAt": None if self.finished_at is None else self.finished_at.isoformat(),
        }

    def rate(self, now: datetime) -> float | None:
        """Runs finished per minute since the batch was created; None while nothing can
        move (every unfinished run waits on a person): no rate holds for that wait."""
        if self.moving == 0 and self.finished < self.total:
            return None
        minutes = ((self.finished_at or now) - self.batch.created_at).total_seconds() / 60
        return self.finished / minutes if minutes > 0 and self.finished else None

    def eta(self, now: datetime) -> float | None:
        """Seconds until the runs that can move have finished, at the rate so far (None:
        unknown, or only runs waiting on a person are left). Those waiting are not in it:
        how long a person takes is no rate of the batch's."""
        if self.total == self.finished:
            return 0.0
        rate = self.rate(now)
        return None if not rate or not self.moving else self.moving / rate * 60


def batch_status(db: Database, batch_id: str) -> BatchStatus:
    with db.snapshot() as s:
        batch = s.get(BatchRow, batch_id)
        if batch is None:
            raise UnknownBatch(batch_id)
        return _status(s, batch)


def _status(s: Session, batch: BatchRow) -> BatchStatus:
    current = (RunRow.batch_id == batch.id, col(RunRow.replaced_by).is_(None))
    counts = dict(
        s.exec(select(RunRow.status, func.count()).where(*current).group_by(RunRow.status)).all()
    )
    tokens, cost, last = s.exec(
        select(
            func.coalesce(func.sum(RunRow.total_tokens), 0),
            func.coalesce(func.sum(RunRow.cost), 0.0),
            func.max(RunRow.updated_at),
        ).where(*current)
    ).one()
    waiting = s.exec(
        select(func.count())
        .select_from(RequestRow)
        .join(RunRow, col(RunRow.id) == RequestRow.run_id)
        .where(*current, RequestRow.status == "open")
    ).one()
    done = all(status in FINISHED for status in counts) and bool(counts)
    return BatchStatus(
        batch=batch,
        counts={str(k): int(v) for k, v in counts.items()},
        open_requests=int(waiting),
        tokens=int(tokens or 0),
        cost=float(cost or 0.0),
        finished_at=last if done else None,
        last_change=last,
    )


def find_batch(db: Database, *, agent: str, name: str) -> BatchStatus | None:
    """The newest batch of `agent` named `name`, with where it stands; None if none is."""
    query = (
        select(BatchRow)
        .where(BatchRow.agent == agent, BatchRow.name == name)
        .order_by(col(BatchRow.created_at).desc(), col(BatchRow.id).desc())
        .limit(1)
    )
    with db.snapshot() as s:
        batch = s.exec(query).first()
        return None if batch is None else _status(s, batch)


def list_batches(
    db: Database, *, agent: str | None = None, limit: int = 50, before: str | None = None
) -> list[BatchStatus]:
    """Batches, newest first, with where each stands; `before`: a batch id of the page before."""
    query = select(BatchRow).order_by(col(BatchRow.created_at).desc(), col(BatchRow.id).desc())
    if agent is not None:
        query = query.where(BatchRow.agent == agent)
    with db.snapshot() as s:
        if before is not None:
            after = s.get(BatchRow, before)
            if after is None:
                raise UnknownBatch(before)
            query = query.where(
                (col(BatchRow.created_at) < after.created_at)
                | ((col(BatchRow.created_at) == after.created_at) & (col(BatchRow.id) < after.id))
            )
        return [_status(s, batch) for batch in s.exec(query.limit(limit))]


class BatchCancel(Counter[str]):
    """How many of a batch's unfinished runs were in each status when asked to stop
    (`cancel_batch`), and which of them that ask ended."""

    agent: str
    settled: list[str]
    """The runs ended at once (queued or waiting), in id order: they settled here."""


def cancel_batch(db: Database, batch_id: str) -> BatchCancel:
    """Ask every unfinished run of the batch to stop; how many were in each status."""
    now = utcnow()
    with db.write() as s:
        batch = s.get(BatchRow, batch_id, with_for_update=True)
        if batch is None:
            raise UnknownBatch(batch_id)
        batch.cancelled_at = batch.cancelled_at or now
        runs = s.exec(
            select(RunRow)
            .where(
                RunRow.batch_id == batch_id,
                col(RunRow.replaced_by).is_(None),
                col(RunRow.status).not_in(FINISHED),
            )
            .order_by(col(RunRow.id))
            .with_for_update()
        ).all()
        asked = BatchCancel(run.status for run in runs)
        ending = [run for run in runs if run.status in ("queued", "pending")]
        asked.agent, asked.settled = batch.agent, [run.id for run in ending]
        # A running run stops at its next boundary; the others end now.
        going = [run.id for run in runs if run.status not in ("queued", "pending")]
        for at in range(0, len(going), IDS_PER_QUERY):
            s.execute(
                update(RunRow)
                .where(col(RunRow.id).in_(going[at : at + IDS_PER_QUERY]))
                .values(cancel_requested=True, updated_at=now)
            )
        cancel_many_locked(s, ending, now)
        return asked


def result_of(run: RunRow, job_id: Any = None) -> dict[str, Any]:
    """A job's outcome as a results line holds it: {id, run_id, status, text, error}."""
    job = run.job_id if job_id is None else job_id
    return {
        "id": job,
        "run_id": run.id,
        "status": run.status,
        "text": run.text or "",
        "error": run.error,
    }


def batch_results(db: Database, batch_id: str) -> list[RunRow]:
    """The batch's current runs in the input's order (by job index)."""
    with db.read() as s:
        if s.get(BatchRow, batch_id) is None:
            raise UnknownBatch(batch_id)
        query = (
            select(RunRow)
            .where(RunRow.batch_id == batch_id, col(RunRow.replaced_by).is_(None))
            .order_by(col(RunRow.job_index), col(RunRow.id))
        )
        return list(s.exec(query))
