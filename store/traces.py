"""The runs' trace contexts: the W3C `traceparent` each run keeps (`runs.trace_context`).

`tasks.observability.tracing` makes the spans; here is only what it reads and keeps in the store,
so every process that takes a turn of a run, answers its request or resumes it
joins the same trace, however long the run waits. A run's context is written once:
where two processes make one at the same moment, the first stored wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select, update

from store.db import Database
from store.models import RequestRow, RunRow

__all__ = [
    "RUNS_PER_STATEMENT",
    "RequestTrace",
    "RunTrace",
    "keep_trace_contexts",
    "request_trace",
    "run_traces",
]

RUNS_PER_STATEMENT = 500
"""The most run ids `run_traces` and `keep_trace_contexts` take at once (SQLite's
bound-parameter limit): a caller with more asks in chunks of this many."""

_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_REQUESTS = RequestRow.__table__  # type: ignore[attr-defined]

_RUN_TRACES = select(_RUNS.c.id, _RUNS.c.agent, _RUNS.c.batch_id, _RUNS.c.trace_context).where(
    _RUNS.c.id.in_(bindparam("ids", expanding=True))
)
# Only where the run has none yet: a context another process stored first stands.
_SET_CONTEXT = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("rid"), _RUNS.c.trace_context.is_(None))
    .values(trace_context=bindparam("tp"))
)
# The request and its run's context in one statement: a worker reads it before each resume.
_REQUEST_TRACE = (
    select(
        _REQUESTS.c.run_id,
        _REQUESTS.c.agent,
        _REQUESTS.c.kind,
        _REQUESTS.c.status,
        _REQUESTS.c.outcome,
        _REQUESTS.c.applied,
        _REQUESTS.c.created_at,
        _REQUESTS.c.answered_at,
        _RUNS.c.trace_context,
    )
    .join(_RUNS, _RUNS.c.id == _REQUESTS.c.run_id)
    .where(_REQUESTS.c.id == bindparam("rid"))
)


@dataclass(frozen=True)
class RunTrace:
    """A run as its trace names it, and the context it keeps (None or empty: none yet)."""

    run_id: str
    agent: str
    batch_id: str | None
    traceparent: str | None


@dataclass(frozen=True)
class RequestTrace:
    """A request as its `relayq.suspension` and `relayq.resume` spans show it, with its
    run's trace context (None or empty: the run has none yet)."""

    run_id: str
    agent: str
    kind: str
    status: str
    outcome: str | None
    applied: bool
    created_at: datetime
    answered_at: datetime | None
    trace_context: str | None


def run_traces(db: Database, run_ids: Sequence[str]) -> list[RunTrace]:
    """Those of `run_ids` the store knows (at most `RUNS_PER_STATEMENT`), in one
    statement, with the trace context each keeps."""
    with db.read() as s:
        rows = s.execute(_RUN_TRACES, {"ids": list(run_ids)}).all()
    return [
        RunTrace(run_id=r.id, agent=r.agent, batch_id=r.batch_id, traceparent=r.trace_context)
        for r in rows
    ]


def keep_trace_contexts(db: Database, contexts: Mapping[str, str]) -> dict[str, str]:
    """Store each run's new trace context (run id -> traceparent; at most
    `RUNS_PER_STATEMENT`, an empty one is not stored) where the run has none yet, in
    one transaction. Returns the contexts the runs hold now: these, or, where another
    process stored one first, the store's (read again, once, only then).
    """
    params = [{"rid": run_id, "tp": tp} for run_id, tp in contexts.items() if tp]
    if not params:
        return {}
    with db.transaction() as conn:
        written = conn.execute(_SET_CONTEXT, params).rowcount
    if written == len(params):
        return {run_id: tp for run_id, tp in contexts.items() if tp}
    return {
        run.run_id: run.traceparent for run in run_traces(db, list(contexts)) if run.traceparent
    }


def request_trace(db: Database, request_id: str) -> RequestTrace | None:
    """The request and its run's trace context, in one statement; None: no such request."""
    with db.read() as s:
        row = s.execute(_REQUEST_TRACE, {"rid": request_id}).first()
    if row is None:
        return None
    return RequestTrace(
        run_id=row.run_id,
        agent=row.agent,
        kind=row.kind,
        status=row.status,
        outcome=row.outcome,
        applied=bool(row.applied),
        created_at=row.created_at,
        answered_at=row.answered_at,
        trace_context=row.trace_context,
    )
