"""A big batch starts beside interactive runs: does the start stop everything else?

    python -m bench.start                     # 100,000 jobs, in chunks and in one transaction
    python -m bench.start --jobs 20000 --modes chunked --stores sqlite,postgresql

For each store and mode (`chunked`: `store.runs.CHUNK` jobs a transaction, the
way every start goes; `whole`: the whole start in one transaction, as before
issue 19):

1. one worker serving interactive runs only (`RELAYQ_WORKER_BATCHES=skip`), with
   `--in-flight` interactive runs (of `--turns` turns, a local tool each, the
   local model server answering after `--latency` s) going on all the time;
2. idle: their latency, as the host sees it, for `--idle` seconds;
3. a host starts a batch of `--jobs` jobs (`store.start_batch`; no worker takes
   its turns), the interactive runs going on; their latency during the start;
4. then what the start cost them: claims lost (a turn taken from a live worker:
   a crash counted, or a turn that found its claim gone) and tool calls run
   again (the ledger's executions), which must both be 0.

On SQLite the write lock is the store's: a start in one transaction holds it
for its whole length, and every interactive turn's write waits behind it.
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
from pathlib import Path

from sqlalchemy import event, func
from sqlmodel import col, select

from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port, start_worker
from bench.inflight import wait_ready as worker_ready
from store import Database, LedgerRow, RunRow, RunSpec, StoreUnavailable, runs, start_batch
from tasks import DurableClient, Settings

ROOT = Path(__file__).resolve().parents[1]
MODES = ("chunked", "whole")


@dataclass
class Figures:
    store: str
    mode: str
    jobs: int
    start_seconds: float
    longest_hold: float
    """Seconds the start's longest transaction held the write lock."""
    median_hold: float
    idle: list[float]
    during: list[float]
    crashed: int
    lost_claims: int
    repeated_tools: int
    failed: int
    refused: int

    @staticmethod
    def p50(seconds: list[float]) -> float:
        return 1000 * statistics.median(seconds) if seconds else float("nan")


class Interactive:
    """`in_flight` hosts, each running interactive runs one after another."""

    def __init__(self, client: DurableClient, in_flight: int) -> None:
        self.client = client
        self.in_flight = in_flight
        self.seconds: list[tuple[float, float]] = []
        """(when it ended, how long it took), per run."""
        self.run_ids: list[str] = []
        self.failed = 0
        self.refused = 0
        """Host calls (a run's start) refused: the store was unavailable."""
        self._stop = asyncio.Event()

    async def run_all(self) -> None:
        await asyncio.gather(*(self._one_host(n) for n in range(self.in_flight)))

    async def _one_host(self, host: int) -> None:
        n = 0
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                result = await self.client.run("bench", f"interactive {host}.{n}", timeout=600)
            except StoreUnavailable:
                # The start held the store's lock past the busy timeout: the host's own
                # call was refused (it would try again, as this one does).
                self.refused += 1
                continue
            ended = time.perf_counter()
            if result.run_id is not None:
                self.run_ids.append(result.run_id)
            if result.status != "done":
                self.failed += 1
            self.seconds.append((ended, ended - began))
            n += 1

    def within(self, since: float, until: float) -> list[float]:
        """Runs begun and ended in the span."""
        return [took for ended, took in self.seconds if since <= ended - took and ended <= until]

    def overlapping(self, since: float, until: float) -> list[float]:
        """Runs that were going at some moment of the span."""
        return [took for ended, took in self.seconds if ended >= since and ended - took <= until]

    def stop(self) -> None:
        self._stop.set()


def _start(url: str, jobs: list[tuple[str, str]], chunk: int) -> tuple[float, list[float]]:
    """Start the batch on a store connection of its own; its length, and how long each of
    its transactions held the write lock, in seconds (from BEGIN's return to COMMIT)."""
    db = Database(url)
    held: list[float] = []
    began: list[float] = []
    # After the store's own "begin" listener: BEGIN IMMEDIATE has taken the lock.
    event.listen(db.engine, "begin", lambda conn: began.append(time.perf_counter()))
    event.listen(db.engine, "commit", lambda conn: held.append(time.perf_counter() - began[-1]))
    try:
        since = time.perf_counter()
        start_batch(db, RunSpec("bench", started_by="bench"), jobs, chunk=chunk)
        return time.perf_counter() - since, held
    finally:
        db.dispose()


def _costs(db: Database, run_ids: list[str]) -> tuple[int, int]:
    """(runs with a crash counted, tool calls run more than once) among `run_ids`."""
    with db.read() as s:
        crashed = s.exec(
            select(func.count())
            .select_from(RunRow)
            .where(col(RunRow.id).in_(run_ids), col(RunRow.crashes) > 0)
        ).one()
        repeated = s.exec(
            select(func.count())
            .select_from(LedgerRow)
            .where(col(LedgerRow.run_id).in_(run_ids), col(LedgerRow.executions) > 1)
        ).one()
    return int(crashed), int(repeated)


def _lost_claims(log: Path) -> int:
    return log.read_text(errors="replace").count("lost the claim")


async def measure(
    args: argparse.Namespace, settings: Settings, store: str, mode: str, log: Path
) -> Figures:
    client = DurableClient(settings=settings)
    hosts = Interactive(client, args.in_flight)
    going = asyncio.ensure_future(hosts.run_all())
    try:
        await asyncio.sleep(2.0)  # connections opened, the worker warm: not measured
        idle_from = time.perf_counter()
        await asyncio.sleep(args.idle)
        start_from = time.perf_counter()
        jobs = [(f"job-{n}", f"big job {n}") for n in range(args.jobs)]
        chunk = len(jobs) if mode == "whole" else args.chunk
        start_seconds, held = await asyncio.to_thread(_start, settings.database_url, jobs, chunk)
        start_until = time.perf_counter()
        hosts.stop()
        await going
        crashed, repeated = await asyncio.to_thread(_costs, client.db, hosts.run_ids)
        return Figures(
            store=store,
            mode=mode,
            jobs=args.jobs,
            start_seconds=start_seconds,
            longest_hold=max(held, default=start_seconds),
            median_hold=statistics.median(held) if held else start_seconds,
            idle=hosts.within(idle_from, start_from),
            during=hosts.overlapping(start_from, start_until),
            crashed=crashed,
            lost_claims=_lost_claims(log),
            repeated_tools=repeated,
            failed=hosts.failed,
            refused=hosts.refused,
        )
    finally:
        hosts.stop()
        client.close()


def one(args: argparse.Namespace, base: Path, store: str, mode: str) -> Figures | None:
    made = bench_store(base / mode, store, f"start_{mode}")
    if made is None:
        return None
    home, url, name = made
    port = free_port()
    env = bench_env(home, url, port, f"relayq-bench-start-{os.getpid()}-{store}-{mode}:")
    env |= {"RELAYQ_WORKER_BATCHES": "skip"}
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", str(args.latency), "--turns", str(args.turns)],
        cwd=ROOT,
    )  # fmt: skip
    log = home / "worker.log"
    worker = start_worker(env, "asyncio", 100, log, "bench-start")
    try:
        worker_ready(log, worker)
        return asyncio.run(measure(args, Settings.from_env(env), store, mode, log))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        server.terminate()
        server.wait(timeout=10)
        if store != "sqlite":
            drop_postgres(name)


def print_table(figures: list[Figures], args: argparse.Namespace) -> None:
    print(
        f"\n{os.cpu_count()} cores; {args.in_flight} interactive runs in flight of {args.turns} "
        f"turns, model latency {args.latency:g} s; a batch of {args.jobs} jobs started beside "
        f"them (chunked: {args.chunk} jobs a transaction, {args.pause:g} s apart, the way "
        "every start goes now; whole: one transaction, as before)\n"
    )
    print(
        "| store | start | started in s | lock held s, median | longest | idle runs | idle p50 ms "
        "| runs during | p50 during ms | p50 ratio | host calls refused | claims lost "
        "| tool calls repeated | runs failed |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figures:
        ratio = f.p50(f.during) / f.p50(f.idle) if f.idle and f.during else float("nan")
        print(
            f"| {f.store} | {f.mode} | {f.start_seconds:.1f} | {f.median_hold:.2f} "
            f"| {f.longest_hold:.2f} "
            f"| {len(f.idle)} | {f.p50(f.idle):.0f} | {len(f.during)} | {f.p50(f.during):.0f} "
            f"| {ratio:.2f}x | {f.refused} | {f.crashed + f.lost_claims} | {f.repeated_tools} "
            f"| {f.failed} |"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--jobs", type=int, default=100_000, help="jobs in the batch started")
    add("--chunk", type=int, default=runs.CHUNK, help="jobs a transaction, chunked")
    add("--pause", type=float, default=runs.CHUNK_PAUSE, help="seconds between chunks")
    add("--in-flight", type=int, default=10, help="interactive runs going on at once")
    add("--turns", type=int, default=3, help="model turns per interactive run")
    add("--latency", type=float, default=0.2, help="seconds the model takes per call")
    add("--idle", type=float, default=10.0, help="seconds of interactive runs measured idle")
    add("--stores", default="sqlite", help="stores, comma-separated: sqlite,postgresql")
    add("--modes", default=",".join(MODES), help="chunked, whole, or both")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # A lever to measure: the pause every chunked start makes on SQLite, in this process.
    runs.CHUNK_PAUSE = args.pause
    with bench_home("rq-bench-start-") as base:
        figures = [
            f
            for store in args.stores.split(",")
            for mode in args.modes.split(",")
            if (f := one(args, base, store, mode))
        ]
    print_table(figures, args)


if __name__ == "__main__":
    main()
