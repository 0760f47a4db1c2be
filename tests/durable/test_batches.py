"""Batches as records: a job never starts twice, a changed prompt is named, status, cancel,
export; through the CLI, real workers behind it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import func, select
from typer.testing import CliRunner, Result

from cli.approvals import os_user
from cli.main import app
from store import (
    Database,
    JobChanged,
    RunRow,
    RunSpec,
    batch_results,
    batch_status,
    cancel_batch,
    list_requests,
    migrate,
    start_batch,
)
from tests import forkserver

from .conftest import ROOT, SUBMITTER, VIEWER, ApiServer, Durable, Eventually, unique_name
from .desk import refund_prompt
from .test_api import log_in
from .test_cli import cli, one_error_line, read_results, settle, write_jobs

__all__ = ["cli"]  # the fixture, shared with test_cli


def jobs_file(tmp_path: Path, tag: str, n: int = 3) -> Path:
    return write_jobs(
        tmp_path / unique_name("jobs.jsonl"),
        [{"id": f"j{i}", "prompt": f"{tag} {i}"} for i in range(n)],
    )


def runs_of(durable: Durable, batch_id: str) -> list[RunRow]:
    db = durable.db()
    try:
        return batch_results(db, batch_id)
    finally:
        db.dispose()


def test_a_batch_is_a_record_with_status_and_an_export_in_input_order(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given a batch of three jobs, run to the end
    tag = uuid.uuid4().hex
    output = tmp_path / "out.jsonl"
    done = cli("batch", "recall", str(jobs_file(tmp_path, tag)), "-o", str(output))
    assert done.exit_code == 0, done.output
    batch_id = json.loads((tmp_path / "out.jsonl.runs").read_text())["batch"]

    # When its status, the list of batches and its export are asked for
    status = cli("batch", "status", batch_id, "--json")
    listed = cli("batches", "--agent", "recall", "--json")
    exported = cli("batch", "export", batch_id)

    # Then the store knows it: three jobs, all done, in the input's order
    assert status.exit_code == 0, status.output
    found = json.loads(status.stdout)
    assert (found["agent"], found["jobs"], found["counts"], found["finished"]) == (
        "recall",
        3,
        {"done": 3},
        3,
    )
    assert found["etaSeconds"] == 0
    assert found["startedBy"] == f"cli:{os_user()}", "who started it, as the CLI knows"
    assert {r.started_by for r in runs_of(durable, batch_id)} == {f"cli:{os_user()}"}
    assert batch_id in [b["id"] for b in json.loads(listed.stdout)["items"]]
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["id"] for line in lines] == ["j0", "j1", "j2"]
    assert lines == [{**r, "id": str(r["id"])} for r in read_results(output)]


def test_a_rerun_with_a_changed_prompt_names_the_job_unless_asked_to_start_it_anew(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    tag = uuid.uuid4().hex
    jobs, output = jobs_file(tmp_path, tag), tmp_path / "out.jsonl"
    assert cli("batch", "recall", str(jobs), "-o", str(output)).exit_code == 0
    batch_id = json.loads((tmp_path / "out.jsonl.runs").read_text())["batch"]
    first = {r.job_id: r.id for r in runs_of(durable, batch_id)}

    # When job j1's prompt changes and the batch runs again
    write_jobs(
        jobs, [{"id": f"j{i}", "prompt": f"{tag} {i}{'!' if i == 1 else ''}"} for i in range(3)]
    )
    refused = cli("batch", "recall", str(jobs), "-o", str(output))

    # Then it is refused, naming the job, and nothing started
    assert "job(s) 'j1' already ran with another prompt" in one_error_line(refused)
    assert {r.job_id: r.id for r in runs_of(durable, batch_id)} == first

    # When it is asked to start changed jobs anew
    again = cli("batch", "recall", str(jobs), "-o", str(output), "--restart-changed")

    # Then j1 alone has a new run, with the new prompt; the old one is kept, replaced
    assert again.exit_code == 0, again.output
    assert "1 started, 2 already started" in again.stderr
    now = {r.job_id: r for r in runs_of(durable, batch_id)}
    assert {j: r.id for j, r in now.items() if j != "j1"} == {"j0": first["j0"], "j2": first["j2"]}
    assert now["j1"].id != first["j1"]
    assert now["j1"].text == f"{tag} 1!"
    db = durable.db()
    with db.read() as s:
        old = s.get(RunRow, first["j1"])
    db.dispose()
    assert old is not None
    assert old.replaced_by == now["j1"].id


def test_racing_starters_of_one_batch_start_each_job_once(durable: Durable):
    # Given eight processes' worth of starters, racing to start the same new batch in
    # chunks of three jobs, so that their chunks interleave
    db = Database(durable.settings.database_url)
    batch_id = f"batch_{uuid.uuid4().hex}"
    jobs = [(f"j{i}", f"race {batch_id} {i}") for i in range(20)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        try:
            start_batch(db, RunSpec("recall", started_by="ci", batch_id=batch_id), jobs, chunk=3)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then none failed, and each job has exactly one run
    assert errors == []
    runs = batch_results(db, batch_id)
    assert sorted(r.job_id or "" for r in runs) == sorted(j for j, _ in jobs)
    with db.read() as s:
        every = s.exec(select(RunRow).where(RunRow.batch_id == batch_id)).all()
    assert len(every) == 20
    db.dispose()


@pytest.mark.timeout(120)
def test_a_batch_start_killed_between_chunks_starts_each_job_once_when_run_again(
    durable: Durable, private_database: str, tmp_path: Path
):
    # Given `relayq batch` starting 10,000 jobs on a store and a broker no worker serves
    env = {
        **durable.env,
        "RELAYQ_DATABASE_URL": private_database,
        "RELAYQ_KEY_PREFIX": durable.broker.new_prefix(),
        "COLUMNS": "250",
    }
    jobs = write_jobs(
        tmp_path / unique_name("jobs.jsonl"),
        [{"id": f"j{i}", "prompt": f"job {i}"} for i in range(10_000)],
    )
    output = tmp_path / "out.jsonl"
    db = Database(private_database)
    migrate(db)
    command = [sys.executable, "-c", "from cli.main import main; main()",
               "batch", "recall", str(jobs), "-o", str(output), "--timeout", "0.1"]  # fmt: skip
    starter = forkserver.spawn(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # When it is SIGKILLed once some chunks have committed and others not
        deadline = time.monotonic() + 60
        started = 0
        while not 0 < started < 9_000:
            assert starter.poll() is None, "the start ended before it could be killed"
            assert time.monotonic() < deadline, "no chunk committed"
            with db.read() as s:
                started = s.exec(select(func.count()).select_from(RunRow)).one()
        starter.send_signal(signal.SIGKILL)
        starter.wait()

        # Then the same command run again starts the jobs still missing, and only those:
        # every job has one run
        rerun = forkserver.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        assert "10000 jobs" in rerun.stderr, rerun.stderr
        assert f"{10_000 - started} started, {started} already started" in rerun.stderr
        with db.read() as s:
            rows = s.exec(select(RunRow.job_id, func.count()).group_by(RunRow.job_id)).all()
        assert len(rows) == 10_000
        assert {n for _, n in rows} == {1}
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        db.dispose()


def test_a_batch_of_another_agent_is_refused(durable: Durable):
    db = Database(durable.settings.database_url)
    batch_id = f"batch_{uuid.uuid4().hex}"
    start_batch(db, RunSpec("recall", batch_id=batch_id), [("a", "x")])
    with pytest.raises(JobChanged, match="runs agent 'recall', not 'desk'"):
        start_batch(db, RunSpec("desk", batch_id=batch_id), [("b", "y")])
    db.dispose()


def test_cancelling_a_batch_cancels_its_waiting_runs_and_closes_their_requests(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given a batch of refunds, each waiting on an approval
    tag = uuid.uuid4().hex
    jobs = write_jobs(
        tmp_path / unique_name("jobs.jsonl"),
        [{"id": i, "prompt": refund_prompt(tag, i)} for i in range(4)],
    )
    output = tmp_path / "out.jsonl"
    waiting = cli("batch", "desk", str(jobs), "-o", str(output), "--timeout", "3")
    assert waiting.exit_code == 1, waiting.output
    batch_id = json.loads((tmp_path / "out.jsonl.runs").read_text())["batch"]
    status = json.loads(cli("batch", "status", batch_id, "--json").stdout)
    assert (status["counts"], status["openRequests"]) == ({"pending": 4}, 4)
    # ... all 4 waiting on a person: nothing can move, so there is no rate and no ETA
    assert (status["waitingOnPeople"], status["moving"]) == (4, 0)
    assert (status["perMinute"], status["etaSeconds"]) == (None, None)
    said = cli("batch", "status", batch_id).stdout.splitlines()
    assert said[-2:] == [
        "4 runs wait on a person; nothing else can move until they are answered: answer in "
        "the inbox or with relayq pending and relayq answer",
        "rate -; eta -",
    ]

    # When the batch is cancelled
    cancelled = cli("batch", "cancel", batch_id)

    # Then every run is cancelled, and no request is left open
    assert cancelled.exit_code == 0, cancelled.output
    assert f"batch {batch_id}: cancelled 4 runs (4 pending)" in cancelled.stdout
    runs = runs_of(durable, batch_id)
    for run in runs:
        settle(durable, run.id, "cancelled")
    db = durable.db()
    after = batch_status(db, batch_id)
    requests = [list_requests(db, status=None, run_id=run.id) for run in runs]
    db.dispose()
    assert (after.counts, after.open_requests) == ({"cancelled": 4}, 0)
    assert after.batch.cancelled_at is not None
    assert [[r.status for r in of_run] for of_run in requests] == [["cancelled"]] * 4
    # ... and `relayq batches` counts them as cancelled, not failed
    listed = cli("batches", "--agent", "desk", "--limit", "50").stdout
    header = next(line for line in listed.splitlines() if "batch" in line and "cancelled" in line)
    assert "failed" in header
    [row] = [line for line in listed.splitlines() if batch_id[:12] in line]
    cells = [c for c in re.split(r"[│┃|]", row) if c.strip()]
    assert [c.strip() for c in cells[-4:]] == ["0", "0", "4", "0"]  # done failed cancelled waiting


def test_an_unknown_batch_is_one_line(cli: Callable[..., Result]):
    for command in (["status"], ["cancel"], ["export"]):
        assert "unknown batch id 'batch_nope'" in one_error_line(
            cli("batch", *command, "batch_nope")
        )


def test_a_batch_whose_output_is_no_terminal_prints_progress_lines(
    durable: Durable, tmp_path: Path
):
    # Given stderr is a pipe (a log, CI), and lines are asked for often
    runner = CliRunner()
    env = {**durable.env, "RELAYQ_PROGRESS_SECONDS": "0.1"}
    tag = uuid.uuid4().hex
    jobs = write_jobs(
        tmp_path / unique_name("jobs.jsonl"),
        [{"id": i, "prompt": refund_prompt(tag, i)} for i in range(2)],
    )

    # When a batch waits on its runs for a while
    args = ["batch", "desk", str(jobs), "-o", str(tmp_path / "out.jsonl"), "--timeout", "2"]
    result = runner.invoke(app, args, env=env, catch_exceptions=False)

    # Then it said where it stood, more than once, in lines a log keeps
    lines = [line for line in result.stderr.splitlines() if line.startswith("batch: ")]
    assert len(lines) >= 2, result.stderr
    # ... with the runs waiting on a person apart, and no rate or ETA while none can move
    assert lines[-1].startswith(
        "batch: 0/2 finished (done 0, waiting on a person 2, failed 0), "
        "nothing can move until a person answers, "
    )
    assert not [line for line in lines if "runs/s" in line or "eta" in line]
    # ... and said once where they are answered
    where = [line for line in result.stderr.splitlines() if "on a person: answer" in line]
    assert where == [
        "2 runs wait on a person: answer in the inbox (relayq api) or with relayq pending "
        "and relayq answer; the batch goes on as they are answered"
    ]
    batch_id = json.loads((tmp_path / "out.jsonl.runs").read_text())["batch"]
    db = durable.db()
    cancel_batch(db, batch_id)  # leave nothing open behind
    db.dispose()


# --- over HTTP -------------------------------------------------------------------------


async def test_a_batch_over_http_starts_each_job_once_and_reports_and_exports_it(
    api: ApiServer, eventually: Eventually
):
    tag = uuid.uuid4().hex
    jobs = [{"id": f"j{i}", "prompt": f"{tag} {i}"} for i in range(3)]
    async with api.http(SUBMITTER) as sub, api.http(VIEWER) as viewer:
        # When a batch is posted, then posted again
        first = await sub.post("/api/batches", json={"agent": "recall", "jobs": jobs})
        assert first.status_code == 201, first.text
        batch_id, runs = first.json()["id"], first.json()["runs"]
        body = {"agent": "recall", "jobs": jobs, "batchId": batch_id}
        again = await sub.post("/api/batches", json=body)

        # Then the second post started nothing and names the same runs
        assert (again.status_code, again.json()["started"]) == (201, [])
        assert again.json()["runs"] == runs

        # And a changed prompt is a 409 naming the job; a bad body is a 422
        changed = [*jobs[:2], {"id": "j2", "prompt": "another"}]
        conflict = await sub.post("/api/batches", json={**body, "jobs": changed})
        assert conflict.status_code == 409
        assert "'j2'" in conflict.json()["detail"]
        twice = await sub.post("/api/batches", json={"agent": "recall", "jobs": jobs[:1] * 2})
        assert twice.status_code == 422
        assert (await viewer.post("/api/batches", json=body)).status_code == 403

        # And its status says all done, once they are; its results keep the input's order
        async def finished() -> dict[str, Any] | None:
            found = (await viewer.get(f"/api/batches/{batch_id}")).json()
            return found if found["finished"] == 3 else None

        status = await eventually(finished, what="the batch to finish")
        assert status["counts"] == {"done": 3}
        assert status["startedBy"] == "sam"
        lines = (await viewer.get(f"/api/batches/{batch_id}/results")).text.splitlines()
        assert [json.loads(line)["id"] for line in lines] == ["j0", "j1", "j2"]
        assert [json.loads(line)["text"] for line in lines] == [j["prompt"] for j in jobs]
        listed = (await viewer.get("/api/batches", params={"agent": "recall"})).json()
        assert batch_id in [b["id"] for b in listed["items"]]
        cancelled = await sub.post(f"/api/batches/{batch_id}/cancel")
        assert cancelled.json() == {"id": batch_id, "cancelled": {}}
        assert (await viewer.get("/api/batches/batch_nope")).status_code == 404


async def test_the_inbox_shows_each_batch_with_its_progress(
    api: ApiServer, durable: Durable, eventually: Eventually
):
    tag = uuid.uuid4().hex
    jobs = [{"id": f"j{i}", "prompt": f"{tag} {i}"} for i in range(2)]
    async with api.http(SUBMITTER) as sub:
        batch_id = (await sub.post("/api/batches", json={"agent": "recall", "jobs": jobs})).json()[
            "id"
        ]
    async with api.http() as browser:
        await log_in(browser, VIEWER)

        async def shown() -> str | None:
            page = (await browser.get("/batches")).text
            return page if "2 of 2 finished" in page.split(batch_id, 1)[-1] else None

        page = await eventually(shown, what="the batch to show as finished")
    assert f'data-batch-id="{batch_id}"' in page
    assert re.search(rf'{batch_id}.*?<progress max="2" value="2"', page, re.S)
    assert 'aria-current="page">Batches' in page
