"""A request's page and a run's page.

A request's page is where a decision is made: the arguments as a table (from
the tool's schema) with the raw JSON a click away, the run's original prompt,
who started it, the transcript so far (folded, the last messages only: a run
of 800 turns is never read whole), the votes and decisions so far, and the
forms. Who may not decide it (outside its approver groups, or the role cannot
answer) sees it read-only; their posts are refused with 403 anyway.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api._auth import Permission, Principal
from api._inbox import page_session, render
from api._inbox_views import SCOPE_NAMES, fields_of, item_of, message_of, when
from api._state import client_of
from relayq import ResumeError
from relayq.approvals import is_approval
from relayq.authority import refusal
from store import (
    StoredRequest,
    UnknownRun,
    decisions_of,
    get_request,
    list_requests,
    proposed_arguments,
    run_view,
    votes_of,
)
from store.models import DecisionRow

__all__ = ["BATCHES", "TAIL", "WINDOW", "request_context", "router"]

BATCHES = 50
"""Batches the inbox's batches page shows (the newest)."""
TAIL = 12
"""Messages of the transcript a request's page shows (the last ones)."""
WINDOW = 100
"""Messages of the transcript a run's page shows at a time."""

router = APIRouter(include_in_schema=False)


def may_decide(who: Principal, stored: StoredRequest, started_by: str | None) -> tuple[bool, str]:
    """Whether `who` may decide `stored` now, and if not, why (for the read-only notice):
    the store's own rules (`relayq.authority`), asked before the forms are shown."""
    if stored.status != "open":
        return False, ""
    if not who.may(Permission.ANSWER):
        return False, f"Your role ({who.role}) may read requests but not decide them."
    refused = refusal(who.role, stored.request.kind, starter=started_by == who.name)
    if refused is not None:
        return False, f"Your {refused[0].lower()}{refused[1:]}; you see it read-only."
    if stored.approvers and not set(who.groups) & set(stored.approvers):
        groups = ", ".join(stored.approvers)
        return False, f"Only members of {groups} may decide this request; you see it read-only."
    return True, ""


async def request_context(request: Request, who: Principal, request_id: str) -> dict[str, Any]:
    """Everything a request's page shows; ResumeError (UnknownRequest) for no such request."""
    client = client_of(request)
    db = client.db

    def read() -> dict[str, Any]:
        stored = get_request(db, request_id)
        view = run_view(db, stored.run_id, limit=TAIL)
        approval = is_approval(stored.request)
        arguments = proposed_arguments(db, request_id) if approval else {}
        return {
            "stored": stored,
            "view": view,
            "approval": approval,
            "arguments": arguments,
            "votes": votes_of(db, request_id) if approval else [],
            "decisions": decisions_of(db, request_id),
        }

    found = await client.store.offload(read)
    stored: StoredRequest = found["stored"]
    view = found["view"]
    allowed, why = may_decide(who, stored, view.run.started_by)
    voted = next((v for v in found["votes"] if v.voter == who.name), None)
    schema = stored.request.data.get("schema") if found["approval"] else None
    approving = [v for v in found["votes"] if v.decision != "decline"]
    item = item_of(stored)
    held = {call["id"]: call.get("held", "") for call in item["calls"]}
    return {
        "r": item,
        "scope_names": SCOPE_NAMES,
        "fields": fields_of(found["arguments"], schema) if found["approval"] else [],
        "call_fields": [
            {"call": call, "fields": fields_of(call_input), "held": held.get(call["id"], "")}
            for call, call_input in _call_inputs(stored)
        ],
        "run": _run_of(view),
        "prompt": view.prompt,
        "messages": [message_of(seq, m) for seq, m in view.messages],
        "earlier": view.start,
        "votes": [
            {"voter": v.voter, "decision": v.decision, "reason": v.reason, "at": when(v.at)}
            for v in found["votes"]
        ],
        "approvals": len(approving),
        "decisions": [_decision_of(d) for d in found["decisions"]],
        "may_decide": allowed and voted is None,
        "read_only_why": why
        if not allowed
        else (f"You voted ({voted.decision}) at {when(voted.at)}." if voted is not None else ""),
    }


def _call_inputs(stored: StoredRequest) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    if is_approval(stored.request):
        return []
    calls = stored.request.data.get("calls") or []
    return [({"id": c.get("id"), "name": c.get("name")}, c.get("input") or {}) for c in calls]


def _run_of(view: Any) -> dict[str, Any]:
    run = view.run
    return {
        "id": run.id,
        "agent": run.agent,
        "status": run.status,
        "started_by": run.started_by or "",
        "created_at": when(run.created_at),
        "updated_at": when(run.updated_at),
        "turns": run.turns,
        "tokens": run.total_tokens,
        "text": run.text or "",
        "error": run.error or "",
        "conversation_id": run.conversation_id,
        "batch_id": run.batch_id or "",
        "job_id": run.job_id or "",
    }


def _decision_of(row: DecisionRow) -> dict[str, Any]:
    return {
        "actor": row.actor,
        "role": row.role or "",
        "groups": ", ".join(row.groups or []),
        "via": row.via,
        "os_user": row.os_user or "",
        "outcome": row.outcome,
        "reason": row.reason or "",
        "diff": row.diff,
        "through": row.through,
        "at": when(row.at),
    }


@router.get("/requests/{request_id}", response_class=HTMLResponse)
async def request_page(request_id: str, request: Request) -> Response:
    who = page_session(request)
    if not isinstance(who, Principal):
        return who
    try:
        context = await request_context(request, who, request_id)
    except (ResumeError, UnknownRun) as exc:
        return render(request, who, "missing.html", {}, status=404, error=str(exc))
    return render(request, who, "request.html", context)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(run_id: str, request: Request) -> Response:
    """A run: its status, a window of its transcript, its requests and their decisions."""
    who = page_session(request)
    if not isinstance(who, Principal):
        return who
    start = request.query_params.get("start", "")
    client = client_of(request)
    db = client.db

    def read() -> tuple[Any, list[StoredRequest], list[DecisionRow]]:
        first = int(start) if start.isascii() and start.isdigit() else None
        view = run_view(db, run_id, start=first, limit=WINDOW)
        stored = list_requests(db, status=None, run_id=run_id, limit=1000)
        return view, stored, decisions_of(db, [s.request.id for s in stored])

    try:
        view, stored, decisions = await client.store.offload(read)
    except UnknownRun as exc:
        return render(request, who, "missing.html", {}, status=404, error=str(exc))
    before = max(view.start - WINDOW, 0) if view.start > 0 else None
    after = view.start + WINDOW if view.start + WINDOW < view.total else None
    context = {
        "run": _run_of(view),
        "prompt": view.prompt,
        "messages": [message_of(seq, m) for seq, m in view.messages],
        "total": view.total,
        "start": view.start,
        "earlier_url": None if before is None else f"/runs/{run_id}?start={before}",
        "later_url": None if after is None else f"/runs/{run_id}?start={after}",
        "requests": [item_of(s) for s in reversed(stored)],
        "decisions": [{"request_id": d.request_id, **_decision_of(d)} for d in decisions],
    }
    return render(request, who, "run.html", context)


@router.get("/batches", response_class=HTMLResponse)
async def batches_page(request: Request) -> Response:
    """The batches, newest first, each with its progress."""
    who = page_session(request)
    if not isinstance(who, Principal):
        return who
    client = client_of(request)
    found = await client.store.list_batches(limit=BATCHES)
    now = datetime.now(UTC)
    return render(request, who, "batches.html", {"batches": [b.to_wire(now) for b in found]})
