"""`relayq.sweep`, `relayq.cancel_run` and `relayq.wake_runs`: the maintenance queue."""

from __future__ import annotations

from celery import Task, shared_task

from store import StoreUnavailable
from store.outbox import CANCEL_TASK, SWEEP_TASK
from tasks.broker.circuit import WAKE_TASK
from tasks.hooks import RunSettled
from tasks.runner.housekeeping import Housekeeping
from tasks.runner.process import current_housekeeping, current_runtime
from tasks.runner.runtime import Runtime

__all__ = ["cancel_run", "sweep", "wake_runs"]


async def _sweep(housekeeping: Housekeeping) -> str:
    try:
        report = await housekeeping.sweep()
    except StoreUnavailable as exc:
        # Beat sends the next within seconds (and every worker sweeps on its own).
        return f"skipped: {exc}"
    return (
        f"sent {len(report.outbox)}, requeued {len(report.requeued)}, "
        f"freed {len(report.freed)}, resent {len(report.resent)}, "
        f"reapplied {len(report.reapplied)}, expired {report.expired}, purged {report.purged} "
        f"runs, {report.purged_events} events, {report.purged_decisions} decisions"
    )


async def _cancel(rt: Runtime, run_id: str) -> str:
    # Until the store answers: a cancel asked for is not dropped with its message.
    asked = await rt.patiently(rt.store.cancel_run, run_id)
    if asked.settled:  # a running run is cancelled by its turn, which says so
        agent = rt.known_agent(asked.agent)
        settled = RunSettled(run_id, asked.agent, asked.status)
        await rt.hooks.emit(settled, agent.hooks if agent is not None else ())
    return asked.status


@shared_task(name=SWEEP_TASK, bind=True, acks_late=True)
def sweep(self: Task) -> str:
    """Re-send lost messages, re-queue runs whose worker vanished, expire overdue requests."""
    housekeeping = current_housekeeping(self.app)
    return housekeeping.rt.loop.wait(_sweep(housekeeping))


@shared_task(name=CANCEL_TASK, bind=True, acks_late=True)
def cancel_run(self: Task, run_id: str) -> str:
    """Cancel a run: at once if it waits, at its next turn or tool boundary if it runs."""
    rt = current_runtime(self.app)
    return rt.loop.wait(_cancel(rt, run_id))


async def _wake(rt: Runtime, run_ids: list[str]) -> str:
    rows = await rt.store.resend_turns(run_ids)
    await rt.dispatch(rows)
    return f"woke {len(rows)} of {len(run_ids)} runs"


@shared_task(name=WAKE_TASK, bind=True, acks_late=True)
def wake_runs(self: Task, run_ids: list[str]) -> str:
    """Send the turns of runs that waited for a provider now its circuit has closed
    (`tasks.broker.circuit`); those no longer queued are left alone."""
    rt = current_runtime(self.app)
    return rt.loop.wait(_wake(rt, run_ids))
