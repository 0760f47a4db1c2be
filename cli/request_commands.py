"""The request commands: `pending` lists requests a page at a time, with the command for
the next page, and `answer` answers one, and the run goes on."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import ValidationError

from cli._common import (
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
from cli.approvals import cli_decider, decision_answer
from cli.grants import grant_terms
from cli.render import print_requests
from relayq import Answer, NotAnApproval
from relayq.approvals import is_approval
from relayq.grants import GrantTerms
from relayq.relay import RelayResult
from relayq.replies import Declined, Output, Results, answer_to
from store import Page, RequestPage, RequestQuery, StoredRequest
from store.paging import DEFAULT_PAGE, MAX_PAGE
from store.requests import STATUSES as STORED_STATUSES
from store.requests import RequestSort, SortOrder, read_statuses
from tasks.client.client import DurableClient

__all__ = ["answer", "pending"]


def pending(
    ctx: typer.Context,
    agent: AgentFilter = None,
    tool: ToolFilter = None,
    kind: Annotated[
        str | None, typer.Option(help="Only requests of this kind (tool_call, approval, ...).")
    ] = None,
    group: GroupFilter = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's requests.")] = None,
    search: SearchFilter = None,
    older_than: OlderThanFilter = None,
    newer_than: Annotated[
        str | None, typer.Option(help="Only requests at most this old: 90s, 15m, 2h, 3d, 1w.")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            help="open (the default), answered, expired, cancelled, or all; repeat for several."
        ),
    ] = None,
    sort: Annotated[str, typer.Option(help="age (oldest first), agent or tool.")] = "age",
    order: Annotated[str, typer.Option(help="asc, or desc for the exact reverse.")] = "asc",
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_PAGE, help="Requests on a page.")
    ] = DEFAULT_PAGE,
    cursor: Annotated[
        str | None, typer.Option(help="Show the page after the one that printed this cursor.")
    ] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="Every page, not only one.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the page as the API does (items, total, ...).")
    ] = False,
) -> None:
    """List open requests, oldest (the most urgent) first, a page at a time.

    Says how many match in all, and the command for the next page. Filters
    combine; `--status all` lists every status.
    """
    statuses = _request_statuses(status)
    sort_by = cast(RequestSort, _choice(sort, ("age", "agent", "tool"), "--sort"))
    direction = cast(SortOrder, _choice(order, ("asc", "desc"), "--order"))
    query = RequestQuery(
        status=statuses,
        agent=agent,
        tool=tool,
        kind=kind,
        group=group,
        run_id=run_id,
        search=search,
        sort=sort_by,
        order=direction,
        limit=limit,
        cursor=cursor,
    ).aged(
        None if older_than is None else age_of(older_than),
        None if newer_than is None else age_of(newer_than),
    )

    async def load(client: DurableClient) -> Page[StoredRequest]:
        return await client.query_requests(query, all_pages=all_pages)

    page = run_with_client(load)
    if as_json:
        typer.echo(RequestPage.of(page).model_dump_json(by_alias=True, indent=2))
        return
    more = None if page.next_cursor is None else _next_page_command(ctx, page.next_cursor)
    what = f"{' or '.join(statuses)} request" if statuses else "request"
    print_requests(
        console(), page, what=what, order=_order_words(sort_by, direction), more=more,
        with_status=statuses != ["open"],
    )  # fmt: skip


def _request_statuses(given: list[str] | None) -> list[str] | None:
    """The statuses asked for, `open` when none; None (every status) for `all`."""
    names = read_statuses(given)
    for name in names or ():
        _choice(name, STORED_STATUSES, "--status")
    return names


def _choice(value: str, choices: tuple[str, ...], option: str) -> str:
    if value not in choices:
        fail(f"unknown {option} {value!r}; one of {', '.join(choices)}")
    return value


def _order_words(sort: str, order: str) -> str:
    first = "oldest first" if order == "asc" else "newest first"
    if sort == "age":
        return first
    return f"by {sort} ({'A to Z' if order == 'asc' else 'Z to A'}), then {first}"


def _next_page_command(ctx: typer.Context, next_cursor: str) -> str:
    """This very command, its options as given, with the cursor of the next page."""
    words = ["relayq", ctx.info_name or "pending"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in ("cursor", "all_pages", "as_json") or value in (None, (), param.default):
            continue
        for one in value if isinstance(value, list | tuple) else [value]:
            words += [next(o for o in param.opts if o.startswith("--")), str(one)]
    return shlex.join([*words, "--cursor", next_cursor])


def answer(
    request_id: Annotated[str, typer.Argument(help="The request's id (see `relayq pending`).")],
    output: Annotated[
        str | None, typer.Option(help="The result of the request's single call, or the reply.")
    ] = None,
    results: Annotated[
        Path | None,
        typer.Option(
            help='A JSON file of results by call id: [{"id": "c1", "output": "...", '
            '"isError": false}, ...] or {"results": [...]}.',
            dir_okay=False,
        ),
    ] = None,
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve an approval request as it stands.")
    ] = False,
    edit: Annotated[
        list[str] | None,
        typer.Option(
            "--edit",
            help="Approve with this argument changed: key=value (JSON values: amount=50). "
            "Repeat for more.",
        ),
    ] = None,
    decline: Annotated[
        str | None, typer.Option(help="Decline the request; each call gets this reason.")
    ] = None,
    partial: Annotated[
        bool, typer.Option(help="Keep these results; the request stays open for the rest.")
    ] = False,
    answered_by: Annotated[
        str | None,
        typer.Option("--as", help="Who answers, as recorded. [default: cli:<OS user>]"),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option("--group", help="An approver group you decide for. Repeat for more."),
    ] = None,
    grant: Annotated[
        str | None,
        typer.Option(
            "--grant",
            metavar="SCOPE",
            help="With --approve or --edit: approve the same for calls to come, in this "
            "scope (run, conversation, principal, agent, all); takes --grant-for.",
        ),
    ] = None,
    grant_for: Annotated[
        str | None, typer.Option("--grant-for", help="How long the grant lasts: 8h, 30m, 7d.")
    ] = None,
    grant_uses: Annotated[
        int | None, typer.Option("--grant-uses", min=1, help="Calls the grant approves at most.")
    ] = None,
    grant_match: Annotated[
        list[str] | None,
        typer.Option(
            "--grant-match",
            help='A constraint the calls it approves meet, such as "amount <= 50" (repeat '
            "for more); without one, calls with the very arguments approved.",
        ),
    ] = None,
) -> None:
    """Answer an open request (exactly one of --output, --results, --approve, --edit,
    --decline); the run goes on. The OS user is recorded with every answer."""
    edits = edit or []
    _one_way(output is not None, results is not None, approve, bool(edits), decline is not None)
    who = cli_decider(answered_by, group or [])
    terms = grant_terms(grant, grant_for, grant_uses, grant_match)
    if terms is not None and not (approve or edits):
        fail("--grant goes with --approve or --edit")

    async def submit(client: DurableClient) -> tuple[str, str, str]:
        deciding = approve or bool(edits)
        known = await client.request(request_id)
        if deciding and not is_approval(known.request):
            fail(_answer_it(request_id, known.request.kind))
        if (output is not None or results is not None) and is_approval(known.request):
            ways = "--approve, --edit or --decline"
            fail(f"request {request_id} is an approval: decide it with {ways}")
        if deciding:
            reply = decision_answer(client, request_id, approving=approve, edits=edits)
            verb = "approved" if approve else "approved with edits"
        elif output is not None:
            reply, verb = answer_to(request_id, Output(output)), "answered"
        elif results is not None:
            reply, verb = answer_to(request_id, Results(_results_file(results))), "answered"
        else:
            reply, verb = answer_to(request_id, Declined(decline or "declined")), "declined"
        try:
            run_id = await client.submit_answer(
                reply, partial=partial, decider=who, decision=deciding, grant=terms
            )
        except NotAnApproval as exc:
            fail(_answer_it(request_id, exc.kind))
        stored = await client.request(request_id)
        return run_id, stored.status, verb + await _granted(client, request_id, terms)

    run_id, status, verb = run_with_client(submit)
    out = console()
    recorded = f"as {who.name} (OS user {who.os_user}, via the CLI)"
    if status == "open":
        out.print(f"{verb} {request_id} {recorded}; it stays open for more answers or votes")
    else:
        out.print(f"{verb} {request_id} {recorded}; run {run_id} goes on (relayq show {run_id})")


async def _granted(client: DurableClient, request_id: str, terms: GrantTerms | None) -> str:
    """What the answer's line says of the grant it made, if it made one."""
    if terms is None:
        return ""
    made = await client.store.grants_of_request([request_id])
    return f" and granted {', '.join(g.id for g in made)} (relayq grants)"


def _one_way(*chosen: bool) -> None:
    if sum(chosen) != 1:
        fail(
            "give exactly one of --output, --results, --approve, --edit, --decline "
            f"(got {sum(chosen)})"
        )


def _answer_it(request_id: str, kind: str) -> str:
    return (
        f"request {request_id} is a {kind} request, not an approval: "
        "answer it with --output or --results (or --decline)"
    )


def _results_file(path: Path) -> list[RelayResult]:
    try:
        data: Any = json.loads(path.read_text())
    except OSError as exc:
        fail(f"cannot read results file {path}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"results file {path} is not valid JSON: {exc}")
    if isinstance(data, dict) and "results" in data:
        data = data["results"]
    if not isinstance(data, list) or not data:
        fail(f'results file {path} must hold a non-empty list of {{"id", "output"}} objects')
    try:  # the strict parser the API and the client use: `"isError": "yes"` is refused
        Answer.model_validate({"id": "", "data": {"results": data}})
    except ValidationError as exc:
        fail(f"results file {path}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}")
    results = []
    for index, item in enumerate(data):
        try:
            results.append(RelayResult.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            fail(f"results file {path}: item {index}{'.' + field if field else ''}: {first['msg']}")
    return results
