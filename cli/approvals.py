"""Decisions from the command line, and the audit trail.

The CLI reaches the store directly, with no token: a decision it makes is
recorded as the operating-system user's (`cli:<user>`, `via: cli`, the OS user
in `os_user`), and says so when it is made.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from cli._common import console, fail, run_with_client
from relayq import Answer
from relayq.approvals import approve, edit
from store import Decider, list_decisions
from store.votes import proposed_arguments
from tasks.client import DurableClient

__all__ = ["audit", "cli_decider", "decision_answer", "os_user"]


def os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "unknown"


def cli_decider(name: str | None, groups: list[str]) -> Decider:
    """Who decides from this shell: `--as` if given, else `cli:<OS user>`; the OS user is
    recorded either way."""
    user = os_user()
    return Decider(
        name=name or f"cli:{user}", role="cli", groups=tuple(groups), via="cli", os_user=user
    )


def parse_edits(edits: list[str]) -> dict[str, Any]:
    """`key=value` pairs; a value that parses as JSON is that JSON (`amount=50` is 50)."""
    out: dict[str, Any] = {}
    for item in edits:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            fail(f"--edit takes key=value, not {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def decision_answer(
    client: DurableClient, request_id: str, *, approving: bool, edits: list[str]
) -> Answer:
    """The answer for `--approve` or `--edit`: edits apply over what is proposed now."""
    if approving:
        return approve(request_id)
    current = proposed_arguments(client.db, request_id)
    return edit(request_id, {**current, **parse_edits(edits)})


def audit(
    since: Annotated[
        datetime | None, typer.Option(help="Only decisions at or after this time (ISO 8601).")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="Only decisions before this time (ISO 8601).")
    ] = None,
    actor: Annotated[str | None, typer.Option(help="Only this person's decisions.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only requests of this agent.")] = None,
    outcome: Annotated[
        str | None,
        typer.Option(help="approved, edited, declined, answered, expired, escalated, overdue"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Decisions per page.")] = 50,
    cursor: Annotated[
        int | None, typer.Option(help="The next page: the cursor an earlier page printed.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
) -> None:
    """The audit trail, newest first: who decided what, when, through which door."""

    async def load(client: DurableClient) -> tuple[list[Any], int | None]:
        return await asyncio.to_thread(
            list_decisions,
            client.db,
            since=_aware(since),
            until=_aware(until),
            actor=actor,
            agent=agent,
            outcome=outcome,
            before_id=cursor,
            limit=limit,
        )

    rows, more = run_with_client(load)
    out = console()
    if as_json:
        items = [
            {
                "id": r.id,
                "requestId": r.request_id,
                "runId": r.run_id,
                "agent": r.agent,
                "tool": r.tool,
                "actor": r.actor,
                "via": r.via,
                "osUser": r.os_user,
                "outcome": r.outcome,
                "reason": r.reason,
                "diff": r.diff,
                "at": r.at.isoformat(),
            }
            for r in rows
        ]
        out.print_json(json.dumps({"items": items, "nextCursor": more}))
        return
    table = Table("at", "request", "agent", "tool", "who", "via", "outcome", "reason")
    for r in rows:
        who = r.actor if r.os_user is None else f"{r.actor} ({r.os_user})"
        table.add_row(
            r.at.strftime("%Y-%m-%d %H:%M:%S"),
            r.request_id,
            r.agent,
            r.tool or "",
            who,
            r.via,
            r.outcome,
            r.reason or "",
        )
    out.print(table)
    if more is not None:
        out.print(f"more: relayq audit --cursor {more}")


def _aware(moment: datetime | None) -> datetime | None:
    """A time given without a zone is taken as this machine's local time."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.astimezone()
