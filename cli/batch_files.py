"""The files of `relayq batch`: the jobs file (JSONL), read and checked whole before any
run starts; the state file beside the output (`results.jsonl.runs`: each job's run, by
job id) that makes a batch resumable; and the results, written atomically."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cli._common import fail, user_errors
from relayq.limits import (
    MAX_ANSWER_BYTES_ENV,
    InputTooLarge,
    UnstorableInput,
    check_run_input,
    problem_of,
)
from store import RunRow, result_of

__all__ = [
    "Job",
    "check_prompts",
    "load_sidecar",
    "read_jobs",
    "save_sidecar",
    "sidecar_of",
    "write_results",
]


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
    is checked by `check_prompts`, once the settings are read."""
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


def check_prompts(path: Path, jobs: list[Job], *, agent: str, max_bytes: int) -> None:
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


def load_sidecar(path: Path, agent: str) -> tuple[str | None, dict[str, str]]:
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


def save_sidecar(path: Path, agent: str, batch_id: str, runs: dict[str, str]) -> None:
    state = {"agent": agent, "batch": batch_id, "runs": runs}
    _write_atomically(path, json.dumps(state, indent=1) + "\n")


def write_results(
    output: Path, jobs: list[Job], runs: dict[str, str], states: dict[str, RunRow]
) -> None:
    lines = []
    for job in jobs:
        result = result_of(states[runs[job.key]], job.id)  # the id as the input gave it
        lines.append(json.dumps(result, ensure_ascii=False))
    _write_atomically(output, "\n".join(lines) + "\n")
