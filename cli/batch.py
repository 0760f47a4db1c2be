"""`relayq batch`: one run per line of a JSONL file, followed to the end, resumable.

Next to the output sits a state file (`results.jsonl.runs`) mapping each job id
to its run id, written as soon as the runs are started. Running the same
command again re-attaches to those runs instead of starting them again, so an
interrupted batch (Ctrl-C, a closed laptop, --timeout) picks up where it was.

The command is here; its files (jobs, state, results) are `cli.batch_files`'s, and
following its runs to the end `cli.batch_watch`'s.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli._common import (
    OverBudget,
    budget_of,
    check_broker,
    fail,
    known_agent,
    run_with_client,
    settings,
    warn_if_no_worker,
)
from cli.approvals import os_user
from cli.batch_files import (
    Job,
    check_prompts,
    load_sidecar,
    read_jobs,
    save_sidecar,
    sidecar_of,
)
from cli.batch_watch import watch
from cli.render import plural
from relayq import new_id
from store import FINISHED, RunRow
from tasks.client.client import DurableClient

__all__ = ["Job", "batch", "read_jobs", "sidecar_of"]


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
    name: Annotated[
        str | None,
        typer.Option(help="What the batch is known by; by default the jobs file's name."),
    ] = None,
    new: Annotated[
        bool,
        typer.Option("--new", help="Start a new batch even where one of this name ran."),
    ] = False,
) -> None:
    """Run an agent once per job and write each job's outcome.

    The file is checked whole before any run starts. Runs pending on a request
    keep the batch waiting until they are answered (`relayq pending`). Results
    are {"id", "run_id", "status", "text", "error"}. Re-running the same command
    starts nothing for jobs already started (state in OUTPUT.runs). A batch is
    known by its name (--name, by default the jobs file's): a start under another
    output resumes the batch of that name, and is refused where it ran every job
    already, unless --new. Exits 0 when every job is done, 1 otherwise.

    Budgets (--max-tokens, --max-cost for the batch; --run-max-* for each run): past
    one, a run asks for more with a `budget` request, one for the whole batch, or
    with --over-budget end, ends over_budget.
    """
    budget = budget_of(max_tokens, max_cost, over_budget, what="--max")
    run_budget = budget_of(run_max_tokens, run_max_cost, over_budget, what="--run-max")
    jobs = read_jobs(jobs_file)
    current = settings()
    known_agent(agent, current)
    check_prompts(jobs_file, jobs, agent=agent, max_bytes=current.max_answer_bytes)
    check_broker(current)  # one line and exit 1, before anything is written
    sidecar = sidecar_of(output)
    batch_id, runs = (None, {}) if new else load_sidecar(sidecar, agent)
    legacy = bool(runs) and batch_id is None  # runs started before batches were records
    known_as = name or jobs_file.name
    err = Console(stderr=True, highlight=False)

    async def go(client: DurableClient) -> dict[str, RunRow]:
        nonlocal batch_id
        if batch_id is None:
            batch_id = await _batch_named(
                client, agent, known_as, jobs, new=new, restart=restart_changed, err=err
            )
            # Named before anything starts: a crash after starting finds the same batch again.
            save_sidecar(sidecar, agent, batch_id, runs)
        todo = [job for job in jobs if not (legacy and job.key in runs)]
        started = await client.start_batch(
            agent,
            [(job.key, job.prompt) for job in todo],
            batch_id=batch_id,
            name=known_as,
            started_by=f"cli:{os_user()}",
            restart_changed=restart_changed,
            budget=budget,
            run_budget=run_budget,
        )
        runs.update(started.runs)
        save_sidecar(sidecar, agent, batch_id, runs)
        fresh, before = len(started.started), len(jobs) - len(started.started)
        err.print(
            f"batch {batch_id}: {len(jobs)} {plural(len(jobs), 'job')}: "
            f"{fresh} started, {before} already started"
        )
        if started.started:  # say at once when nothing will take them
            await client.store.offload(
                warn_if_no_worker, agent, current, db=client.db, batches=True
            )
        return await watch(client, jobs, runs, output, timeout=timeout, err=err)

    states = run_with_client(go, current)
    _verdict(jobs, runs, states, output, timeout)


async def _batch_named(
    client: DurableClient,
    agent: str,
    name: str,
    jobs: list[Job],
    *,
    new: bool,
    restart: bool,
    err: Console,
) -> str:
    """The id of the batch `name` to start or resume: the newest of that name unless `new`.
    Exits naming it where that batch has run every job of the file to its end already."""
    store = client.store
    found = None if new else await store.find_batch(agent=agent, name=name)
    if found is None:
        return new_id("batch")
    batch_id = found.batch.id
    prompts = await store.batch_prompts(batch_id)
    other = next((job for job in jobs if prompts.get(job.key, job.prompt) != job.prompt), None)
    if other is not None and not restart:
        fail(
            f"batch {name!r} ({batch_id}) ran job {other.key!r} with another prompt: "
            "--name or --new for a batch of its own, --restart-changed to run it anew there"
        )
    ran = {row.job_id: row.status for row in await store.batch_results(batch_id)}
    if other is None and all(ran.get(job.key) in FINISHED for job in jobs):
        statuses = ", ".join(f"{n:,} {s}" for s, n in sorted(Counter(ran.values()).items()))
        every = "its one job" if len(jobs) == 1 else f"all {len(jobs):,} jobs"
        fail(
            f"batch {name!r} ({batch_id}) has run {every} of the file to its end already "
            f"({statuses}); for its results: relayq batch export {batch_id}; to run "
            "them again as a new batch: --new (or another --name)"
        )
    err.print(f"batch {name!r} ({batch_id}) was started before: resuming it")
    return batch_id


def _verdict(
    jobs: list[Job],
    runs: dict[str, str],
    states: dict[str, RunRow],
    output: Path,
    timeout: float | None,
) -> None:
    statuses = [states[runs[job.key]].status for job in jobs]
    summary = ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))
    total = len(jobs)
    typer.echo(f"{total} {plural(total, 'job')}: {summary}; results in {output}")
    unfinished = sum(1 for s in statuses if s not in FINISHED)
    if unfinished:
        fail(
            f"{unfinished} of {total} {plural(total, 'run')} not finished after "
            f"{timeout or 0:g} s; run the same command again to wait on them"
        )
    not_done = sum(1 for s in statuses if s != "done")
    if not_done:
        fail(f"{not_done} of {total} {plural(total, 'run')} did not end done; see {output}")
