"""Sending outbox rows, after the transaction that wrote them has committed.

A batch's turns (`store.batch_queues`) go at low priorities, everything else at the
highest. Kombu's Redis transport keeps a queue's messages of each priority in a list of
their own, and a worker asks for every queue's priority-0 list before any priority-6
one, and those before any priority-9 one: an interactive turn, an answer or a sweep
waiting anywhere is fetched before any batch turn. (0 is the highest there, the reverse
of RabbitMQ's.)

Within a batch, a run already started goes before runs not started yet (6, then 9): a
batch finishes runs as it goes, depth first, instead of taking every run's first turn
before any run's second, which would finish no run until the very end, keep every run's
transcript in the worker meanwhile, and make its rate and ETA meaningless.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from celery import Celery
from kombu import Producer

from store import Database, OutboxRow
from store.batch_queues import is_batch_queue
from store.outbox import is_first_turn, mark_published, task_id_of
from tasks.settings import PRIORITY_STEPS, Settings, queue_named

__all__ = [
    "BATCH_PRIORITY",
    "BATCH_STARTED_PRIORITY",
    "batches_changed",
    "priority_of",
    "publish",
    "send",
    "sender_app",
]

log = logging.getLogger(__name__)

PIPELINED = 500
"""Broker commands sent in one round trip when many rows go at once."""

BATCH_PRIORITY = 9
"""A batch's runs not started yet: the lowest of the priority steps relayq gives kombu's
Redis transport (`tasks.settings.PRIORITY_STEPS`; 0 is fetched first)."""
BATCH_STARTED_PRIORITY = 6
"""The later turns of a batch's runs already started."""
assert {0, BATCH_STARTED_PRIORITY, BATCH_PRIORITY} == set(PRIORITY_STEPS), "a list per priority"


def priority_of(row: OutboxRow) -> int | None:
    """The priority `row`'s message is sent with: a batch's turns after every other message,
    its runs already started before those not started; None, the default (0), for every
    other queue.

    A turn re-sent as a retry of its task (`tasks.runner.turn.waits.resend`) keeps the priority its
    message came with: Celery copies it from the delivery.
    """
    if not is_batch_queue(row.queue):
        return None
    return BATCH_PRIORITY if is_first_turn(row) else BATCH_STARTED_PRIORITY


def sender_app(settings: Settings) -> Celery:
    """A Celery app that only sends: for hosts, the API and the CLI."""
    app = Celery("relayq-sender", set_as_current=False)
    app.conf.update(settings.broker_options())
    return app


def batches_changed(app: Celery) -> None:
    """Tell every worker that a batch has new runs, so that those taking batches consume its
    queue at once instead of at their next look at the store (`RELAYQ_BATCH_POLL`).

    Best effort: a worker that misses it finds the batch at its next look.
    """
    try:
        app.control.broadcast("relayq_batches_changed", reply=False)
    except Exception as exc:
        log.warning("could not tell the workers a batch started: %s", type(exc).__name__)


def publish(app: Celery, db: Database, rows: Iterable[OutboxRow]) -> int:
    """Send each row and mark it sent; rows that fail stay for the sweeper. Returns the count."""
    sent = send(app, rows)
    mark_published(db, sent)
    return len(sent)


def send(app: Celery, rows: Iterable[OutboxRow], *, quiet: bool = False) -> list[OutboxRow]:
    """Send each row; returns the rows that went (the caller marks them sent).

    A row that does not go is logged, and left for the sweeper; `quiet`: not logged,
    the caller says itself what did not go (the CLI, in one line).

    Many rows go through one producer in pipelined batches (kombu's `Producer.batch`:
    a batch's 5,000 first turns are sent in a fraction of the round trips). If a
    batch fails, its rows are sent again one by one: a message sent twice names the
    same task and claim, and its duplicate changes nothing.
    """
    rows = list(rows)
    if len(rows) > 1:
        try:
            with app.producer_or_acquire() as producer, producer.batch(max_size=PIPELINED):
                for row in rows:
                    _send(app, row, producer)
        except Exception as exc:
            if not quiet:
                log.warning(
                    "could not send %d messages at once (%s); sending each",
                    len(rows),
                    type(exc).__name__,
                )
        else:
            return rows
    sent = []
    for row in rows:
        try:
            _send(app, row)
        except Exception as exc:  # the sweeper sends it again later
            if not quiet:
                log.warning("could not send %s (%s): %s", row.task, row.label, type(exc).__name__)
            continue
        sent.append(row)
    return sent


def _send(app: Celery, row: OutboxRow, producer: Producer | None = None) -> None:
    app.send_task(
        row.task,
        args=row.args,
        # A batch's queue as a Queue, not a name: Celery keeps every name it meets in the
        # app's queues for the life of the process (an API's: months).
        queue=queue_named(row.queue) if is_batch_queue(row.queue) else row.queue,
        priority=priority_of(row),
        countdown=row.countdown or None,
        task_id=task_id_of(row),
        argsrepr=row.label,
        kwargsrepr="{}",
        producer=producer,
    )
