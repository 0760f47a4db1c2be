"""Issue 51: a worker outlives its tools. A sync tool that never returns costs one thread
(`tasks.runner.tool_threads`), never the store's threads or the runs beside it; a worker with
too many such threads retires (`Runtime.retire`) and hands its runs on; a tool that kills
its process fails its own run, alone (`tasks.runner.alone`), and no run beside it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from store import get_run
from tasks import DurableClient
from tasks.runner.runtime import EXIT_RETIRED

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


class Supervisor:
    """Starts a worker again whenever its process ends, as systemd or compose would."""

    def __init__(self, spare_workers: SpareWorkers, worker: Durable) -> None:
        self.spare_workers = spare_workers
        self.worker = worker
        self.restarts = 0
        self.logs = [worker.worker.logfile]
        self._stop = threading.Event()

    def watch(self) -> None:
        while not self._stop.wait(0.1):
            proc = self.worker.worker.proc
            if proc is not None and proc.poll() is not None:
                self.restarts += 1
                self.worker = self.spare_workers.restart(self.worker)
                self.logs.append(self.worker.worker.logfile)

    def log(self) -> str:
        return "".join(path.read_text() for path in self.logs if path.exists())


@contextmanager
def supervised(spare_workers: SpareWorkers, worker: Durable) -> Iterator[Supervisor]:
    supervisor = Supervisor(spare_workers, worker)
    thread = threading.Thread(target=supervisor.watch, daemon=True)
    thread.start()
    try:
        yield supervisor
    finally:
        supervisor._stop.set()
        thread.join()


def tool_lines(durable: Durable, prefix: str) -> list[str]:
    path = durable.log / "tool.log"
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.startswith(prefix)]


KILL: tuple[str, str, dict[str, str]] = ("kill", "kill", {})
"""The agent, its tool, and the worker's environment: a tool that ends its process at once
(`os._exit`, as a crash in a C extension)."""
STALL = (
    "stall",
    "block",
    {"RELAYQ_TEST_STALL": "600", "RELAYQ_LOOP_STALL": "1", "RELAYQ_LOOP_STALL_EXIT": "6"},
)
"""An async tool that blocks its event loop (for 10 minutes): the worker's loop watch ends
its process 6 s in, the process of a turn alone at the first second."""


def _case(store: str, pool: str, poison: tuple[str, str, dict[str, str]], n: int) -> Any:
    marks = [pytest.mark.postgres] if store == "postgresql" else []
    return pytest.param(store, pool, poison, n, marks=marks, id=f"{store}-{pool}-{poison[0]}-{n}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("database_url", "pool", "poison", "poisoned"),
    # Each store, pool and harm at least once, not every combination (the suite's time):
    # what a death marks and counts is the store's, proven on both by
    # tests/store/test_crash_attribution.py.
    [
        _case("sqlite", "asyncio", KILL, 5),
        _case("postgresql", "prefork", KILL, 5),
        _case("sqlite", "asyncio", STALL, 1),
    ],
    indirect=["database_url"],
)
async def test_tools_that_kill_or_stall_their_process_fail_their_own_runs_and_no_other(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
    eventually: Eventually,
    pool: str,
    poison: tuple[str, str, dict[str, str]],
    poisoned: int,
):
    agent, tool, env = poison
    # Given a worker under a supervisor that starts it again whenever it ends, and 40
    # healthy runs of five turns in flight on it
    worker = spare_workers.start(
        RELAYQ_AGENTS=AGENTS,
        RELAYQ_DATABASE_URL=private_database,
        RELAYQ_POOL=pool,
        RELAYQ_CONCURRENCY="60" if pool == "asyncio" else "6",
        # On one process, the poison runs' first kills come together (`poison_agents.kill`)
        RELAYQ_TEST_KILLS=str(poisoned) if pool == "asyncio" else "1",
        **QUICK_BEATS,
        **env,
    )
    with supervised(spare_workers, worker) as supervisor:
        async with DurableClient(settings=worker.settings) as client:
            healthy = await client.start_many("outlast", [f"{prompt} {i}" for i in range(40)])
            await eventually(lambda: len(tool_lines(durable, "mark ")) > 0, what="runs in flight")

            # When runs whose tool kills (or wedges) its process start beside them
            prompts = [f"{prompt} {agent} {i}" for i in range(poisoned)]
            poisons = await client.start_many(agent, prompts)
            every = [*healthy, *poisons]
            await eventually(lambda: all_finished(client.db, every), timeout=240, what="all ended")

            # Then every healthy run is done, none failed on a crash limit
            for run_id in healthy:
                run = get_run(client.db, run_id)
                assert run.status == "done", run.error
            # ... and each poison run failed, naming its tool, after three deaths alone
            for run_id in poisons:
                run = get_run(client.db, run_id)
                assert (run.status, run.error) == (
                    "failed",
                    f"the tool `{tool}` (call c1) killed its worker 3 times, in turn 1; giving up",
                )
                died = len(tool_lines(durable, f"{agent} {run_id} attempt "))
                # The asyncio pool: once in the worker beside others (unless another poison
                # run's kill came first), then three times alone; prefork: alone each time.
                assert died in ((3, 4) if pool == "asyncio" else (3,)), died
    # ... and the worker itself died at most once: the poison runs were all in flight on
    # it then, and every later death was a process of a single turn. So no healthy run was
    # taken over more than once: no call of theirs ran a third time.
    assert supervisor.restarts <= (1 if pool == "asyncio" else 0), supervisor.log()[-4000:]
    marks = [line for line in tool_lines(durable, "mark ") if any(r in line for r in healthy)]
    assert not [line for line in marks if line.endswith((" attempt 3", " attempt 4"))]
    if pool == "asyncio":  # (prefork's pool logs each child it lost with a traceback)
        assert "Traceback" not in supervisor.log(), supervisor.log()[-4000:]
