"""The worker's Celery settings. Each one is deliberate; the comment says why.

What every process that sends messages needs too (broker URL, key prefix,
visibility timeout, JSON only, the queues and routes) comes from
`tasks.settings`.
"""

from __future__ import annotations

from typing import Any

from store.outbox import MAINTENANCE_QUEUE, SWEEP_TASK
from tasks.settings import QUEUES, Settings

__all__ = ["QUEUES", "celery_config"]


def celery_config(settings: Settings) -> dict[str, Any]:
    hard_limit = settings.turns.time_limit.total_seconds() + 30
    visibility = settings.recovery.visibility_timeout.total_seconds()
    assert hard_limit < visibility, "a turn must end before it is redelivered"
    sweep_every = settings.recovery.sweep_every.total_seconds()
    worker = {
        # A message is acknowledged only when its task has finished, so a
        # worker that dies mid-task leaves it to be delivered again (by the
        # sweeper for turns and answers, which workers hold in memory only:
        # `workers.doorbell`) ...
        "task_acks_late": True,
        # ... also when it was the pool's child process that died.
        "task_reject_on_worker_lost": True,
        # A task that failed or timed out is finished: its run is marked failed
        # or re-queued in the store, and redelivery would only repeat that.
        "task_acks_on_failure_or_timeout": True,
        # The broker hands a worker only as many messages as it runs at once,
        # so turns spread across workers instead of queueing behind busy ones.
        "worker_prefetch_multiplier": 1,
        # Soft limit: the turn is interrupted and re-queued with backoff; hard
        # limit: the process is killed. Both below the visibility timeout. (The
        # asyncio pool times a turn out itself, a few seconds before the soft limit.)
        "task_soft_time_limit": settings.turns.time_limit.total_seconds(),
        "task_time_limit": hard_limit,
        # Task events feed Flower, which turns them on in every worker while it
        # runs (its `enable_events` broadcast; a worker that starts while Flower
        # watches has them from the start, `workers.events`), so they are off
        # until then: three events a turn cost about a sixth of a worker's turns
        # per second. Their arguments are `argsrepr`: ids and the turn number,
        # never prompts or secrets.
        "worker_send_task_events": settings.worker.task_events,
        # The "sent" event doubles the cost of every send: it goes with task events.
        "task_send_sent_event": settings.worker.task_events,
        # The sweeper re-sends what was lost and expires overdue requests.
        "beat_schedule": {
            "relayq-sweep": {
                "task": SWEEP_TASK,
                "schedule": sweep_every,
                "options": {
                    "queue": MAINTENANCE_QUEUE,
                    "expires": settings.recovery.sweep_every.total_seconds() * 2,
                },
            }
        },
        # A lost broker connection cancels the running tasks' reservations
        # rather than letting them finish and ack on a dead channel (the asyncio
        # pool lets such a turn finish unreported: see `workers.aio`).
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # A broker outage is waited out however long it lasts: the consumer
        # reconnects forever (Celery gives up after 100 tries, about 45 minutes,
        # and the worker stops) ...
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        # ... and survives releasing the connection it lost (see `workers.app.Consumer`).
        "worker_consumer": "workers.app:Consumer",
        "imports": (
            "tasks.runner.turn.task",
            "tasks.runner.turn.answers",
            "tasks.runner.maintenance",
        ),
        # Hooks of the worker's runtime besides relayq's own (`tasks.hooks`): the turns'
        # progress events for Flower. (RELAYQ_HOOKS adds the user's.)
        "relayq_worker_hooks": ("workers.events:FlowerProgress",),
    }
    return settings.broker_options() | worker | _pool(settings)


def _pool(settings: Settings) -> dict[str, Any]:
    """The asyncio pool keeps hundreds of turns in flight per process (see `workers.aio`)."""
    if settings.worker.pool == "asyncio":
        return {
            "worker_pool": "workers.aio:AsyncioPool",
            "worker_concurrency": settings.worker.concurrency or 500,
        }
    pool = {"worker_pool": settings.worker.pool, "worker_concurrency": settings.worker.concurrency}
    if settings.worker.max_memory is not None and settings.worker.pool == "prefork":
        # Celery replaces a child over it once its task ends (KiB); the asyncio pool's
        # one process retires instead (`tasks.runner.memory`).
        pool["worker_max_memory_per_child"] = settings.worker.max_memory // 1024
    return pool
