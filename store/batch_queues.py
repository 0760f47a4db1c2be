"""Batch queues: each batch's turns wait in a queue of their own.

A backlog of batch turns in the agent's queue would starve the interactive runs
behind it, and one large batch every batch started after it. So a batch's
queue is named from its agent's queue when the batch starts, kept on the batch
(`BatchRow.queue`), and every turn of its runs goes there (`store.outbox`):

    relayq.turns                        the agent's queue: interactive runs
    relayq.turns.batch.batch_3f2a91c0   one batch's turns, sent at a low priority

A worker that consumes `relayq.turns` also consumes the queues of its active
batches (`workers.batch_queues`), so an interactive turn is fetched before any
batch turn, and the batches' queues take turns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, select

from store.db import Database
from store.models import FINISHED, BatchRow, RunRow
from store.transitions import STATUSES

__all__ = [
    "BATCH_MARK",
    "UNFINISHED",
    "active_batch_queues",
    "batch_queue_name",
    "batch_queue_or",
    "is_batch_queue",
    "is_batch_queue_of",
]

BATCH_MARK = ".batch."
"""What sets a batch's queue apart from the agent's queue it is named after."""

UNFINISHED = tuple(status for status in STATUSES if status not in FINISHED)
"""The statuses of a run that may still take a turn: its batch is active."""

_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_BATCHES = BatchRow.__table__  # type: ignore[attr-defined]

_OF_RUN = (
    select(_BATCHES.c.queue)
    .select_from(_RUNS.join(_BATCHES, _BATCHES.c.id == _RUNS.c.batch_id))
    .where(_RUNS.c.id == bindparam("rid"))
)
# From the unfinished runs (the status index), not from the batches: a finished batch
# of 10,000 runs costs nothing here, where asking each batch for an unfinished run would
# read them all. A cancelled batch stays active while a run of it has a turn to finish.
_ACTIVE = (
    select(_BATCHES.c.queue)
    .where(
        _BATCHES.c.queue.is_not(None),
        _BATCHES.c.id.in_(select(_RUNS.c.batch_id).where(_RUNS.c.status.in_(UNFINISHED))),
    )
    .order_by(_BATCHES.c.queue)
)


def batch_queue_name(agent_queue: str, batch_id: str) -> str:
    """The queue of batch `batch_id`, whose agent's turns go to `agent_queue`."""
    return f"{agent_queue}{BATCH_MARK}{batch_id}"


def is_batch_queue(queue: str) -> bool:
    """Whether `queue` is a batch's (agents' own queues may not look like one)."""
    return BATCH_MARK in queue


def is_batch_queue_of(base: str, queue: str) -> bool:
    """Whether `queue` is the queue of a batch whose agent's queue is `base`.

    >>> is_batch_queue_of("relayq.turns", "relayq.turns.batch.batch_1")
    True
    >>> is_batch_queue_of("relayq.turns", "relayq.turns.vip.batch.batch_1")
    False
    """
    return queue.startswith(base + BATCH_MARK)


def batch_queue_or(queue: Any) -> ColumnElement[Any]:
    """SQL for the queue of the batch run `:rid` is a job of, else `queue` (a run of no
    batch, or of a batch older than batch queues): for a statement that decides it
    without a round trip of its own (`store.outbox.enqueue_turn`)."""
    return func.coalesce(_OF_RUN.scalar_subquery(), queue)


def active_batch_queues(db: Database, *, under: Iterable[str] | None = None) -> list[str]:
    """The queues of the batches that have a run not yet finished, sorted; with `under`,
    only those of batches whose agent's queue is one of these.

    One statement over the runs' status index: its cost grows with the runs not yet
    finished, never with the runs a store has kept.
    """
    with db.read() as s:
        queues = [str(q) for q in s.execute(_ACTIVE).scalars()]
    if under is None:
        return queues
    bases = tuple(under)
    return [q for q in queues if any(is_batch_queue_of(base, q) for base in bases)]
