"""relayq as its users run it: a real asyncio worker process, and a DurableClient in this one.

The worker and the host are measured apart (each from its own /proc counters):
the worker takes the turns, the host starts the runs and waits for their end,
as `bench.inflight` and `bench.turns` do. Both write to one SQLite store.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import redis
from sqlmodel import col, select

from bench.inflight import bench_env, start_worker, wait_all, wait_ready
from bench.peers.sample import Counters, Sample, sqlite_bytes
from store import RunRow
from tasks import DurableClient, Settings


async def measure(*, port: int, runs: int, turns: int, home: Path) -> Sample:
    """Start `runs` runs at once on one fresh asyncio worker, against the model server on `port`."""
    store = home / "relayq.db"
    prefix = f"relayq-bench-peers-{os.getpid()}-{home.name}:"
    env = bench_env(home, f"sqlite:///{store}", port, prefix)
    client = DurableClient(settings=Settings.from_env(env))
    log = home / "worker.log"
    worker = start_worker(env, "asyncio", runs, log, f"bench-peers-{home.name}")
    try:
        await asyncio.to_thread(wait_ready, log, worker)
        # The worker's start (imports, migrations) is not a turn's cost.
        await asyncio.sleep(1.0)
        size = sqlite_bytes(store)
        host, agent = Counters.of(os.getpid()), Counters.of(worker.pid)
        started = time.perf_counter()
        ids = await client.start_many("bench-long", [f"job {i}" for i in range(runs)])
        await wait_all(client, set(ids))
        seconds = time.perf_counter() - started
        host, agent = Counters.of(os.getpid()).since(host), Counters.of(worker.pid).since(agent)
        stored = sqlite_bytes(store) - size
        ends = await asyncio.to_thread(turns_taken, client, ids)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        client.close()
        forget_keys(env, prefix)
    return Sample(
        system="relayq",
        runs=runs,
        turns_each=turns,
        runs_done=sum(1 for status, taken in ends if status == "done" and taken == turns),
        turns=sum(taken for _, taken in ends),
        seconds=seconds,
        cpu_seconds=agent.cpu_seconds,
        host_cpu_seconds=host.cpu_seconds,
        bytes_written=agent.bytes_written + host.bytes_written,
        stored_bytes=stored,
    )


def forget_keys(env: dict[str, str], prefix: str) -> None:
    """Delete what the measure left on the machine's Redis: its keys have a prefix of their own."""
    url = env.get("RELAYQ_BROKER_URL")
    if not url:
        return
    conn = redis.Redis.from_url(url)
    try:
        keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()


def turns_taken(client: DurableClient, ids: list[str]) -> list[tuple[str, int]]:
    """Each run's status and model turns, as the store has them."""
    with client.db.read() as s:
        query = select(RunRow.status, RunRow.turns).where(col(RunRow.id).in_(ids))
        return [(status, turns) for status, turns in s.exec(query)]
