"""Following a batch's runs until all have finished or the timeout: a progress bar (lines
where stderr is no terminal), woken by the workers' announcements of the runs that can
move; the results are written either way."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlmodel import col, select

from cli._common import fail
from cli.batch_files import Job, write_results
from store import FINISHED, Database, RunRow
from tasks.client.client import DurableClient

__all__ = ["watch"]

# Ids per query when reading the runs' states (SQLite caps bound parameters).
CHUNK = 500


async def watch(
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
        write_results(output, jobs, runs, states)
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
