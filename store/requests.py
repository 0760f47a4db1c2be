"""Requests: opened when a turn halts, read by hosts, closed with their run.

Here: a run's requests written, and read by id. The shape they are read in is in
`store.stored_requests`, listing them in `store.request_listing`, a listing's words
in `store.request_terms`; all of those stay importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from relayq import Request, UnknownRequest
from relayq.approvals import BUDGET_KIND, Policy, is_approval, policy_of
from relayq.relay import is_relay_request, relay_calls_of
from store.db import Database
from store.events import emit_about
from store.messages import storable_text
from store.models import OutboxRow, RelayCallRow, RequestRow, RunRow, utcnow
from store.outbox import enqueue_turn, turn_label
from store.request_listing import (
    RequestPage,
    RequestQuery,
    all_requests,
    list_requests,
    query_requests,
)
from store.request_terms import (
    STATUSES,
    RequestSort,
    RequestStatus,
    SortOrder,
    age_of,
    read_statuses,
)
from store.stored_requests import (
    IDS_PER_QUERY,
    CallHold,
    StoredRequest,
    request_of,
    stored_requests,
)
from store.transitions import move

__all__ = [
    "STATUSES",
    "CallHold",
    "run_of_request",
    "RequestPage",
    "RequestQuery",
    "RequestSort",
    "RequestStatus",
    "SortOrder",
    "StoredRequest",
    "age_of",
    "all_requests",
    "cancel_requests",
    "get_request",
    "get_requests",
    "list_requests",
    "open_request",
    "query_requests",
    "read_statuses",
    "release_waiters",
    "request_of",
    "waiters_of",
]


def open_request(
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
    calls = relay_calls_of(request)
    row = RequestRow(
        id=request.id,
        run_id=run.id,
        agent=run.agent,
        kind=storable_text(request.kind),
        prompt=storable_text(request.prompt),
        url=None if request.url is None else storable_text(request.url),
        data={k: v for k, v in request.data.items() if not (relay and k == "calls")},
        calls=[c.model_dump(mode="json") for c in calls],
        status="open",
        expires_at=expires_at,
        on_expiry=on_expiry,
        created_at=now,
        tool=calls[0].name if calls else None,
    )
    if is_approval(request):
        _apply_policy(row, policy_of(request))
    s.add(row)
    # Each relay call, as hosts lease it (`store.leases`).
    for call in calls if relay else []:
        s.add(
            RelayCallRow(
                request_id=row.id, call_id=call.id, run_id=run.id, name=call.name, created_at=now
            )
        )
    s.flush()
    expires = None if expires_at is None else expires_at.isoformat()
    emit_about(s, "request.opened", row, now=now, expiresAt=expires)


def _apply_policy(row: RequestRow, policy: Policy) -> None:
    """An approval's policy, in the columns the store enforces it from."""
    row.tool = str(row.data.get("tool") or "") or None
    row.approvers = list(policy.approvers)
    row.quorum = policy.quorum
    row.declines = policy.declines
    row.forbid_self = policy.forbid_self_approval
    row.escalation = [step.to_wire() for step in policy.escalation]
    # Declining at the deadline is the `error` expiry every request has.
    row.on_expiry = {"decline": "error"}.get(policy.on_expiry, policy.on_expiry)
    if row.expires_at is not None and policy.remind_before is not None:
        row.remind_at = row.expires_at - policy.remind_before


def cancel_requests(s: Session, run_ids: Sequence[str]) -> None:
    """Close these runs' open requests, a chunk of runs a statement. Runs waiting on one
    of them (a batch's `budget` request) go back to their queue to look again; the
    sweeper sends their turns."""
    table = RequestRow.__table__  # type: ignore[attr-defined]
    closing: list[str] = []
    for at in range(0, len(run_ids), IDS_PER_QUERY):
        chunk = list(run_ids[at : at + IDS_PER_QUERY])
        closing += s.exec(
            select(RequestRow.id).where(
                col(RequestRow.run_id).in_(chunk),
                RequestRow.status == "open",
                RequestRow.kind == BUDGET_KIND,
            )
        ).all()
        # Compare-and-swap: only requests still open; an answered one stays answered.
        s.execute(
            table.update()
            .where(table.c.run_id.in_(chunk), table.c.status == "open")
            .values(status="cancelled", outcome="cancelled")
        )
    if closing:
        release_waiters(s, closing, utcnow())


def waiters_of(s: Session, request_ids: Sequence[str]) -> list[RunRow]:
    """The runs waiting on these requests of other runs (a batch's `budget` request), locked."""
    return list(
        s.exec(
            select(RunRow)
            .where(col(RunRow.waiting_on).in_(request_ids), RunRow.status == "pending")
            .order_by(col(RunRow.id))
            .with_for_update()
        )
    )


def release_waiters(s: Session, request_ids: Sequence[str], now: datetime) -> list[OutboxRow]:
    """Queue the next turn of each run waiting on these requests; returns the messages."""
    outbox = []
    for run in waiters_of(s, request_ids):
        move(s, run, "queued", now=now, waiting_on=None)
        label = turn_label(run.id, run.agent, run.turns + 1)
        outbox.append(enqueue_turn(s, run.id, run.version, label=label))
    return outbox


def get_requests(db: Database, request_ids: Sequence[str]) -> dict[str, StoredRequest]:
    """The stored requests of these ids, by id; unknown ids are left out."""
    found: dict[str, StoredRequest] = {}
    wanted = list(dict.fromkeys(request_ids))
    with db.read() as s:
        for at in range(0, len(wanted), IDS_PER_QUERY):
            chunk = wanted[at : at + IDS_PER_QUERY]
            rows = list(s.exec(select(RequestRow).where(col(RequestRow.id).in_(chunk))))
            found.update((r.request.id, r) for r in stored_requests(s, rows))
    return found


def run_of_request(db: Database, request_id: str) -> str | None:
    """The run a request belongs to; None for no such request."""
    with db.read() as s:
        return s.exec(select(RequestRow.run_id).where(RequestRow.id == request_id)).first()


def get_request(db: Database, request_id: str) -> StoredRequest:
    with db.read() as s:
        row = s.get(RequestRow, request_id)
        if row is None:
            raise UnknownRequest(request_id)
        [stored] = stored_requests(s, [row])
    return stored
