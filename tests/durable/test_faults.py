"""Fault probes with real processes: whatever dies when, every run moves on within 30 s.

Workers run with the default recovery settings (heartbeat every 2 s, taken for
dead after 10 s, a sweep every 5 s, lost messages sent again after 10 s). Each
test SIGKILLs a worker's whole process group at a chosen moment and starts a
new one, as a supervisor would, and measures how long the runs it held take
to move on. The figures go to `fault-figures.log` in the session's log folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import pytest
from sqlmodel import col, select

from relayq import ResumeError, RunResult
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import Database, RunRow, get_run, list_requests, transcript
from tasks import DurableClient, Settings
from tests import forkserver
from tests.brokers import PrivateRedis

from .conftest import ROOT, SQLITE_ONLY, Durable, Eventually, SpareWorkers, Worker

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first

BOUND = 30.0
"""The promise: seconds from a death (or the broker's return) to every run moving on."""


def figures(durable: Durable, case: str, delays: list[float]) -> None:
    line = {
        "case": case,
        "db": durable.settings.database_url.split(":", 1)[0].split("+", 1)[0],
        "runs": len(delays),
        "median_s": round(statistics.median(delays), 2) if delays else None,
        "max_s": round(max(delays), 2) if delays else None,
    }
    durable.log.mkdir(parents=True, exist_ok=True)
    with (durable.log / "fault-figures.log").open("a") as out:
        out.write(json.dumps(line) + "\n")


def caught(db: Database, run_ids: list[str], *, worker_pid: int | None = None) -> dict[str, int]:
    """Runs a death would strand: running ones, and pending ones whose answer is accepted
    but not applied (run id -> version now). With `worker_pid`, only runs that worker
    process holds mid-turn: a killed worker's runs stay `running`, their claims naming
    it, until a sweep, and killing the next worker would catch none of them."""
    held = {}
    unapplied = (
        set()
        if worker_pid
        else {r.run_id for r in list_requests(db, status="answered", limit=1000)}
    )
    for run in runs_now(db, run_ids):
        mid_turn = run.status == "running" and (worker_pid is None or claimed_by(run, worker_pid))
        if mid_turn or (run.status == "pending" and run.id in unapplied):
            held[run.id] = run.version
    return held


def runs_now(db: Database, run_ids: list[str]) -> list[RunRow]:
    """The runs as one read sees them: a poll of one query a run took longer than a 0.2 s
    turn on a loaded machine, and could see no run mid-turn though some always were."""
    with db.read() as s:
        return list(s.exec(select(RunRow).where(col(RunRow.id).in_(run_ids))))


def claimed_by(run: RunRow, pid: int) -> bool:
    """Whether the run's claim names the worker process `pid` (`host:pid:nonce`)."""
    return run.worker is not None and run.worker.rsplit(":", 2)[-2] == str(pid)


async def finished(client: DurableClient, run_id: str, timeout: float = 120.0) -> RunResult:
    """The run once it has finished (a pending run waits on the host loop's answer)."""
    deadline = time.monotonic() + timeout
    while True:
        res = await client.result(run_id, wait=True, timeout=timeout)
        if res.status not in ("queued", "running", "pending") or time.monotonic() > deadline:
            return res
        await asyncio.sleep(0.1)


async def until_caught(
    db: Database, run_ids: list[str], timeout: float = 20.0, *, worker_pid: int | None = None
) -> dict[str, int]:
    """The runs a death would strand (`caught`), as soon as there are some; {} once all
    are finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = caught(db, run_ids, worker_pid=worker_pid)
        if held:
            return held
        if all(run.status == "done" for run in runs_now(db, run_ids)):
            return {}
        await asyncio.sleep(0.05)
    return {}


async def moved_on(db: Database, held: dict[str, int], since: float) -> list[float]:
    """Seconds until each held run's version moved, measured from `since`."""
    delays: dict[str, float] = {}
    deadline = since + BOUND + 30
    while len(delays) < len(held) and time.monotonic() < deadline:
        for run_id, version in held.items():
            if run_id not in delays and get_run(db, run_id).version != version:
                delays[run_id] = time.monotonic() - since
        await asyncio.sleep(0.1)
    stuck = sorted(set(held) - set(delays))
    assert not stuck, f"runs that never moved on: {stuck}"
    return list(delays.values())


async def answer_everything(client: DurableClient, run_ids: set[str]) -> None:
    """The host: approves every relay call of these runs as its request opens."""
    while True:
        for stored in await client.requests("open", agent="steady"):
            if stored.run_id not in run_ids:
                continue
            results = [
                RelayResult(id=c.id, output="approved") for c in relay_calls_of(stored.request)
            ]
            # Answered in an earlier round, or its run moved on meanwhile: fine.
            with contextlib.suppress(ResumeError):
                await client.submit_answer(relay_answer(stored.request.id, results))
        await asyncio.sleep(0.2)


def check_transcript(
    durable: Durable, db: Database, res: RunResult, *, deaths: int | None = None
) -> None:
    """Exactly one reply per turn and one result per call, whatever was redone; with
    `deaths`, the tool ran at most once more than the worker was killed."""
    assert res.run_id is not None
    assert res.status == "done", res.error
    messages = transcript(db, res.run_id)
    assert [m["role"] for m in messages] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant",
    ], messages  # fmt: skip
    assert res.text == f"paced {res.run_id}:1:c1 | approved"
    attempts = [
        int(line.rsplit(" ", 1)[1])
        for line in (durable.log / "tool.log").read_text().splitlines()
        if line.startswith(f"pace {res.run_id} attempt ")
    ]
    # At least once; a re-execution (its worker died before the ledger) counts up. An
    # attempt is counted before the tool runs, so one whose worker died before the tool
    # wrote its line leaves a gap ([1, 3]); no attempt ever runs twice or out of order.
    assert attempts, f"the tool of {res.run_id} never ran"
    assert attempts == sorted(set(attempts)), attempts
    assert attempts[0] >= 1, attempts
    if deaths is not None:
        assert attempts[-1] <= 1 + deaths, attempts


KILLS = 5


@pytest.mark.timeout(300)
async def test_forty_runs_finish_once_each_though_their_worker_is_killed_again_and_again(
    durable: Durable, spare_workers: SpareWorkers, prompt: str
):
    # Given 40 runs on one worker (20 turns in flight), each with a local tool and a
    # relay call that a host answers as soon as it opens
    spare = spare_workers.start(RELAYQ_CONCURRENCY="20")
    async with DurableClient(settings=spare.settings) as client:
        db = client.db
        run_ids = await client.start_many("steady", [f"{prompt} #{i}" for i in range(40)])
        host = asyncio.create_task(answer_everything(client, set(run_ids)))
        watches = []

        # When the worker is SIGKILLed five times, each time a supervisor starts another,
        # and each kill catches runs that worker holds mid-turn (not on a clock that may
        # miss them, nor on runs an earlier death left `running`)
        for kill in range(1, KILLS + 1):
            assert spare.worker.proc is not None
            held = await until_caught(db, run_ids, worker_pid=spare.worker.proc.pid)
            assert held, f"kill {kill}: the worker held no run mid-turn"
            spare_workers.kill(spare)
            killed_at = time.monotonic()
            spare = spare_workers.restart(spare)
            watches.append(asyncio.create_task(moved_on(db, held, killed_at)))

        # Then every run caught by a death moved on within the bound ...
        caught_by_kill = await asyncio.gather(*watches)
        deaths = len(caught_by_kill)
        assert deaths == KILLS
        delays = [d for batch in caught_by_kill for d in batch]
        figures(durable, "worker SIGKILLed 5 times during 40 runs", delays)
        assert max(delays) < BOUND, sorted(delays)

        # ... and all 40 finished, no transcript duplicated, no tool run more than once
        # for each death
        for run_id in run_ids:
            check_transcript(durable, db, await finished(client, run_id), deaths=deaths)
        host.cancel()


@pytest.mark.timeout(120)
async def test_a_retry_waiting_in_a_killed_worker_moves_on_within_the_bound(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a run whose model asked for a retry in 3 s: the retry's message waits
    # in the worker (received, not acknowledged) for its time to come
    spare = spare_workers.start()
    async with DurableClient(settings=spare.settings) as client:
        run_id = await holding_a_retry(spare, client, "later", prompt, eventually)
        version = get_run(client.db, run_id).version

        # When the worker is SIGKILLed holding that message, and a new one starts
        spare_workers.kill(spare)
        killed_at = time.monotonic()
        spare = spare_workers.restart(spare)

        # Then the message lost with it (held in its memory only) is sent again, and the
        # run finishes
        assert not waits_in_redis(spare, run_id), "the retry's message died with its worker"
        [delay] = await moved_on(client.db, {run_id: version}, killed_at)
        res = await client.result(run_id, wait=True, timeout=60)
    figures(durable, "worker SIGKILLed holding a queued run's retry message", [delay])
    assert delay < BOUND
    assert (res.status, res.text) == ("done", "came back")
    assert durable.count("model", prompt) == 2


@pytest.mark.timeout(120)
async def test_a_message_its_worker_holds_goes_back_to_its_queue_when_the_worker_stops(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a worker holding a run's retry message, two minutes before its time
    spare = spare_workers.start()
    async with DurableClient(settings=spare.settings) as client:
        run_id = await holding_a_retry(spare, client, "much-later", prompt, eventually)

        # When the worker is asked to stop (SIGTERM: a deploy, a scale-down)
        spare.worker.stop()
        assert spare.worker.proc is not None
        assert spare.worker.proc.returncode == 0

        # Then the message waits in its queue again for the next worker, from the
        # worker's memory (kombu's `unacked` never had it)
        assert waits_in_redis(spare, run_id), "the retry's message was lost with its worker"
        assert get_run(client.db, run_id).status == "queued"


async def holding_a_retry(
    spare: Durable, client: DurableClient, agent: str, prompt: str, eventually: Eventually
) -> str:
    """A run of `agent` started on `spare`, once its worker holds the run's retry message."""
    run_id = await client.start(agent, prompt)
    await eventually(lambda: get_run(client.db, run_id).attempts == 1, what="the retry")
    await eventually(
        lambda: holds_the_retry(spare, run_id), what="the worker to hold the retry's message"
    )
    return run_id


def holds_the_retry(spare: Durable, run_id: str) -> bool:
    """Whether the worker, which serves this one run, took the run's second message (its
    retry) and holds it: neither the turns queue nor kombu's `unacked` hash has it (a
    turn message is held in the worker's memory only: `workers.doorbell`)."""
    log = spare.worker.logfile.read_text(errors="replace")
    received = [line for line in log.splitlines() if line.endswith("] received")]
    return len(received) >= 2 and not waits_in_redis(spare, run_id)


def waits_in_redis(spare: Durable, run_id: str) -> bool:
    """Whether a message of the run's waits in the turns queue or in kombu's `unacked`."""
    conn = spare.broker.client()
    try:
        unacked = conn.hvals(spare.settings.key_prefix + "unacked")
        queued = conn.lrange(spare.settings.key_prefix + "relayq.turns", 0, -1)
    finally:
        conn.close()
    label = f"run={run_id} ".encode()
    return any(label in m for m in [*unacked, *queued])


GHOST = """
import os, signal, sys
from kombu import Connection

url, prefix, queue = sys.argv[1:4]
with Connection(url, transport_options={"global_keyprefix": prefix}) as conn:
    ghost = conn.SimpleQueue(queue)
    message = ghost.get(timeout=20)  # received, never acknowledged
    print(message.headers["id"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def ghost_takes(durable: Durable, queue: str) -> str:
    """A consumer that takes one message from `queue` and is SIGKILLed holding it."""
    done = forkserver.run(
        [sys.executable, "-c", GHOST, durable.settings.broker_url, durable.settings.key_prefix,
         queue],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr
    return done.stdout.strip()


@pytest.mark.timeout(120)
async def test_an_answer_whose_task_died_with_its_worker_is_applied_within_the_bound(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a run pending on a request, and a worker that serves turns only
    spare = spare_workers.start("-Q", "relayq.turns,relayq.maintenance")
    async with DurableClient(settings=spare.settings) as client:
        halted = await client.run("lookup", prompt, timeout=30)
        assert halted.pending is not None
        run_id = halted.run_id
        assert run_id is not None

        # When the answer is accepted and a consumer dies holding its answer task
        await client.submit_answer(relay_answer(halted.pending.id, [
            RelayResult(id=c.id, output="found") for c in relay_calls_of(halted.pending)
        ]))  # fmt: skip
        version = get_run(client.db, run_id).version
        held = ghost_takes(spare, "relayq.answers")
        died_at = time.monotonic()
        unacked = spare.broker.client().hvals(spare.settings.key_prefix + "unacked")
        assert any(held.encode() in m for m in unacked), "the message died with its consumer"
        spare = spare_workers.restart(spare)

        # Then a sweep sends the answer task again, and the run finishes
        [delay] = await moved_on(client.db, {run_id: version}, died_at)
        res = await client.result(run_id, wait=True, timeout=60)
    figures(durable, "consumer SIGKILLed holding an answer task", [delay])
    assert delay < BOUND
    assert res.status == "done", res.error
    assert res.tool_calls[0].output == "found"


def stranded(db: Database, run_ids: list[str]) -> dict[str, int]:
    """Runs that wait on the broker, not on the host: all but the finished ones and
    those pending on a request nobody has answered yet."""
    open_for = {r.run_id for r in list_requests(db, status="open", limit=1000)}
    held = {}
    for run_id in run_ids:
        run = get_run(db, run_id)
        if run.status in ("queued", "running") or (
            run.status == "pending" and run_id not in open_for
        ):
            held[run_id] = run.version
    return held


@pytest.mark.timeout(240)
@SQLITE_ONLY  # the broker's return; the sweeper's re-sends are tests/store's
async def test_runs_move_on_within_the_bound_after_the_broker_comes_back_empty(
    durable: Durable, tmp_path: Path, prompt: str
):
    # Given a broker of this test's own, a worker of 50 turns at once, and 50 runs whose
    # relay calls a host answers as they open (after the reconnect the worker must take
    # 50 at once again: one at a time, the last of them moved on 30 s after the return)
    redis = PrivateRedis(tmp_path / "redis").start()
    env = {**durable.env, "RELAYQ_BROKER_URL": redis.url, "RELAYQ_CONCURRENCY": "50"}
    worker = Worker(env, tmp_path / "worker.log").start()
    try:
        async with DurableClient(settings=Settings.from_env(env)) as client:
            run_ids = await client.start_many("steady", [f"{prompt} #{i}" for i in range(50)])
            host = asyncio.create_task(answer_everything(client, set(run_ids)))
            assert await until_caught(client.db, run_ids), "no run was ever mid-turn"

            # When the broker is killed mid-batch and comes back empty 3 s later: every
            # message it held (queued turns, answer tasks, unacked ones) is gone. The
            # outage's length is the scenario: a worker whose every slot is taken does not
            # read from the broker, so it has no event to wait for.
            redis.kill()
            await asyncio.sleep(3.0)
            redis.start()
            back_at = time.monotonic()
            held = stranded(client.db, run_ids)

            # Then every run the broker stranded moves on within the bound, the worker
            # still the same process, and all 50 finish once
            delays = await moved_on(client.db, held, back_at)
            figures(durable, "broker killed and restarted empty mid-batch", delays)
            assert held, "the outage stranded nothing: the probe proved nothing"
            assert max(delays) < BOUND, sorted(delays)
            for run_id in run_ids:
                check_transcript(durable, client.db, await finished(client, run_id))
            host.cancel()
        assert worker.proc is not None
        assert worker.proc.poll() is None, "the worker rode the outage out"
    finally:
        worker.stop()
        redis.stop()
