"""`relayq.sweep` and `relayq.cancel_run`: the maintenance queue."""

from __future__ import annotations

from celery import Task, shared_task

from store import cancel_run as cancel_stored_run
from store import sweep as sweep_store
from store.outbox import CANCEL_TASK, MAINTENANCE_QUEUE, SWEEP_TASK
from tasks.publish import publish
from tasks.runtime import Runtime

__all__ = ["cancel_run", "sweep"]


@shared_task(name=SWEEP_TASK, bind=True, acks_late=True, queue=MAINTENANCE_QUEUE)
def sweep(self: Task) -> str:
    """Re-send lost messages, re-queue runs whose worker vanished, expire overdue requests."""
    rt = Runtime.current()
    report = sweep_store(rt.db)
    sent = publish(self.app, rt.db, report.outbox)
    return (
        f"sent {sent}, requeued {len(report.requeued)}, resent {len(report.resent)}, "
        f"expired {report.expired}"
    )


@shared_task(name=CANCEL_TASK, bind=True, acks_late=True, queue=MAINTENANCE_QUEUE)
def cancel_run(self: Task, run_id: str) -> str:
    """Cancel a run: at once if it waits, at its next turn or tool boundary if it runs."""
    return cancel_stored_run(Runtime.current().db, run_id)
