"""Sending outbox rows, after the transaction that wrote them has committed.

A batch's turns (`store.batch_queues`) go at the lowest priority, everything else at
the highest. Kombu's Redis transport keeps a queue's messages of each priority in a
list of their own, and a worker asks for every queue's priority-0 list before any
priority-9 one: an interactive turn, an answer or a sweep waiting anywhere is fetched
before any batch turn. (0 is the highest there, the reverse of RabbitMQ's.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from celery import Celery

from store import Database, OutboxRow
from store.batch_queues import is_batch_queue
from store.outbox import mark_published, task_id_of
from tasks.settings import Settings, queue_named

__all__ = ["BATCH_PRIORITY", "priority_of", "publish", "send", "sender_app"]

log = logging.getLogger(__name__)

BATCH_PRIORITY = 9
"""Kombu Redis's lowest priority (its steps are 0, 3, 6, 9; 0 is fetched first)."""


def priority_of(queue: str) -> int | None:
    """The priority a message to `queue` is sent with: a batch's turns last; None, the
    default (0), for every other queue.

    A turn re-sent as a retry of its task (`tasks.turns`) keeps the priority its
    message came with: Celery copies it from the delivery.
    """
    return BATCH_PRIORITY if is_batch_queue(queue) else None


def sender_app(settings: Settings) -> Celery:
    """A Celery app that only sends: for hosts, the API and the CLI."""
    app = Celery("relayq-sender", set_as_current=False)
    app.conf.update(settings.broker_options())
    return app


def publish(app: Celery, db: Database, rows: Iterable[OutboxRow]) -> int:
    """Send each row and mark it sent; rows that fail stay for the sweeper. Returns the count."""
    sent = send(app, rows)
    mark_published(db, sent)
    return len(sent)


def send(app: Celery, rows: Iterable[OutboxRow]) -> list[OutboxRow]:
    """Send each row; returns the rows that went (the caller marks them sent)."""
    sent = []
    for row in rows:
        try:
            app.send_task(
                row.task,
                args=row.args,
                # A batch's queue as a Queue, not a name: Celery keeps every name it
                # meets in the app's queues for the life of the process (an API's: months).
                queue=queue_named(row.queue) if is_batch_queue(row.queue) else row.queue,
                priority=priority_of(row.queue),
                countdown=row.countdown or None,
                task_id=task_id_of(row),
                argsrepr=row.label,
                kwargsrepr="{}",
            )
        except Exception as exc:  # the sweeper sends it again later
            log.warning("could not send %s (%s): %s", row.task, row.label, type(exc).__name__)
            continue
        sent.append(row)
    return sent
