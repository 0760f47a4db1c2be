"""What a metrics scrape reads of the store (`tasks.observability.gauges`, the API's `/metrics`).

Each read is a count or a sum over an index, whatever the store holds: the runs by
agent and status (the (status, agent) index), the open requests by age (the
(status, created_at) index), the live workers, and the requests answered since a
moment (the audit trail's `at` index). The active batches' queues are
`store.batch_queues.active_batch_queues`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, case, func, select, text

from store.db import Database
from store.models import DecisionRow, RequestRow, RunRow, WorkerRow

__all__ = [
    "Decided",
    "OpenRequests",
    "StoreCounts",
    "decided_since",
    "ping",
    "store_counts",
]

_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_REQUESTS = RequestRow.__table__  # type: ignore[attr-defined]
_DECISIONS = DecisionRow.__table__  # type: ignore[attr-defined]
_WORKERS = WorkerRow.__table__  # type: ignore[attr-defined]

# Grouped in the (status, agent) index's order: counted from the index, nothing sorted.
_RUN_COUNTS = select(_RUNS.c.agent, _RUNS.c.status, func.count()).group_by(
    _RUNS.c.status, _RUNS.c.agent
)
_ALIVE = select(func.count()).where(_WORKERS.c.heartbeat_at >= bindparam("alive_since"))
# The requests answered that have a decision at `since` or later: those a scrape has
# not counted yet (and a few it has, which the caller skips).
_DECIDED = select(
    _REQUESTS.c.id,
    _REQUESTS.c.agent,
    _REQUESTS.c.outcome,
    _REQUESTS.c.created_at,
    _REQUESTS.c.answered_at,
).where(
    _REQUESTS.c.status == "answered",
    _REQUESTS.c.id.in_(
        select(_DECISIONS.c.request_id).where(_DECISIONS.c.at >= bindparam("since")).distinct()
    ),
)
_PING = text("SELECT 1")


@functools.cache
def _open_requests(bounds: int) -> Any:
    """One row: all open requests, the oldest's opening, and those opened after each of
    `bounds` moments (bound as `:b0`, `:b1`...). Built once per number of bounds."""
    return select(
        func.count(),
        func.min(_REQUESTS.c.created_at),
        *(
            func.coalesce(
                func.sum(case((_REQUESTS.c.created_at > bindparam(f"b{n}"), 1), else_=0)), 0
            )
            for n in range(bounds)
        ),
    ).where(_REQUESTS.c.status == "open")


@dataclass(frozen=True)
class OpenRequests:
    """The open requests: how many, the oldest's opening, and how many were opened after
    each moment asked for (in its order)."""

    total: int
    oldest: datetime | None
    """Aware; None: none is open."""
    younger: tuple[int, ...]


@dataclass(frozen=True)
class StoreCounts:
    """The store's state at one moment, as one scrape reads it."""

    runs: dict[tuple[str, str], int]
    """`(agent, status)` -> runs; only the pairs that have runs."""
    open: OpenRequests
    workers_alive: int
    """Workers whose heartbeat is at `alive_since` or later."""


@dataclass(frozen=True)
class Decided:
    """A request answered, and when it was opened and answered."""

    request_id: str
    agent: str
    outcome: str | None
    created_at: datetime
    answered_at: datetime | None


def ping(db: Database) -> None:
    """One `SELECT 1`: raises if the store cannot be reached."""
    with db.read() as s:
        s.execute(_PING).scalar()


def store_counts(
    db: Database, *, opened_after: Sequence[datetime], alive_since: datetime
) -> StoreCounts:
    """The runs by agent and status, the open requests (with those opened after each of
    `opened_after`) and the workers alive since `alive_since`: three statements, each a
    count over an index, in one read."""
    bounds = {f"b{n}": moment for n, moment in enumerate(opened_after)}
    with db.read() as s:
        runs = s.execute(_RUN_COUNTS).all()
        total, oldest, *younger = s.execute(_open_requests(len(bounds)), bounds).one()
        alive = s.execute(_ALIVE, {"alive_since": alive_since}).scalar_one()
    return StoreCounts(
        runs={(agent, status): int(count) for agent, status, count in runs},
        open=OpenRequests(
            total=int(total),
            oldest=_aware(oldest) if oldest is not None else None,
            younger=tuple(int(count) for count in younger),
        ),
        workers_alive=int(alive),
    )


def decided_since(db: Database, since: datetime) -> list[Decided]:
    """The requests answered that have a decision (an answer or a vote) at `since` or
    later: one statement, by the audit trail's `at` index."""
    with db.read() as s:
        rows = s.execute(_DECIDED, {"since": since}).all()
    return [
        Decided(
            request_id=row.id,
            agent=row.agent,
            outcome=row.outcome,
            created_at=row.created_at,
            answered_at=row.answered_at,
        )
        for row in rows
    ]


def _aware(moment: datetime | str) -> datetime:
    """`min(created_at)` as an aware datetime, however the driver hands the aggregate back."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
