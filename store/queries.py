"""What hosts and operators read: runs, their results and transcripts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, exists, false, true
from sqlalchemy import select as sa_select
from sqlmodel import col, func, select

from relayq import RunResult
from relayq import transcript as tx
from relayq.wire import CamelModel
from store.db import Database
from store.errors import UnknownRun
from store.messages import conversation
from store.models import FINISHED, MessageRow, RequestRow, RunRow
from store.requests import request_of

__all__ = [
    "RunQuery",
    "RunSummary",
    "RunView",
    "get_run",
    "list_runs",
    "run_result",
    "run_view",
    "settled",
    "settled_many",
    "transcript",
]


_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_REQUESTS = RequestRow.__table__  # type: ignore[attr-defined]
_MESSAGES = MessageRow.__table__  # type: ignore[attr-defined]


class RunSummary(CamelModel):
    """A run without its transcript, as `GET /api/runs` and `relayq runs --json` show it."""

    id: str
    agent: str
    status: str
    conversation_id: str
    turns: int
    total_tokens: int
    cost: float
    """What the run's model calls cost, by the provider's prices (0: no price)."""
    budget: dict[str, Any] | None
    """The run's own budget (`relayq.budgets.Budget` wire), if it has one."""
    text: str | None
    error: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: RunRow) -> RunSummary:
        return cls.model_validate(row.model_dump())


def transcript(db: Database, conversation_id: str) -> list[dict[str, Any]]:
    with db.read() as s:
        return conversation(s, conversation_id)


def settled(db: Database, run_id: str) -> tuple[str, bool]:
    """The run's status, and whether a host has something to do or wait for no more.

    A run is settled when it has finished, or when it is pending on an open
    request. Pending with none open means an answer is on its way in.
    """
    with db.read() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise UnknownRun(run_id)
        if run.status in FINISHED:
            return run.status, True
        if run.status != "pending":
            return run.status, False
        waiting = s.exec(select(RequestRow.id).where(_open_for(run.id, run.waiting_on))).first()
        return run.status, waiting is not None


_OPEN = _REQUESTS.c.status == "open"
# `settled` for many runs in one statement: a pending run is settled when a request it
# waits on is open (its batch's, when `waiting_on` names one; else its own).
_SETTLED_MANY = select(
    _RUNS.c.id,
    _RUNS.c.status,
    case(
        (col(_RUNS.c.status).in_(FINISHED), true()),
        (_RUNS.c.status != "pending", false()),
        (
            _RUNS.c.waiting_on.is_(None),
            exists().where(and_(_REQUESTS.c.run_id == _RUNS.c.id, _OPEN)),
        ),
        else_=exists().where(and_(_REQUESTS.c.id == _RUNS.c.waiting_on, _OPEN)),
    ),
).where(_RUNS.c.id.in_(bindparam("ids", expanding=True)))
_MANY = 1000
"""Run ids per statement: well within every driver's limit on bound parameters."""


def settled_many(db: Database, run_ids: Iterable[str]) -> dict[str, tuple[str, bool]]:
    """`settled` for each of `run_ids` the store knows, one statement per thousand runs:
    what a host waiting on many runs reads each time it is woken.

        states = settled_many(db, ["run_1", "run_2"])   # {"run_1": ("done", True), ...}
    """
    ids = list(dict.fromkeys(run_ids))
    found: dict[str, tuple[str, bool]] = {}
    with db.read() as s:
        for start in range(0, len(ids), _MANY):
            rows = s.connection().execute(_SETTLED_MANY, {"ids": ids[start : start + _MANY]})
            found.update((rid, (status, bool(done))) for rid, status, done in rows)
    return found


def _open_for(run_id: str, waiting_on: str | None) -> ColumnElement[bool]:
    """The open requests the run waits on: its own, or its batch's budget request another
    run asked (`waiting_on`)."""
    if waiting_on is not None:
        return and_(col(RequestRow.id) == waiting_on, col(RequestRow.status) == "open")
    return and_(col(RequestRow.run_id) == run_id, col(RequestRow.status) == "open")


@dataclass(frozen=True, kw_only=True)
class RunQuery:
    """Which runs to list, newest first.

    RunQuery(status="failed", agent="support", limit=20)
    """

    status: str | None = None
    """One status; None (or empty: no filter, as in every listing) for any."""
    agent: str | None = None
    limit: int = 100


def list_runs(db: Database, query: RunQuery | None = None) -> list[RunRow]:
    """The runs `query` picks (the newest 100 by default), newest first."""
    query = query or RunQuery()
    listing = select(RunRow).order_by(col(RunRow.created_at).desc(), col(RunRow.id).desc())
    if query.status:
        listing = listing.where(RunRow.status == query.status)
    if query.agent:
        listing = listing.where(RunRow.agent == query.agent)
    with db.read() as s:
        return list(s.exec(listing.limit(query.limit)))


def get_run(db: Database, run_id: str) -> RunRow:
    with db.read() as s:
        run = s.get(RunRow, run_id)
    if run is None:
        raise UnknownRun(run_id)
    return run


# The run and where its messages end, in one statement: a host reads it for every run
# it waited on.
_RESULT = sa_select(
    _RUNS.c.status,
    _RUNS.c.text,
    _RUNS.c.turns,
    _RUNS.c.error,
    _RUNS.c.conversation_id,
    _RUNS.c.waiting_on,
    sa_select(func.max(_MESSAGES.c.seq)).where(_MESSAGES.c.run_id == _RUNS.c.id).scalar_subquery(),
).where(_RUNS.c.id == bindparam("rid"))


# The run's conversation up to its last message, built once (a statement built per
# call costs more than reading a short transcript).
_UPTO = (
    sa_select(_MESSAGES.c.body)
    .where(_MESSAGES.c.conversation_id == bindparam("conv"), _MESSAGES.c.seq <= bindparam("upto"))
    .order_by(_MESSAGES.c.seq)
)


def run_result(db: Database, run_id: str) -> RunResult:
    """A stored run as the same RunResult the in-process client returns."""
    with db.read() as s:
        conn = s.connection()
        found = conn.execute(_RESULT, {"rid": run_id}).first()
        if found is None:
            raise UnknownRun(run_id)
        status, text, turns, error, conversation_id, waiting_on, last = found
        if last is None:
            messages = conversation(s, conversation_id)
        else:
            bodies = conn.execute(_UPTO, {"conv": conversation_id, "upto": last}).scalars()
            messages = [dict(body) for body in bodies]
        pending = None
        if status == "pending":
            pending = s.exec(select(RequestRow).where(_open_for(run_id, waiting_on))).first()
    return RunResult(
        status=status,
        text=text or "",
        tool_calls=tx.records_of(messages),
        messages=messages,
        pending=request_of(pending) if pending is not None else None,
        turns=turns,
        usage=tx.usage_of(messages),
        run_id=run_id,
        error=error,
    )


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run as a page shows it: its prompt, and one window of its messages."""

    run: RunRow
    prompt: str | None
    """The user message that started the run."""
    messages: list[tuple[int, dict[str, Any]]]
    """`(seq, message)` of the window, in order."""
    total: int
    """Messages the run wrote, in all."""
    start: int
    """Where the window starts among them, from 0."""


def run_view(db: Database, run_id: str, *, start: int | None = None, limit: int = 50) -> RunView:
    """The run, its prompt and `limit` of its messages from `start` (default: the last
    `limit`): a conversation of 800 turns is never read whole for one page."""
    with db.read() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise UnknownRun(run_id)
        mine = MessageRow.run_id == run_id
        total = s.exec(select(func.count()).select_from(MessageRow).where(mine)).one()
        first = max(total - limit, 0) if start is None else max(min(start, total), 0)
        window = s.exec(
            select(MessageRow.seq, MessageRow.body)
            .where(mine)
            .order_by(col(MessageRow.seq))
            .offset(first)
            .limit(limit)
        ).all()
        prompt = s.exec(
            select(MessageRow.body).where(
                MessageRow.conversation_id == run.conversation_id,
                MessageRow.seq == run.start_seq,
            )
        ).first()
    text = prompt.get("content") if isinstance(prompt, dict) else None
    return RunView(
        run=run,
        prompt=text if isinstance(text, str) else None,
        messages=[(seq, dict(body)) for seq, body in window],
        total=total,
        start=first,
    )
