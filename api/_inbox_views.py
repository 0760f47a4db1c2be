"""What the inbox's templates show, from what the store keeps: plain dicts, no HTML.

Every string here is shown escaped by the templates (autoescape); nothing is
marked safe. Long values are cut for lists and shown whole on a request's page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from relayq import transcript as tx
from relayq.approvals import arguments_of, diff_arguments, is_approval, is_tool_approval, policy_of
from relayq.grants import SCOPES
from relayq.relay import relay_calls_of
from store import CallHold, StoredRequest

__all__ = ["Field", "ago", "fields_of", "item_of", "message_of", "pretty", "when"]

_SHORT = 80
"""Characters of a value a list shows."""


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def when(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(moment: datetime, now: datetime | None = None) -> str:
    """How long ago, to the largest unit: `3 h`, `12 min`, `2 d`."""
    seconds = max(int(((now or datetime.now(UTC)) - moment).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _short(text: str) -> str:
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


@dataclass(frozen=True, kw_only=True)
class Field:
    """One argument, as a table row and an edit form's input."""

    name: str
    value: str
    """The value as text: a string as is, anything else as JSON."""
    kind: str
    """The schema's type: string, integer, number, boolean, or `json` for anything else."""
    description: str = ""
    required: bool = False


def fields_of(arguments: dict[str, Any], schema: dict[str, Any] | None = None) -> list[Field]:
    """The arguments as rows, in the schema's order (then any it does not name), each with
    the schema's type and description."""
    properties: dict[str, Any] = dict((schema or {}).get("properties") or {})
    required = set((schema or {}).get("required") or ())
    names = list(properties) + [n for n in arguments if n not in properties]
    rows = []
    for name in names:
        found = properties.get(name)
        spec: dict[str, Any] = found if isinstance(found, dict) else {}
        kind = str(spec.get("type")) if spec.get("type") in _SCALARS else "json"
        if name not in arguments:
            value = ""
        elif kind == "json" or not isinstance(arguments[name], str):
            value = _text(arguments[name])
        else:
            value = arguments[name]
        rows.append(
            Field(
                name=name,
                value=value,
                kind=kind,
                description=str(spec.get("description") or ""),
                required=name in required,
            )
        )
    return rows


_SCALARS = ("string", "integer", "number", "boolean")


SCOPE_NAMES: dict[str, str] = {
    "run": "this run",
    "conversation": "this conversation",
    "principal": "runs of this agent its starter starts",
    "agent": "every run of this agent",
    "all": "every run of any agent with this tool",
}


def grant_scopes(stored: StoredRequest) -> list[str]:
    """The scopes a grant made deciding `stored` may take (none: it takes no grant)."""
    request = stored.request
    if not is_tool_approval(request):
        return []
    policy = policy_of(request)
    # The one rule of what a grant may do (`GrantCaps.refusal`), asked of each scope.
    return [s for s in SCOPES if policy.grants.refusal(s, _SHORTEST, policy.quorum) is None]


_SHORTEST = timedelta(seconds=1)
"""A lifetime every policy allows: the form asks for the lifetime itself."""


def item_of(stored: StoredRequest, now: datetime | None = None) -> dict[str, Any]:
    """A request as a list shows it, and the head of its page."""
    request = stored.request
    approval = is_approval(request)
    if approval:
        arguments = arguments_of(request)
        calls = [
            {
                "id": "",
                "name": stored.tool or request.kind,
                "arguments": pretty(arguments),
                "summary": _summary(arguments),
            }
        ]
    else:
        holds = {h.call_id: h for h in stored.holds}
        calls = [
            {
                "id": c.id,
                "name": c.name,
                "arguments": pretty(c.input),
                "summary": _summary(c.input),
                "held": _held(holds.get(c.id)),
            }
            for c in relay_calls_of(request)
        ]
    answer = stored.answer
    return {
        "id": request.id,
        "run_id": stored.run_id,
        "agent": stored.agent,
        "kind": request.kind,
        "approval": approval,
        "tool": stored.tool or "",
        "prompt": request.prompt,
        "status": stored.status,
        "outcome": stored.outcome or stored.status,
        "created_at": when(stored.created_at),
        "age": ago(stored.created_at, now),
        "expires_at": when(request.expires_at),
        "approvers": stored.approvers,
        "quorum": stored.quorum,
        "decisions": list(policy_of(request).decisions) if approval else ["approve", "decline"],
        "grant_scopes": grant_scopes(stored),
        "revision": stored.revision,
        "answered_by": stored.answered_by or "",
        "answered_at": when(stored.answered_at),
        "reason": (answer.reason or "") if answer is not None and not answer.ok else "",
        "changes": _changes(stored) if approval else "",
        "calls": calls,
        # Other kinds (a question, a budget) show their data instead of calls.
        "data": None if calls else pretty(request.data),
    }


def _held(hold: CallHold | None) -> str:
    """Who runs the call now, and until when their lease holds: `held by hal until ...`."""
    if hold is None:
        return ""
    again = f", try {hold.attempt}" if hold.attempt > 1 else ""
    return f"held by {hold.host} until {when(hold.until)}{again}"


def _changes(stored: StoredRequest) -> str:
    """What an approval approved in place of the model's arguments: `amount: 120 → 45`."""
    answer = stored.answer
    edited = (answer.data or {}).get("arguments") if answer is not None and answer.ok else None
    if not isinstance(edited, dict):
        return ""
    diff = diff_arguments(arguments_of(stored.request), edited)
    return _short(", ".join(f"{k}: {_text(old)} → {_text(new)}" for k, (old, new) in diff.items()))


def _summary(arguments: dict[str, Any]) -> str:
    return _short(" · ".join(f"{k}: {_text(v)}" for k, v in arguments.items()))


def message_of(seq: int, message: dict[str, Any]) -> dict[str, Any]:
    """One transcript message, folded: a one-line summary and the whole of it."""
    role = str(message.get("role") or "?")
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if isinstance(content, str) and content:
        body = content
    elif calls:
        body = pretty([{"name": c.get("function", {}).get("name"), **c} for c in calls])
    else:
        body = pretty(content)
    named = ", ".join(str(c.get("function", {}).get("name")) for c in calls)
    head = _short(content) if isinstance(content, str) and content else f"calls {named}"
    note = message.get(tx.NOTE) or {}
    return {
        "seq": seq,
        "role": role,
        "summary": head.replace("\n", " "),
        "body": body,
        "error": bool(note.get("is_error")) if isinstance(note, dict) else False,
        "pending": isinstance(note, dict) and "pending" in note,
    }
