"""The answer task (`relayq.submit_answer` on the wire, `apply_answer_task` here): an answer
the client accepted (`DurableClient.submit_answer`) goes into the transcript, and the run
is queued again."""

from __future__ import annotations

from celery import Task, shared_task

from store import OutboxRow
from store.outbox import ANSWER_TASK
from tasks.hooks import AnswerApplied, AnswerApplying
from tasks.runner.process import current_runtime
from tasks.runner.runtime import Runtime

__all__ = ["apply_answer", "apply_answer_task"]


async def apply_answer(rt: Runtime, request_id: str) -> str:
    """Apply the answer (until the store answers: applying again is safe, an applied
    answer is skipped, and the message must not be acknowledged with the answer left
    unapplied); the hooks see it before and after (`tasks.hooks`)."""
    await rt.hooks.emit(AnswerApplying(request_id))
    outbox: list[OutboxRow] = []
    error: str | None = None
    try:
        outbox = await rt.patiently(rt.store.apply_answer_of, request_id)
        await rt.dispatch(outbox)
    except BaseException as exc:
        error = type(exc).__name__
        raise
    finally:
        applied = AnswerApplied(request_id, bool(outbox), error)
        await rt.hooks.emit(applied)
    return "resumed" if outbox else "skipped: already applied or run not pending"


@shared_task(name=ANSWER_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def apply_answer_task(self: Task, request_id: str) -> str:
    """Apply the stored answer of `request_id`; a second delivery finds it applied and stops."""
    rt = current_runtime(self.app)
    return rt.loop.wait(apply_answer(rt, request_id))
