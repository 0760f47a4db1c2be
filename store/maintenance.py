"""The sweeper: nothing the workers were doing is ever left stuck or lost.

It re-sends outbox rows that were committed but never sent (a worker died
between commit and publish), re-queues `running` runs whose lease ran out
(their worker vanished), re-sends `queued` runs that sat too long (their
message was lost with a broker), and expires overdue requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import col, select

from store.answers import expire_and_count
from store.db import Database
from store.models import OutboxRow, RunRow, utcnow
from store.outbox import enqueue_turn, unpublished
from store.runs import _label

__all__ = ["SweepReport", "sweep"]


@dataclass(kw_only=True)
class SweepReport:
    outbox: list[OutboxRow] = field(default_factory=list)
    """Messages to send now."""
    requeued: list[str] = field(default_factory=list)
    """Runs whose worker vanished."""
    resent: list[str] = field(default_factory=list)
    """Queued runs whose message went missing."""
    expired: int = 0


def sweep(
    db: Database,
    *,
    now: datetime | None = None,
    outbox_grace: timedelta = timedelta(seconds=30),
    stale_queued: timedelta = timedelta(minutes=15),
) -> SweepReport:
    moment = now or utcnow()
    report = SweepReport()
    expired, report.expired = expire_and_count(db, now=moment)
    with db.write() as s:
        # Locked, skipping rows a turn holds: a turn finishing now is not vanished.
        vanished = s.exec(
            select(RunRow)
            .where(RunRow.status == "running", col(RunRow.lease_until) < moment)
            .with_for_update(skip_locked=True)
        ).all()
        for run in vanished:
            run.status = "queued"
            run.version += 1
            run.attempts += 1  # its worker died holding it: that try counts
            run.claimed_by = None
            run.lease_until = None
            run.updated_at = moment
            report.requeued.append(run.id)
            report.outbox.append(enqueue_turn(s, run.id, run.version, label=_label(run)))
        waiting = {
            r
            for r in s.exec(
                select(OutboxRow.run_id).where(col(OutboxRow.published_at).is_(None))
            ).all()
        }
        stale = s.exec(
            select(RunRow)
            .where(RunRow.status == "queued", col(RunRow.updated_at) < moment - stale_queued)
            .with_for_update(skip_locked=True)
        ).all()
        for run in stale:
            if run.id in waiting or run.id in report.requeued:
                continue
            run.updated_at = moment
            report.resent.append(run.id)
            report.outbox.append(enqueue_turn(s, run.id, run.version, label=_label(run)))
    report.outbox += expired
    fresh_ids = {r.id for r in report.outbox}
    report.outbox += [
        r for r in unpublished(db, older_than=outbox_grace, now=moment) if r.id not in fresh_ids
    ]
    return report
