"""The run commands: start and follow a run, list runs, show and cancel one.

The request commands (`pending`, `answer`) are `cli.request_commands`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli._common import (
    MaxCost,
    MaxTokens,
    OverBudget,
    WorkerWatch,
    budget_of,
    check_broker,
    console,
    fail,
    known_agent,
    run_with_client,
    settings,
)
from cli.approvals import os_user
from cli.render import MessagePrinter, age, clip, print_pending, status_style
from relayq import RunResult
from store import FINISHED, RunRow, StoredRequest
from store.queries import RunSummary
from store.transitions import STATUSES
from tasks.client.client import DurableClient, WaitTimeout

__all__ = ["cancel", "run", "runs", "show"]


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
        status, done = await client.store.settled(run_id)
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
            asked = await client.request(run_id)
        the_run = run_id if asked is None else asked.run_id
        row = await client.store.get_run(the_run)
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


def cancel(run_id: Annotated[str, typer.Argument(help="The run's id.")]) -> None:
    """Cancel a run: a queued or pending one stops now, a running one at its next step."""

    async def stop(client: DurableClient) -> str:
        before = await client.store.get_run(run_id)
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
