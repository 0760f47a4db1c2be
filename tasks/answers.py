"""`relayq.submit_answer`: an accepted answer goes into the transcript and the run is re-queued."""

from __future__ import annotations

from celery import Task, shared_task

from store import apply_answer_of
from store.outbox import ANSWER_TASK
from tasks.runtime import Runtime
from tasks.tracing import resumed

__all__ = ["apply_answer", "submit_answer"]


async def apply_answer(rt: Runtime, request_id: str) -> str:
    async with resumed(rt, request_id):  # traced, when tracing is on (`tasks.tracing`)
        # Until the store answers: applying again is safe (an applied answer is skipped),
        # and the message must not be acknowledged with the answer left unapplied.
        outbox = await rt.patiently(apply_answer_of, rt.db, request_id)
        await rt.publish(outbox)
    return "resumed" if outbox else "skipped: already applied or run not pending"


@shared_task(name=ANSWER_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def submit_answer(self: Task, request_id: str) -> str:
    """Apply the stored answer of `request_id`; a second delivery finds it applied and stops."""
    rt = Runtime.current(self.app)
    return rt.wait(apply_answer(rt, request_id))
