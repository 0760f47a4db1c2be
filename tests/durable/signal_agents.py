"""Celery signal receivers, and agents to watch with them (`tests/durable/test_signals.py`).

A worker started with this module in `RELAYQ_AGENTS` imports it at start, so
the receivers run inside the worker (in each child under prefork). Each signal
they see becomes one JSON line in `signals.log` under `RELAYQ_TEST_LOG`: which
signal, the task id and the run it served, what Celery passed (state, result,
runtime, exception), the request Celery held as current, and when.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from celery import Task
from celery.signals import task_failure, task_postrun, task_prerun, task_retry, task_success

from relayq import Agent, InProcessRequest, InProcessResponse, ToolContext, define_tool

from .agents import calls, log_dir, prompt_of, tool_outputs

NAP = 10.0
"""Seconds the napping tool sleeps: past any time limit the tests set."""


def _record(signal: str, sender: Task, task_id: str | None, args: Any, **seen: Any) -> None:
    """One line per signal; a single `write` on an O_APPEND file, whole across processes."""
    request = sender.request
    line = {
        "signal": signal,
        "task_id": task_id,
        "run": args[0] if args else None,
        "current": request.id,
        "at": time.time(),
        "pid": os.getpid(),
        **seen,
    }
    fd = os.open(log_dir() / "signals.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@task_prerun.connect
def _prerun(sender: Task, task_id: str, args: Any = None, **_: Any) -> None:
    _record("task_prerun", sender, task_id, args)


@task_success.connect
def _success(sender: Task, result: Any = None, runtime: float | None = None, **_: Any) -> None:
    # Celery passes no task id here: the current request (the task's own, under
    # any pool) says which task it is.
    request = sender.request
    _record("task_success", sender, request.id, request.args, result=result, runtime=runtime)


@task_failure.connect
def _failure(
    sender: Task, task_id: str, exception: BaseException, args: Any = None, **_: Any
) -> None:
    name = type(exception).__name__
    _record("task_failure", sender, task_id, args, exception=name, error=str(exception))


@task_retry.connect
def _retry(sender: Task, request: Any, reason: Any, **_: Any) -> None:
    when = getattr(reason, "when", None)
    _record("task_retry", sender, request.id, request.args, reason=str(reason), when=when)


@task_postrun.connect
def _postrun(
    sender: Task, task_id: str, args: Any = None, state: str | None = None, **_: Any
) -> None:
    _record("task_postrun", sender, task_id, args, state=state)


def _times(kind: str, key: str) -> None:
    with (log_dir() / "signal-times.log").open("a") as f:
        f.write(json.dumps({"kind": kind, "key": key, "at": time.time()}) + "\n")


# One turn that takes a second: the model sleeps, then answers.
async def slow_model(req: InProcessRequest) -> InProcessResponse:
    key = prompt_of(req)
    _times("model-start", key)
    await asyncio.sleep(1.0)
    _times("model-end", key)
    return InProcessResponse(content="slept")


slow = Agent("signals-slow", slow_model)


# A tool that sleeps past the turn's time limit, on every attempt.
async def nap(args: dict[str, Any], ctx: ToolContext) -> str:
    _times(f"nap-{ctx.attempt}", ctx.run_id)
    await asyncio.sleep(NAP)
    return "rested"


def napping_model(req: InProcessRequest) -> InProcessResponse:
    if tool_outputs(req):
        return InProcessResponse(content="awake")
    return calls(("c1", "nap"))


napping = Agent("signals-napping", napping_model, tools=[define_tool("nap", "n", None, nap)])
