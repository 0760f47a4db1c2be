"""A conversation's messages: one row each, written where they changed, read in order."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlmodel import Session

from relayq import transcript as tx
from store import statements as sql
from store.models import MessageRow, RunRow, utcnow

__all__ = ["conversation", "message_row", "message_values", "storable_text", "write_messages"]


def storable_text(text: str) -> str:
    """Text a model or a tool made, fit for a text column: PostgreSQL refuses NUL there
    (JSON columns keep it), and no database takes a lone surrogate."""
    return tx.valid_text(text).replace("\x00", "\ufffd")


def conversation(
    s: Session | Connection, conversation_id: str, upto: int | None = None
) -> list[dict[str, Any]]:
    query = sql.CONVERSATION if upto is None else sql.CONVERSATION.where(sql.MESSAGES.c.seq <= upto)
    return [dict(body) for body in s.execute(query, {"conv": conversation_id}).scalars()]


def message_row(run: RunRow, seq: int, body: dict[str, Any]) -> MessageRow:
    return MessageRow(**message_values(run.conversation_id, run.id, seq, body))


def write_messages(
    s: Session | Connection,
    conversation_id: str,
    run_id: str,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
) -> None:
    """Write what changed from `before` to `after`: appended messages, and placeholders
    replaced in place, as `run_id`'s."""
    kept = len(before)
    rows = [
        message_values(conversation_id, run_id, seq, body)
        for seq, body in enumerate(after)
        # The same object is the same message: only the rest need comparing.
        if seq >= kept or (before[seq] is not body and before[seq] != body)
    ]
    if rows:
        # One statement, many parameter sets: compiled once, cached after.
        dialect = s.dialect if isinstance(s, Connection) else s.get_bind().dialect
        s.execute(sql.upsert_message(dialect.name), rows)


def message_values(
    conversation_id: str, run_id: str, seq: int, body: dict[str, Any]
) -> dict[str, Any]:
    usage = (body.get(tx.NOTE) or {}).get("usage") or {}
    return {
        "conversation_id": conversation_id,
        "seq": seq,
        "run_id": run_id,
        "role": str(body.get("role")),
        "body": body,
        "prompt_tokens": int(usage.get("promptTokens", 0)),
        "completion_tokens": int(usage.get("completionTokens", 0)),
        "created_at": utcnow(),
    }
