"""Provider errors: retryable ones are Celery retries with backoff; others fail the run."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from tasks import DurableClient

from . import agents
from .conftest import Durable, Eventually


async def test_a_rate_limited_model_is_retried_until_it_answers(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model that is rate limited twice, then answers
    # When the run goes through the worker
    res = await client.run("flaky", prompt, timeout=30)

    # Then the turn is retried after each failure and the run ends with the answer
    assert res.status == "done", res.error
    assert res.text == "finally"
    assert res.error is None, "a successful try clears the last error"
    assert durable.count("model", prompt) == 3


async def test_a_retry_waits_at_least_as_long_as_the_provider_asked(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model rate limited twice with "Retry-After: 0.4 s"
    res = await client.run("patient", prompt, timeout=30)

    # Then each try comes at least that long after the one before
    assert res.status == "done", res.error
    log = (durable.log / "model-times.log").read_text().splitlines()
    tries = [float(t) for key, t in (line.split("\t") for line in log) if key == prompt]
    assert len(tries) == 3
    gaps = [later - earlier for earlier, later in pairwise(tries)]
    assert all(gap >= 0.4 for gap in gaps), gaps


async def test_a_model_that_stays_overloaded_fails_the_run_once_the_retries_are_spent(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model that is always overloaded, and RELAYQ_MODEL_RETRIES=2
    res = await client.run("overloaded", prompt, timeout=30)

    # Then the first try and two retries are made, and the run fails saying so
    assert res.status == "failed"
    assert res.error is not None
    assert "529 overloaded" in res.error
    assert "gave up after 3 tries" in res.error
    assert durable.count("model", prompt) == 3


async def test_a_model_error_that_is_not_retryable_fails_the_run_at_once(
    durable: Durable, client: DurableClient, prompt: str
):
    res = await client.run("refusing", prompt, timeout=30)

    assert res.status == "failed"
    assert res.error is not None
    assert "400 bad request: no such model" in res.error
    assert "gave up" not in res.error
    assert durable.count("model", prompt) == 1


# -- a run that fails: one log line of the run's and the user's frames, nothing of relayq's ----


def _records(log: str) -> list[str]:
    """The worker log's records: each starts with `[date time: LEVEL/process]`."""
    return [r for r in re.split(r"^(?=\[\d{4}-\d\d-\d\d )", log, flags=re.MULTILINE) if r]


def _line_of(fn: Callable[..., Any], text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(n for n, line in enumerate(lines) if text in line)


async def test_a_model_that_raises_fails_the_run_with_one_line_and_only_the_users_frames(
    durable: Durable, client: DurableClient, prompt: str, eventually: Eventually
):
    # Given a model whose own helper raises an exception of its user's
    res = await client.run("buggy", prompt, timeout=30)

    # Then the run failed, its stored error the exception's type and message
    assert res.status == "failed"
    assert res.error == "OrderBookError: order 17 is not in the book"
    run_id = res.run_id
    assert run_id is not None

    # And once Celery has logged the task's end, the worker's log holds one error record
    # of the run: a line naming the run, its agent, the turn and the error, then the
    # user's frames (the model and the helper that raised), and no frame of relayq's,
    # Celery's or asyncio's, and no traceback of Celery's
    def about_the_run() -> list[str]:
        log = durable.worker.logfile.read_text(errors="replace")
        return [r for r in _records(log) if run_id in r]

    def ended() -> bool:
        return any(" raised " in r and "TurnFailed" in r for r in about_the_run())

    await eventually(ended, what="Celery to log the end of the failed turn")
    records = about_the_run()
    errors = [r for r in records if re.match(r"\[[^\]]*: ERROR/", r)]
    assert len(errors) == 1, "".join(errors)
    first, *frames = errors[0].rstrip("\n").splitlines()
    assert first.endswith(
        f"run {run_id} of agent 'buggy' failed in turn 1: "
        "OrderBookError: order 17 is not in the book"
    ), first
    files = [line.strip() for line in frames if line.strip().startswith("File ")]
    agents_py = agents.__file__
    assert files == [
        f'File "{agents_py}", line {_line_of(agents.buggy_model, "order_of(")}, in buggy_model',
        f'File "{agents_py}", line {_line_of(agents.order_of, "raise ")}, in order_of',
    ], errors[0]
    every = "".join(records)
    assert "Traceback" not in every, every
    assert every.count('  File "') == 2, every  # the user's two, and no one else's
    assert prompt not in errors[0]
