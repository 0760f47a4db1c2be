"""Finished work removed: `purge_finished` drops runs that ended before a moment, with
every row that belongs to them alone; `purge_events` the webhook events all of whose
deliveries are settled, and `purge_decisions` the audit trail's oldest rows, each on a
retention of its own (issue 25).

A run is removed once it is finished (`FINISHED`) and its last change is older than
the cut, with its messages, ledger, outbox rows, requests (their votes, relay calls and
leases), and its events with their webhook deliveries and attempts. A batch goes with
its last run. The audit trail (`relayq_decisions`) stays: each decision names its run,
request and actor itself. A run that is queued, running or waiting is never touched,
nor a run with a request still open, nor a finished run whose conversation has a run
still going (that run's history is its messages), nor one with a webhook delivery not
yet delivered or given up (it goes once the delivery settles).

The work goes in small transactions (`chunk` runs each), so none holds SQLite's write
lock for long beside live work, and a purge cut short leaves whole runs, removed or
not. Ids are never reused (runs' and requests' are random), so an answer or a lease
for a removed request is an unknown request: a 404.

On SQLite the pages freed go back to the file system (`give_back_space`) where the file
was made with incremental auto-vacuum, as `store.db` makes every new one; an older file
reuses them for new rows, and shrinks only with an offline `VACUUM`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_ as _and_all
from sqlalchemy import delete, func, text
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from store.db import Database
from store.models import (
    FINISHED,
    BatchRow,
    DecisionRow,
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
from store.run_export import exported

__all__ = [
    "CHUNK",
    "DECISION_CHUNK",
    "EVENT_CHUNK",
    "Exporter",
    "Purged",
    "give_back_space",
    "purge_decisions",
    "purge_events",
    "purge_finished",
]

CHUNK = 50
"""Runs a transaction: about 600 rows; on SQLite beside live work, 78 ms of the write lock
at the longest in a purge of 200,000 runs (`bench.retention`)."""
EVENT_CHUNK = 500
"""Webhook events a transaction, with their deliveries and attempts."""
DECISION_CHUNK = 1000
"""Audit rows a transaction."""
PAUSE = 2.0
"""On SQLite, a purge's pause between two write transactions, in lengths of the first."""
VACUUM_PAGES = 1000
"""SQLite pages given back a transaction: 15 ms of the write lock at the longest in a purge
of 200,000 runs beside live work (`bench.retention`)."""

Exporter = Callable[[list[dict[str, Any]]], None]
"""Keeps the runs about to be removed, one object a run (`store.run_export`), or raises:
then the purge stops, and removes none of them."""

KEPT = ("relayq_decisions", "relayq_workers", "relayq_grants")
"""Tables no purge of runs touches: the audit trail, the workers' heartbeats, and the
standing grants (a grant outlives the run it was made on, as the trail's rows naming
it do)."""


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
    export: Exporter | None = None,
) -> Purged:
    """Remove the runs finished before `before`, with all that is theirs alone, `chunk`
    runs a transaction, and no more transactions once `limit` runs went; returns what
    went. With `dry_run`, removes nothing (and takes no write lock) and counts what
    would go. With `export` (and no `dry_run`), each chunk is read and handed to it
    first, and only what it took is removed (a run changed meanwhile stays)."""
    purged = Purged()
    counted: set[str] = set()  # a dry run's batches, counted once
    after: tuple[datetime, str] | None = None
    # Other workers sweep too: on PostgreSQL each takes runs no other holds.
    sqlite = db.is_sqlite
    lock = not dry_run and not sqlite
    # Not for a sweep's one chunk, every few seconds; nor a dry run, which writes nothing
    # and may be on a replica.
    if not sqlite and not dry_run and (limit is None or limit > chunk):
        _fresh_statistics(db)
    pace = _Pace(db, writes=not dry_run)
    while limit is None or purged.runs < limit:
        if not dry_run and not _found(db, _next(before, after, 1, lock=False, sqlite=sqlite)):
            break  # found by a read: a sweep with nothing to remove takes no lock
        query = _next(before, after, chunk, lock=lock, sqlite=sqlite)
        if export is not None and not dry_run:
            with db.read() as s:
                taken = s.exec(_next(before, after, chunk, lock=False, sqlite=sqlite)).all()
                if not taken:
                    break
                lines = exported(s, taken)
            export(lines)
            after = (taken[-1].updated_at, taken[-1].id)
            query = query.where(col(RunRow.id).in_([r.id for r in taken]))
        with pace.turn(), db.read() if dry_run else db.write() as s:
            runs = s.exec(query).all()
            if export is None or dry_run:
                if not runs:
                    break
                after = (runs[-1].updated_at, runs[-1].id)
            runs = _still_purgeable(s, runs, before, lock=lock)
            if runs:
                _remove(s, runs, purged, before if dry_run else None, counted, lock=lock)
    if purged.runs and not dry_run:
        give_back_space(db)
    return purged


def purge_events(
    db: Database, before: datetime, *, chunk: int = EVENT_CHUNK, limit: int | None = None
) -> Purged:
    """Remove the webhook events made before `before` whose deliveries are all settled
    (delivered, or given up), with those deliveries and their attempts, `chunk` events a
    transaction; an event with a delivery still pending stays, whatever its age."""
    purged = Purged()
    lock = not db.is_sqlite
    pace = _Pace(db)
    while limit is None or purged.rows.get("relayq_events", 0) < limit:
        if not _found(db, _settled_events(before, 1, lock=False)):
            break
        with pace.turn(), db.write() as s:
            event_ids = list(s.exec(_settled_events(before, chunk, lock=lock)))
            if not event_ids:
                break
            _drop_events(s, event_ids, purged, dry_run=False)
    if purged.rows:
        give_back_space(db)
    return purged


def purge_decisions(
    db: Database, before: datetime, *, chunk: int = DECISION_CHUNK, limit: int | None = None
) -> int:
    """Remove the audit trail's rows made before `before`, `chunk` a transaction; returns
    how many went."""
    removed = 0
    lock = not db.is_sqlite
    oldest = select(DecisionRow.id).where(col(DecisionRow.at) < before)
    pace = _Pace(db)
    while limit is None or removed < limit:
        if not _found(db, oldest.limit(1)):
            break
        with pace.turn(), db.write() as s:
            query = oldest.order_by(col(DecisionRow.id)).limit(chunk)
            ids = list(s.exec(query.with_for_update(skip_locked=True) if lock else query))
            if not ids:
                break
            removed += _drop(s, DecisionRow, DecisionRow.id, ids, dry_run=False)
    if removed:
        give_back_space(db)
    return removed


def give_back_space(db: Database, *, pages: int = VACUUM_PAGES) -> int:
    """On SQLite, return the file's free pages to the file system, `pages` a write
    transaction; returns how many. None on PostgreSQL (autovacuum keeps its tables'
    space for their new rows), nor on a SQLite file made without incremental
    auto-vacuum."""
    if not db.is_sqlite:
        return 0
    with db.connect() as conn:
        if conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() != _INCREMENTAL:
            return 0
    freed = 0
    pace = _Pace(db)
    while True:
        with db.connect() as conn:
            free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
        if free == 0:
            return freed
        with pace.turn(), db.transaction() as conn:
            # sqlite3 steps a statement once, and `incremental_vacuum` frees a page a
            # step: so one statement a page, each reset by the next.
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                for _ in range(min(free, pages)):
                    cursor.execute("PRAGMA incremental_vacuum(1)")
            finally:
                cursor.close()
        freed += min(free, pages)


_INCREMENTAL = 2
"""`PRAGMA auto_vacuum`'s value for incremental."""


class _Pace:
    """Each write transaction of a purge after a pause twice as long as the one before
    it, on SQLite: live work's writers, which ask for its one write lock again after
    short sleeps, take it between two of the purge's transactions instead of waiting out
    a run of them (`bench.retention`, 200,000 runs: the interactive p50 1.86x idle with
    pauses as long as the transactions, 1.10x with twice). PostgreSQL's writers lock
    rows, not the store: no pause there."""

    def __init__(self, db: Database, *, writes: bool = True) -> None:
        self.pauses = db.is_sqlite and writes
        self.held = 0.0

    @contextmanager
    def turn(self) -> Iterator[None]:
        if self.pauses and self.held:
            _sleep(PAUSE * self.held)
        began = time.monotonic()
        try:
            yield
        finally:
            self.held = time.monotonic() - began


_sleep = time.sleep
"""How a purge pauses (a test records the pauses instead)."""


def _fresh_statistics(db: Database) -> None:
    """PostgreSQL's planner, with no statistics of the runs yet (autovacuum analyzes a
    table a while after a bulk load), guessed a dozen runs where tens of thousands were
    left, and sorted every one of them for each chunk: 62 ms a chunk against 0.2, 284 runs
    a second purged after `bench.retention` seeded 200,000. One ANALYZE of the runs first
    (a sample of them: a fraction of a second); later, as the purge removes runs, the
    statistics only overstate what is left, which keeps the planner on the index. A purge
    of more than one chunk only: a sweep's one chunk costs such a plan once."""
    with db.transaction() as conn:
        conn.execute(text("ANALYZE relayq_runs"))


def _found(db: Database, query: Any) -> bool:
    with db.read() as s:
        return s.exec(query).first() is not None


def _purgeable(before: datetime, *, sqlite: bool = True) -> list[Any]:
    """A run that may go: finished, last changed before `before`, no request open, no run
    of its conversation still going (it reads this one's messages), no webhook delivery
    of its events still pending (it would be lost unsent).

    On SQLite the statuses are compared as `status || ''`, which no index serves: its
    planner, with no statistics, took the index on status for both, sorting every
    finished run for each chunk and reading every open request for each run (73 ms a
    chunk at 200,000 runs, against 0.2 ms by the runs' `updated_at` and the requests'
    `run_id`). Not on PostgreSQL, which keeps statistics of the column: there the
    expression only hid them from its planner (1,754 runs guessed where 69,913 were)."""
    status: Any = _unindexed if sqlite else col
    open_request = select(RequestRow.id).where(
        RequestRow.run_id == RunRow.id, status(RequestRow.status) == "open"
    )
    # A run of the same conversation still going reads this one's messages as its history.
    sibling = aliased(RunRow)
    going_on = select(sibling.id).where(
        col(sibling.conversation_id) == col(RunRow.conversation_id),
        status(sibling.status).not_in(FINISHED),
    )
    undelivered = (
        select(DeliveryRow.id)
        .join(EventRow, col(EventRow.id) == col(DeliveryRow.event_id))
        .where(EventRow.run_id == RunRow.id, status(DeliveryRow.state) == "pending")
    )
    return [
        status(RunRow.status).in_(FINISHED),
        col(RunRow.updated_at) < before,
        ~open_request.exists(),
        ~going_on.exists(),
        ~undelivered.exists(),
    ]


def _still_purgeable(
    s: Session, runs: Sequence[RunRow], before: datetime, *, lock: bool
) -> Sequence[RunRow]:
    """Of `runs`, locked (`lock`: PostgreSQL), those that may still go, asked by a statement
    of its own. The
    one that locked them judged them by what was committed when it began: a run that
    continues the conversation, committed before the lock was taken, was not in its view,
    and the lock only says that none can be now (`store.runs` locks a conversation's
    runs to continue it). SQLite's one writer leaves nothing to ask again."""
    if not lock or not runs:
        return runs
    query = select(RunRow.id).where(
        col(RunRow.id).in_([r.id for r in runs]), *_purgeable(before, sqlite=False)
    )
    kept = set(s.exec(query))
    return [r for r in runs if r.id in kept]


def _unindexed(column: Any) -> Any:
    return col(column).concat("")


def _next(
    before: datetime, after: tuple[datetime, str] | None, chunk: int, *, lock: bool, sqlite: bool
) -> Any:
    """The next `chunk` runs that may go, oldest first, after the key `after` (a dry run
    removes nothing, so it pages on)."""
    query = select(RunRow).where(*_purgeable(before, sqlite=sqlite))
    if after is not None:
        at, run_id = after
        # (updated_at, id) past the key, with the index's range on updated_at stated
        # alone, so that the scan starts at the key rather than filtering up to it.
        query = query.where(
            col(RunRow.updated_at) >= at,
            ~_and_all(col(RunRow.updated_at) == at, col(RunRow.id) <= run_id),
        )
    query = query.order_by(col(RunRow.updated_at), col(RunRow.id)).limit(chunk)
    return query.with_for_update(skip_locked=True) if lock else query


def _settled_events(before: datetime, chunk: int, *, lock: bool) -> Any:
    """The oldest `chunk` events made before `before` with no delivery still pending."""
    pending = select(DeliveryRow.id).where(
        DeliveryRow.event_id == EventRow.id, DeliveryRow.state == "pending"
    )
    query = (
        select(EventRow.id)
        .where(col(EventRow.created_at) < before, ~pending.exists())
        .order_by(col(EventRow.created_at))
        .limit(chunk)
    )
    return query.with_for_update(skip_locked=True) if lock else query


def _drop(s: Session, model: Any, column: Any, ids: Sequence[Any], *, dry_run: bool) -> int:
    """Delete (or, in a dry run, count) `model`'s rows whose `column` is in `ids`."""
    if not ids:
        return 0
    where = col(column).in_(ids)
    if dry_run:
        return int(s.exec(select(func.count()).select_from(model).where(where)).one())
    return int(s.execute(delete(model).where(where)).rowcount)  # type: ignore[attr-defined]


def _drop_events(s: Session, event_ids: Sequence[str], purged: Purged, *, dry_run: bool) -> None:
    """The events, with their deliveries and the deliveries' attempts."""
    delivery_ids = list(
        s.exec(select(DeliveryRow.id).where(col(DeliveryRow.event_id).in_(event_ids)))
    )
    for model, column, ids in (
        (DeliveryAttemptRow, DeliveryAttemptRow.delivery_id, delivery_ids),
        (DeliveryRow, DeliveryRow.id, delivery_ids),
        (EventRow, EventRow.id, event_ids),
    ):
        if ids:
            purged.add(model.__tablename__, _drop(s, model, column, ids, dry_run=dry_run))


def _remove(
    s: Session,
    runs: Sequence[RunRow],
    purged: Purged,
    dry_before: datetime | None,
    counted: set[str],
    *,
    lock: bool,
) -> None:
    """Remove `runs` and what is theirs; with `dry_before` (a dry run's cut), count it.
    With `lock` (PostgreSQL), the runs' events are locked before their deliveries are
    touched, the order `purge_events` keeps too: a sweep removing the same settled
    events meanwhile is waited for, never deadlocked with."""
    dry_run = dry_before is not None
    run_ids = [r.id for r in runs]
    request_ids = list(s.exec(select(RequestRow.id).where(col(RequestRow.run_id).in_(run_ids))))
    events = select(EventRow.id).where(col(EventRow.run_id).in_(run_ids))
    event_ids = list(s.exec(events.with_for_update() if lock else events))

    def drop(model: Any, column: Any, ids: Sequence[Any]) -> None:
        if ids:
            purged.add(model.__tablename__, _drop(s, model, column, ids, dry_run=dry_run))

    _drop_events(s, event_ids, purged, dry_run=dry_run)
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
