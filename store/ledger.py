"""The tool-call ledger: each call's executions counted, and its outcome kept once.

A row is keyed by (run, the turn's position in the transcript, call id,
attempt) and written twice: when the call starts (`executions` counts up) and
when it ends (`outcome`, the first one recorded standing). A turn taken over
reads an outcome instead of running its call again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from relayq import Request, ToolResult
from store import statements as sql
from store.db import Database
from store.messages import storable_text
from store.models import utcnow

__all__ = [
    "LedgerEntry",
    "ledger_get",
    "ledger_put",
    "ledger_put_all",
    "ledger_start",
    "ledger_values",
    "write_entries",
]


@dataclass(frozen=True)
class LedgerEntry:
    """A finished call's outcome, to record."""

    at: int
    call_id: str
    attempt: str
    outcome: ToolResult | Request


def ledger_values(
    run_id: str,
    at: int,
    call_id: str,
    attempt: str,
    outcome: ToolResult | Request | None,
    *,
    executions: int,
    now: datetime,
) -> dict[str, Any]:
    kind = "request" if isinstance(outcome, Request) else "result"
    return {
        "run_id": run_id,
        "at": at,
        "call_id": storable_text(call_id),
        "attempt": attempt,
        "outcome": (
            None if outcome is None else {"type": kind, "value": outcome.model_dump(mode="json")}
        ),
        "executions": executions,
        "created_at": now,
    }


def ledger_get(
    db: Database, run_id: str, at: int, call_id: str, attempt: str
) -> ToolResult | Request | None:
    with db.connect() as conn:
        outcome = conn.execute(
            sql.LEDGER_OUTCOME,
            {"rid": run_id, "at": at, "cid": storable_text(call_id), "attempt": attempt},
        ).scalar_one_or_none()
    if outcome is None:
        return None  # never started, or started and not finished
    if outcome.get("type") == "request":
        return Request.model_validate(outcome["value"])
    return ToolResult.model_validate(outcome["value"])


def ledger_start(db: Database, run_id: str, at: int, call_id: str, attempt: str) -> int:
    """Count one more execution of a call that has no outcome; returns its number."""
    values = ledger_values(run_id, at, call_id, attempt, None, executions=1, now=utcnow())
    with db.transaction() as conn:
        return int(conn.execute(sql.ledger_start(conn.dialect.name), values).scalar_one())


def ledger_put(
    db: Database, run_id: str, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
) -> bool:
    """Record a finished tool call; returns whether the run has been asked to cancel."""
    return ledger_put_all(db, run_id, [LedgerEntry(at, call_id, attempt, outcome)])


def ledger_put_all(db: Database, run_id: str, entries: Sequence[LedgerEntry]) -> bool:
    """`ledger_put` for several outcomes in one transaction."""
    with db.transaction() as conn:
        write_entries(conn, run_id, entries, now=utcnow())
        cancel = conn.execute(sql.CANCEL_FLAG, {"rid": run_id}).scalar_one_or_none()
        return cancel is None or bool(cancel)


def write_entries(
    conn: Connection, run_id: str, entries: Sequence[LedgerEntry], *, now: datetime
) -> None:
    """Record outcomes inside the caller's transaction (a turn's finish writes its last)."""
    if entries:
        rows = [
            ledger_values(run_id, e.at, e.call_id, e.attempt, e.outcome, executions=1, now=now)
            for e in entries
        ]
        conn.execute(sql.ledger_finish(conn.dialect.name), rows)
