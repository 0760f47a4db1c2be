"""`relayq batch`: one run per line of a JSONL file, followed to the end, resumable.

Next to the output sits a state file (`results.jsonl.runs`) mapping each job id
to its run id, written as soon as the runs are started. Running the same
command again re-attaches to those runs instead of starting them again, so an
interrupted batch (Ctrl-C, a closed laptop, --timeout) picks up where it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlmodel import col, select

from cli._common import (
    OverBudget,
    budget_of,
    check_broker,
    fail,
    known_agent,
    run_with_client,
    settings,
    user_errors,
    warn_if_no_worker,
)
from cli.approvals import os_user
from relayq._types import new_id
from relayq.limits import check_run_input
from store import FINISHED, Database, RunRow, result_of
from tasks.client import DurableClient

__all__ = ["Job", "batch", "read_jobs", "sidecar_of"]

# Ids per query when reading the runs' states (SQLite caps bound parameters).
CHUNK = 500


@dataclass(frozen=True, kw_only=True)
class Job:
    line: int
    """Where the job sits in the input file, from 1."""
    id: str | int
    """The job's id as given; `key` is its string form."""
    prompt: str

    @property
    def key(self) -> str:
        return str(self.id)


def read_jobs(path: Path) -> list[Job]:
    """Every job of a JSONL file, or a one-line error naming the first bad line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        job = _job(path, number, text)
        if job.key in seen:
            fail(f"{path} line {number}: duplicate id {job.id!r} (first on line {seen[job.key]})")
        seen[job.key] = number
        jobs.append(job)
    if not jobs:
        fail(f"{path} holds no jobs")
    return jobs


def _job(path: Path, number: int, text: str) -> Job:
    where = f"{path} line {number}"
    try:
        item = json.loads(text)
    except ValueError as exc:
        fail(f"{where}: not valid JSON ({exc})")
    if not isinstance(item, dict):
        fail(f'{where}: expected an object like {{"id": ..., "prompt": ...}}')
    job_id, prompt = item.get("id"), item.get("prompt")
    if job_id is None:
        fail(f'{where}: missing "id"')
    if isinstance(job_id, bool) or not isinstance(job_id, str | int) or job_id == "":
        fail(f'{where}: "id" must be a non-empty string or an integer')
    if prompt is None:
        fail(f'{where}: missing "prompt"')
    if not isinstance(prompt, str) or not prompt.strip():
        fail(f'{where}: "prompt" must be a non-empty string')
    return Job(line=number, id=job_id, prompt=prompt)


def sidecar_of(output: Path) -> Path:
    """The state file that makes a batch resumable: job id -> run id."""
    return output.with_name(output.name + ".runs")


def _load_sidecar(path: Path, agent: str) -> tuple[str | None, dict[str, str]]:
    """The batch's id (None for a new batch, or a state file older than batch records)
    and the runs it started, by job id."""
    if not path.exists():
        return None, {}
    try:
        state = json.loads(path.read_text())
        known = state["runs"]
        if not isinstance(known, dict):
            raise TypeError("runs is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"cannot read the batch state {path} ({exc}); delete it to start the batch over")
    if state.get("agent") != agent:
        fail(
            f"{path} records a batch of agent {state.get('agent')!r}, not {agent!r}; "
            "use another output file or delete it to start over"
        )
    batch_id = state.get("batch")
    runs = {str(k): str(v) for k, v in known.items()}
    return (batch_id if isinstance(batch_id, str) and batch_id else None), runs


def _write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _save_sidecar(path: Path, agent: str, batch_id: str, runs: dict[str, str]) -> None:
    state = {"agent": agent, "batch": batch_id, "runs": runs}
    _write_atomically(path, json.dumps(state, indent=1) + "\n")


def batch(
    agent: Annotated[str, typer.Argument(help="A registered agent (see RELAYQ_AGENTS).")],
    jobs_file: Annotated[
        Path,
        typer.Argument(
            metavar="JOBS.jsonl", help='One job a line: {"id": ..., "prompt": ...}.', dir_okay=False
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Where the results go, one JSON line per job in input order."
        ),
    ],
    timeout: Annotated[
        float | None,
        typer.Option(help="Stop waiting after this many seconds; re-run to wait on."),
    ] = None,
    restart_changed: Annotated[
        bool,
        typer.Option(
            "--restart-changed",
            help="Start anew the jobs whose prompt changed since their run started.",
        ),
    ] = False,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", help="The most tokens all the batch's runs may spend."),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option("--max-cost", help="The most all the batch's runs may cost."),
    ] = None,
    run_max_tokens: Annotated[
        int | None, typer.Option("--run-max-tokens", help="The most tokens each run may spend.")
    ] = None,
    run_max_cost: Annotated[
        float | None, typer.Option("--run-max-cost", help="The most each run may cost.")
    ] = None,
    over_budget: OverBudget = "ask",
) -> None:
    """Run an agent once per job and write each job's outcome.

    The file is checked whole before any run starts. Runs pending on a request
    keep the batch waiting until they are answered (`relayq pending`). Results
    are {"id", "run_id", "status", "text", "error"}. Re-running the same command
    starts nothing for jobs already started (state in OUTPUT.runs). Exits 0 when
    every job is done, 1 otherwise.

    Budgets (--max-tokens, --max-cost for the batch; --run-max-* for each run): past
    one, a run asks for more with a `budget` request, one for the whole batch, or
    with --over-budget end, ends over_budget.
    """
    budget = budget_of(max_tokens, max_cost, over_budget, what="--max")
    run_budget = budget_of(run_max_tokens, run_max_cost, over_budget, what="--run-max")
    jobs = read_jobs(jobs_file)
    current = settings()
    known_agent(agent, current)
    with user_errors():  # a prompt the store cannot keep: one line, nothing written
        check_run_input(
            agent=agent, prompts=[job.prompt for job in jobs], max_bytes=current.max_answer_bytes
        )
    check_broker(current)  # one line and exit 1, before anything is written
    sidecar = sidecar_of(output)
    batch_id, runs = _load_sidecar(sidecar, agent)
    legacy = bool(runs) and batch_id is None  # runs started before batches were records
    if batch_id is None:
        # Named before anything starts: a crash after starting finds the same batch again.
        batch_id = new_id("batch")
        _save_sidecar(sidecar, agent, batch_id, runs)
    err = Console(stderr=True, highlight=False)

    async def go(client: DurableClient) -> dict[str, RunRow]:
        todo = [job for job in jobs if not (legacy and job.key in runs)]
        started = await client.start_batch(
            agent,
            [(job.key, job.prompt) for job in todo],
            batch_id=batch_id,
            started_by=f"cli:{os_user()}",
            restart_changed=restart_changed,
            budget=budget,
            run_budget=run_budget,
        )
        runs.update(started.runs)
        _save_sidecar(sidecar, agent, batch_id, runs)
        fresh, before = len(started.started), len(jobs) - len(started.started)
        err.print(f"batch {batch_id}: {len(jobs)} jobs: {fresh} started, {before} already started")
        if started.started:  # say at once when nothing will take them
            await asyncio.to_thread(warn_if_no_worker, agent, current, db=client.db, batches=True)
        return await _watch(client.db, jobs, runs, output, timeout=timeout, err=err)

    states = run_with_client(go, current)
    _verdict(jobs, runs, states, output, timeout)


async def _watch(
    db: Database,
    jobs: list[Job],
    runs: dict[str, str],
    output: Path,
    *,
    timeout: float | None,
    err: Console,
) -> dict[str, RunRow]:
    """Poll the runs until all have finished or `timeout`; the results are written either way."""
    ids = [runs[job.key] for job in jobs]
    started = time.monotonic()
    next_line = started
    deadline = None if timeout is None else started + timeout
    states: dict[str, RunRow] = {}
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("done {task.fields[done]}  pending {task.fields[pending]}  "),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=err) as progress:
            bar = progress.add_task("batch", total=len(ids), done=0, pending=0, failed=0)
            delay = 0.05
            while True:
                states = await asyncio.to_thread(_states, db, ids)
                counts = _counts(states.values())
                progress.update(
                    bar,
                    completed=counts["finished"],
                    done=counts["done"],
                    pending=counts["pending"],
                    failed=counts["failed"],
                )
                if not err.is_terminal and time.monotonic() >= next_line:
                    # No bar where nobody sees one redraw (a log, CI): a line now and then.
                    next_line = time.monotonic() + _progress_every()
                    err.print(_progress_line(counts, len(ids), started))
                if counts["finished"] == len(ids):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 1.0)
    finally:
        if states:
            _write_results(output, jobs, runs, states)
    return states


def _progress_every() -> float:
    """Seconds between progress lines when stderr is no terminal: RELAYQ_PROGRESS_SECONDS."""
    try:
        return max(float(os.environ.get("RELAYQ_PROGRESS_SECONDS", "10")), 0.1)
    except ValueError:
        fail("RELAYQ_PROGRESS_SECONDS must be a number of seconds")


def _progress_line(counts: dict[str, int], total: int, started: float) -> str:
    elapsed = time.monotonic() - started
    rate = counts["finished"] / elapsed if elapsed > 0 else 0.0
    return (
        f"batch: {counts['finished']}/{total} finished (done {counts['done']}, "
        f"pending {counts['pending']}, failed {counts['failed']}), "
        f"{rate:.1f} runs/s, {elapsed:.0f} s"
    )


def _states(db: Database, ids: list[str]) -> dict[str, RunRow]:
    found: dict[str, RunRow] = {}
    with db.read() as s:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            found.update((r.id, r) for r in s.exec(select(RunRow).where(col(RunRow.id).in_(chunk))))
    missing = [i for i in ids if i not in found]
    if missing:
        fail(
            f"the store holds no run {missing[0]} (and {len(missing) - 1} more) that the batch "
            "state names; delete the .runs file next to the output to start over"
        )
    return found


def _counts(rows: Any) -> dict[str, int]:
    counts = {"finished": 0, "done": 0, "pending": 0, "failed": 0}
    for row in rows:
        if row.status in FINISHED:
            counts["finished"] += 1
            counts["done" if row.status == "done" else "failed"] += 1
        elif row.status == "pending":
            counts["pending"] += 1
    return counts


def _write_results(
    output: Path, jobs: list[Job], runs: dict[str, str], states: dict[str, RunRow]
) -> None:
    lines = []
    for job in jobs:
        result = result_of(states[runs[job.key]], job.id)  # the id as the input gave it
        lines.append(json.dumps(result, ensure_ascii=False))
    _write_atomically(output, "\n".join(lines) + "\n")


def _verdict(
    jobs: list[Job],
    runs: dict[str, str],
    states: dict[str, RunRow],
    output: Path,
    timeout: float | None,
) -> None:
    statuses = [states[runs[job.key]].status for job in jobs]
    summary = ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))
    typer.echo(f"{len(jobs)} jobs: {summary}; results in {output}")
    unfinished = sum(1 for s in statuses if s not in FINISHED)
    if unfinished:
        fail(
            f"{unfinished} of {len(jobs)} runs not finished after {timeout or 0:g} s; "
            "run the same command again to wait on them"
        )
    not_done = sum(1 for s in statuses if s != "done")
    if not_done:
        fail(f"{not_done} of {len(jobs)} runs did not end done; see {output}")
