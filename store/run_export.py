"""What a run was, as one JSON object: the line `relayq purge --export` writes for each
run before it removes it (`store.retention`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlmodel import Session, SQLModel, col, select

from store.models import BatchRow, DecisionRow, MessageRow, RequestRow, RunRow

__all__ = ["exported"]


def exported(s: Session, runs: Sequence[RunRow]) -> list[dict[str, Any]]:
    """Each run with its transcript (the messages it wrote, in order), its requests, its
    audit trail, its batch and its job within it: four queries, whatever the count."""
    ids = [r.id for r in runs]
    messages = _by_run(
        s.exec(
            select(MessageRow)
            .where(col(MessageRow.run_id).in_(ids))
            .order_by(col(MessageRow.conversation_id), col(MessageRow.seq))
        )
    )
    requests = _by_run(
        s.exec(
            select(RequestRow)
            .where(col(RequestRow.run_id).in_(ids))
            .order_by(col(RequestRow.created_at), col(RequestRow.id))
        )
    )
    decisions = _by_run(
        s.exec(
            select(DecisionRow)
            .where(col(DecisionRow.run_id).in_(ids))
            .order_by(col(DecisionRow.id))
        )
    )
    batch_ids = sorted({r.batch_id for r in runs if r.batch_id is not None})
    batches = {
        b.id: _plain(b) for b in s.exec(select(BatchRow).where(col(BatchRow.id).in_(batch_ids)))
    }
    return [
        {
            "run": _plain(run),
            "transcript": messages.get(run.id, []),
            "requests": requests.get(run.id, []),
            "decisions": decisions.get(run.id, []),
            "batch": batches.get(run.batch_id) if run.batch_id is not None else None,
            "job": (
                {"id": run.job_id, "index": run.job_index} if run.batch_id is not None else None
            ),
        }
        for run in runs
    ]


def _by_run(rows: Any) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        found[row.run_id].append(_plain(row))
    return found


def _plain(row: SQLModel) -> dict[str, Any]:
    return row.model_dump(mode="json")
