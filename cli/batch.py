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
from collections import Counter
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
from cli.render import plural
from relayq import new_id
from relayq.limits import (
    MAX_ANSWER_BYTES_ENV,
    InputTooLarge,
    UnstorableInput,
    check_run_input,
    problem_of,
)
from store import (
    FINISHED,
    Database,
    RunRow,
    batch_prompts,
    batch_results,
    find_batch,
    result_of,
)
from tasks.host.client import DurableClient

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
    """Every job of a JSONL file, or a one-line error naming the first bad line
    (`JOBS.jsonl:LINE`, from 1) and its job's id where it has one. A prompt's size
    is checked by `_check_prompts`, once the settings are read."""
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
            first = f"{path}:{seen[job.key]}"
            fail(f"{path}:{number}: {_named(job.id)}: duplicate id, first on {first}")
        seen[job.key] = number
        jobs.append(job)
    if not jobs:
        fail(f"{path} holds no jobs")
    return jobs


def _job(path: Path, number: int, text: str) -> Job:
    where = f"{path}:{number}"
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
    if isinstance(job_id, str) and (problem := problem_of(job_id)) is not None:
        fail(f'{where}: "id" {problem}')  # the store keeps it as text, as it does a prompt
    if prompt is None:
        fail(f'{where}: {_named(job_id)}: missing "prompt"')
    if not isinstance(prompt, str) or not prompt.strip():
        fail(f'{where}: {_named(job_id)}: "prompt" must be a non-empty string')
    if (problem := problem_of(prompt)) is not None:
        fail(f"{where}: {_named(job_id)}: its prompt {problem}")
    return Job(line=number, id=job_id, prompt=prompt)


def _named(job_id: str | int) -> str:
    """`job 'a'`, `job 7`: a job by its id as the file gave it, cut short if long."""
    shown = repr(job_id)
    return f"job {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _check_prompts(path: Path, jobs: list[Job], *, agent: str, max_bytes: int) -> None:
    """Every job's prompt within the limit on prompts (`max_bytes` of JSON: the setting
    RELAYQ_MAX_ANSWER_BYTES, which bounds prompts as it does answers), or a one-line error
    naming the first that is over: its line of `path` and its job."""
    with user_errors():  # the agent's name: the store keeps it as text too
        check_run_input(agent=agent, prompts=[], max_bytes=max_bytes)
    for job in jobs:
        try:
            check_run_input(agent=agent, prompts=[job.prompt], max_bytes=max_bytes)
        except InputTooLarge as exc:
            fail(
                f"{path}:{job.line}: {_named(job.id)}: its prompt is over the limit of "
                f"{exc.limit} bytes of JSON ({MAX_ANSWER_BYTES_ENV}, the limit on prompts "
                "as on answers)"
            )
        except UnstorableInput as exc:  # what `_job` did not already refuse
            fail(f"{path}:{job.line}: {_named(job.id)}: {exc}")


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
    _check_prompts(jobs_file, jobs, agent=agent, max_bytes=current.max_answer_bytes)
    check_broker(current)  # one line and exit 1, before anything is written
    sidecar = sidecar_of(output)
    batch_id, runs = (None, {}) if new else _load_sidecar(sidecar, agent)
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
            _save_sidecar(sidecar, agent, batch_id, runs)
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
        _save_sidecar(sidecar, agent, batch_id, runs)
        fresh, before = len(started.started), len(jobs) - len(started.started)
        err.print(
            f"batch {batch_id}: {len(jobs)} {plural(len(jobs), 'job')}: "
            f"{fresh} started, {before} already started"
        )
        if started.started:  # say at once when nothing will take them
            await client.store.offload(
                warn_if_no_worker, agent, current, db=client.db, batches=True
            )
        return await _watch(client, jobs, runs, output, timeout=timeout, err=err)

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
    store, db = client.store, client.db
    found = None if new else await store.offload(find_batch, db, agent=agent, name=name)
    if found is None:
        return new_id("batch")
    batch_id = found.batch.id
    prompts = await store.offload(batch_prompts, db, batch_id)
    other = next((job for job in jobs if prompts.get(job.key, job.prompt) != job.prompt), None)
    if other is not None and not restart:
        fail(
            f"batch {name!r} ({batch_id}) ran job {other.key!r} with another prompt: "
            "--name or --new for a batch of its own, --restart-changed to run it anew there"
        )
    ran = {row.job_id: row.status for row in await store.offload(batch_results, db, batch_id)}
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


async def _watch(
    client: DurableClient,
    jobs: list[Job],
    runs: dict[str, str],
    output: Path,
    *,
    timeout: float | None,
    err: Console,
) -> dict[str, RunRow]:
    """Follow the runs until all have finished or `timeout`; the results are written either
    way. Woken by the workers' announcements (`DurableClient.settled`) of the runs
    that can move; runs waiting on a person are read again now and then, in one light query."""
    db = client.db
    ids = [runs[job.key] for job in jobs]
    started = time.monotonic()
    next_line = started
    deadline = None if timeout is None else started + timeout
    statuses = await client.store.offload(_statuses, db, ids)
    at_start = _counts(statuses.values())["finished"]
    told_where = False
    waits: dict[str, asyncio.Future[Any]] = {}
    states: dict[str, RunRow] = {}
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("done {task.fields[done]}  waiting on a person {task.fields[pending]}  "),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=err) as progress:
            bar = progress.add_task("batch", total=len(ids), done=0, pending=0, failed=0)
            while True:
                counts = _counts(statuses.values())
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
                    err.print(_progress_line(counts, len(ids), started, at_start), soft_wrap=True)
                if counts["finished"] == len(ids):
                    break
                if counts["pending"] and not told_where and counts["moving"] == 0:
                    told_where = True
                    err.print(_where_to_answer(counts["pending"]), soft_wrap=True)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                moving = [i for i, status in statuses.items() if _can_move(status)]
                await _next_change(client, moving, waits, _pause(counts, left))
                statuses = await client.store.offload(_statuses, db, ids)
    finally:
        for wait in waits.values():
            wait.cancel()
        states = await client.store.offload(_states, db, ids)
        _write_results(output, jobs, runs, states)
    return states


def _can_move(status: str) -> bool:
    return status not in FINISHED and status != "pending"


async def _next_change(
    client: DurableClient, moving: list[str], waits: dict[str, asyncio.Future[Any]], pause: float
) -> None:
    """Return once one of the runs that can move has settled (announced by its worker), or
    after `pause`: a run waiting on a person moves when someone answers, unannounced here."""
    for run_id in moving:
        if run_id not in waits:
            waits[run_id] = asyncio.ensure_future(client.settled(run_id))
    started = time.monotonic()
    if waits:
        await asyncio.wait(list(waits.values()), timeout=pause, return_when="FIRST_COMPLETED")
        # Runs settle in bursts: one read for all that settle within the next moment,
        # not one read of every run for each of them.
        await asyncio.sleep(max(0.0, min(pause, GATHER) - (time.monotonic() - started)))
    else:
        await asyncio.sleep(pause)
    for run_id in [r for r, wait in waits.items() if wait.done()]:
        # Its outcome is read with the others' statuses next; a failed wait is read so too.
        waits.pop(run_id).exception()


GATHER = 0.5
"""Seconds at least between two reads of the runs' statuses, however many settle."""
POLL_PEOPLE = 2.0
"""Seconds between reads while every unfinished run waits on a person."""


def _pause(counts: dict[str, int], left: float | None) -> float:
    """How long to wait for a change before reading the runs again."""
    pause = _progress_every() if counts["moving"] else min(_progress_every(), POLL_PEOPLE)
    return pause if left is None else max(0.0, min(pause, left))


def _where_to_answer(waiting: int) -> str:
    runs = "1 run waits" if waiting == 1 else f"{waiting:,} runs wait"
    return (
        f"{runs} on a person: answer in the inbox (relayq api) or with relayq pending "
        "and relayq answer; the batch goes on as they are answered"
    )


def _progress_every() -> float:
    """Seconds between progress lines when stderr is no terminal: RELAYQ_PROGRESS_SECONDS."""
    try:
        return max(float(os.environ.get("RELAYQ_PROGRESS_SECONDS", "10")), 0.1)
    except ValueError:
        fail("RELAYQ_PROGRESS_SECONDS must be a number of seconds")


def _progress_line(counts: dict[str, int], total: int, started: float, at_start: int) -> str:
    """One line of where the batch stands; a rate only of the runs that finished while this
    watched (not those a rerun found finished), and none while nothing can move."""
    elapsed = time.monotonic() - started
    line = (
        f"batch: {counts['finished']}/{total} finished (done {counts['done']}, "
        f"waiting on a person {counts['pending']}, failed {counts['failed']})"
    )
    moved = counts["finished"] - at_start
    if counts["moving"] == 0 and counts["finished"] < total:
        return f"{line}, nothing can move until a person answers, {elapsed:.0f} s"
    if moved > 0 and elapsed > 0:
        line += f", {moved / elapsed:.1f} runs/s"
    return f"{line}, {elapsed:.0f} s"


def _statuses(db: Database, ids: list[str]) -> dict[str, str]:
    """Each run's status: the watch's read, light enough to repeat for thousands of runs."""
    found: dict[str, str] = {}
    with db.read() as s:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            query = select(RunRow.id, RunRow.status).where(col(RunRow.id).in_(chunk))
            found.update((str(i), str(status)) for i, status in s.exec(query))
    _all_there(ids, found)
    return found


def _states(db: Database, ids: list[str]) -> dict[str, RunRow]:
    found: dict[str, RunRow] = {}
    with db.read() as s:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            found.update((r.id, r) for r in s.exec(select(RunRow).where(col(RunRow.id).in_(chunk))))
    _all_there(ids, found)
    return found


def _all_there(ids: list[str], found: dict[str, Any]) -> None:
    missing = [i for i in ids if i not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        fail(
            f"the store holds no run {missing[0]}{more} that the batch "
            "state names; delete the .runs file next to the output to start over"
        )


def _counts(statuses: Any) -> dict[str, int]:
    """Runs finished (done, or failed: any other end), waiting on a person, and moving."""
    counts = {"finished": 0, "done": 0, "pending": 0, "failed": 0, "moving": 0}
    for status in statuses:
        if status in FINISHED:
            counts["finished"] += 1
            counts["done" if status == "done" else "failed"] += 1
        elif status == "pending":
            counts["pending"] += 1
        else:
            counts["moving"] += 1
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
