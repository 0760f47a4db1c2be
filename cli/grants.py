"""Standing grants from the command line: list them, make one, revoke one.

    relayq grants [--tool refund] [--status active]
    relayq grants add refund --agent clerk --scope agent --for 7d --match "amount <= 50"
    relayq grants revoke grt_...

The CLI reaches the store directly, as the deployment's own administrator: what it
makes and revokes is recorded as the OS user's (`cli:<user>`), as its decisions are.
A grant is also made with a decision: `relayq answer REQ --approve --grant conversation
--grant-for 8h --grant-uses 20`.
"""

from __future__ import annotations

import json
from typing import Annotated, cast

import typer
from rich.table import Table

from cli._common import console, fail, run_with_client
from cli.approvals import cli_decider
from relayq import ToolkitError
from relayq.grants import SCOPES, GrantScope, GrantTerms, parse_duration
from relayq.matching import Matcher, parse_constraints
from store.grants import GrantQuery, GrantRefused, GrantView, NewGrant, status_of
from store.models import GrantRow
from tasks.client.client import DurableClient

__all__ = ["add", "grant_terms", "listing", "revoke"]

ScopeOption = Annotated[
    str, typer.Option(help=f"Which runs it covers: {', '.join(SCOPES)}.", metavar="SCOPE")
]
MatchOption = Annotated[
    list[str] | None,
    typer.Option(
        "--match",
        help='A constraint every covered call meets, such as "amount <= 50". Repeat for more.',
    ),
]


def grant_terms(
    scope: str | None, lasts: str | None, uses: int | None, match: list[str] | None
) -> GrantTerms | None:
    """The grant `relayq answer --grant ...` asks for, or None; exits saying why it is bad."""
    if scope is None:
        if lasts is not None or uses is not None or match:
            fail("--grant-for, --grant-uses and --grant-match go with --grant SCOPE")
        return None
    if lasts is None:
        fail("--grant takes --grant-for: how long it lasts, say 8h")
    wire = {"scope": scope, "for": lasts, "max_uses": uses, "match": match or "exact"}
    try:
        return GrantTerms.from_wire(wire)
    except ToolkitError as exc:
        fail(str(exc))


def listing(
    ctx: typer.Context,
    tool: Annotated[str | None, typer.Option(help="Only grants of this tool.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only grants of this agent.")] = None,
    scope: Annotated[str | None, typer.Option(help="Only grants of this scope.")] = None,
    status: Annotated[
        str | None, typer.Option(help="active, expired, revoked or used (up).")
    ] = None,
    made_by: Annotated[str | None, typer.Option(help="Only grants this person made.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Grants per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="The next page's cursor.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
) -> None:
    """Standing grants, newest first: what each covers, its uses, and where it stands."""
    if ctx.invoked_subcommand is not None:
        return  # `relayq grants add ...`: the listing's options are not asked for
    query = GrantQuery(
        tool=tool,
        agent=agent,
        scope=scope,
        made_by=made_by,
        status=status,  # type: ignore[arg-type]  # the store says what is wrong
        cursor=cursor,
        limit=limit,
    )

    async def load(client: DurableClient) -> tuple[list[GrantRow], str | None]:
        return await client.store.list_grants(query)

    rows, more = run_with_client(load)
    out = console()
    if as_json:
        items = [GrantView.of(r).model_dump(mode="json", by_alias=True) for r in rows]
        out.print_json(json.dumps({"items": items, "nextCursor": more}))
        return
    table = Table("id", "tool", "agent", "scope", "covers", "uses", "expires", "status", "made by")
    for r in rows:
        table.add_row(
            r.id,
            r.tool,
            r.agent or "(any)",
            r.scope if r.scope_id is None else f"{r.scope} {r.scope_id}",
            str(Matcher.from_wire(r.match)),
            f"{r.uses}" if r.max_uses is None else f"{r.uses}/{r.max_uses}",
            r.expires_at.strftime("%Y-%m-%d %H:%M"),
            status_of(r),
            r.made_by,
        )
    out.print(table)
    if more is not None:
        out.print(f"more: relayq grants --cursor {more}")


def add(
    tool: Annotated[str, typer.Argument(help="The gated tool it approves.")],
    scope: ScopeOption,
    lasts: Annotated[str, typer.Option("--for", help="How long it lasts: 8h, 30m, 7d.")],
    agent: Annotated[
        str | None, typer.Option(help="The agent whose runs it covers (scope all: any).")
    ] = None,
    scope_id: Annotated[
        str | None, typer.Option(help="The run, conversation or principal it covers.")
    ] = None,
    max_uses: Annotated[int | None, typer.Option(min=1, help="Calls it approves at most.")] = None,
    match: MatchOption = None,
    reason: Annotated[str | None, typer.Option(help="Why, for the record.")] = None,
    made_by: Annotated[
        str | None, typer.Option("--as", help="Who makes it, as recorded. [default: cli:<OS user>]")
    ] = None,
) -> None:
    """Make a grant directly, as the deployment's administrator."""
    try:
        matcher = Matcher(where=parse_constraints(match or []))
        grant = NewGrant(
            tool=tool,
            agent=agent,
            scope=cast(GrantScope, scope),  # NewGrant refuses one not in SCOPES
            scope_id=scope_id,
            matcher=matcher,
            lasts=parse_duration(lasts),
            max_uses=max_uses,
            maker=cli_decider(made_by, []),
            reason=reason,
        )
    except (ToolkitError, GrantRefused) as exc:
        fail(str(exc))

    async def make(client: DurableClient) -> GrantRow:
        return await client.store.make_grant(grant)

    row = run_with_client(make)
    covers = row.scope_id or row.agent or "(any agent)"
    console().print(
        f"granted {row.id}: {tool} calls of {row.scope} {covers} "
        f"where {Matcher.from_wire(row.match)}, until {row.expires_at:%Y-%m-%d %H:%M} UTC"
    )


def revoke(
    grant_id: Annotated[str, typer.Argument(help="The grant's id (see `relayq grants`).")],
    made_by: Annotated[
        str | None, typer.Option("--as", help="Who revokes it, as recorded.")
    ] = None,
) -> None:
    """Revoke a grant: from this moment it approves no call."""

    async def run(client: DurableClient) -> GrantRow:
        return await client.store.revoke_grant(grant_id, cli_decider(made_by, []))

    row = run_with_client(run)
    console().print(f"revoked {row.id} (used {row.uses} times); calls it covered ask again")
