"""Celery tasks that drive durable runs, and the client.

Task names are stable: `relayq.run_turn`, `relayq.submit_answer`,
`relayq.cancel_run`, `relayq.sweep`. Their arguments are ids only; the store
is the source of truth and the broker carries wake-ups: task messages for the
workers, and for waiting clients the ids of the runs a task may have settled
(`tasks.broker.announce`, heard by `tasks.client.waiting`).
`DurableClient(eager=True)` runs the same turns in the calling process instead
(`tasks.client.eager`).
"""

from tasks.client.client import DurableClient, WaitTimeout
from tasks.settings import Settings

__all__ = ["DurableClient", "Settings", "WaitTimeout"]
