"""Task messages decided inside a transaction, sent only after it commits.

The tasks and their queues are named here because the store decides which
message follows which state change; `tasks/` registers the functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, insert
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from store.batch_queues import batch_queue_or, is_batch_queue
from store.db import Database
from store.models import OutboxRow, RunRow, utcnow

__all__ = [
    "ANSWER_QUEUE",
    "ANSWER_TASK",
    "CANCEL_TASK",
    "MAINTENANCE_QUEUE",
    "SWEEP_TASK",
    "WAKE_TASK",
    "TURN_QUEUE",
    "TURN_TASK",
    "enqueue_answer",
    "FirstTurns",
    "enqueue_first_turns",
    "enqueue_turn",
    "is_first_turn",
    "mark_published",
    "resend",
    "resend_turns",
    "sent_at",
    "turn_label",
    "task_id_of",
    "unpublished",
]

TURN_TASK, TURN_QUEUE = "relayq.run_turn", "relayq.turns"
ANSWER_TASK, ANSWER_QUEUE = "relayq.submit_answer", "relayq.answers"
CANCEL_TASK = "relayq.cancel_run"
SWEEP_TASK = "relayq.sweep"
WAKE_TASK = "relayq.wake_runs"
"""Runs that waited on a provider's circuit, sent on once it closed (`tasks.broker.circuit`)."""
MAINTENANCE_QUEUE = "relayq.maintenance"


_TABLE = OutboxRow.__table__  # type: ignore[attr-defined]
_INSERT = insert(_TABLE).returning(_TABLE.c.id)
_INSERT_MANY = insert(_TABLE).returning(_TABLE.c.id, sort_by_parameter_order=True)
# The worker names its agent's queue for every turn it queues, and a batch's run must not
# leave its batch's queue for it: the INSERT itself picks the batch's queue, if any.
_INSERT_KEEPING_BATCH = (
    insert(_TABLE)
    .values(queue=batch_queue_or(bindparam("named")))
    .returning(_TABLE.c.id, _TABLE.c.queue)
)
# A run's rows before its newest turn message: spent (see `enqueue_turn`).
_SPENT = _TABLE.delete().where(
    _TABLE.c.run_id == bindparam("rid"), _TABLE.c.id < bindparam("newest")
)
_LAST_QUEUE = (
    sa_select(_TABLE.c.queue)
    .where(_TABLE.c.run_id == bindparam("rid"), _TABLE.c.task == TURN_TASK)
    .order_by(_TABLE.c.id.desc())
    .limit(1)
)


def enqueue_turn(
    session: Session | Connection,
    run_id: str,
    version: int,
    *,
    label: str,
    countdown: float = 0.0,
    queue: str | None = None,
) -> OutboxRow:
    """The run's next turn message, on `queue` (its agent's; see `relayq.Agent`).

    With no `queue` the turn goes where the run's previous turn went, else to
    `relayq.turns`: the store knows no agents, so a turn queued without one (an
    answer applied, a run taken over from a dead worker) follows its run. A run
    of a batch keeps to its batch's queue (`store.batch_queues`) whatever its
    agent's queue is.

    The run's earlier rows are deleted: a turn is queued only once every message
    sent for the run before has taken effect (the turn claimed, the answer
    applied), so the outbox holds one row per unfinished run, not one per turn.
    """
    values: dict[str, Any] = {
        "task": TURN_TASK,
        "args": [run_id, version],
        "countdown": countdown,
        "run_id": run_id,
        "label": label,
        "sends": 0,
        "created_at": utcnow(),
    }
    # A plain INSERT ... RETURNING: the ORM's unit of work costs more than the row.
    if queue is not None and not is_batch_queue(queue):
        found = session.execute(_INSERT_KEEPING_BATCH, {**values, "named": queue, "rid": run_id})
        row_id, values["queue"] = found.one()
    else:
        values["queue"] = queue or _last_queue(session, run_id)
        row_id = session.execute(_INSERT, values).scalar_one()
    session.execute(_SPENT, {"rid": run_id, "newest": row_id})
    return OutboxRow(id=row_id, **values)


@dataclass(frozen=True)
class FirstTurns:
    """First turn messages written: `rows()` builds them as OutboxRows once their
    transaction has committed (building a thousand costs more than writing them, and no
    write lock need be held meanwhile)."""

    ids: list[int]
    values: list[dict[str, Any]]

    def rows(self) -> list[OutboxRow]:
        return [
            OutboxRow(id=row_id, **row) for row_id, row in zip(self.ids, self.values, strict=True)
        ]


NO_FIRST_TURNS = FirstTurns([], [])


def enqueue_first_turns(
    conn: Session | Connection, run_ids: list[str], labels: list[str], *, queue: str
) -> FirstTurns:
    """The first turn messages of runs just created, all on `queue`, in one statement:
    new runs have no earlier rows to delete, nor a batch queue to keep other than `queue`."""
    now = utcnow()
    values: list[dict[str, Any]] = [
        {
            "task": TURN_TASK,
            "queue": queue,
            "args": [run_id, 0],
            "countdown": 0.0,
            "run_id": run_id,
            "label": label,
            "sends": 0,
            "created_at": now,
        }
        for run_id, label in zip(run_ids, labels, strict=True)
    ]
    return FirstTurns(list(conn.execute(_INSERT_MANY, values).scalars().all()), values)


def turn_label(run_id: str, agent: str, turn: int) -> str:
    """A turn message's label (Flower shows it as the task's arguments)."""
    return f"run={run_id} agent={agent} turn={turn}"


def is_first_turn(row: OutboxRow) -> bool:
    """Whether `row` is the first turn of a run never claimed: a run is created at version
    0, and every change of its status moves its version on."""
    return row.task == TURN_TASK and row.args[1] == 0


def _last_queue(session: Session | Connection, run_id: str) -> str:
    found = session.execute(_LAST_QUEUE, {"rid": run_id}).scalar()
    return str(found) if found else TURN_QUEUE


def enqueue_answer(session: Session, request_id: str, run_id: str) -> OutboxRow:
    row = OutboxRow(
        task=ANSWER_TASK,
        queue=ANSWER_QUEUE,
        args=[request_id],
        run_id=run_id,
        label=f"request={request_id} run={run_id}",
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def task_id_of(row: OutboxRow) -> str:
    """A message id per send: a redelivery keeps it, a re-send by the sweeper does not."""
    return f"relayq-{row.id}" if row.sends == 0 else f"relayq-{row.id}-{row.sends}"


def mark_published(db: Database, rows: Iterable[OutboxRow]) -> None:
    ids = [r.id for r in rows]
    if not ids:
        return
    table = OutboxRow.__table__  # type: ignore[attr-defined]
    with db.transaction() as conn:
        conn.execute(table.update().where(table.c.id.in_(ids)).values(published_at=utcnow()))


def unpublished(
    db: Database, *, older_than: timedelta, now: datetime | None = None, limit: int = 1000
) -> list[OutboxRow]:
    """Rows whose send never happened (or was not recorded), each counted as a new send.

    They are marked sent now, in the transaction that picks them, so another
    sweeper does not pick them too; a send that fails after all is a lost
    message, which the sweeper finds by its effect not happening.
    """
    moment = now or utcnow()
    with db.write() as s:
        rows = list(
            s.exec(
                select(OutboxRow)
                .where(
                    col(OutboxRow.published_at).is_(None),
                    col(OutboxRow.created_at) < moment - older_than,
                )
                .order_by(col(OutboxRow.id))
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        for row in rows:
            resend(row, moment)
        return rows


def resend(row: OutboxRow, now: datetime) -> OutboxRow:
    """Count a new send of `row` (a new task id: the broker's copy, if any, is not it)."""
    row.sends += 1
    row.published_at = now
    return row


def resend_turns(db: Database, run_ids: Iterable[str], *, chunk: int = 500) -> list[OutboxRow]:
    """The turn messages of those of `run_ids` still queued, each counted as a new send and
    to go now: runs that waited out a countdown for a reason that has gone (their provider
    answers again) go at once. The message still counting down finds its run moved on."""
    ids = list(run_ids)
    rows: list[OutboxRow] = []
    now = utcnow()
    for start in range(0, len(ids), chunk):
        with db.write() as s:
            found = s.exec(
                select(OutboxRow)
                .join(RunRow, col(RunRow.id) == OutboxRow.run_id)
                .where(
                    col(OutboxRow.run_id).in_(ids[start : start + chunk]),
                    OutboxRow.task == TURN_TASK,
                    RunRow.status == "queued",
                )
                .with_for_update(skip_locked=True)
            )
            for row in found:
                resend(row, now)
                row.countdown = 0.0
                rows.append(row)
    return rows


def sent_at(db: Database, task_id: str) -> datetime | None:
    """When the message `task_id` (one of ours) was last sent; None if unknown."""
    match = _TASK_ID.fullmatch(task_id)
    if match is None:
        return None
    with db.read() as s:
        row = s.get(OutboxRow, int(match.group(1)))
    return None if row is None else row.published_at


_TASK_ID = re.compile(r"relayq-(\d+)(?:-\d+)?")
