"""Celery's signals and task events say what a turn really did, on the asyncio pool as on prefork.

Issue #10: under the asyncio pool `task_success` fired when the task body had
only deferred its turn (with a runtime of a millisecond and the result
"deferred to the event loop"), a failing turn never fired `task_failure`, and
a retried turn was a success. The receivers in `tests.durable.signal_agents`
run inside each worker here and log every signal; Flower watches the same
worker through its task events.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import tests.durable.signal_agents  # noqa: F401  (the host knows the agents, as a real one would)
from relayq.relay import answer_output
from store import get_run
from tasks import DurableClient
from tests import forkserver
from tests.ports import free_port
from tests.processes import stop_group

from .conftest import ROOT, SQLITE_ONLY, Durable, Eventually, SpareWorkers
from .test_flower import Flower, _answers

pytestmark = SQLITE_ONLY
ONE_LANE = True  # tests/conftest.py: a worker and Flower per pool, once
START_EARLY = True  # and its tests take long, so a lane takes them first

TIME_LIMIT = 3.0
"""These workers' RELAYQ_TURN_TIME_LIMIT (Celery's soft limit); a turn's own deadline is 2.25 s."""
RETRY_BASE = 0.5
"""Backoff before the first retry: 0.25 to 0.5 s; before the second, 0.5 to 1 s."""


@dataclass
class Watched:
    """A worker on one pool with the signal receivers loaded, and a Flower on it."""

    pool: str
    spare: Durable
    flower: Flower

    def signals(self, run_id: str) -> list[dict[str, Any]]:
        """What the receivers logged for the run's tasks, in order (whole lines only)."""
        path = self.spare.log / "signals.log"
        if not path.exists():
            return []
        lines = path.read_text().split("\n")[:-1]
        return [s for s in map(json.loads, lines) if s["run"] == run_id]

    def ended(self, run_id: str, tries: int = 1) -> list[dict[str, Any]] | None:
        """The run's one turn's signals once `tries` of it have ended."""
        seen = self.signals(run_id)
        ends = [s for s in seen if s["signal"] == "task_postrun"]
        return seen if len(ends) >= tries else None

    def times(self, kind: str, key: str) -> list[float]:
        path = self.spare.log / "signal-times.log"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [t["at"] for t in lines if t["kind"] == kind and t["key"] == key]

    async def flower_task(self, task_id: str, state: str) -> dict[str, Any] | None:
        """The task as Flower shows it, by id, once it is in `state`."""
        try:
            task: dict[str, Any] = await self.flower.get(f"/api/task/info/{task_id}")
        except httpx.HTTPStatusError:  # 404 until Flower has seen it
            return None
        return task if task["state"] == state else None


def _start_flower(spare: Durable) -> Flower:
    """`workers.flower.run` on the worker's broker and prefix, as `test_flower` runs it."""
    port = free_port()
    password = secrets.token_urlsafe(12)
    env = {**spare.env, "RELAYQ_FLOWER_AUTH": f"ops:{password}"}
    logfile = spare.log.parent / f"flower-{port}.log"
    with logfile.open("ab") as out:
        proc = forkserver.spawn(
            [sys.executable, "-c", f"from workers.flower import run; run(port={port})"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc)
            raise RuntimeError(f"flower did not start:\n{logfile.read_text()[-3000:]}")
        time.sleep(0.1)
    return Flower(url, ("ops", password), logfile, proc)


@pytest.fixture(scope="module", params=["asyncio", "prefork"])
def watched(request: pytest.FixtureRequest, durable: Durable) -> Iterator[Watched]:
    pool: str = request.param
    spares = SpareWorkers(durable)
    spare = spares.start(
        RELAYQ_POOL=pool,
        RELAYQ_AGENTS="tests.durable.agents,tests.durable.signal_agents",
        RELAYQ_TURN_TIME_LIMIT=str(TIME_LIMIT),
        RELAYQ_RETRY_BASE=str(RETRY_BASE),
    )
    flower = _start_flower(spare)
    try:
        # Flower turns the worker's task events on with a broadcast every 5 s.
        deadline = time.monotonic() + 20
        enabled = "Events of group {task} enabled by remote"
        while enabled not in spare.worker.logfile.read_text(errors="replace"):
            assert time.monotonic() < deadline, "flower's enable_events did not reach the worker"
            time.sleep(0.05)
        yield Watched(pool, spare, flower)
    finally:
        stop_group(flower.proc)
        for worker in spares.started:
            worker.stop()


def _names(seen: list[dict[str, Any]]) -> list[str]:
    return [s["signal"].removeprefix("task_") for s in seen]


async def test_a_turn_signals_its_start_and_its_real_end_with_its_result_and_runtime(
    watched: Watched, prompt: str, eventually: Eventually
):
    # Given two runs of one turn each, whose model takes a second, in flight together
    async with DurableClient(settings=watched.spare.settings) as client:
        ids = [await client.start("signals-slow", f"{prompt} {i}") for i in range(2)]
        results = await asyncio.gather(*(client.result(r, wait=True, timeout=30) for r in ids))
    assert [r.status for r in results] == ["done", "done"], [r.error for r in results]

    for i, run_id in enumerate(ids):
        # Then each turn's signals came once each, in Celery's order ...
        seen = await eventually(lambda r=run_id: watched.ended(r), what="the turn's signals")
        assert _names(seen) == ["prerun", "success", "postrun"]
        prerun, success, postrun = seen
        assert len({s["task_id"] for s in seen}) == 1
        # ... with Celery's current request the turn's own, though two were in flight
        assert all(s["current"] == s["task_id"] for s in seen)
        # ... prerun before the model started, success after it ended, with the
        # turn's real result and a runtime at least the model's second
        (started,) = watched.times("model-start", f"{prompt} {i}")
        (ended,) = watched.times("model-end", f"{prompt} {i}")
        assert prerun["at"] <= started
        assert success["at"] >= ended
        assert success["result"] == "done"
        assert success["runtime"] >= 1.0
        assert postrun["state"] == "SUCCESS"

        # And Flower shows the turn succeeded, with that runtime
        task = await eventually(
            lambda t=success["task_id"]: watched.flower_task(t, "SUCCESS"),
            what="flower to see it succeed",
        )
        assert task["runtime"] >= 1.0
        assert task["result"] == "'done'"


async def test_a_turn_that_fails_signals_its_failure_and_flower_shows_it_failed(
    watched: Watched, prompt: str, eventually: Eventually
):
    # Given a model that refuses the request (not retryable)
    async with DurableClient(settings=watched.spare.settings) as client:
        run_id = await client.start("refusing", prompt)
        res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "failed"

    # Then task_failure fired with the turn's exception, and postrun with FAILURE
    seen = await eventually(lambda: watched.ended(run_id), what="the turn's signals")
    assert _names(seen) == ["prerun", "failure", "postrun"]
    _, failure, postrun = seen
    assert failure["exception"] == "TurnFailed"
    assert "400 bad request: no such model" in failure["error"]
    assert failure["current"] == failure["task_id"]
    assert postrun["state"] == "FAILURE"

    # And Flower shows the turn failed, with that exception
    task = await eventually(
        lambda: watched.flower_task(failure["task_id"], "FAILURE"), what="flower to see it fail"
    )
    assert task["exception"].startswith("TurnFailed(")


async def test_a_retried_turn_signals_each_retry_and_flower_sees_them(
    watched: Watched, prompt: str, eventually: Eventually
):
    # Given a model rate limited twice, then answering
    async with DurableClient(settings=watched.spare.settings) as client:
        run_id = await client.start("flaky", prompt)
        res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error

    # Then each try of the one task (same id) ended in task_retry, the last in task_success
    seen = await eventually(lambda: watched.ended(run_id, tries=3), what="three tries' signals")
    assert _names(seen) == ["prerun", "retry", "postrun"] * 2 + ["prerun", "success", "postrun"]
    assert len({s["task_id"] for s in seen}) == 1
    retries = [s for s in seen if s["signal"] == "task_retry"]
    assert [r["reason"].split(" in ")[0] for r in retries] == ["retry 1", "retry 2"]
    assert all("429 rate limited" in r["reason"] for r in retries)
    assert [s["state"] for s in seen if s["signal"] == "task_postrun"] == [
        "RETRY",
        "RETRY",
        "SUCCESS",
    ]

    # And Flower saw the task retried (twice) before it succeeded
    task = await eventually(
        lambda: watched.flower_task(seen[0]["task_id"], "SUCCESS"), what="flower to see it succeed"
    )
    assert task["retried"] is not None
    assert task["retries"] == 2
    # ... under the turn's label, as each retry's message carries it
    assert task["args"] == f"run={run_id} agent=flaky turn=1"


async def test_a_turn_past_its_time_limit_is_retried_with_backoff_then_fails(
    watched: Watched, prompt: str, eventually: Eventually
):
    # Given a tool that sleeps 10 s on a worker whose turns may take 3 s (soft limit)
    db = watched.spare.db()
    try:
        async with DurableClient(settings=watched.spare.settings) as client:
            run_id = await client.start("signals-napping", prompt)

            # When the turn runs out of time, again and again, the run's attempts go up
            attempts: list[int] = []

            async def failed() -> bool:
                run = await asyncio.to_thread(get_run, db, run_id)
                if not attempts or attempts[-1] != run.attempts:
                    attempts.append(run.attempts)
                return run.status == "failed"

            await eventually(failed, timeout=40, what="the run to fail")
            res = await client.result(run_id)
    finally:
        db.dispose()

    # Then it was retried twice (RELAYQ_MODEL_RETRIES=2), and failed after the third try
    assert res.error == "gave up after 3 tries: the turn ran out of time in tool `nap` (call c1)"
    assert attempts[:3] == [0, 1, 2]
    assert [watched.times(f"nap-{n}", run_id) != [] for n in (1, 2, 3)] == [True] * 3
    seen = await eventually(lambda: watched.ended(run_id, tries=3), what="three tries' signals")
    assert _names(seen) == ["prerun", "retry", "postrun"] * 2 + ["prerun", "failure", "postrun"]
    retries = [s for s in seen if s["signal"] == "task_retry"]
    assert all(
        r["reason"].endswith(": the turn ran out of time in tool `nap` (call c1)") for r in retries
    )
    # ... with backoff: growing waits, each kept before the next try began
    waits = [r["when"] for r in retries]
    assert RETRY_BASE / 2 <= waits[0] <= waits[1] <= RETRY_BASE * 2, waits
    preruns = [s["at"] for s in seen if s["signal"] == "task_prerun"]
    for retry, next_try in zip(retries, preruns[1:], strict=True):
        # (the wait is given to 0.1 s, and counts from the send, just before the signal)
        assert next_try >= retry["at"] + retry["when"] - 0.1
    # ... each try ended by the turn's own deadline, never by Celery's soft limit
    tries = [r["at"] - p for r, p in zip(retries, preruns, strict=False)]
    print(f"{watched.pool}: tries ended after {', '.join(f'{t:.2f}' for t in tries)} s")
    failure = next(s for s in seen if s["signal"] == "task_failure")
    assert failure["exception"] == "TurnFailed"
    log = watched.spare.worker.logfile.read_text(errors="replace")
    assert "SoftTimeLimitExceeded" not in log
    assert "Soft time limit" not in log


async def test_the_answer_task_signals_its_end_once_the_answer_is_applied(
    watched: Watched, prompt: str, eventually: Eventually
):
    # Given a run halted on a relay call
    async with DurableClient(settings=watched.spare.settings) as client:
        run_id = await client.start("lookup", prompt)
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.pending is not None

        # When the host answers it (the answer task applies it on the worker)
        await client.submit_answer(answer_output(halted.pending.id, "found"))
        res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error

    # Then the answer task's success came with what it did, not "deferred": the
    # signals fire when its work ends, as a turn's do
    request_id = halted.pending.id
    seen = await eventually(lambda: watched.ended(request_id), what="the answer task's signals")
    assert _names(seen) == ["prerun", "success", "postrun"]
    assert seen[1]["result"] == "resumed"
    task = await eventually(
        lambda: watched.flower_task(seen[1]["task_id"], "SUCCESS"), what="flower to see it"
    )
    assert task["result"] == "'resumed'"
