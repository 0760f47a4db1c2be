"""What hosts and operators read: runs, their results and transcripts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlalchemy import ColumnElement
from sqlmodel import col, func, select

from relayq import RunResult
from relayq import _transcript as tx
from store.db import Database
from store.errors import UnknownRun
from store.messages import conversation
from store.models import FINISHED, MessageRow, RequestRow, RunRow
from store.requests import request_of

__all__ = [
    "RunSummary",
    "RunView",
    "get_run",
    "list_runs",
    "run_result",
    "run_view",
    "settled",
    "transcript",
]


class RunSummary(BaseModel):
    """A run without its transcript, as `GET /api/runs` and `relayq runs --json` show it."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, serialize_by_alias=True
    )

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
        waiting = s.exec(
            select(RequestRow.id).where(_waits_on(run), RequestRow.status == "open")
        ).first()
        return run.status, waiting is not None


def _waits_on(run: RunRow) -> ColumnElement[bool]:
    """The requests the run waits on: its own, or its batch's budget request another asked."""
    if run.waiting_on is not None:
        return col(RequestRow.id) == run.waiting_on
    return col(RequestRow.run_id) == run.id


def list_runs(
    db: Database, *, status: str | None = None, agent: str | None = None, limit: int = 100
) -> list[RunRow]:
    """Runs, newest first, optionally of one status and one agent."""
    query = select(RunRow).order_by(col(RunRow.created_at).desc(), col(RunRow.id).desc())
    if status is not None:
        query = query.where(RunRow.status == status)
    if agent is not None:
        query = query.where(RunRow.agent == agent)
    with db.read() as s:
        return list(s.exec(query.limit(limit)))


def get_run(db: Database, run_id: str) -> RunRow:
    with db.read() as s:
        run = s.get(RunRow, run_id)
    if run is None:
        raise UnknownRun(run_id)
    return run


def run_result(db: Database, run_id: str) -> RunResult:
    """A stored run as the same RunResult the in-process client returns."""
    with db.read() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise UnknownRun(run_id)
        last = s.exec(
            select(MessageRow.seq)
            .where(MessageRow.run_id == run_id)
            .order_by(col(MessageRow.seq).desc())
        ).first()
        messages = conversation(s, run.conversation_id, upto=last)
        pending = s.exec(
            select(RequestRow).where(_waits_on(run), RequestRow.status == "open")
        ).first()
    return RunResult(
        status=run.status,
        text=run.text or "",
        tool_calls=tx.records_of(messages),
        messages=messages,
        pending=request_of(pending) if pending is not None and run.status == "pending" else None,
        turns=run.turns,
        usage=tx.usage_of(messages),
        run_id=run.id,
        error=run.error,
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
