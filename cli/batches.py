"""`relayq batches` and `relayq batch status | cancel | export ID`: batches as the store keeps them.

`relayq batch AGENT JOBS.jsonl -o OUT` (cli.batch) starts or resumes one; the
group below sends every other first word to that command, so an agent may be
called anything but `status`, `cancel` or `export`.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from cli._common import console, run_with_client, settings
from cli.render import plural
from relayq import Budget
from store import (
    BatchStatus,
    result_of,
)
from tasks.broker.circuit import CircuitView, batch_waits, since_text

__all__ = ["BatchGroup", "batches", "cancel", "export", "status", "status_of"]


class BatchGroup(TyperGroup):
    """`relayq batch AGENT ...` is `relayq batch start AGENT ...`."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:  # click vendored by typer
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["start", *args]
        return super().resolve_command(ctx, args)


def status_of(found: BatchStatus) -> dict[str, Any]:
    return found.to_wire(datetime.now(UTC))


def _wait_of(view: CircuitView) -> dict[str, Any]:
    """A circuit the batch's runs wait for, as `--json` shows it."""
    return {
        "provider": view.provider,
        "since": datetime.fromtimestamp(view.batch_since or 0, UTC).isoformat(),
        "circuit": view.state,
        "openedAt": datetime.fromtimestamp(view.opened_at, UTC).isoformat(),
        "kind": view.kind,
        "runsWaiting": view.waiting,
    }


def batches(
    agent: Annotated[str | None, typer.Option(help="Only this agent's batches.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Batches to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """Batches, newest first, with where each stands."""
    found = run_with_client(lambda client: client.store.list_batches(agent=agent, limit=limit))
    out = console()
    if as_json:
        out.print_json(json.dumps({"items": [status_of(b) for b in found]}))
        return
    table = Table(
        "batch",
        "name",
        "agent",
        "created",
        "jobs",
        "finished",
        "done",
        "failed",
        "cancelled",
        "waiting on a person",
    )
    for b in found:
        done, cancelled = b.counts.get("done", 0), b.counts.get("cancelled", 0)
        table.add_row(
            b.batch.id,
            b.batch.name or "-",
            b.batch.agent,
            b.batch.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(b.total),
            str(b.finished),
            str(done),
            str(b.finished - done - cancelled),
            str(cancelled),
            str(b.waiting_on_people),
        )
    out.print(table if found else "No batch yet.")


def status(
    batch_id: Annotated[str, typer.Argument(help="The batch's id (`relayq batches`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """Where one batch stands: runs by status, open requests, tokens, cost, budget, rate, ETA."""
    found = status_of(run_with_client(lambda client: client.store.batch_status(batch_id)))
    waits = batch_waits(settings(), batch_id)
    found["waitingOn"] = [_wait_of(view) for view in waits]
    out = console()
    if as_json:
        out.print_json(json.dumps(found))
        return
    counts = ", ".join(f"{n} {s}" for s, n in sorted(found["counts"].items())) or "no runs"
    rate = "-" if found["perMinute"] is None else f"{found['perMinute']:g} runs/min"
    eta = "-" if found["etaSeconds"] is None else f"{found['etaSeconds']} s"
    waiting = found["waitingOnPeople"]
    if waiting and found["etaSeconds"]:
        eta += " for the runs not waiting on a person"
    out.print(f"batch {found['id']} of agent {found['agent']}, created {found['createdAt']}")
    jobs, open_requests, tokens = found["jobs"], found["openRequests"], found["tokens"]
    out.print(f"{jobs} {plural(jobs, 'job')}: {counts}")
    out.print(
        f"{open_requests} open {plural(open_requests, 'request')}; "
        f"{tokens:,} {plural(tokens, 'token')}; cost {found['cost']:g}"
    )
    if found["budget"]:
        limits = Budget.model_validate(found["budget"]).describe()
        state = "; over budget: raising it was declined" if found["overBudget"] else ""
        out.print(f"budget {limits}{state}")
    for view in waits:
        out.print(
            f"waiting on provider {view.provider} since {since_text(view.batch_since or 0)}: "
            f"its circuit is {view.state.replace('_', '-')} ({view.kind}), "
            f"{view.waiting} {plural(view.waiting, 'run waits', 'runs wait')} for it"
        )
    if waiting:
        runs = "1 run waits" if waiting == 1 else f"{waiting:,} runs wait"
        still = "; nothing else can move until they are answered" if not found["moving"] else ""
        out.print(
            f"{runs} on a person{still}: answer in the inbox or with relayq pending "
            "and relayq answer"
        )
    out.print(f"rate {rate}; eta {eta}")
    if found["cancelledAt"]:
        out.print(f"cancelled at {found['cancelledAt']}")


def cancel(
    batch_id: Annotated[str, typer.Argument(help="The batch's id (`relayq batches`).")],
) -> None:
    """Cancel every unfinished run of the batch (running ones stop at their next step)."""
    asked = run_with_client(lambda client: client.cancel_batch(batch_id))
    done = ", ".join(f"{n} {s}" for s, n in sorted(asked.items())) or "none unfinished"
    cancelled = sum(asked.values())
    console().print(f"batch {batch_id}: cancelled {cancelled} {plural(cancelled, 'run')} ({done})")


def export(
    batch_id: Annotated[str, typer.Argument(help="The batch's id (`relayq batches`).")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """The batch's results as JSON lines in the input's order: {id, run_id, status, text, error}."""
    rows = run_with_client(lambda client: client.store.batch_results(batch_id))
    lines = [json.dumps(result_of(r), ensure_ascii=False) for r in rows]
    text = "".join(f"{line}\n" for line in lines)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
