"""The host's commands: start and follow a run, list and answer requests, show and cancel runs."""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli._common import console, fail, known_agent, run_with_client, settings
from cli.render import MessagePrinter, age, clip, print_pending, status_style
from relayq import Answer, RunResult
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer, relay_calls_of
from store import FINISHED, get_request, get_run, settled
from tasks.client import DurableClient, WaitTimeout

__all__ = ["answer", "cancel", "pending", "run", "runs", "show"]

STATUSES = ("queued", "running", "pending", "done", "failed", "cancelled", "incomplete")


def run(
    agent: Annotated[str, typer.Argument(help="A registered agent (see RELAYQ_AGENTS).")],
    prompt: Annotated[str, typer.Argument(help="What to ask the agent.")],
    timeout: Annotated[
        float | None,
        typer.Option(help="Give up waiting after this many seconds (the run goes on)."),
    ] = None,
) -> None:
    """Start a run, print its transcript as it grows, then its text or the request it waits on.

    Exits 0 when the run is done or pending on the host, 1 when it failed, was
    cancelled, ran out of turns, or did not settle within --timeout.
    """
    current = settings()
    known_agent(agent, current)
    out = console()

    async def go(client: DurableClient) -> RunResult:
        run_id = await client.start(agent, prompt)
        out.print(Text.assemble(("run ", "dim"), (run_id, "bold"), (f"  agent {agent}", "dim")))
        return await follow(client, run_id, timeout=timeout, out=out)

    result = run_with_client(go, current)
    _finish(out, result)


async def follow(
    client: DurableClient, run_id: str, *, timeout: float | None, out: Console
) -> RunResult:
    """Print each new message of the run until it settles; WaitTimeout after `timeout` s."""
    printer = MessagePrinter(out)
    shown = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while True:
        # Settled first, then the result: the result is then at least as recent.
        status, done = await asyncio.to_thread(settled, client.db, run_id)
        result = await client.result(run_id)
        for message in result.messages[shown:]:
            printer.print(message)
        shown = len(result.messages)
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
    fail(f"run {result.run_id} is {result.status}{why}")


def pending(
    agent: Annotated[str | None, typer.Option(help="Only this agent's requests.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 100,
) -> None:
    """List the open requests: what each run waits on the host for."""
    requests = run_with_client(lambda c: c.requests("open", agent=agent, limit=limit))
    out = console()
    if not requests:
        out.print("no open requests")
        return
    table = Table("request", "agent", "run", "calls", "age")
    table.columns[0].no_wrap = table.columns[2].no_wrap = True
    for stored in requests:
        request = stored.request
        calls = relay_calls_of(request)
        what = (
            "; ".join(f"{c.name} {clip(json.dumps(c.input), 60)}" for c in calls)
            if calls
            else f"{request.kind}: {clip(request.prompt, 60)}"
        )
        table.add_row(request.id, stored.agent, stored.run_id, what, age(stored.created_at))
    out.print(table)


def show(run_id: Annotated[str, typer.Argument(help="The run's id.")]) -> None:
    """Show a run: its status, its transcript turn by turn, and its requests."""

    async def load(client: DurableClient) -> tuple[Any, RunResult, list[Any]]:
        row = await asyncio.to_thread(get_run, client.db, run_id)
        result = await client.result(run_id)
        requests = await client.requests(None, run_id=run_id)
        return row, result, requests

    row, result, requests = run_with_client(load)
    out = console()
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
    for stored in reversed(requests):  # oldest first, as in the transcript
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
    decline: Annotated[
        str | None, typer.Option(help="Decline the request; each call gets this reason.")
    ] = None,
    partial: Annotated[
        bool, typer.Option(help="Keep these results; the request stays open for the rest.")
    ] = False,
    answered_by: Annotated[
        str | None,
        typer.Option("--as", help="Who answers, as recorded. [default: the OS user]"),
    ] = None,
) -> None:
    """Answer an open request (exactly one of --output, --results, --decline); the run goes on."""
    given = sum(1 for v in (output, results, decline) if v is not None)
    if given != 1:
        fail(f"give exactly one of --output, --results, --decline (got {given})")
    if output is not None:
        reply = answer_output(request_id, output)
    elif results is not None:
        reply = relay_answer(request_id, _results_file(results))
    else:
        reply = answer_declined(request_id, decline or "declined")
    who = answered_by or _os_user()

    async def submit(client: DurableClient) -> tuple[str, str]:
        run_id = await client.submit_answer(reply, answered_by=who, partial=partial)
        stored = await asyncio.to_thread(get_request, client.db, request_id)
        return run_id, stored.status

    run_id, status = run_with_client(submit)
    out = console()
    if status == "open":
        out.print(f"recorded partial results for {request_id}; it stays open for the other calls")
    else:
        verb = "declined" if not reply.ok else "answered"
        out.print(f"{verb} {request_id} as {who}; run {run_id} goes on (relayq show {run_id})")


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


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "unknown"


def cancel(run_id: Annotated[str, typer.Argument(help="The run's id.")]) -> None:
    """Cancel a run: a queued or pending one stops now, a running one at its next step."""

    async def stop(client: DurableClient) -> str:
        before = await asyncio.to_thread(get_run, client.db, run_id)
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
) -> None:
    """List runs, newest first."""
    if status is not None and status not in STATUSES:
        fail(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    rows = run_with_client(lambda c: c.runs(status, agent=agent, limit=limit))
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
