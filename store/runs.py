"""Runs and their turns: create, claim, journal, finish.

A turn message carries `(run_id, version)`. Claiming is a compare-and-swap:
the run must be `queued` at that version (or `running` under a claim by the
very same task message, which a broker redelivers only when the worker that
held it died). Every later write of the turn checks the claim still holds,
so a turn that lost its run writes nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, col, select

from relayq import ConversationBusy, Request, ResumeError, RunResult, ToolResult
from relayq import _transcript as tx
from relayq.limits import check_run_input
from relayq.loop import Turn
from relayq.relay import RELAY_KIND, is_relay_request, relay_calls_of
from store.db import Database
from store.errors import StaleClaim, UnknownRun
from store.models import FINISHED, LedgerRow, MessageRow, OutboxRow, RequestRow, RunRow, utcnow
from store.outbox import TURN_QUEUE, enqueue_turn
from store.transitions import ONE_MORE_ATTEMPT, move, transition
from store.workers import WORKER_TIMEOUT, holder_alive

__all__ = [
    "Claim",
    "cancel_requested",
    "claim_turn",
    "create_run",
    "create_runs",
    "fail_run",
    "finish_cancelled",
    "finish_turn",
    "get_run",
    "ledger_get",
    "ledger_put",
    "ledger_start",
    "request_of",
    "retry_turn",
    "run_result",
    "save_reply",
    "settled",
    "transcript",
]


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A turn's hold on its run, valid while the run stays at `version`."""

    run_id: str
    version: int
    agent: str
    conversation_id: str
    tools_digest: str | None
    attempts: int
    """Failed tries of this turn so far: model errors, and workers that died holding it."""
    turns: int
    taken_over: bool = False
    """This delivery took the run over from one whose worker died."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation's transcript as the claim found it."""


def storable_text(text: str) -> str:
    """Text a model or a tool made, fit for a text column: PostgreSQL refuses NUL there
    (JSON columns keep it), and no database takes a lone surrogate."""
    return tx.valid_text(text).replace("\x00", "\ufffd")


def _label(run: RunRow) -> str:
    return f"run={run.id} agent={run.agent} turn={run.turns + 1}"


def create_run(
    db: Database,
    *,
    run_id: str,
    agent: str,
    prompt: str,
    conversation_id: str | None,
    tools_digest: str | None = None,
    queue: str | None = None,
) -> OutboxRow:
    """A queued run with its prompt; continues `conversation_id` if it names one.

    Its first turn goes to `queue` (its agent's), by default `relayq.turns`.
    """
    check_run_input(agent=agent, prompts=[prompt], conversation_id=conversation_id)
    now = utcnow()
    conv = conversation_id or run_id
    if conversation_id is None:
        return create_runs(
            db, agent=agent, runs=[(run_id, prompt)], tools_digest=tools_digest, queue=queue
        )[0]
    with db.write() as s:
        history = _conversation(s, conv)
        _check_can_continue(s, conv, history)
        run = RunRow(
            id=run_id,
            agent=agent,
            conversation_id=conv,
            status="queued",
            start_seq=len(history),
            tools_digest=tools_digest,
            created_at=now,
            updated_at=now,
        )
        s.add(run)
        s.add(_message_row(run, len(history), tx.user_message(prompt, run_id)))
        s.flush()
        return enqueue_turn(s, run_id, run.version, label=_label(run), queue=queue or TURN_QUEUE)


def create_runs(
    db: Database,
    *,
    agent: str,
    runs: list[tuple[str, str]],
    tools_digest: str | None = None,
    queue: str | None = None,
) -> list[OutboxRow]:
    """Many queued runs, each a new conversation, in one transaction: `runs` is (id, prompt)."""
    check_run_input(agent=agent, prompts=[prompt for _, prompt in runs])
    now = utcnow()
    rows = [
        RunRow(
            id=run_id,
            agent=agent,
            conversation_id=run_id,
            status="queued",
            tools_digest=tools_digest,
            created_at=now,
            updated_at=now,
        )
        for run_id, _ in runs
    ]
    with db.transaction() as conn:
        conn.execute(_RUNS.insert(), [r.model_dump() for r in rows])
        conn.execute(
            _MESSAGE_TABLE.insert(),
            [
                _message_values(run_id, run_id, 0, tx.user_message(prompt, run_id))
                for run_id, prompt in runs
            ],
        )
        first = queue or TURN_QUEUE
        return [enqueue_turn(conn, r.id, r.version, label=_label(r), queue=first) for r in rows]


def _check_can_continue(s: Session, conv: str, history: list[dict[str, Any]]) -> None:
    busy = s.exec(
        select(RunRow).where(RunRow.conversation_id == conv, col(RunRow.status).not_in(FINISHED))
    ).first()
    if busy is not None:
        raise ConversationBusy(conv, busy.id, busy.status)
    if any(slot.state != "done" for slot in tx.slots(history)):
        raise ResumeError(f"conversation {conv!r} ends in an unfinished turn; it cannot go on")


def claim_turn(
    db: Database,
    run_id: str,
    version: int,
    *,
    task_id: str | None,
    lease: timedelta,
    worker: str | None = None,
    worker_timeout: timedelta = WORKER_TIMEOUT,
) -> Claim | None:
    """Take the run for one turn, or None if this message is stale or a duplicate.

    A claim made by `worker` lasts while that worker's heartbeat does; one
    made with no worker lasts `lease`.
    """
    now = utcnow()
    until = None if worker is not None else now + lease
    with db.transaction() as conn:
        # The common case in one statement: a queued run at this version.
        took = conn.execute(
            _CLAIM,
            {
                "rid": run_id,
                "v": version,
                "claimed_by": task_id,
                "worker": worker,
                "lease_until": until,
                "now": now,
            },
        ).first()
        if took is not None:
            return _claim_of(run_id, took, _conversation(conn, took.conversation_id))
    with db.write() as s:
        run = s.get(RunRow, run_id, with_for_update=True)
        if run is None:
            return None
        fresh = run.status == "queued" and run.version == version
        # The broker delivers the same message again when the process holding it
        # died (a prefork child lost), or when it lost its connection and put its
        # messages back: only the first may take the run over.
        taken_over = (
            run.status == "running"
            and task_id is not None
            and run.claimed_by == task_id
            and not holder_alive(s, run, now=now, timeout=worker_timeout)
        )
        if not (fresh or taken_over):
            return None
        if run.cancel_requested:
            _cancel(s, run, now)
            return None
        move(
            s,
            run,
            "running",
            now=now,
            claimed_by=task_id,
            worker=worker,
            lease_until=until,
            attempts=ONE_MORE_ATTEMPT if taken_over else run.attempts,
        )
        return _claim_of(run_id, run, _conversation(s, run.conversation_id), taken_over=taken_over)


def _claim_of(
    run_id: str, run: Any, messages: list[dict[str, Any]], *, taken_over: bool = False
) -> Claim:
    """A Claim from the run as claimed: a RunRow or a row of the claim's RETURNING."""
    return Claim(
        run_id=run_id,
        version=run.version,
        agent=run.agent,
        conversation_id=run.conversation_id,
        tools_digest=run.tools_digest,
        attempts=run.attempts,
        turns=run.turns,
        taken_over=taken_over,
        messages=messages,
    )


_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_MESSAGE_TABLE = MessageRow.__table__  # type: ignore[attr-defined]
_LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]

# The statements every turn runs, built once.
_CLAIM = transition(
    "queued",
    "running",
    sets=("claimed_by", "worker", "lease_until"),
    returning=("version", "agent", "conversation_id", "tools_digest", "attempts", "turns"),
).where(_RUNS.c.cancel_requested.is_(False))
_MESSAGES = (
    select(_MESSAGE_TABLE.c.body)
    .where(_MESSAGE_TABLE.c.conversation_id == bindparam("conv"))
    .order_by(_MESSAGE_TABLE.c.seq)
)
# The claim `v` on run `rid` still stands: the check of every write a turn makes.
_HELD_BY = (
    _RUNS.c.id == bindparam("rid"),
    _RUNS.c.version == bindparam("v"),
    _RUNS.c.status == "running",
)
_STILL_HELD = (
    _RUNS.update()
    .where(*_HELD_BY)
    .values(updated_at=bindparam("now"))
    .returning(_RUNS.c.cancel_requested)
)


@functools.cache
def _finish(to: str) -> Any:
    """The claim check and the run's new state after a turn, in one statement."""
    return transition("running", to, returning=("id",)).values(
        tools_digest=func.coalesce(_RUNS.c.tools_digest, bindparam("digest")),
        turns=bindparam("turns"),
        prompt_tokens=bindparam("prompt"),
        completion_tokens=bindparam("completion"),
        total_tokens=bindparam("total"),
        attempts=0,
        error=None,
        text=bindparam("text"),
    )


_CANCEL_FLAG = select(_RUNS.c.cancel_requested).where(_RUNS.c.id == bindparam("rid"))
_LEDGER_OUTCOME = select(_LEDGER.c.outcome).where(
    _LEDGER.c.run_id == bindparam("rid"),
    _LEDGER.c.at == bindparam("at"),
    _LEDGER.c.call_id == bindparam("cid"),
    _LEDGER.c.attempt == bindparam("attempt"),
)


def _insert(dialect: str) -> Any:
    return (sqlite_insert if dialect == "sqlite" else postgresql_insert)(_LEDGER)


_LEDGER_KEY = ["run_id", "at", "call_id", "attempt"]


@functools.cache
def _ledger_insert(dialect: str) -> Any:
    return _insert(dialect).on_conflict_do_nothing()


@functools.cache
def _ledger_start(dialect: str) -> Any:
    stmt = _insert(dialect)
    return stmt.on_conflict_do_update(
        index_elements=_LEDGER_KEY, set_={"executions": _LEDGER.c.executions + 1}
    ).returning(_LEDGER.c.executions)


@functools.cache
def _ledger_finish(dialect: str) -> Any:
    stmt = _insert(dialect)
    # The first outcome recorded stands: a late duplicate of the call changes nothing.
    return stmt.on_conflict_do_update(
        index_elements=_LEDGER_KEY,
        set_={"outcome": stmt.excluded.outcome},
        where=_LEDGER.c.outcome.is_(None),
    )


def _hold(s: Session, claim: Claim) -> RunRow:
    run = s.get(RunRow, claim.run_id, with_for_update=True)
    if run is None or run.version != claim.version or run.status != "running":
        raise StaleClaim(claim.run_id, claim.version)
    return run


def transcript(db: Database, conversation_id: str) -> list[dict[str, Any]]:
    with db.read() as s:
        return _conversation(s, conversation_id)


def _conversation(
    s: Session | Connection, conversation_id: str, upto: int | None = None
) -> list[dict[str, Any]]:
    query = _MESSAGES if upto is None else _MESSAGES.where(_MESSAGE_TABLE.c.seq <= upto)
    return [dict(body) for body in s.execute(query, {"conv": conversation_id}).scalars()]


def _message_row(run: RunRow, seq: int, body: dict[str, Any]) -> MessageRow:
    return MessageRow(**_message_values(run.conversation_id, run.id, seq, body))


def _write_messages(
    s: Session | Connection,
    run: RunRow | Claim,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
) -> None:
    """Write what changed: appended messages, and placeholders replaced in place."""
    run_id = run.id if isinstance(run, RunRow) else run.run_id
    rows = [
        _message_values(run.conversation_id, run_id, seq, body)
        for seq, body in enumerate(after)
        if seq >= len(before) or before[seq] != body
    ]
    if rows:
        # One statement, many parameter sets: compiled once, cached after.
        dialect = s.dialect if isinstance(s, Connection) else s.get_bind().dialect
        s.execute(_upsert_message(dialect.name), rows)


@functools.cache
def _upsert_message(dialect: str) -> Any:
    insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
    stmt = insert(MessageRow.__table__)  # type: ignore[attr-defined]
    return stmt.on_conflict_do_update(
        index_elements=["conversation_id", "seq"],
        set_={"body": stmt.excluded.body, "role": stmt.excluded.role},
    )


def _message_values(
    conversation_id: str, run_id: str, seq: int, body: dict[str, Any]
) -> dict[str, Any]:
    usage = (body.get(tx.NOTE) or {}).get("usage") or {}
    return {
        "conversation_id": conversation_id,
        "seq": seq,
        "run_id": run_id,
        "role": str(body.get("role")),
        "body": body,
        "prompt_tokens": int(usage.get("promptTokens", 0)),
        "completion_tokens": int(usage.get("completionTokens", 0)),
        "created_at": utcnow(),
    }


def save_reply(db: Database, claim: Claim, messages: list[dict[str, Any]]) -> bool:
    """Keep the model's reply (the last message) before any of its tools run, and count
    each of its calls as started once (`ctx.attempt` 1), in the same transaction.

    Returns whether the run has been asked to cancel meanwhile.
    """
    at = len(messages) - 1
    now = utcnow()
    with db.transaction() as conn:
        cancel = conn.execute(
            _STILL_HELD, {"rid": claim.run_id, "v": claim.version, "now": now}
        ).scalar_one_or_none()
        if cancel is None:
            raise StaleClaim(claim.run_id, claim.version)
        _write_messages(conn, claim, messages[:-1], messages)
        starts = [
            _ledger_values(claim.run_id, at, call.id, "", None, executions=1, now=now)
            for call in tx.calls_of(messages[at])
        ]
        if starts:
            conn.execute(_ledger_insert(conn.dialect.name), starts)
        return bool(cancel)


def _ledger_values(
    run_id: str,
    at: int,
    call_id: str,
    attempt: str,
    outcome: ToolResult | Request | None,
    *,
    executions: int,
    now: datetime,
) -> dict[str, Any]:
    kind = "request" if isinstance(outcome, Request) else "result"
    return {
        "run_id": run_id,
        "at": at,
        "call_id": storable_text(call_id),
        "attempt": attempt,
        "outcome": (
            None if outcome is None else {"type": kind, "value": outcome.model_dump(mode="json")}
        ),
        "executions": executions,
        "created_at": now,
    }


def ledger_get(
    db: Database, run_id: str, at: int, call_id: str, attempt: str
) -> ToolResult | Request | None:
    with db.engine.connect() as conn:
        outcome = conn.execute(
            _LEDGER_OUTCOME,
            {"rid": run_id, "at": at, "cid": storable_text(call_id), "attempt": attempt},
        ).scalar_one_or_none()
    if outcome is None:
        return None  # never started, or started and not finished
    if outcome.get("type") == "request":
        return Request.model_validate(outcome["value"])
    return ToolResult.model_validate(outcome["value"])


def ledger_start(db: Database, run_id: str, at: int, call_id: str, attempt: str) -> int:
    """Count one more execution of a call that has no outcome; returns its number."""
    values = _ledger_values(run_id, at, call_id, attempt, None, executions=1, now=utcnow())
    with db.transaction() as conn:
        return int(conn.execute(_ledger_start(conn.dialect.name), values).scalar_one())


def ledger_put(
    db: Database, run_id: str, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
) -> bool:
    """Record a finished tool call; returns whether the run has been asked to cancel."""
    values = _ledger_values(run_id, at, call_id, attempt, outcome, executions=1, now=utcnow())
    with db.transaction() as conn:
        conn.execute(_ledger_finish(conn.dialect.name), values)
        cancel = conn.execute(_CANCEL_FLAG, {"rid": run_id}).scalar_one_or_none()
        return cancel is None or bool(cancel)


def cancel_requested(db: Database, run_id: str) -> bool:
    with db.read() as s:
        run = s.get(RunRow, run_id)
        return run is None or run.cancel_requested


def finish_turn(
    db: Database,
    claim: Claim,
    before: list[dict[str, Any]],
    turn: Turn,
    *,
    tools_digest: str,
    request_ttl: timedelta | None = None,
    on_expiry: str = "error",
    queue: str | None = None,
) -> list[OutboxRow]:
    """Persist what a turn did and what comes next, in one transaction.

    `before` is the transcript as stored (with the model's reply if it was saved);
    the next turn goes to `queue` (by default where this one came from).
    """
    now = utcnow()
    usage = tx.usage_of(turn.messages)
    turns = tx.turns_taken(turn.messages)
    status = "queued" if turn.status == "next" else turn.status
    # Only opening a request needs the ORM; every other ending is plain statements.
    scope = db.write() if turn.status == "pending" else db.transaction()
    with scope as s:
        # The claim check and the run's new state in one statement.
        held = s.execute(
            _finish(status),
            {
                "rid": claim.run_id,
                "v": claim.version,
                "digest": tools_digest,
                "turns": turns,
                "prompt": usage.prompt_tokens,
                "completion": usage.completion_tokens,
                "total": usage.total_tokens,
                "now": now,
                "text": storable_text(turn.text) if turn.status == "done" else None,
            },
        ).first()
        if held is None:
            raise StaleClaim(claim.run_id, claim.version)
        _write_messages(s, claim, before, turn.messages)
        if turn.status == "next":
            label = f"run={claim.run_id} agent={claim.agent} turn={turns + 1}"
            return [enqueue_turn(s, claim.run_id, claim.version + 1, label=label, queue=queue)]
        if turn.status == "pending":
            assert turn.pending is not None
            assert isinstance(s, Session)
            run = s.get(RunRow, claim.run_id)
            assert run is not None
            _open_request(s, run, turn.pending, now, ttl=request_ttl, on_expiry=on_expiry)
        return []


def _open_request(
    s: Session,
    run: RunRow,
    request: Request,
    now: datetime,
    *,
    ttl: timedelta | None,
    on_expiry: str,
) -> None:
    if s.get(RequestRow, request.id) is not None:
        return
    expires_at = request.expires_at or (now + ttl if ttl is not None else None)
    relay = is_relay_request(request)
    s.add(
        RequestRow(
            id=request.id,
            run_id=run.id,
            agent=run.agent,
            kind=storable_text(request.kind),
            prompt=storable_text(request.prompt),
            url=None if request.url is None else storable_text(request.url),
            data={k: v for k, v in request.data.items() if not (relay and k == "calls")},
            calls=[c.model_dump(mode="json") for c in relay_calls_of(request)],
            status="open",
            expires_at=expires_at,
            on_expiry=on_expiry,
            created_at=now,
        )
    )


def request_of(row: RequestRow) -> Request:
    """The Request a stored row stands for, in the wire shape hosts see."""
    data = dict(row.data or {})
    if row.kind == RELAY_KIND:
        data["calls"] = row.calls or []
    return Request(
        id=row.id,
        kind=row.kind,
        prompt=row.prompt,
        url=row.url,
        data=data,
        expires_at=row.expires_at,
    )


def retry_turn(
    db: Database, claim: Claim, *, error: str, countdown: float, queue: str | None = None
) -> OutboxRow:
    """Give the run back to `queue` (by default its last) after a retryable failure."""
    with db.write() as s:
        run = _hold(s, claim)
        move(s, run, "queued", now=utcnow(), attempts=ONE_MORE_ATTEMPT, error=error)
        return enqueue_turn(
            s, run.id, run.version, label=_label(run), countdown=countdown, queue=queue
        )


def fail_run(db: Database, claim: Claim, error: str) -> None:
    with db.write() as s:
        run = _hold(s, claim)
        move(s, run, "failed", now=utcnow(), error=error)
        _cancel_requests(s, run.id)


def finish_cancelled(db: Database, claim: Claim) -> None:
    with db.write() as s:
        _cancel(s, _hold(s, claim), utcnow())


def _cancel(s: Session, run: RunRow, now: datetime) -> None:
    run_id = run.id
    move(s, run, "cancelled", now=now, cancel_requested=True)
    _cancel_requests(s, run_id)


def _cancel_requests(s: Session, run_id: str) -> None:
    # Compare-and-swap: only requests still open; an answered one stays answered.
    table = RequestRow.__table__  # type: ignore[attr-defined]
    s.execute(
        table.update()
        .where(table.c.run_id == run_id, table.c.status == "open")
        .values(status="cancelled")
    )


def settled(db: Database, run_id: str) -> tuple[str, bool]:
    """The run's status, and whether a host has something to do or wait for no more.

    A run is settled when it has finished, or when it is pending on an open
    request. Pending with none open means an answer is on its way in.
    """
    with db.read() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise UnknownRun(run_id)
        if run.status in FINISHED:
            return run.status, True
        if run.status != "pending":
            return run.status, False
        waiting = s.exec(
            select(RequestRow.id).where(RequestRow.run_id == run_id, RequestRow.status == "open")
        ).first()
        return run.status, waiting is not None


def list_runs(
    db: Database, *, status: str | None = None, agent: str | None = None, limit: int = 100
) -> list[RunRow]:
    """Runs, newest first, optionally of one status and one agent."""
    query = select(RunRow).order_by(col(RunRow.created_at).desc(), col(RunRow.id).desc())
    if status is not None:
        query = query.where(RunRow.status == status)
    if agent is not None:
        query = query.where(RunRow.agent == agent)
    with db.read() as s:
        return list(s.exec(query.limit(limit)))


def get_run(db: Database, run_id: str) -> RunRow:
    with db.read() as s:
        run = s.get(RunRow, run_id)
    if run is None:
        raise UnknownRun(run_id)
    return run


def run_result(db: Database, run_id: str) -> RunResult:
    """A stored run as the same RunResult the in-process client returns."""
    with db.read() as s:
        run = s.get(RunRow, run_id)
        if run is None:
            raise UnknownRun(run_id)
        last = s.exec(
            select(MessageRow.seq)
            .where(MessageRow.run_id == run_id)
            .order_by(col(MessageRow.seq).desc())
        ).first()
        messages = _conversation(s, run.conversation_id, upto=last)
        pending = s.exec(
            select(RequestRow).where(RequestRow.run_id == run_id, RequestRow.status == "open")
        ).first()
    return RunResult(
        status=run.status,
        text=run.text or "",
        tool_calls=tx.records_of(messages),
        messages=messages,
        pending=request_of(pending) if pending is not None and run.status == "pending" else None,
        turns=run.turns,
        usage=tx.usage_of(messages),
        run_id=run.id,
        error=run.error,
    )
