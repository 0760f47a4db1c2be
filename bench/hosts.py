"""Relay hosts serving relay calls through the API: how many a second, and how soon
a call is taken.

    python -m bench.hosts                                  # 1,000 runs, 4 hosts
    python -m bench.hosts --runs 10000 --hosts 8 --stores postgresql   # at volume

For each store: one worker (asyncio pool), one API process, and `--hosts`
`relayq host` processes (`--concurrency` calls each) serving `shell` for the agent
`bench-relayed` (`bench.agents`: one relay call a run, then the run ends).

1. burst: `--runs` runs started at once: the calls the hosts answered per second,
   from the first request opened to the last answered;
2. trickle: `--trickle` runs one after another, each started when the one before
   is done, every host idle and waiting in its long poll: how soon a waiting host
   hears of a new call.

Each run's times are read from the store: its request opened, the call's first
lease, the request answered (the run sent on), and the run done (the turn after
the answer ended). The tables give p50 and p99 of each from the request opened,
and the trickle's open-to-lease as a share of the API's look-again interval
(`tasks.client.leasing.RECHECK`): far under 1, the host was woken (Redis), not polled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import func
from sqlmodel import col, select

from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port, start_worker
from store import FINISHED, Database, RunRow
from store.models import LeaseRow, RequestRow, utcnow
from tasks import DurableClient, Settings
from tasks.client.leasing import RECHECK

ROOT = Path(__file__).resolve().parents[1]
AGENT = "bench-relayed"
HOST_TOKEN = "tok-bench-host"
CHUNK = 500  # ids a query (SQLite caps a statement's parameters)


class Parts:
    """The worker, the API and the hosts of one store, each a process group of its own."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = env
        self.home = home
        self.procs: list[tuple[subprocess.Popen[bytes], Path, bytes]] = []
        self.port = free_port()
        self.host_env = env | {
            "RELAYQ_API_URL": f"http://127.0.0.1:{self.port}",
            "RELAYQ_API_TOKEN": HOST_TOKEN,
        }

    def start(self) -> None:
        """The worker and the API, once started: `stop` ends whatever did start."""
        log = self.home / "worker.log"
        worker = start_worker(self.env, "asyncio", 500, log, "bench-hosts")
        self.procs.append((worker, log, b"ready."))
        self._spawn(self.env, self.home / "api.log", b"Uvicorn running on",
                    "api", "--port", str(self.port))  # fmt: skip
        self.wait_ready()

    def start_hosts(self, hosts: int, concurrency: int) -> None:
        serve = ["--tool", "shell=bench.agents:echo", "--concurrency", str(concurrency)]
        for n in range(hosts):
            log = self.home / f"host-{n}.log"
            self._spawn(self.host_env, log, b"serving shell", "host", *serve)
        self.wait_ready()

    def _spawn(self, env: dict[str, str], log: Path, ready: bytes, *args: str) -> None:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *args],
                cwd=ROOT, env=env | {"PYTHONUNBUFFERED": "1"}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.procs.append((proc, log, ready))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        for proc, log, line in self.procs:
            while line not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{log.name} did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _, _ in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class Times:
    """Each run's seconds from its request opened, read from the store."""

    to_lease: list[float]
    to_answer: list[float]
    to_done: list[float]
    leases: int
    span: float
    """Seconds in which the calls were answered."""


def times_of(db: Database, run_ids: list[str], start: datetime | None = None) -> Times:
    """Each run's times; the span from `start` (else the first request opened) to the
    last request answered."""
    opened: dict[str, datetime] = {}  # by request
    answered: dict[str, datetime] = {}
    leased: dict[str, datetime] = {}
    done: dict[str, datetime] = {}  # by request, the run's end
    leases = 0
    with db.read() as s:
        for at in range(0, len(run_ids), CHUNK):
            chunk = run_ids[at : at + CHUNK]
            requests = list(s.exec(select(RequestRow).where(col(RequestRow.run_id).in_(chunk))))
            ended = {
                run.id: run.updated_at
                for run in s.exec(
                    select(RunRow).where(col(RunRow.id).in_(chunk), RunRow.status == "done")
                )
            }
            for row in requests:
                opened[row.id] = row.created_at
                if row.answered_at is not None:
                    answered[row.id] = row.answered_at
                if row.run_id in ended:
                    done[row.id] = ended[row.run_id]
            ids = [row.id for row in requests]
            for lease in s.exec(select(LeaseRow).where(col(LeaseRow.request_id).in_(ids))):
                leases += 1
                first = leased.get(lease.request_id)
                leased[lease.request_id] = (
                    lease.created_at if first is None else min(first, lease.created_at)
                )

    def since(ends: dict[str, datetime]) -> list[float]:
        return [(ends[r] - opened[r]).total_seconds() for r in opened if r in ends]

    first = start or min(opened.values(), default=None)
    span = (max(answered.values()) - first).total_seconds() if answered and first else 0.0
    return Times(since(leased), since(answered), since(done), leases, span)


async def settled(client: DurableClient, ids: list[str]) -> int:
    """Wait until every run has ended; returns how many did not end `done`."""

    def ended() -> tuple[int, int]:
        over = done = 0
        with client.db.read() as s:
            for at in range(0, len(ids), CHUNK):
                rows = select(RunRow.status).where(col(RunRow.id).in_(ids[at : at + CHUNK]))
                for status in s.exec(rows):
                    over += status in FINISHED
                    done += status == "done"
        return over, done

    while True:
        over, done = await asyncio.to_thread(ended)
        if over == len(ids):
            return len(ids) - done
        await asyncio.sleep(0.05)


async def burst(client: DurableClient, runs: int) -> tuple[list[str], int]:
    ids = await client.start_many(AGENT, [f"echo burst {i}" for i in range(runs)])
    return ids, await settled(client, ids)


async def trickle(client: DurableClient, runs: int) -> tuple[list[str], int]:
    ids, failed = [], 0
    for i in range(runs):
        ids += await client.start_many(AGENT, [f"echo trickle {i}"])
        failed += await settled(client, ids[-1:])
    return ids, failed


async def one_store(args: argparse.Namespace, store: str, home: Path, url: str) -> list[Phase]:
    env = bench_env(home, url, 9, f"relayq-bench-hosts-{os.getpid()}-{store}:")
    env["RELAYQ_API_TOKENS"] = f"bench:host:{HOST_TOKEN}:shell"
    parts = Parts(env, home)
    client = DurableClient(settings=Settings.from_env(env))
    phases = []
    try:
        await asyncio.to_thread(parts.start)
        # backlog: every call open before a host starts; the hosts' pace alone
        ids = await client.start_many(AGENT, [f"echo backlog {i}" for i in range(args.runs)])
        await opened(client, ids)
        started = utcnow()
        await asyncio.to_thread(parts.start_hosts, args.hosts, args.concurrency)
        failed = await settled(client, ids)
        times = await asyncio.to_thread(times_of, client.db, ids, started)
        phases.append(Phase(store, "backlog", args.runs, failed, times))
        for name, drive, runs in (("burst", burst, args.runs), ("trickle", trickle, args.trickle)):
            ids, failed = await drive(client, runs)
            times = await asyncio.to_thread(times_of, client.db, ids)
            phases.append(Phase(store, name, runs, failed, times))
    finally:
        parts.stop()
        client.close()
    return phases


async def opened(client: DurableClient, ids: list[str]) -> None:
    """Wait until each run waits on its relay request."""

    def count() -> int:
        with client.db.read() as s:
            return sum(
                s.exec(
                    select(func.count())
                    .select_from(RequestRow)
                    .where(col(RequestRow.run_id).in_(ids[at : at + CHUNK]))
                ).one()
                for at in range(0, len(ids), CHUNK)
            )

    while await asyncio.to_thread(count) < len(ids):  # noqa: ASYNC110 (polls a database)
        await asyncio.sleep(0.1)


@dataclass
class Phase:
    store: str
    phase: str
    runs: int
    failed: int
    """Runs that did not end `done`."""
    times: Times

    @property
    def calls_per_second(self) -> float:
        span = self.times.span
        return len(self.times.to_answer) / span if span > 0 else 0.0


def pct(values: list[float], q: int) -> float:
    """The q-th percentile, in milliseconds."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def print_tables(phases: list[Phase], hosts: int, concurrency: int) -> None:
    print(f"\n{hosts} hosts x {concurrency} calls at once, one relay call a run\n")
    print("| store | phase | runs | failed | calls/s | open→lease p50 ms | p99 | "
          "open→answered p50 ms | p99 | open→done p50 ms | p99 | leases per call | "
          "lease p50 / look-again |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in phases:
        t = p.times
        per_call = t.leases / len(t.to_answer) if t.to_answer else float("nan")
        print(
            f"| {p.store} | {p.phase} | {p.runs} | {p.failed} | {p.calls_per_second:.0f} | "
            f"{pct(t.to_lease, 50):.0f} | {pct(t.to_lease, 99):.0f} | "
            f"{pct(t.to_answer, 50):.0f} | {pct(t.to_answer, 99):.0f} | "
            f"{pct(t.to_done, 50):.0f} | {pct(t.to_done, 99):.0f} | {per_call:.2f} | "
            f"{pct(t.to_lease, 50) / 1000 / RECHECK:.3f} |"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--runs", type=int, default=1000, help="runs started at once (one relay call each)")
    add("--trickle", type=int, default=100, help="runs started one after another")
    add("--hosts", type=int, default=4, help="`relayq host` processes")
    add("--concurrency", type=int, default=16, help="calls each host runs at once")
    add("--stores", default="sqlite,postgresql", help="stores to compare, comma-separated")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    phases: list[Phase] = []
    with bench_home("rq-bench-hosts-") as base:
        for store in args.stores.split(","):
            made = bench_store(base, store, "hosts")
            if made is None:
                continue
            home, url, name = made
            try:
                phases += asyncio.run(one_store(args, store, home, url))
            finally:
                if store != "sqlite":
                    drop_postgres(name)
    print_tables(phases, args.hosts, args.concurrency)


if __name__ == "__main__":
    main()
