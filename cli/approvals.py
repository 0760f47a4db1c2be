"""Decisions from the command line, and the audit trail.

The CLI reaches the store directly, with no token: a decision it makes is
recorded as the operating-system user's (`cli:<user>`, `via: cli`, the OS user
in `os_user`), and says so when it is made.
"""

from __future__ import annotations

import getpass
import json
from datetime import datetime
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from cli._common import (
    EXIT_FAILED,
    AgentFilter,
    GroupFilter,
    OlderThanFilter,
    SearchFilter,
    ToolFilter,
    age_of,
    console,
    fail,
    run_with_client,
)
from cli.render import plural
from relayq import Answer, BulkRefused
from relayq.approvals import arguments_of, is_approval
from relayq.relay import relay_calls_of
from relayq.replies import Decided, answer_to
from store import AuditQuery, Decider, RequestQuery
from store.answers import MAX_BULK, BulkChoice
from store.votes import proposed_arguments
from tasks.client.client import DurableClient

__all__ = ["audit", "bulk", "cli_decider", "decision_answer", "os_user"]

PREVIEW_ROWS = 20
"""Requests a bulk preview lists one by one; it counts them all."""


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
        return answer_to(request_id, Decided("approve"))
    current = proposed_arguments(client.db, request_id)
    return answer_to(request_id, Decided("edit", {**current, **parse_edits(edits)}))


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
        typer.Option(
            help="approved, edited, declined, answered, expired, escalated, overdue, denied, asked"
        ),
    ] = None,
    through: Annotated[
        str | None,
        typer.Option(help="What decided: person, system, policy, or grant:<id>."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Decisions per page.")] = 50,
    cursor: Annotated[
        str | None,
        typer.Option(help="The next page: the cursor an earlier page printed (its filters too)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
) -> None:
    """The audit trail, newest first: who decided what, when, through which door."""

    query = AuditQuery(
        since=_aware(since),
        until=_aware(until),
        actor=actor,
        agent=agent,
        outcome=outcome,
        through=through,
        cursor=cursor,
        limit=limit,
    )

    async def load(client: DurableClient) -> tuple[list[Any], str | None]:
        return await client.store.list_decisions(query)

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
                "through": r.through,
                "at": r.at.isoformat(),
            }
            for r in rows
        ]
        out.print_json(json.dumps({"items": items, "nextCursor": more}))
        return
    table = Table("at", "request", "agent", "tool", "who", "via", "through", "outcome", "reason")
    for r in rows:
        who = r.actor if r.os_user is None else f"{r.actor} ({r.os_user})"
        table.add_row(
            r.at.strftime("%Y-%m-%d %H:%M:%S"),
            r.request_id or "(not asked)",
            r.agent,
            r.tool or "",
            who,
            r.via,
            r.through,
            r.outcome,
            r.reason or "",
        )
    out.print(table)
    if more is not None:
        out.print(f"more: relayq audit --cursor {more}")


def bulk(
    approve_all: Annotated[
        bool, typer.Option("--approve", help="Approve every approval request that matches.")
    ] = False,
    decline_reason: Annotated[
        str | None,
        typer.Option("--decline", metavar="REASON", help="Decline every match, saying why."),
    ] = None,
    agent: AgentFilter = None,
    tool: ToolFilter = None,
    group: GroupFilter = None,
    search: SearchFilter = None,
    older_than: OlderThanFilter = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Decide without asking (after the preview).")
    ] = False,
    name: Annotated[
        str | None, typer.Option("--as", help="Decide as this name (default cli:<OS user>).")
    ] = None,
    groups: Annotated[
        list[str] | None,
        typer.Option("--member-of", help="An approver group you decide for. Repeat for more."),
    ] = None,
) -> None:
    """Approve or decline every open request the filters match (the oldest 1,000 when
    more match), all or nothing.

    Prints a preview (how many, and the first of them), asks before deciding,
    and decides each at the revision the preview showed: if any was decided or
    voted on meanwhile, or is not yours to decide, nothing is applied and the
    command names each one and why. --approve leaves out relay requests (they
    take an answer: `relayq answer`), and says how many.
    """
    _check_bulk(approve_all, decline_reason, filtered=any((agent, tool, group, search, older_than)))
    decision: Literal["approve", "decline"] = "approve" if approve_all else "decline"
    query = RequestQuery(status="open", agent=agent, tool=tool, group=group, search=search).aged(
        None if older_than is None else age_of(older_than)
    )

    async def preview(client: DurableClient) -> BulkChoice:
        # The inbox's "the oldest 1,000 matching" too: one cap, the oldest first.
        return await client.store.bulk_choice(query, decision)

    choice = run_with_client(preview)
    found = choice.items
    out = console()
    if choice.left_out:
        out.print(_left_out(choice), soft_wrap=True)  # one line, however narrow the terminal
    if not found:
        out.print("No open request matches; nothing to decide.")
        return
    _print_preview(out, choice, decision)
    verb = "Approve" if approve_all else f"Decline (reason: {decline_reason})"
    if not yes and not typer.confirm(f"{verb} {_these(choice)}?"):
        out.print("Nothing was decided.")
        raise typer.Exit(EXIT_FAILED)
    who = cli_decider(name, groups or [])
    revisions: dict[str, int | None] = {s.request.id: s.revision for s in found}

    async def decide(client: DurableClient) -> list[str] | BulkRefused:
        try:
            return await client.decide_many(revisions, decision, decider=who, reason=decline_reason)
        except BulkRefused as exc:  # said here in full, not as one line
            return exc

    resumed = run_with_client(decide)
    if isinstance(resumed, BulkRefused):
        out.print(f"Nothing was decided: {len(resumed.refused)} of {len(revisions)} refused it:")
        for request_id, why in resumed.refused:
            out.print(f"  {request_id}: {why}")
        raise typer.Exit(EXIT_FAILED)
    done = "approved" if approve_all else "declined"
    decided, resuming = len(revisions), len(resumed)
    out.print(
        f"{decided} {plural(decided, 'request')} {done} as {who.name} "
        f"(via cli, OS user {who.os_user}); "
        f"{resuming} {plural(resuming, 'run resumes', 'runs resume')}."
    )
    if choice.capped:
        rest = choice.matching - decided
        out.print(f"{rest:,} more {plural(rest, 'matches', 'match')}: run it again for the next.")


def _these(choice: BulkChoice) -> str:
    count = len(choice.items)
    if choice.capped:
        return f"the oldest {count:,} of these {choice.matching:,} requests"
    return "this request" if count == 1 else f"these {count} requests"


def _left_out(choice: BulkChoice) -> str:
    """The one line that says which matches an approval left out, and why."""
    count = choice.left_out
    if choice.relay == count:
        what = f"{count:,} relay {plural(count, 'request')}"
    else:
        what = f"{count:,} {plural(count, 'request that is', 'requests that are')} not approvals"
    return f"left out {what}: they take an answer, not a decision (relayq answer REQ --output ...)"


def _check_bulk(approve_all: bool, decline_reason: str | None, *, filtered: bool) -> None:
    if approve_all == (decline_reason is not None):
        fail("give one of --approve or --decline REASON")
    if decline_reason is not None and not decline_reason.strip():
        fail("--decline takes a reason: the model is told it")
    if not filtered:  # a filter says which, on purpose: no "decide everything" by accident
        fail("give at least one filter (--agent, --tool, --group, --search, --older-than)")


def _print_preview(out: Console, choice: BulkChoice, decision: str) -> None:
    items = choice.items
    table = Table("request", "agent", "tool", "arguments", "created", title=None)
    for stored in items[:PREVIEW_ROWS]:
        arguments = (
            arguments_of(stored.request)
            if is_approval(stored.request)
            else [c.input for c in relay_calls_of(stored.request)]
        )
        table.add_row(
            stored.request.id,
            stored.agent,
            stored.tool or stored.request.kind,
            json.dumps(arguments, ensure_ascii=False)[:60],
            stored.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    if choice.capped:
        out.print(
            f"{choice.matching:,} open requests match; a bulk decision takes at most "
            f"{MAX_BULK:,}: to {decision}, the oldest {len(items):,}:"
        )
    else:
        match = plural(len(items), "open request matches", "open requests match")
        out.print(f"{len(items)} {match}; to {decision}:")
    out.print(table)
    if len(items) > PREVIEW_ROWS:
        out.print(f"... and {len(items) - PREVIEW_ROWS} more.")


def _aware(moment: datetime | None) -> datetime | None:
    """A time given without a zone is taken as this machine's local time."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.astimezone()
