"""Issue 51: a worker outlives its tools. A sync tool that never returns costs one thread
(`tasks.tool_threads`), never the store's threads or the runs beside it; a worker with
too many such threads retires (`Runtime.retire`) and hands its runs on."""

from __future__ import annotations

import pytest

from store import get_run
from tasks import DurableClient
from tasks.runtime import EXIT_RETIRED

from . import poison_agents  # noqa: F401  (the host knows the poison agents)
from .conftest import Durable, Eventually, SpareWorkers, poll
from .test_store_outage import all_finished

AGENTS = "tests.durable.agents,tests.durable.store_outage_agents,tests.durable.poison_agents"
QUICK_BEATS = {"RELAYQ_HEARTBEAT_EVERY": "0.3", "RELAYQ_WORKER_TIMEOUT": "1.5"}
"""A heartbeat, and the health checks after it, every 0.3 s."""


@pytest.mark.timeout(240)
async def test_sync_tools_that_never_return_cost_their_threads_and_not_the_runs_beside_them(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
    eventually: Eventually,
):
    # Given a worker whose turns may take 4 s, tried twice, and 40 healthy runs on it
    worker = spare_workers.start(
        RELAYQ_AGENTS=AGENTS,
        RELAYQ_DATABASE_URL=private_database,
        RELAYQ_CONCURRENCY="60",
        RELAYQ_TURN_TIME_LIMIT="4",
        RELAYQ_MODEL_RETRIES="1",
        RELAYQ_TOOL_THREADS_STUCK="100",
    )
    async with DurableClient(settings=worker.settings) as client:
        healthy = await client.start_many("outlast", [f"{prompt} {i}" for i in range(40)])

        # When ten runs each call a sync tool that never returns, each try stranding its
        # thread (20 threads: more than the store has, on SQLite or PostgreSQL)
        poison = await client.start_many("wedge", [f"{prompt} wedge {i}" for i in range(10)])
        await eventually(
            lambda: all_finished(client.db, [*healthy, *poison]), timeout=150, what="all ended"
        )

        # Then every healthy run is done, and each poison run failed naming its tool
        for run_id in healthy:
            run = get_run(client.db, run_id)
            assert run.status == "done", run.error
        for run_id in poison:
            run = get_run(client.db, run_id)
            assert run.status == "failed"
            assert run.error == (
                "gave up after 2 tries: the turn ran out of time in tool `wedge` (call c1)"
            )
    # ... and the worker still stands, having said what it gave up on
    assert worker.worker.proc is not None
    assert worker.worker.proc.poll() is None
    log = worker.worker.logfile.read_text()
    assert "a tool call was given up on while its thread still ran it" in log


@pytest.mark.timeout(240)
async def test_a_worker_with_too_many_stuck_tool_threads_retires_and_its_runs_go_on(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
):
    # Given worker A, which retires at 2 stuck tool threads, and 20 healthy runs on it
    env = {"RELAYQ_AGENTS": AGENTS, "RELAYQ_DATABASE_URL": private_database}
    retiring = spare_workers.start(**env, RELAYQ_CONCURRENCY="30", RELAYQ_TOOL_THREADS_STUCK="2")
    async with DurableClient(settings=retiring.settings) as client:
        healthy = await client.start_many("outlast", [f"{prompt} {i}" for i in range(20)])

        # When two runs' sync tool calls outlast the agent's tool timeout (1 s) and run on
        bounded = await client.start_many("wedge_bounded", [f"{prompt} b{i}" for i in range(2)])

        # Then A retires, and every run goes on to its end, on B for what A left
        await retired_and_taken_over(client, retiring, spare_workers, [*healthy, *bounded])
        # ... each call's result saying it was given up on
        for run_id in bounded:
            text = (await client.result(run_id)).text or ""
            assert "the tool 'wedge' did not return within 1 s" in text
    log = retiring.worker.logfile.read_text()
    assert "this worker retires: 2 sync tool calls were given up on" in log, log[-3000:]


@pytest.mark.timeout(240)
async def test_a_worker_over_its_memory_bound_retires_and_its_runs_go_on(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
    eventually: Eventually,
):
    # Given worker A, bounded to 300 MiB of resident memory (it starts at well under
    # that), and 20 healthy runs on it
    env = {"RELAYQ_AGENTS": AGENTS, "RELAYQ_DATABASE_URL": private_database}
    bounded = spare_workers.start(
        **env, RELAYQ_CONCURRENCY="30", RELAYQ_WORKER_MAX_MEMORY="300MiB", **QUICK_BEATS
    )
    async with DurableClient(settings=bounded.settings) as client:
        healthy = await client.start_many("outlast", [f"{prompt} {i}" for i in range(20)])
        assert "this worker retires" not in bounded.worker.logfile.read_text()

        # When a tool on A allocates 400 MiB and keeps it
        hog = await client.start("hog", prompt)
        await eventually(lambda: durable.count("tool", f"hog {hog} attempt 1") == 1, what="hog")

        # Then A retires, and every run goes on to its end, on B for what A left
        await retired_and_taken_over(client, bounded, spare_workers, [*healthy, hog])
    log = bounded.worker.logfile.read_text()
    assert "over RELAYQ_WORKER_MAX_MEMORY (300 MiB)" in log, log[-3000:]


async def retired_and_taken_over(
    client: DurableClient, retiring: Durable, spare_workers: SpareWorkers, every: list[str]
) -> None:
    """`retiring` says it retires; another worker on its queues then finishes every run
    of `every`, done; and `retiring` ends with the status that asks its supervisor for a
    new process."""
    log = retiring.worker.logfile
    await poll(lambda: "this worker retires" in log.read_text(), what="retiring")
    # Its queues and its store, not its bounds
    spare_workers.start(
        **{**retiring.env, "RELAYQ_TOOL_THREADS_STUCK": "8", "RELAYQ_WORKER_MAX_MEMORY": "off"}
    )
    await poll(lambda: all_finished(client.db, every), timeout=150, what="all ended")
    for run_id in every:
        run = get_run(client.db, run_id)
        assert run.status == "done", run.error
    assert retiring.worker.proc is not None
    assert retiring.worker.proc.wait(timeout=60) == EXIT_RETIRED
