"""A message a worker cannot read as a task is logged, counted and dropped; never fatal.

Celery and kombu stop a worker on some malformed messages ("Unrecoverable error":
a payload that is not JSON, a body that is not base64, headers of the wrong type;
celery#4308, #7975), and log the body of others (an unknown task, an undecodable
body), which may hold a prompt. relayq's consumer (`workers.app.Consumer`) and its
Redis channel (`workers.doorbell.Channel`) send every such message here instead.

Dropping loses nothing real: a turn's or an answer's message is a doorbell, rung again
by the sweeper from the store when its effect is overdue (`store.maintenance`); a
maintenance message is sent again on its schedule.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

__all__ = ["malformed_message"]

log = logging.getLogger(__name__)

MALFORMED = Counter(
    "relayq_malformed_messages_total",
    "Messages a worker could not read as a task, logged without their content and dropped",
)


def malformed_message(where: str, exc: BaseException | None, task: str | None = None) -> None:
    """Log (its error's type alone: a message quotes what it read) and count a dropped
    message found on `where`; `task` names the task it claimed to be, if any."""
    MALFORMED.inc()
    claimed = f" (it named task {task!r})" if task else ""
    log.error(
        "a message on %s could not be read as a task%s: %s; it was dropped, unread, and "
        "the worker goes on",
        where,
        claimed,
        type(exc).__name__ if exc is not None else "not a task message",
    )
