"""Finished work removed: `purge_finished` drops runs that ended before a moment, with
every row that belongs to them alone (issue 25).

A run is removed once it is finished (`FINISHED`) and its last change is older than
the cut, with its messages, ledger, outbox rows, requests (their votes, relay calls and
leases), and its events with their webhook deliveries and attempts. A batch goes with
its last run. The audit trail (`relayq_decisions`) stays: each decision names its run,
request and actor itself. A run that is queued, running or waiting is never touched,
nor a run with a request still open.

The work goes in small transactions (`chunk` runs each), so none holds SQLite's write
lock for long beside live work, and a purge cut short leaves whole runs, removed or
not. Ids are never reused (runs' and requests' are random), so an answer or a lease
for a removed request is an unknown request: a 404.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_ as _and_all
from sqlalchemy import delete, func
from sqlmodel import Session, col, select

from store.db import Database
from store.models import (
    FINISHED,
    BatchRow,
    DeliveryAttemptRow,
    DeliveryRow,
    EventRow,
    LeaseRow,
    LedgerRow,
    MessageRow,
    OutboxRow,
    RelayCallRow,
    RequestRow,
    RunRow,
    VoteRow,
)

__all__ = ["CHUNK", "Purged", "purge_finished"]

CHUNK = 100
"""Runs a transaction: a few thousand rows at most, tens of milliseconds of SQLite's lock."""

KEPT = ("relayq_decisions", "relayq_workers")
"""Tables no purge of runs touches: the audit trail, and the workers' heartbeats."""


@dataclass
class Purged:
    """Rows removed (or, in a dry run, that would be), by table."""

    rows: dict[str, int] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return self.rows.get("relayq_runs", 0)

    def add(self, table: str, count: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + count


def purge_finished(
    db: Database,
    before: datetime,
    *,
    dry_run: bool = False,
    chunk: int = CHUNK,
    limit: int | None = None,
) -> Purged:
    """Remove the runs finished before `before`, with all that is theirs alone, `chunk`
    runs a transaction, and no more transactions once `limit` runs went; returns what
    went. With `dry_run`, removes nothing (and takes no write lock) and counts what
    would go."""
    purged = Purged()
    counted: set[str] = set()  # a dry run's batches, counted once
    after: tuple[datetime, str] | None = None
    # Other workers sweep too: on PostgreSQL each takes runs no other holds.
    lock = not dry_run and not db.is_sqlite
    while True:
        if not dry_run and not _any(db, before, after):
            return purged  # found by a read: a sweep with nothing to remove takes no lock
        with db.read() if dry_run else db.write() as s:
            runs = s.exec(_next(before, after, chunk, lock=lock)).all()
            if not runs:
                return purged
            after = (runs[-1].updated_at, runs[-1].id)
            _remove(s, runs, purged, before if dry_run else None, counted)
        if limit is not None and purged.runs >= limit:
            return purged


def _any(db: Database, before: datetime, after: tuple[datetime, str] | None) -> bool:
    with db.read() as s:
        return s.exec(_next(before, after, 1, lock=False)).first() is not None


def _purgeable(before: datetime) -> list[Any]:
    """A run that may go: finished, last changed before `before`, no request open."""
    open_request = select(RequestRow.id).where(
        RequestRow.run_id == RunRow.id, RequestRow.status == "open"
    )
    return [
        col(RunRow.status).in_(FINISHED),
        col(RunRow.updated_at) < before,
        ~open_request.exists(),
    ]


def _next(before: datetime, after: tuple[datetime, str] | None, chunk: int, *, lock: bool) -> Any:
    """The next `chunk` runs that may go, oldest first, after the key `after` (a dry run
    removes nothing, so it pages on)."""
    query = select(RunRow).where(*_purgeable(before))
    if after is not None:
        at, run_id = after
        query = query.where(
            (col(RunRow.updated_at) > at)
            | _and_all(col(RunRow.updated_at) == at, col(RunRow.id) > run_id)
        )
    query = query.order_by(col(RunRow.updated_at), col(RunRow.id)).limit(chunk)
    return query.with_for_update(skip_locked=True) if lock else query


def _remove(
    s: Session,
    runs: Sequence[RunRow],
    purged: Purged,
    dry_before: datetime | None,
    counted: set[str],
) -> None:
    """Remove `runs` and what is theirs; with `dry_before` (a dry run's cut), count it."""
    dry_run = dry_before is not None
    run_ids = [r.id for r in runs]
    request_ids = list(s.exec(select(RequestRow.id).where(col(RequestRow.run_id).in_(run_ids))))
    event_ids = list(s.exec(select(EventRow.id).where(col(EventRow.run_id).in_(run_ids))))
    delivery_ids = list(
        s.exec(select(DeliveryRow.id).where(col(DeliveryRow.event_id).in_(event_ids)))
    )

    def drop(model: Any, column: Any, ids: Sequence[Any]) -> None:
        if not ids:
            return
        where = col(column).in_(ids)
        if dry_run:
            count = s.exec(select(func.count()).select_from(model).where(where)).one()
        else:
            count = s.execute(delete(model).where(where)).rowcount  # type: ignore[attr-defined]
        purged.add(model.__tablename__, int(count))

    drop(DeliveryAttemptRow, DeliveryAttemptRow.delivery_id, delivery_ids)
    drop(DeliveryRow, DeliveryRow.id, delivery_ids)
    drop(EventRow, EventRow.id, event_ids)
    drop(VoteRow, VoteRow.request_id, request_ids)
    drop(LeaseRow, LeaseRow.request_id, request_ids)
    drop(RelayCallRow, RelayCallRow.request_id, request_ids)
    drop(RequestRow, RequestRow.id, request_ids)
    drop(LedgerRow, LedgerRow.run_id, run_ids)
    drop(MessageRow, MessageRow.run_id, run_ids)
    drop(OutboxRow, OutboxRow.run_id, run_ids)
    drop(RunRow, RunRow.id, run_ids)
    # A batch goes with its last run: in a dry run, once none of its runs would stay.
    batch_ids = {r.batch_id for r in runs if r.batch_id is not None} - counted
    if batch_ids:
        left = select(RunRow.batch_id).where(col(RunRow.batch_id).in_(batch_ids))
        if dry_before is not None:
            left = left.where(~_and_all(*_purgeable(dry_before)))
        going = sorted(batch_ids - set(s.exec(left)))
        counted.update(going)
        drop(BatchRow, BatchRow.id, going)
