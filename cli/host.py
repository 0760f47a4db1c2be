"""The host's commands: start and follow a run, list and answer requests, show and cancel runs."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli._common import (
    AgentFilter,
    GroupFilter,
    MaxCost,
    MaxTokens,
    OlderThanFilter,
    OverBudget,
    SearchFilter,
    ToolFilter,
    WorkerWatch,
    age_of,
    budget_of,
    check_broker,
    console,
    fail,
    known_agent,
    run_with_client,
    settings,
)
from cli.approvals import cli_decider, decision_answer, os_user
from cli.render import MessagePrinter, age, clip, print_pending, print_requests, status_style
from relayq import Answer, NotAnApproval, RunResult
from relayq.approvals import is_approval
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer
from store import (
    FINISHED,
    Page,
    RequestPage,
    RequestQuery,
    RunRow,
    StoredRequest,
    get_request,
    get_run,
    settled,
)
from store.paging import DEFAULT_PAGE, MAX_PAGE
from store.queries import RunSummary
from store.requests import STATUSES as STORED_STATUSES
from store.requests import RequestSort, SortOrder, read_statuses
from store.transitions import STATUSES
from tasks.host.client import DurableClient, WaitTimeout

__all__ = ["answer", "cancel", "pending", "run", "runs", "show"]


def run(
    agent: Annotated[str, typer.Argument(help="A registered agent (see RELAYQ_AGENTS).")],
    prompt: Annotated[str, typer.Argument(help="What to ask the agent.")],
    timeout: Annotated[
        float | None,
        typer.Option(help="Give up waiting after this many seconds (the run goes on)."),
    ] = None,
    max_tokens: MaxTokens = None,
    max_cost: MaxCost = None,
    over_budget: OverBudget = "ask",
) -> None:
    """Start a run, print its transcript as it grows, then its text or the request it waits on.

    --max-tokens and --max-cost give the run a budget in place of its agent's; past
    it the run asks for more with a `budget` request (or, --over-budget end, ends).

    Exits 0 when the run is done or pending on the host, 1 when it failed, was
    cancelled, ran out of turns, or did not settle within --timeout. A broker
    that does not answer is an error before anything is started; a run that no
    worker consumes is said to be so on stderr, with the command that starts one.
    """
    budget = budget_of(max_tokens, max_cost, over_budget, what="--max")
    current = settings()
    known_agent(agent, current)
    check_broker(current)
    out = console()

    async def go(client: DurableClient) -> RunResult:
        run_id = await client.start(agent, prompt, budget=budget, started_by=f"cli:{os_user()}")
        out.print(Text.assemble(("run ", "dim"), (run_id, "bold"), (f"  agent {agent}", "dim")))
        watch = WorkerWatch(agent, current, client.db)
        try:
            return await follow(client, run_id, timeout=timeout, out=out, watch=watch)
        except WaitTimeout as exc:
            fail(f"{exc}{watch.hint()}")

    result = run_with_client(go, current)
    _finish(out, result)


async def follow(
    client: DurableClient,
    run_id: str,
    *,
    timeout: float | None,
    out: Console,
    watch: WorkerWatch | None = None,
) -> RunResult:
    """Print each new message of the run until it settles; WaitTimeout after `timeout` s.

    With `watch`, a run left waiting in a queue no worker consumes is said to be so.
    """
    printer = MessagePrinter(out)
    shown = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while True:
        # Settled first, then the result: the result is then at least as recent.
        status, done = await client.store(settled, client.db, run_id)
        result = await client.result(run_id)
        for message in result.messages[shown:]:
            printer.print(message)
        shown = len(result.messages)
        if watch is not None:
            watch.poll(status)
        if done:
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(run_id, status, timeout or 0.0)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _finish(out: Console, result: RunResult) -> None:
    if result.status == "done":
        out.print(Text("done", style="bold green"))
        out.print(Text(result.text))
        return
    if result.status == "pending" and result.pending is not None:
        print_pending(out, result.pending)
        return
    why = f": {result.error}" if result.error else ""
    fail(f"run {result.run_id} {_ended(result.status)}{why}")


def _ended(status: str) -> str:
    """How a run that is not done ended, as a verb: `failed`, `was cancelled`, ..."""
    return {"failed": "failed", "cancelled": "was cancelled"}.get(status, f"is {status}")


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


def show(
    run_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="The run's id, or the id of one of its requests (req_...)."
        ),
    ],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the run as `GET /api/runs/{id}` does, with its agent, times and requests.",
        ),
    ] = False,
) -> None:
    """Show a run: its status, its transcript turn by turn, and its requests.

    Given a request's id, it names the request's run and agent first, then shows that run.
    """

    async def load(
        client: DurableClient,
    ) -> tuple[RunRow, RunResult, list[StoredRequest], StoredRequest | None]:
        asked = None
        if run_id.startswith("req_"):  # ids say what they name (relayq._types.new_id)
            asked = await client.store(get_request, client.db, run_id)
        the_run = run_id if asked is None else asked.run_id
        row = await client.store(get_run, client.db, the_run)
        result = await client.result(the_run)
        requests = await client.requests(None, run_id=the_run, all_pages=True)
        return row, result, list(requests), asked

    row, result, requests, asked = run_with_client(load)
    if as_json:
        typer.echo(_run_json(row, result, requests))
        return
    _print_run(console(), row, result, requests, asked=asked)


def _print_run(
    out: Console,
    row: RunRow,
    result: RunResult,
    requests: list[StoredRequest],
    *,
    asked: StoredRequest | None,
) -> None:
    """`relayq show`: the request asked about (if one was), then its run, turn by turn."""
    if asked is not None:
        out.print(
            Text.assemble(
                ("request ", "dim"),
                (asked.request.id, "bold"),
                (f" ({asked.request.kind}, {asked.status}) of run ", ""),
                (row.id, "bold"),
                (f", agent {row.agent}", ""),
            )
        )
    out.print(
        Text.assemble(
            ("run ", "dim"),
            (row.id, "bold"),
            (f"  agent {row.agent}  ", ""),
            (row.status, f"bold {status_style(row.status)}"),
            (f"  turns {row.turns}  tokens {row.total_tokens}", ""),
            (f"  created {age(row.created_at)} ago, updated {age(row.updated_at)} ago", "dim"),
        )
    )
    printer = MessagePrinter(out, show_turns=True)
    for message in result.messages:
        printer.print(message)
    for stored in requests:  # oldest first, as in the transcript
        if stored.status == "open":
            continue
        by = f" by {stored.answered_by}" if stored.answered_by else ""
        verdict = "" if stored.answer is None or stored.answer.ok else " (declined)"
        out.print(Text(f"request {stored.request.id} {stored.status}{by}{verdict}", style="dim"))
    if result.status == "done":
        out.print(Text("done", style="bold green"))
        out.print(Text(result.text))
    elif result.pending is not None:
        print_pending(out, result.pending)
    elif result.error:
        out.print(Text(f"{result.status}: {result.error}", style="red"))


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
) -> None:
    """Answer an open request (exactly one of --output, --results, --approve, --edit,
    --decline); the run goes on. The OS user is recorded with every answer."""
    edits = edit or []
    chosen = (output is not None, results is not None, approve, bool(edits), decline is not None)
    if sum(chosen) != 1:
        fail(
            "give exactly one of --output, --results, --approve, --edit, --decline "
            f"(got {sum(chosen)})"
        )
    who = cli_decider(answered_by, group or [])

    async def submit(client: DurableClient) -> tuple[str, str, str]:
        deciding = approve or bool(edits)
        known = await client.store(get_request, client.db, request_id)
        if deciding and not is_approval(known.request):
            fail(_answer_it(request_id, known.request.kind))
        if (output is not None or results is not None) and is_approval(known.request):
            ways = "--approve, --edit or --decline"
            fail(f"request {request_id} is an approval: decide it with {ways}")
        if deciding:
            reply = decision_answer(client, request_id, approving=approve, edits=edits)
            verb = "approved" if approve else "approved with edits"
        elif output is not None:
            reply, verb = answer_output(request_id, output), "answered"
        elif results is not None:
            reply, verb = relay_answer(request_id, _results_file(results)), "answered"
        else:
            reply, verb = answer_declined(request_id, decline or "declined"), "declined"
        try:
            run_id = await client.submit_answer(
                reply, partial=partial, decider=who, decision=deciding
            )
        except NotAnApproval as exc:
            fail(_answer_it(request_id, exc.kind))
        stored = await client.store(get_request, client.db, request_id)
        return run_id, stored.status, verb

    run_id, status, verb = run_with_client(submit)
    out = console()
    recorded = f"as {who.name} (OS user {who.os_user}, via the CLI)"
    if status == "open":
        out.print(f"{verb} {request_id} {recorded}; it stays open for more answers or votes")
    else:
        out.print(f"{verb} {request_id} {recorded}; run {run_id} goes on (relayq show {run_id})")


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


def cancel(run_id: Annotated[str, typer.Argument(help="The run's id.")]) -> None:
    """Cancel a run: a queued or pending one stops now, a running one at its next step."""

    async def stop(client: DurableClient) -> str:
        before = await client.store(get_run, client.db, run_id)
        if before.status in FINISHED:
            fail(f"run {run_id} is already {before.status}; there is nothing to cancel")
        return await client.cancel(run_id)

    status = run_with_client(stop)
    if status == "cancelled":
        console().print(f"cancelled {run_id}")
    else:
        console().print(f"cancel requested: {run_id} is {status} and stops at its next step")


def runs(
    status: Annotated[
        str | None,
        typer.Option(help=f"Only runs in this status: {', '.join(STATUSES)}."),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's runs.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the runs as `GET /api/runs` does.")
    ] = False,
) -> None:
    """List runs, newest first."""
    if status is not None and status not in STATUSES:
        fail(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    rows = run_with_client(lambda c: c.runs(status, agent=agent, limit=limit))
    if as_json:
        summaries = [RunSummary.of(row) for row in rows]
        typer.echo(_SUMMARIES.dump_json(summaries, by_alias=True, indent=2).decode())
        return
    out = console()
    if not rows:
        out.print("no runs")
        return
    table = Table("run", "agent", "status", "turns", "age", "text / error")
    table.columns[0].no_wrap = True
    for row in rows:
        outcome = row.error or row.text or ""
        table.add_row(
            row.id,
            row.agent,
            Text(row.status, style=status_style(row.status)),
            str(row.turns),
            age(row.created_at),
            clip(outcome, 60),
        )
    out.print(table)


# --- --json: the API's shapes and keys (camelCase), so a script reads both alike --------------


_SUMMARIES = TypeAdapter(list[RunSummary])


def _run_json(row: RunRow, result: RunResult, requests: list[StoredRequest]) -> str:
    """`relayq show --json`: the run as `GET /api/runs/{id}` gives it (status, text, toolCalls,
    messages, pending, turns, usage, runId, error), with its summary's fields beside them
    (agent, conversationId, cancelRequested, createdAt, updatedAt) and its requests, oldest
    first, each as `GET /api/requests` lists it."""
    summary = RunSummary.of(row)
    shown: dict[str, Any] = result.model_dump(mode="json", by_alias=True)
    for key, value in summary.model_dump(mode="json", by_alias=True).items():
        shown.setdefault(key, value)
    del shown["id"]  # `runId` says it, as in the API's run
    shown["requests"] = [r.model_dump(mode="json", by_alias=True) for r in requests]
    return json.dumps(shown, indent=2, ensure_ascii=False)
