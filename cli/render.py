"""How runs, transcripts and requests look on a terminal."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from relayq import Request
from relayq.relay import relay_calls_of
from store import Page, StoredRequest

__all__ = [
    "MessagePrinter",
    "age",
    "clip",
    "plural",
    "print_pending",
    "print_requests",
    "status_style",
]

NOTE = "relayq"  # relayq's own notes on a transcript message (see relayq.transcript)
CLIP = 240

_STATUS_STYLES = {
    "done": "green",
    "pending": "yellow",
    "failed": "red",
    "cancelled": "red",
    "incomplete": "red",
    "over_budget": "red",
    "running": "cyan",
    "queued": "cyan",
}


def status_style(status: str) -> str:
    return _STATUS_STYLES.get(status, "")


def plural(count: int, one: str, many: str | None = None) -> str:
    """`one` for a count of exactly one, else `many` (by default `one` + "s").

    f"{n} {plural(n, 'job')}"; f"{n} {plural(n, 'run resumes', 'runs resume')}"
    """
    return one if count == 1 else many or one + "s"


def clip(text: str, limit: int = CLIP) -> str:
    """One line of at most `limit` characters: newlines folded, the rest cut with its size."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]}… (+{len(flat) - limit} chars)"


def age(moment: datetime, now: datetime | None = None) -> str:
    """`42s`, `5m`, `3h`, `2d`: how long ago `moment` was."""
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(raw, ensure_ascii=False)


class MessagePrinter:
    """Prints transcript messages one by one, remembering which call had which tool name."""

    def __init__(self, console: Console, *, show_turns: bool = False) -> None:
        self.console = console
        self.show_turns = show_turns
        self.names: dict[str, str] = {}
        self.turn = 0

    def print(self, message: dict[str, Any]) -> None:
        role = message.get("role")
        if role == "user":
            self._line(("user  ", "bold"), (clip(str(message.get("content") or "")), ""))
        elif role == "assistant":
            self._assistant(message)
        elif role == "tool":
            self._tool(message)
        elif role == "system":
            self._line(("system  ", "dim"), (clip(str(message.get("content") or "")), "dim"))

    def _assistant(self, message: dict[str, Any]) -> None:
        self.turn += 1
        if self.show_turns:
            usage = (message.get(NOTE) or {}).get("usage") or {}
            total = usage.get("totalTokens", 0)
            tokens = f"  ({total} {plural(total, 'token')})" if usage else ""
            self._line((f"── turn {self.turn}{tokens}", "bold dim"))
        if message.get("content"):
            self._line(("model  ", "bold magenta"), (clip(str(message["content"])), ""))
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            name = str(fn.get("name", "?"))
            self.names[str(call.get("id"))] = name
            args = clip(_arguments(fn.get("arguments", "{}")))
            ident = f"  [{call.get('id')}]"
            self._line(("  → ", "cyan"), (name, "bold cyan"), (f" {args}", ""), (ident, "dim"))

    def _tool(self, message: dict[str, Any]) -> None:
        note = message.get(NOTE) or {}
        call_id = str(message.get("tool_call_id"))
        name = self.names.get(call_id, call_id)
        if "pending" in note and "answer" not in note:
            request_id = (note.get("pending") or {}).get("id", "?")
            waits = f" waits on request {request_id}"
            self._line(("  ⏸ ", "yellow"), (name, "bold"), (waits, "yellow"))
            return
        error = bool(note.get("is_error"))
        mark, style = ("  ✗ ", "red") if error else ("  ← ", "green")
        output = clip(str(message.get("content") or ""))
        self._line((mark, style), (name, "bold"), (": ", ""), (output, "red" if error else ""))

    def _line(self, *parts: tuple[str, str]) -> None:
        self.console.print(Text.assemble(*parts))


def print_pending(console: Console, request: Request) -> None:
    """The request a run waits on, with its calls and the commands that answer it."""
    console.print(
        Text.assemble(
            ("pending ", "bold yellow"),
            (request.id, "bold"),
            (f"  ({request.kind}) {clip(request.prompt)}", ""),
        )
    )
    calls = relay_calls_of(request)
    for call in calls:
        args = clip(_arguments(call.input if call.input else call.arguments))
        line = Text.assemble(("  call ", ""), (call.id, "bold"), (f"  {call.name} {args}", ""))
        console.print(line)
    if request.data and not calls:
        console.print(Text(f"  data {clip(json.dumps(request.data, ensure_ascii=False))}"))
    console.print("answer it with:")
    if len(calls) > 1:
        example = json.dumps([{"id": c.id, "output": "..."} for c in calls[:2]])
        console.print(Text(f"  relayq answer {request.id} --results results.json   # {example}"))
    else:
        console.print(Text(f"  relayq answer {request.id} --output TEXT"))
    console.print(Text(f"  relayq answer {request.id} --decline REASON"))


def print_requests(
    console: Console,
    page: Page[StoredRequest],
    *,
    what: str,
    order: str,
    more: str | None,
    with_status: bool,
) -> None:
    """A page of requests as a table, then how many match in all and how to see the rest.

    `what` names one of them (`open request`), `order` says their order (`oldest first`),
    `more` is the command for the next page, if there is one.
    """
    if not page.items:
        many = f"{what}s"
        console.print(f"no {many}" if page.total == 0 else f"no more {many} (of {page.total})")
        return
    # Who runs a relay call now, where a host holds one on this page.
    held = any(stored.holds for stored in page)
    table = Table(
        "request",
        "agent",
        *(["status"] if with_status else []),
        "run",
        "calls",
        *(["held by"] if held else []),
        "age",
    )
    table.columns[0].no_wrap = table.columns[-3 - held].no_wrap = True
    for stored in page:
        status = [Text(stored.status, style=_REQUEST_STYLES.get(stored.status, ""))]
        table.add_row(
            stored.request.id,
            stored.agent,
            *(status if with_status else []),
            stored.run_id,
            _asks(stored.request),
            *([_holders(stored)] if held else []),
            age(stored.created_at),
        )
    console.print(table)
    shown = len(page)
    if more is None and shown == page.total == 1:
        console.print(f"showing the one {what}")
    else:
        every = more is None and shown == page.total
        counted = f"all {shown}" if every else f"{shown} of {page.total}"
        console.print(f"showing {counted} {plural(page.total, what, what + 's')}, {order}")
    if more is not None:
        console.print(Text(f"next page: {more}"))


_REQUEST_STYLES = {"open": "yellow", "answered": "green", "expired": "red", "cancelled": "red"}


def _holders(stored: StoredRequest) -> str:
    """`hal until 14:02:07Z`, for each call a host holds (its id first, of several calls)."""
    named = len(relay_calls_of(stored.request)) > 1
    return "; ".join(
        f"{f'{h.call_id}: ' if named else ''}{h.host} until "
        f"{h.until.astimezone(UTC):%H:%M:%SZ}{f' (try {h.attempt})' if h.attempt > 1 else ''}"
        for h in stored.holds
    )


def _asks(request: Request) -> str:
    """What a request asks for, on one line: its calls, or its kind and prompt."""
    calls = relay_calls_of(request)
    if calls:
        return "; ".join(f"{c.name} {clip(json.dumps(c.input), 60)}" for c in calls)
    return f"{request.kind}: {clip(request.prompt, 60)}"
