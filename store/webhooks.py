"""Webhook deliveries: every event, to every endpoint that wants it, at least once.

The events table is the outbox: an event is written in the transaction that
made it happen (`store.events.emit`). A sender (`tasks.webhooks.sender`, in every
worker process) then, again and again:

1. `fan_out`: one delivery row per (event, endpoint), in batches; the unique
   index on the pair makes a second fan-out of the same event a no-op;
2. `claim_due`: takes the deliveries whose time has come, locked (PostgreSQL's
   `SKIP LOCKED`; SQLite has one writer) and leased, so that no other sender
   takes them while they are in flight;
3. sends them, and `record`s what each attempt came to: one row of the
   delivery log (`relayq_delivery_attempts`), and the delivery `delivered`,
   or tried again after a backoff (`RetryPolicy`), or `failed` once its
   attempts are used up.

A receiver may get an event twice: a lease that ran out mid-send, a 2xx lost
on the way back. The event's id, the same on every attempt, tells it so.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, bindparam, exists, func, literal, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import select as model_select

from store.db import Database
from store.models import DeliveryAttemptRow, DeliveryRow, EventRow, UTCDateTime, utcnow

__all__ = [
    "CURSOR_REACH",
    "FANOUT_MARGIN",
    "NEW_ENDPOINT_BACKLOG",
    "Attempt",
    "Due",
    "Event",
    "RetryPolicy",
    "Subscription",
    "claim_due",
    "delivery_log",
    "fan_out",
    "list_deliveries",
    "record",
]

EVENTS = EventRow.__table__  # type: ignore[attr-defined]
DELIVERIES = DeliveryRow.__table__  # type: ignore[attr-defined]
ATTEMPTS = DeliveryAttemptRow.__table__  # type: ignore[attr-defined]

FANOUT_MARGIN = timedelta(minutes=2)
"""How far before an endpoint's newest fanned-out event the next fan-out looks again.
An event is stamped in its transaction, which may commit after a later-stamped one,
on a host whose clock may be a little off: such an event lands behind the cursor."""

NEW_ENDPOINT_BACKLOG = timedelta(hours=1)
"""An endpoint with no delivery yet starts with the events of the last hour: one
added to a store with years of history must not be sent all of it."""

CURSOR_REACH = 10_000
"""How many of the newest events (of the types it wants) are searched for an
endpoint's newest fanned-out one. An endpoint further behind than that, which
takes its senders being down for long while events pile up, counts as new."""


@dataclass(frozen=True, kw_only=True)
class Subscription:
    """One endpoint, as the store knows it: a name and the event types it wants."""

    endpoint: str
    """The endpoint's name; its deliveries are keyed by it, so a renamed endpoint is a new one."""
    events: frozenset[str] | None = None
    """The event types it wants; None for every type."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """An event as it is delivered."""

    id: str
    type: str
    run_id: str | None
    request_id: str | None
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class Due:
    """A delivery claimed for one attempt."""

    delivery_id: int
    endpoint: str
    attempt: int
    """This attempt's number: 1 for the first."""
    event: Event


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """What one attempt of a delivery came to."""

    delivery_id: int
    status: int | None = None
    """The HTTP status of the reply; None when none came (refused, timed out)."""
    error: str | None = None
    """Why it failed, in a few words: never the endpoint's URL or secret."""
    duration: timedelta = timedelta(0)
    retry_after: timedelta | None = None
    """The receiver's `Retry-After`: the next attempt waits at least that long."""

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When a failed delivery is tried again, and when it is given up.

    With the defaults, 40 attempts over about a day: 1 s, 2 s, 4 s ... doubling
    up to an hour, each wait jittered, then hourly.
    """

    attempts: int = 40
    """Attempts in all; after the last one fails the delivery is `failed`."""
    base: timedelta = timedelta(seconds=1)
    """The wait after the first failed attempt; it doubles after each."""
    cap: timedelta = timedelta(hours=1)
    """No wait is longer, whatever the receiver's `Retry-After`."""

    def delay(self, attempt: int, retry_after: timedelta | None = None) -> timedelta:
        """The wait after failed attempt number `attempt` (1 for the first).

        `base * 2**(attempt - 1)` up to `cap`, times a random factor in [0.5, 1]
        so that the deliveries one outage held back do not all return at once;
        at least `retry_after`, at most `cap`.
        """
        doubled = self.base.total_seconds() * 2.0 ** min(attempt - 1, 60)
        seconds = min(self.cap.total_seconds(), doubled) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            seconds = max(seconds, retry_after.total_seconds())
        return timedelta(seconds=min(seconds, self.cap.total_seconds()))


# -- fan-out --------------------------------------------------------------------------------------


def fan_out(
    db: Database,
    subscriptions: Iterable[Subscription],
    *,
    now: datetime | None = None,
    limit: int = 1000,
) -> int:
    """Make the deliveries of events not yet fanned out, up to `limit` per endpoint;
    how many were made. Call it until it makes fewer than `limit` to catch up."""
    moment = now or utcnow()
    made = 0
    with db.transaction() as conn:
        for sub in subscriptions:
            made += _fan_out_one(conn, sub, moment, limit)
    return made


def _fan_out_one(conn: Connection, sub: Subscription, now: datetime, limit: int) -> int:
    done = DELIVERIES.alias("done")
    fresh = (
        select(
            EVENTS.c.id,
            literal(sub.endpoint),
            literal("pending"),
            literal(0),
            literal(now, UTCDateTime()),
            literal(now, UTCDateTime()),
        )
        .where(
            EVENTS.c.created_at >= _since(conn, sub, now),
            ~exists().where(done.c.event_id == EVENTS.c.id, done.c.endpoint == sub.endpoint),
        )
        .order_by(EVENTS.c.created_at, EVENTS.c.id)
        .limit(limit)
    )
    if sub.events is not None:
        fresh = fresh.where(EVENTS.c.type.in_(sorted(sub.events)))
    insert = postgresql_insert if conn.dialect.name == "postgresql" else sqlite_insert
    stmt = insert(DELIVERIES).from_select(_FANNED, fresh).on_conflict_do_nothing()
    # An INSERT's row count is kept only when asked for (SQLAlchemy 2).
    return int(conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount)


_FANNED = ["event_id", "endpoint", "state", "attempts", "next_at", "created_at"]


def _since(conn: Connection, sub: Subscription, now: datetime) -> datetime:
    """Where the endpoint's fan-out starts: a little before its newest fanned-out event.

    Looked for among the newest events (of the types it wants), each a probe of
    the unique index on (event, endpoint), the deliveries having no index by
    endpoint: first the newest hundred, where an endpoint that keeps up finds
    it, then up to CURSOR_REACH. None of them fanned out: a new endpoint (or
    one far behind) starts with the last NEW_ENDPOINT_BACKLOG.
    """
    for reach in (100, CURSOR_REACH):
        cursor = conn.execute(_newest_fanned(sub, reach)).scalar()
        if cursor is not None:
            return cursor - FANOUT_MARGIN
    return now - NEW_ENDPOINT_BACKLOG


def _newest_fanned(sub: Subscription, reach: int) -> Select[datetime]:
    newest = select(EVENTS.c.id, EVENTS.c.created_at)
    if sub.events is not None:
        newest = newest.where(EVENTS.c.type.in_(sorted(sub.events)))
    recent = newest.order_by(EVENTS.c.created_at.desc()).limit(reach).subquery()
    # max(), not ORDER BY ... LIMIT 1: a plan that may stop early turns into a nested
    # loop over the whole table when its statistics say it is small (fresh, or emptied).
    return (
        select(func.max(recent.c.created_at))
        .select_from(recent.join(DELIVERIES, DELIVERIES.c.event_id == recent.c.id))
        .where(DELIVERIES.c.endpoint == sub.endpoint)
    )


# -- claiming and recording -----------------------------------------------------------------------


def claim_due(
    db: Database,
    endpoints: Collection[str],
    *,
    lease: timedelta,
    now: datetime | None = None,
    limit: int = 100,
) -> list[Due]:
    """Take up to `limit` deliveries due by `now` to any of `endpoints`, oldest due first.

    Each is leased: its next try moves to `now + lease`, so no sender takes it
    again unless this one dies (or takes longer than the lease) before it
    `record`s the attempt. Deliveries to endpoints not named stay where they are.
    """
    if not endpoints:
        return []
    moment = now or utcnow()
    query = (
        select(
            DELIVERIES.c.id,
            DELIVERIES.c.endpoint,
            DELIVERIES.c.attempts,
            *_EVENT_COLUMNS,
        )
        .select_from(DELIVERIES.join(EVENTS, EVENTS.c.id == DELIVERIES.c.event_id))
        .where(
            DELIVERIES.c.state == "pending",
            DELIVERIES.c.next_at <= moment,
            DELIVERIES.c.endpoint.in_(sorted(endpoints)),
        )
        .order_by(DELIVERIES.c.next_at, DELIVERIES.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=DELIVERIES)
    )
    with db.transaction() as conn:
        rows = conn.execute(query).all()
        if rows:
            conn.execute(
                DELIVERIES.update()
                .where(DELIVERIES.c.id.in_([r.id for r in rows]))
                .values(next_at=moment + lease)
            )
    return [_due(r) for r in rows]


_EVENT_COLUMNS = (
    EVENTS.c.id.label("event_id"),
    EVENTS.c.type,
    EVENTS.c.run_id,
    EVENTS.c.request_id,
    EVENTS.c.payload,
    EVENTS.c.created_at,
)


def _due(row: Any) -> Due:
    event = Event(
        id=row.event_id,
        type=row.type,
        run_id=row.run_id,
        request_id=row.request_id,
        payload=dict(row.payload or {}),
        created_at=row.created_at,
    )
    return Due(delivery_id=row.id, endpoint=row.endpoint, attempt=row.attempts + 1, event=event)


def record(
    db: Database,
    attempts: Iterable[Attempt],
    *,
    policy: RetryPolicy = RetryPolicy(),
    now: datetime | None = None,
) -> None:
    """Log each attempt and move its delivery on, all in one transaction.

    A 2xx marks the delivery `delivered` whatever came before (a slower
    duplicate may have failed). A failure of a delivery still `pending` sets
    its next try after a backoff, or gives it up (`failed`) at the last
    attempt; a failure of one already settled is only logged.
    """
    moment = now or utcnow()
    tried = list(attempts)
    if not tried:
        return
    with db.transaction() as conn:
        current = {
            row.id: dict(row._mapping)
            for row in conn.execute(
                select(DELIVERIES)
                .where(DELIVERIES.c.id.in_({a.delivery_id for a in tried}))
                .order_by(DELIVERIES.c.id)  # locks taken in one order: no deadlock between senders
                .with_for_update()
            )
        }
        # A delivery deleted meanwhile (pruned) has nothing left to record.
        log = [
            _apply_attempt(current[a.delivery_id], a, policy, moment)
            for a in tried
            if a.delivery_id in current
        ]
        if log:
            conn.execute(_UPDATE, [_changes(row) for row in current.values()])
            conn.execute(ATTEMPTS.insert(), log)


def _apply_attempt(
    row: dict[str, Any], attempt: Attempt, policy: RetryPolicy, now: datetime
) -> dict[str, Any]:
    """Apply `attempt` to the delivery `row` (in place); its line of the delivery log."""
    row["attempts"] += 1
    row["last_status"] = attempt.status
    row["last_error"] = attempt.error
    if attempt.delivered:
        if row["state"] != "delivered":
            row["state"], row["delivered_at"] = "delivered", now
    elif row["state"] == "pending":
        if row["attempts"] >= policy.attempts:
            row["state"] = "failed"
        else:
            row["next_at"] = now + policy.delay(row["attempts"], attempt.retry_after)
    return {
        "delivery_id": row["id"],
        "event_id": row["event_id"],
        "endpoint": row["endpoint"],
        "attempt": row["attempts"],
        "status": attempt.status,
        "error": attempt.error,
        "duration_ms": attempt.duration.total_seconds() * 1000,
        "at": now,
    }


_SETTLED = ("state", "attempts", "next_at", "last_status", "last_error", "delivered_at")
_UPDATE = (
    DELIVERIES.update()
    .where(DELIVERIES.c.id == bindparam("row_id"))
    .values({name: bindparam(f"new_{name}") for name in _SETTLED})
)


def _changes(row: dict[str, Any]) -> dict[str, Any]:
    return {"row_id": row["id"], **{f"new_{name}": row[name] for name in _SETTLED}}


# -- reading --------------------------------------------------------------------------------------


def list_deliveries(
    db: Database,
    *,
    state: str | None = None,
    endpoint: str | None = None,
    event_id: str | None = None,
    limit: int = 100,
) -> list[DeliveryRow]:
    """Deliveries, newest first: e.g. `state="failed"` for those given up."""
    query = model_select(DeliveryRow).order_by(DELIVERIES.c.id.desc()).limit(limit)
    for column, value in (("state", state), ("endpoint", endpoint), ("event_id", event_id)):
        if value is not None:
            query = query.where(DELIVERIES.c[column] == value)
    with db.read() as s:
        return list(s.exec(query))


def delivery_log(
    db: Database,
    *,
    event_id: str | None = None,
    endpoint: str | None = None,
    limit: int = 100,
) -> list[DeliveryAttemptRow]:
    """The delivery log, newest attempt first: when, to which endpoint, the status or error."""
    query = model_select(DeliveryAttemptRow).order_by(ATTEMPTS.c.id.desc()).limit(limit)
    if event_id is not None:
        query = query.where(ATTEMPTS.c.event_id == event_id)
    if endpoint is not None:
        query = query.where(ATTEMPTS.c.endpoint == endpoint)
    with db.read() as s:
        return list(s.exec(query))
