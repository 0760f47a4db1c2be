"""Runs: created (one, or many in chunks of `CHUNK` a transaction) and cancelled.

A run's status only ever changes through `store.transitions`; its turns are
in `store.turns`, its answers in `store.answers`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from relayq import ConversationBusy, ConversationPurged, ResumeError
from relayq import transcript as tx
from relayq.limits import check_run_input
from store import statements as sql
from store.db import Database
from store.errors import JobExists, StaleClaim, UnknownRun
from store.events import emit, emit_many
from store.messages import conversation, message_row, message_values
from store.models import FINISHED, MessageRow, OutboxRow, RunRow, utcnow
from store.outbox import (
    NO_FIRST_TURNS,
    TURN_QUEUE,
    FirstTurns,
    enqueue_first_turns,
    enqueue_turn,
    turn_label,
)
from store.requests import cancel_requests
from store.transitions import SPENT_MESSAGES, move, transition

__all__ = [
    "CHUNK",
    "CancelAsked",
    "RunSpec",
    "cancel_locked",
    "cancel_many_locked",
    "cancel_run",
    "create_run",
    "chunked",
    "create_runs",
    "fail_locked",
    "label_of",
]

T = TypeVar("T")

CHUNK = 1000
"""Runs started in one transaction: a few hundred milliseconds of SQLite's write lock at
most, so a start of 100,000 never stops every other run's turns for long."""
CHUNK_PAUSE = 0.05
"""Seconds between two chunks on SQLite, so the writers waiting on its lock get it first
(SQLite queues no one: a waiter polls, and a starter taking the lock straight back would
keep it for the whole start)."""


def chunked(db: Database, items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """`items`, `size` at a time, with a pause between two on SQLite (`CHUNK_PAUSE`)."""
    if size < 1:
        raise ValueError(f"a chunk holds at least one, not {size}")
    for n in range(0, len(items), size):
        if n and db.is_sqlite:
            time.sleep(CHUNK_PAUSE)
        yield items[n : n + size]


def label_of(run: RunRow) -> str:
    """The label of the run's next turn message."""
    return turn_label(run.id, run.agent, run.turns + 1)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """How runs start: what each run started with it shares, one run or a batch's
    thousands. Built once where a start is asked for (`tasks.DurableClient`), and
    passed whole to `create_run`, `create_runs` and `store.batch_start.start_batch`.
    """

    agent: str
    tools_digest: str | None = None
    """The agent's tools' digest, when the starter knows the agent: a worker with other
    tools does not take its turns."""
    queue: str | None = None
    """Where the first turn goes (its agent's queue); `relayq.turns` by default."""
    started_by: str | None = None
    """Who asked: an approval may forbid them to approve it."""
    batch_id: str | None = None
    """The batch the runs are jobs of."""
    budget: dict[str, Any] | None = None
    """What each run may spend (`relayq.budgets.Budget` wire), in place of its agent's."""


def create_run(
    db: Database,
    spec: RunSpec,
    *,
    run_id: str,
    prompt: str,
    conversation_id: str | None = None,
    job_id: str | None = None,
    max_bytes: int | None = None,
) -> OutboxRow:
    """A queued run with its prompt, started as `spec` says; continues `conversation_id`
    if it names one. `job_id` says which job of `spec.batch_id` it is. A prompt over
    `max_bytes` (the caller's `Settings.max_answer_bytes`; by default
    RELAYQ_MAX_ANSWER_BYTES) is refused here, the one place a prompt's size is checked."""
    check_run_input(
        agent=spec.agent, prompts=[prompt], conversation_id=conversation_id, max_bytes=max_bytes
    )
    if conversation_id is None:
        jobs = None if job_id is None else [job_id]
        return create_runs(db, spec, [(run_id, prompt)], job_ids=jobs, max_bytes=max_bytes)[0]
    now = utcnow()
    try:
        with db.write() as s:
            _check_can_continue(s, conversation_id)
            history = conversation(s, conversation_id)
            _check_history(s, conversation_id, history)
            run = RunRow(
                id=run_id,
                agent=spec.agent,
                conversation_id=conversation_id,
                status="queued",
                start_seq=len(history),
                tools_digest=spec.tools_digest,
                started_by=spec.started_by,
                batch_id=spec.batch_id,
                job_id=job_id,
                budget=spec.budget,
                created_at=now,
                updated_at=now,
            )
            s.add(run)
            s.add(message_row(run, len(history), tx.user_message(prompt, run_id)))
            s.flush()
            return enqueue_turn(
                s, run_id, run.version, label=label_of(run), queue=spec.queue or TURN_QUEUE
            )
    except IntegrityError:
        _refuse_taken_jobs(db, spec.batch_id, [job_id] if job_id is not None else [])
        raise


def create_runs(
    db: Database,
    spec: RunSpec,
    runs: list[tuple[str, str]],
    *,
    job_ids: list[str] | None = None,
    max_bytes: int | None = None,
) -> list[OutboxRow]:
    """Many queued runs started as `spec` says, each a new conversation: `runs` is
    (id, prompt); `job_ids`, if given, one per run (the jobs of `spec.batch_id`).

    Every prompt is checked before anything is written; the runs are then written
    `CHUNK` to a transaction. A caller that dies between two leaves the chunks it
    wrote: a batch (`store.batch_start.start_batch`) is what starts each job exactly once.
    """
    check_run_input(agent=spec.agent, prompts=[prompt for _, prompt in runs], max_bytes=max_bytes)
    if job_ids is not None and len(job_ids) != len(runs):
        raise ValueError(f"{len(job_ids)} job ids for {len(runs)} runs")
    placed = list(enumerate(job_ids)) if job_ids is not None else None
    outbox: list[OutboxRow] = []
    for part in chunked(db, range(len(runs))):
        jobs = None if placed is None else [placed[n] for n in part]
        try:
            with db.transaction() as conn:
                written = insert_runs(conn, spec, [runs[n] for n in part], jobs=jobs)
        except IntegrityError:
            _refuse_taken_jobs(db, spec.batch_id, [job for _, job in jobs or []])
            raise
        outbox += written.rows()
    return outbox


def _refuse_taken_jobs(db: Database, batch_id: str | None, job_ids: list[str]) -> None:
    """JobExists if a run of `batch_id` holds any of `job_ids` (the unique index's refusal,
    named); else the caller's IntegrityError was about something else."""
    if batch_id is None or not job_ids:
        return
    with db.read() as s:
        taken = s.exec(
            select(RunRow.job_id).where(
                RunRow.batch_id == batch_id, col(RunRow.job_id).in_(job_ids)
            )
        ).all()
    if taken:
        raise JobExists(batch_id, sorted({str(j) for j in taken}, key=job_ids.index)) from None


def insert_runs(
    conn: Connection,
    spec: RunSpec,
    runs: list[tuple[str, str]],
    *,
    jobs: list[tuple[int, str]] | None = None,
) -> FirstTurns:
    """Insert queued runs, their prompts and first turns' messages on `conn`, started as
    `spec` says; `jobs` is (index, job id) per run, for a batch's."""
    if not runs:
        return NO_FIRST_TURNS
    now = utcnow()
    placed: list[tuple[int | None, str | None]] = list(jobs) if jobs else [(None, None)] * len(runs)
    # One row built and validated; the others are its values with their own ids (building
    # a RunRow each is most of the cost of starting 5,000).
    common = RunRow(
        id="",
        agent=spec.agent,
        conversation_id="",
        status="queued",
        tools_digest=spec.tools_digest,
        started_by=spec.started_by,
        batch_id=spec.batch_id,
        budget=spec.budget,
        created_at=now,
        updated_at=now,
    ).model_dump()
    rows = [
        {**common, "id": run_id, "conversation_id": run_id, "job_id": job, "job_index": index}
        for (run_id, _), (index, job) in zip(runs, placed, strict=True)
    ]
    conn.execute(sql.RUNS.insert(), rows)
    conn.execute(
        sql.MESSAGES.insert(),
        [
            message_values(run_id, run_id, 0, tx.user_message(prompt, run_id))
            for run_id, prompt in runs
        ],
    )
    labels = [turn_label(run_id, spec.agent, 1) for run_id, _ in runs]
    queue = spec.queue or TURN_QUEUE
    return enqueue_first_turns(conn, [r for r, _ in runs], labels, queue=queue)


def _check_can_continue(s: Session, conv: str) -> None:
    """ConversationBusy if a run of `conv` is not finished. Its runs stay locked until
    the new one is written: a purge, which locks the runs it removes, either removed
    them already (and `_check_history` sees it) or waits for the new run, which keeps
    them (`store.retention`)."""
    runs = select(RunRow.id, RunRow.status).where(RunRow.conversation_id == conv)
    for run_id, status in s.exec(runs.with_for_update()):
        if status not in FINISHED:
            raise ConversationBusy(conv, run_id, status)


def _check_history(s: Session, conv: str, history: list[dict[str, Any]]) -> None:
    """ConversationPurged if messages of `conv` were purged: each message's position is
    its place in the conversation, so a history with holes cannot go on. A conversation
    purged whole has nothing left, and starts again."""
    if history:
        last = s.exec(select(func.max(MessageRow.seq)).where(MessageRow.conversation_id == conv))
        written = int(last.one() or 0) + 1
        if written != len(history):
            raise ConversationPurged(conv, len(history), written)
    if any(slot.state != "done" for slot in tx.slots(history)):
        raise ResumeError(f"conversation {conv!r} ends in an unfinished turn; it cannot go on")


def cancel_locked(s: Session, run: RunRow, now: datetime) -> None:
    """Cancel a run the caller has locked, and close its open requests."""
    run_id, agent = run.id, run.agent
    move(s, run, "cancelled", now=now, cancel_requested=True)
    cancel_requests(s, [run_id])
    emit(s, "run.finished", run_id=run_id, now=now, agent=agent, status="cancelled")


def cancel_many_locked(s: Session, runs: Sequence[RunRow], now: datetime) -> None:
    """`cancel_locked` for many runs the caller has locked (a batch's cancel): each step
    once for them all (an executemany, or a chunk of ids a statement), not once a run."""
    for status in sorted({run.status for run in runs}):
        group = [run for run in runs if run.status == status]
        stmt = transition(status, "cancelled", sets=("cancel_requested",))
        done = s.execute(
            stmt,
            [{"rid": r.id, "v": r.version, "now": now, "cancel_requested": True} for r in group],
        )
        if s.get_bind().dialect.supports_sane_multi_rowcount and done.rowcount != len(group):  # type: ignore[attr-defined]
            raise StaleClaim(group[0].id, group[0].version)
    ids = [run.id for run in runs]
    if ids:
        s.execute(SPENT_MESSAGES, [{"rid": run_id} for run_id in ids])
    cancel_requests(s, ids)
    emit_many(
        s,
        "run.finished",
        [{"run_id": r.id, "agent": r.agent, "status": "cancelled"} for r in runs],
        now=now,
    )
    for run in runs:
        s.expire(run)


def fail_locked(s: Session, run: RunRow, now: datetime, error: str) -> None:
    """Fail a run the caller has locked, saying why, and close its open requests."""
    run_id, agent = run.id, run.agent
    move(s, run, "failed", now=now, error=error)
    cancel_requests(s, [run_id])
    emit(s, "run.failed", run_id=run_id, now=now, agent=agent, status="failed", error=error)


class CancelAsked(str):
    """The run's status once asked to stop (`cancel_run`): `cancelled`, `running` (until
    its next boundary), or the end it had reached before; and what the ask did."""

    agent: str
    settled: bool
    """This ask ended the run (it was queued or waiting): the run settled here."""

    def __new__(cls, status: str, *, agent: str, settled: bool) -> CancelAsked:
        asked = super().__new__(cls, status)
        asked.agent = agent
        asked.settled = settled
        return asked

    @property
    def status(self) -> str:
        return str(self)


def cancel_run(db: Database, run_id: str) -> CancelAsked:
    """Ask a run to stop. Queued and pending runs stop now; a running one at its next boundary."""
    now = utcnow()
    with db.write() as s:
        run = s.get(RunRow, run_id, with_for_update=True)
        if run is None:
            raise UnknownRun(run_id)
        if run.status in FINISHED:
            return CancelAsked(run.status, agent=run.agent, settled=False)
        run.cancel_requested = True
        run.updated_at = now
        settled = run.status in ("queued", "pending")
        if settled:
            cancel_locked(s, run, now)
        return CancelAsked(run.status, agent=run.agent, settled=settled)
