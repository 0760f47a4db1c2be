"""The inbox's forms: approve, edit, decline one request; preview and decide many.

Every post carries its page's CSRF token (`api._inbox`) and answers through the
same client calls as the API, recorded `via: inbox` with the user's name, role
and groups. A refused post changes nothing and shows why on the page it came
from, with the status the API would give (403, 404, 409, 422). A post that
worked redirects (303) to where the form said, with a confirmation.

Bulk decisions go in two steps: a preview lists what would be decided, each
request at the revision it was seen in; confirming decides them all or none:
if any was decided or voted on since the preview, nothing is applied and the
page names which. "All matching" is at most the oldest MAX_BULK of them
(`store.answers.bulk_choice`, as `relayq bulk` takes them); an approval leaves
out the requests that are not approvals, and says so.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from api._answers import answer_request, approval, stored_request
from api._approvals import decider_of
from api._auth import Principal
from api._inbox import Answering, redirect_after, render
from api._inbox_lists import Filters
from api._inbox_pages import request_context
from api._inbox_views import fields_of, item_of
from api._state import client_of
from relayq import Answer, BulkRefused, ResumeError
from relayq.replies import Decided, Declined, answer_to
from store import BadQuery, StoredRequest
from store.answers import MAX_BULK, BulkChoice

__all__ = ["PREVIEW_SHOWN", "refused_page", "router"]

PREVIEW_SHOWN = 200
"""Requests a bulk preview lists one by one; it counts them all."""

router = APIRouter(include_in_schema=False)


async def refused_page(
    request: Request, who: Principal, request_id: str, exc: HTTPException
) -> Response:
    """The request's page again, saying why the post was refused (nothing changed)."""
    try:
        context = await request_context(request, who, request_id)
    except ResumeError:
        return render(
            request, who, "missing.html", {}, status=exc.status_code, error=str(exc.detail)
        )
    return render(
        request, who, "request.html", context, status=exc.status_code, error=str(exc.detail)
    )


async def _decide(
    request: Request, who: Principal, answer: Answer, done: str, to: str, *, decision: bool = False
) -> Response:
    client, decider = client_of(request), decider_of(who, "inbox")
    try:
        stored = await answer_request(client, answer, decider=decider, decision=decision)
    except HTTPException as exc:
        return await refused_page(request, who, answer.id, exc)
    if stored.status == "open" and stored.quorum > 1:  # a vote towards a quorum
        return redirect_after(request, "voted", f"{answer.id} (quorum {stored.quorum})", to)
    return redirect_after(request, done, answer.id, to)


@router.post("/requests/{request_id}/approve")
async def approve(
    request_id: str,
    request: Request,
    who: Answering,
    output: Annotated[str, Form()] = "approved",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """Approve: for an approval, the typed decision (the text is never its result); for a
    relay tool's request, `output` is the tool's result, for every call."""
    try:
        stored = await stored_request(client_of(request), request_id)
    except HTTPException as exc:
        return await refused_page(request, who, request_id, exc)
    return await _decide(request, who, approval(stored, output), "approved", next)


@router.post("/requests/{request_id}/edit")
async def edit_arguments(
    request_id: str, request: Request, who: Answering, next: Annotated[str, Form()] = "/"
) -> Response:
    """Approve with the arguments the form's `arg:<name>` fields hold, read by the tool's
    schema's types; the store checks them against the schema before anything is kept."""
    try:
        stored = await stored_request(client_of(request), request_id)
        arguments = _arguments(stored, await request.form())
    except HTTPException as exc:
        return await refused_page(request, who, request_id, exc)
    answer = answer_to(request_id, Decided("edit", arguments))
    return await _decide(request, who, answer, "edited", next, decision=True)


def _arguments(stored: StoredRequest, form: FormData) -> dict[str, Any]:
    schema = stored.request.data.get("schema")
    current = dict(stored.request.data.get("arguments") or {})
    arguments: dict[str, Any] = {}
    for field in fields_of(current, schema):
        given = form.get(f"arg:{field.name}")
        if not isinstance(given, str):
            continue
        if given == "" and not field.required and field.kind != "string":
            continue  # left empty: not given
        arguments[field.name] = _read(field.name, field.kind, given)
    return arguments


def _read(name: str, kind: str, text: str) -> Any:
    """A form field's text as the schema's type says; 422 when it cannot be one."""
    try:
        if kind == "string":
            return text
        if kind == "integer":
            return int(text.strip())
        if kind == "number":
            number = float(text.strip())
            return int(number) if number.is_integer() and "." not in text else number
        if kind == "boolean":
            return {"true": True, "false": False}[text.strip().lower()]
        return json.loads(text)
    except (ValueError, KeyError):
        shown = {"json": "JSON"}.get(kind, f"a {kind}")
        raise HTTPException(422, f"{name} must be {shown}; nothing was decided") from None


@router.post("/requests/{request_id}/decline")
async def decline_request(
    request_id: str,
    request: Request,
    who: Answering,
    reason: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """Decline, saying why: the tool does not run (each call of a relay tool's request gets
    an error result) and the model is told the reason."""
    if not reason.strip():
        refusal = HTTPException(422, "declining takes a reason; nothing was decided")
        return await refused_page(request, who, request_id, refusal)
    return await _decide(
        request, who, answer_to(request_id, Declined(reason.strip())), "declined", next
    )


# --- many at once: preview, then confirm ---------------------------------------------

_ACTIONS = {
    "approve-selected": ("approve", "selected"),
    "decline-selected": ("decline", "selected"),
    "approve-matching": ("approve", "matching"),
    "decline-matching": ("decline", "matching"),
}


@router.post("/bulk/preview")
async def bulk_preview(request: Request, who: Answering) -> Response:
    """What a bulk decision would decide: the selected requests, or every open one the
    filters match; nothing is decided until the preview is confirmed."""
    form = await request.form()
    action = _ACTIONS.get(str(form.get("action") or ""))
    try:
        filters = Filters.of(form)
    except BadQuery as exc:
        return _bulk_page(request, who, "approve", [], Filters(), status=422, error=str(exc))
    if action is None:
        return _bulk_page(request, who, "approve", [], filters, status=422, error="unknown action")
    decision, scope = action
    client = client_of(request)
    if scope == "selected":
        ids = [str(v) for v in form.getlist("ids")]
        if not ids:
            error = "Select the requests to decide first (or decide all that match the filter)."
            return _bulk_page(request, who, decision, [], filters, status=422, error=error)
        found = await client.store.get_requests(ids[:MAX_BULK])
        chosen = [found[i] for i in ids if i in found and found[i].status == "open"]
        return _bulk_page(request, who, decision, chosen, filters)
    query = filters.query(history=False)
    choice = await client.store.bulk_choice(query, _decision(decision))
    return _bulk_page(request, who, decision, choice.items, filters, choice=choice)


def _decision(decision: str) -> Literal["approve", "decline"]:
    return "approve" if decision == "approve" else "decline"


@router.post("/bulk")
async def bulk_decide(
    request: Request,
    who: Answering,
    decision: Annotated[str, Form()],
    items: Annotated[str, Form()],
    reason: Annotated[str, Form()] = "",
) -> Response:
    """Decide every request of a confirmed preview, at the revision the preview showed."""
    form = await request.form()
    try:
        filters = Filters.of(form)
    except BadQuery:  # only where the list goes back to: the preview checked them
        filters = Filters()
    revisions = _revisions(items)
    client = client_of(request)
    if decision not in ("approve", "decline") or not revisions:
        error = "this form is not a bulk decision's preview; nothing was decided"
        return _bulk_page(request, who, "approve", [], filters, status=422, error=error)
    if decision == "decline" and not reason.strip():
        found = await client.store.get_requests(list(revisions))
        chosen = [found[i] for i in revisions if i in found]
        error = "Declining takes a reason (the model is told it); nothing was decided."
        return _bulk_page(
            request, who, decision, chosen, filters, status=422, error=error, revisions=revisions
        )
    try:
        resumed = await client.decide_many(
            revisions,
            "approve" if decision == "approve" else "decline",
            decider=decider_of(who, "inbox"),
            reason=reason.strip() or None,
        )
    except BulkRefused as exc:
        found = await client.store.get_requests(list(revisions))
        chosen = [found[i] for i in revisions if i in found]
        refused = dict(exc.refused)
        error = (
            f"Nothing was decided: {len(refused)} of {len(revisions)} requests cannot take "
            "this decision now (decided or voted on since the preview, or not yours to "
            "decide). Take them out, or go back and preview again."
        )
        return _bulk_page(
            request, who, decision, chosen, filters, status=409, error=error, refused=refused,
            revisions=revisions, reason=reason,
        )  # fmt: skip
    subject = f"{len(revisions):,} request{'s' if len(revisions) != 1 else ''}"
    if len(resumed) != len(revisions):
        subject += f" ({len(resumed):,} resolved; the others wait for more approvers)"
    kind = "bulk_approved" if decision == "approve" else "bulk_declined"
    return redirect_after(request, kind, subject, filters.url("/"))


def _revisions(items: str) -> dict[str, int | None]:
    """`id:revision,id:revision` (the preview's hidden field) as a dict."""
    found: dict[str, int | None] = {}
    for item in items.split(","):
        request_id, _, revision = item.strip().rpartition(":")
        if request_id and revision.isascii() and revision.isdigit():
            found[request_id] = int(revision)
    return found


def _bulk_page(
    request: Request,
    who: Principal,
    decision: str,
    chosen: list[StoredRequest],
    filters: Filters,
    *,
    status: int = 200,
    error: str | None = None,
    refused: dict[str, str] | None = None,
    revisions: dict[str, int | None] | None = None,
    reason: str = "",
    choice: BulkChoice | None = None,
) -> Response:
    """The preview (or the refusal) of a bulk decision; `choice`, for all that match."""
    refused = refused or {}
    seen = revisions or {s.request.id: s.revision for s in chosen}
    shown = [item_of(s) for s in chosen]
    # The refused first: they are what the user must look at.
    shown.sort(key=lambda item: item["id"] not in refused)
    context = {
        "decision": decision,
        "items": shown[:PREVIEW_SHOWN],
        "count": len(chosen),
        "more": max(len(chosen) - PREVIEW_SHOWN, 0),
        "refused": refused,
        # What confirming decides: the preview's revisions, less any refused.
        "field": ",".join(
            f"{i}:{r}" for i, r in seen.items() if r is not None and i not in refused
        ),
        "left": sum(1 for i in seen if i not in refused),
        "filters": filters,
        "back": filters.url("/"),
        "reason": reason,
        "cap": MAX_BULK,
        # All that match: how many in all when past the cap, and what an approval left out.
        "matching": choice.matching if choice is not None and choice.capped else None,
        "left_out": choice.left_out if choice is not None else 0,
        "relay": choice.relay if choice is not None else 0,
    }
    return render(request, who, "bulk.html", context, status=status, error=error)
