"""A worker process's background work: its heartbeat and the watch on its loop, sweeps of
the store, retention, webhook deliveries, and signing off at exit.

Every worker does all of it (from its start, then with jitter), so no run waits on a
beat process for its lost message or dead worker, and the store's claims share the
webhook deliveries out. Started once per process (`tasks.runner.process`), for its life.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import random
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from store import forget_worker
from store.batch_queues import active_batch_queues
from store.errors import safe_text
from store.maintenance import SweepReport
from store.outbox import ANSWER_QUEUE, TURN_QUEUE, sent_at
from store.retention import CHUNK as RETENTION_CHUNK
from store.retention import (
    DECISION_CHUNK,
    EVENT_CHUNK,
)
from tasks.broker.peek import QueuePeek
from tasks.webhooks.sender import WebhookSender

if TYPE_CHECKING:
    from tasks.runner.runtime import Runtime

__all__ = ["Housekeeping", "peeked_queues"]

log = logging.getLogger(__name__)


def peeked_queues(rt: Runtime) -> tuple[str, ...]:
    """The queues whose backlog the sweeper reads: relayq's, and its agents' own."""
    agents = sorted({a.queue for a in rt.agents.values()} - {TURN_QUEUE})
    return (TURN_QUEUE, ANSWER_QUEUE, *agents)


class Housekeeping:
    """The background work of the worker process `rt` holds (`start`), and one sweep
    of it on demand (`sweep`: the maintenance queue's `relayq.sweep`)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._peek: QueuePeek | None = None
        self._started = False

    def start(self) -> None:
        """Heartbeats, the loop's watch, sweeps and webhook deliveries, for the life of the
        process; once. The first heartbeat is written before this returns, so no claim of
        this process is ever seen without one."""
        if self._started:
            return
        rt = self.rt
        recovery = rt.settings.recovery
        watch = rt.loop.start_watch(
            stall=recovery.loop_stall.total_seconds(),
            exit_after=recovery.loop_stall_exit.total_seconds(),
        )
        rt.heartbeat.loop_stalled = lambda: watch.stalled
        rt.heartbeat.start()
        self._started = True
        atexit.register(self.sign_off)
        asyncio.run_coroutine_threadsafe(self._sweep_forever(), rt.loop.loop)
        asyncio.run_coroutine_threadsafe(self._deliver_forever(), rt.loop.loop)

    def sign_off(self) -> None:
        """At exit: the claims still held go to other workers at their next sweep."""
        rt = self.rt
        if rt.loop.watch is not None:
            rt.loop.watch.stop()  # the loop may well stop turning now
        rt.heartbeat.stop()
        try:
            forget_worker(rt.db, rt.worker_id)
        except Exception as exc:  # the heartbeat's timeout does it later
            log.warning("could not sign the worker off: %s", type(exc).__name__)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:
                log.warning("sweep failed: %s", safe_text(exc))
            every = self.rt.settings.recovery.sweep_every.total_seconds()
            await asyncio.sleep(every * random.uniform(0.8, 1.2))

    async def _deliver_forever(self) -> None:
        rt = self.rt
        if rt.settings.webhooks.endpoints:
            sender = WebhookSender.from_settings(rt.settings.webhooks, rt.db, store=rt.store)
            await sender.run_forever()

    async def sweep(self) -> SweepReport:
        """One sweep of the store, with what the broker still holds; sends what it finds."""
        rt = self.rt
        waiting = await rt.store.call(self._waiting)
        report = await rt.store.sweep(
            recovery=rt.settings.recovery.bounds(),
            waiting=waiting,
            worker=rt.worker_id,
            working=rt.working.runs,
            heartbeats_steady=rt.heartbeat.steady,
        )
        await rt.dispatch(report.outbox)
        await self._retain(report)
        return report

    async def _retain(self, report: SweepReport) -> None:
        """What the retentions let go: one transaction's worth of each a sweep, since every
        worker sweeps every few seconds (`store.retention`); on a thread, never inline on
        the loop: a purge's transactions are long beside a turn's, and pause between."""
        rt = self.rt
        now = datetime.now(UTC)
        runs = rt.settings.recovery.retention
        if runs is not None:
            purged = await rt.store.purge_finished(now - runs, limit=RETENTION_CHUNK)
            report.purged = purged.runs
        events = rt.settings.webhooks.retention
        if events is not None:
            gone = await rt.store.purge_events(now - events, limit=EVENT_CHUNK)
            report.purged_events = gone.rows.get("relayq_events", 0)
        audit = rt.settings.recovery.audit_retention
        if audit is not None:
            report.purged_decisions = await rt.store.purge_decisions(
                now - audit, limit=DECISION_CHUNK
            )

    def _waiting(self) -> dict[str, datetime | None] | None:
        """When the oldest message still in each queue (at any priority) was sent; a
        queue holding a message that is not one we know is left out (nothing is taken
        for lost there)."""
        rt = self.rt
        if self._peek is None:
            self._peek = QueuePeek(rt.settings)
        # The active batches' queues too, whichever worker consumes them: a batch turn
        # lost with a dead worker or an emptied broker is sent again like any other.
        queues = (*peeked_queues(rt), *active_batch_queues(rt.db))
        tails = self._peek.oldest(queues)
        if tails is None:
            return None
        waiting: dict[str, datetime | None] = {}
        for queue, task_ids in tails.items():
            sent = [sent_at(rt.db, task_id) for task_id in task_ids]
            known = [moment for moment in sent if moment is not None]
            if len(known) == len(sent):
                waiting[queue] = min(known, default=None)
        return waiting
