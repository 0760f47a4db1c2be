"""Sending outbox rows, after the transaction that wrote them has committed."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from celery import Celery

from store import Database, OutboxRow
from store.outbox import mark_published, task_id_of
from tasks.settings import Settings

__all__ = ["publish", "send", "sender_app"]

log = logging.getLogger(__name__)


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
                queue=row.queue,
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
