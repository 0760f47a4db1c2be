"""The sweeper: whatever process died when, every run has a way forward.

Each sweep, from the store alone (it is the source of truth):

- expires overdue requests (or escalates them, or notices them overdue), and sends
  the reminders that are due;
- re-queues `running` runs whose worker died (its heartbeat stopped, or on
  this host its process is gone: counted against a turn that ran alone, a
  suspect mark on one that shared its process), or, for claims no worker stands behind,
  whose lease lapsed; a stale heartbeat counts only while the sweeper's own
  beats have been steady (`heartbeats_steady`: after the store was down or
  locked, every worker's beat is stale, and none of them is dead for it);
- re-queues the sweeping worker's own claims that none of its tasks holds
  (`working`): a task that ended on an error without giving its run back,
  counted as a crash; never one of its claims that a task still works on;
- sends again what was committed but never sent (a process died between
  commit and publish);
- sends again what was sent but lost: the turn of a run still queued at that
  version, the answer task of an answer accepted but not applied, when the
  message left its queue (`waiting`: the oldest message the broker still
  holds there was sent after it) and its effect is overdue. A duplicate is a
  no-op: the claim, and the answer's `applied` flag, see to that.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from store.answers import expire_and_count, remind_due
from store.db import Database
from store.models import OutboxRow, RequestRow, RunRow, utcnow
from store.outbox import (
    ANSWER_QUEUE,
    ANSWER_TASK,
    TURN_TASK,
    enqueue_turn,
    resend,
    unpublished,
)
from store.runs import label_of
from store.transitions import ONE_MORE_CRASH, died_holding, move
from store.workers import WORKER_TIMEOUT, live_workers, prune_workers

__all__ = ["Recovery", "SweepReport", "sweep"]


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """How soon the sweeper acts. The defaults, with a sweep every 5 s, move every
    run on within 30 s of a worker's death or the broker's return."""

    worker_timeout: timedelta = WORKER_TIMEOUT
    """A worker whose heartbeat is older is dead; its claims are taken over."""
    outbox_grace: timedelta = timedelta(seconds=5)
    """A message committed this long ago and never marked sent is sent again."""
    redeliver_after: timedelta = timedelta(seconds=10)
    """A message sent this long ago whose effect has not happened, and that is no
    longer waiting in its queue, is sent again."""
    forget_workers_after: timedelta = timedelta(hours=1)


@dataclass(kw_only=True)
class SweepReport:
    outbox: list[OutboxRow] = field(default_factory=list)
    """Messages to send now."""
    requeued: list[str] = field(default_factory=list)
    """Runs whose worker died."""
    freed: list[str] = field(default_factory=list)
    """Runs claimed by the sweeping worker that none of its tasks held."""
    resent: list[str] = field(default_factory=list)
    """Queued runs whose turn message was lost."""
    reapplied: list[str] = field(default_factory=list)
    """Accepted answers (request ids) whose answer task was lost."""
    expired: int = 0
    """Requests that reached their deadline (expired, escalated or noticed overdue)."""
    reminded: int = 0
    """Requests whose reminder went out."""
    purged: int = 0
    """Finished runs removed for RELAYQ_RETENTION (`store.retention`)."""
    purged_events: int = 0
    """Webhook events removed for RELAYQ_WEBHOOK_RETENTION."""
    purged_decisions: int = 0
    """Audit rows removed for RELAYQ_AUDIT_RETENTION."""


def _always() -> bool:
    return True


def _nothing() -> Collection[str]:
    return ()


def sweep(
    db: Database,
    *,
    now: datetime | None = None,
    recovery: Recovery = Recovery(),
    waiting: Mapping[str, datetime | None] | None = None,
    worker: str | None = None,
    working: Callable[[], Collection[str]] = _nothing,
    heartbeats_steady: Callable[[], bool] = _always,
) -> SweepReport:
    """One sweep. `waiting` maps a queue to when the oldest message still in it was
    sent (None: the queue is empty); a queue left out is not looked at for lost
    messages, since whether they wait there is unknown.

    `worker` is the sweeping worker: its claims are never taken for a dead worker's,
    and those of them on no run of `working()` (read once the runs are locked) are
    freed. `heartbeats_steady()`, asked once the store's lock is held, says whether a
    stale heartbeat may count as a death now.
    """
    moment = now or utcnow()
    report = SweepReport()
    expired, report.expired = expire_and_count(db, now=moment)
    report.reminded = remind_due(db, now=moment)
    with db.write() as s:
        _requeue_abandoned(
            s,
            report,
            moment,
            recovery.worker_timeout,
            worker=worker,
            working=working,
            heartbeats_steady=heartbeats_steady,
        )
        if waiting is not None:
            lost_before = {
                queue: min(moment - recovery.redeliver_after, oldest or moment)
                for queue, oldest in waiting.items()
            }
            turn_queues = {q: t for q, t in lost_before.items() if q != ANSWER_QUEUE}
            if turn_queues:
                _resend_lost_turns(s, report, turn_queues)
            if ANSWER_QUEUE in lost_before:
                _resend_lost_answers(s, report, lost_before[ANSWER_QUEUE])
    report.outbox += expired
    fresh = {r.id for r in report.outbox}
    report.outbox += [
        r
        for r in unpublished(db, older_than=recovery.outbox_grace, now=moment)
        if r.id not in fresh
    ]
    prune_workers(db, older_than=recovery.forget_workers_after, now=moment)
    return report


def _requeue_abandoned(
    s: Session,
    report: SweepReport,
    now: datetime,
    worker_timeout: timedelta,
    *,
    worker: str | None,
    working: Callable[[], Collection[str]],
    heartbeats_steady: Callable[[], bool],
) -> None:
    # Locked, skipping rows a turn holds right now: one that is writing is not dead.
    candidates = s.exec(
        select(RunRow).where(RunRow.status == "running").with_for_update(skip_locked=True)
    ).all()
    if not candidates:
        return
    # Asked with the runs locked: a claim made before is counted, a turn ending now waits.
    held = working() if worker is not None else ()
    timeout = worker_timeout if heartbeats_steady() else None
    live = live_workers(s, now=now, timeout=timeout)
    for run in candidates:
        if run.worker is not None and run.worker == worker:
            if run.id in held:
                continue
            # Ours, and no task of ours holds it: its task ended without giving it back
            # (a claim whose commit it never heard of, or a fault). Counted as a crash,
            # so that a turn that always ends so cannot loop for ever (RELAYQ_CRASH_LIMIT).
            move(s, run, "queued", now=now, crashes=ONE_MORE_CRASH)
            report.freed.append(run.id)
        elif _abandoned(run, live, now):
            # Its worker died holding it: counted against the turn if it ran alone.
            move(s, run, "queued", now=now, **died_holding(run))
            report.requeued.append(run.id)
        else:
            continue
        report.outbox.append(enqueue_turn(s, run.id, run.version, label=label_of(run)))


def _abandoned(run: RunRow, live: Collection[str], now: datetime) -> bool:
    """Held by a worker no longer alive, or, a claim with no worker, past its lease."""
    if run.worker is not None:
        return run.worker not in live
    return run.lease_until is not None and run.lease_until < now


def _latest_rows(s: Session, task: str, run_ids: list[str]) -> dict[str, OutboxRow]:
    """The newest outbox row of `task` for each message's first argument (a run or request)."""
    latest: dict[str, OutboxRow] = {}
    for chunk in (run_ids[i : i + 500] for i in range(0, len(run_ids), 500)):
        rows = s.exec(
            select(OutboxRow)
            .where(OutboxRow.task == task, col(OutboxRow.run_id).in_(chunk))
            .order_by(col(OutboxRow.id))
        )
        for row in rows:
            latest[str(row.args[0])] = row
    return latest


def _lost(row: OutboxRow | None, before: datetime) -> bool:
    """Sent (not merely committed), and due to have taken effect before `before`."""
    if row is None or row.published_at is None:
        return False  # never sent: the grace rule sends it
    return row.published_at + timedelta(seconds=row.countdown) < before


def _resend_lost_turns(
    s: Session, report: SweepReport, lost_before: Mapping[str, datetime]
) -> None:
    """Each turn judged against its own queue's backlog (agents may have queues of their
    own); a queue not looked into is left alone."""
    queued = s.exec(
        select(RunRow)
        .where(RunRow.status == "queued", col(RunRow.updated_at) < max(lost_before.values()))
        .with_for_update(skip_locked=True)
    ).all()
    latest = _latest_rows(s, TURN_TASK, [r.id for r in queued])
    for run in queued:
        row = latest.get(run.id)
        before = lost_before.get(row.queue) if row is not None else None
        if (
            row is not None
            and before is not None
            and row.args == [run.id, run.version]
            and _lost(row, before)
        ):
            report.resent.append(run.id)
            report.outbox.append(resend(row, utcnow()))


def _resend_lost_answers(s: Session, report: SweepReport, before: datetime) -> None:
    unapplied = s.exec(
        select(RequestRow).where(
            col(RequestRow.applied).is_(False),
            col(RequestRow.status).in_(("answered", "expired")),
            col(RequestRow.answered_at) < before,
        )
    ).all()
    latest = _latest_rows(s, ANSWER_TASK, sorted({r.run_id for r in unapplied}))
    for request in unapplied:
        row = latest.get(request.id)
        if row is not None and _lost(row, before):
            report.reapplied.append(request.id)
            report.outbox.append(resend(row, utcnow()))
