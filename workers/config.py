"""The worker's Celery settings. Each one is deliberate; the comment says why.

Connection settings (broker URL, key prefix, visibility timeout, JSON only)
come from `tasks.settings`, shared with every process that sends messages.
"""

from __future__ import annotations

from typing import Any

from kombu import Queue

from store.outbox import (
    ANSWER_QUEUE,
    ANSWER_TASK,
    CANCEL_TASK,
    MAINTENANCE_QUEUE,
    SWEEP_TASK,
    TURN_QUEUE,
    TURN_TASK,
)
from tasks.settings import VISIBILITY_TIMEOUT, Settings

__all__ = ["QUEUES", "SWEEP_EVERY", "celery_config"]

QUEUES = (TURN_QUEUE, ANSWER_QUEUE, MAINTENANCE_QUEUE)
SWEEP_EVERY = 15.0


def celery_config(settings: Settings) -> dict[str, Any]:
    hard_limit = settings.turn_time_limit + 30
    assert hard_limit < VISIBILITY_TIMEOUT, "a turn must end before its message is redelivered"
    return settings.broker_options() | {
        # A message is acknowledged only when its task has finished, so a
        # worker that dies mid-turn leaves it to be delivered again ...
        "task_acks_late": True,
        # ... also when it was the pool's child process that died.
        "task_reject_on_worker_lost": True,
        # A task that failed or timed out is finished: its run is marked failed
        # or re-queued in the store, and redelivery would only repeat that.
        "task_acks_on_failure_or_timeout": True,
        # Each pool process reserves just the message it runs, so turns spread
        # across workers instead of queueing behind a slow one.
        "worker_prefetch_multiplier": 1,
        # Soft limit: the turn is interrupted and re-queued with backoff; hard
        # limit: the process is killed. Both below the visibility timeout.
        "task_soft_time_limit": settings.turn_time_limit,
        "task_time_limit": hard_limit,
        # Separate queues: answers and maintenance never wait behind a backlog
        # of turns, and each can get its own workers.
        "task_queues": tuple(Queue(name) for name in QUEUES),
        "task_default_queue": TURN_QUEUE,
        "task_routes": {
            TURN_TASK: {"queue": TURN_QUEUE},
            ANSWER_TASK: {"queue": ANSWER_QUEUE},
            CANCEL_TASK: {"queue": MAINTENANCE_QUEUE},
            SWEEP_TASK: {"queue": MAINTENANCE_QUEUE},
        },
        # Task events for Flower; arguments are shown as `argsrepr`, which the
        # outbox sets to ids and the turn number, never prompts or secrets.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # The sweeper re-sends what was lost and expires overdue requests.
        "beat_schedule": {
            "relayq-sweep": {
                "task": SWEEP_TASK,
                "schedule": SWEEP_EVERY,
                "options": {"queue": MAINTENANCE_QUEUE, "expires": SWEEP_EVERY * 2},
            }
        },
        # A lost broker connection cancels the running tasks' reservations
        # rather than letting them finish and ack on a dead channel.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "imports": ("tasks.turns", "tasks.answers", "tasks.maintenance"),
    }
