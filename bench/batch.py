"""A batch at production size beside interactive runs: is the batch fast, and are people first?

    python -m bench.batch                       # 5,000 jobs of 3 turns, model latency 0.2 s
    python -m bench.batch --jobs 1000 --stores sqlite,postgresql --layouts shared

The local model server, and the workers of a layout:

- shared: one asyncio worker process (500 in flight) takes interactive and batch turns;
- split: one worker for interactive runs (`RELAYQ_WORKER_BATCHES=skip`, 100 in
  flight) and one for batches (`only`, 500 in flight), on the same machine.

In order, for each layout:

1. idle: `--interactive` runs (of as many turns), one at a time (`client.run`),
   with nothing else queued: their latency as the host sees it;
2. a batch of `--jobs` jobs starts (`start_batch`, one transaction); once a
   tenth of its runs have finished, a small batch of `--small` jobs starts, and
   interactive runs go one at a time for as long as the big batch runs;
3. then the big batch's status and export are read and timed, as `relayq batch
   status` and `relayq batch export` read them.

Interactive turns go at the highest priority and each batch's turns to a queue
of their own at lower ones, taken in turns. Priority decides what a worker takes
next from the broker; a turn it has taken shares the worker with every other
turn in flight. The tables show the batch's rate, when the small batch finished,
and the interactive runs' latency during the batches beside idle.
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

from sqlalchemy import func
from sqlmodel import col, select

from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port, start_worker
from bench.inflight import wait_ready as worker_ready
from store import FINISHED, OutboxRow, RunRow, batch_results, batch_status
from tasks import DurableClient, Settings

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Figures:
    store: str
    layout: str
    jobs: int
    turns: int
    start_seconds: float
    big_seconds: float
    first_done_seconds: float
    """When the big batch's first run finished, from its start."""
    small_jobs: int
    small_seconds: float
    small_big_left: int
    """Runs of the big batch still unfinished when the small one finished."""
    idle: list[float]
    during: list[float]
    not_done: int
    status_ms: float
    export_ms: float
    outbox_left: int

    @staticmethod
    def p50(seconds: list[float]) -> float:
        return 1000 * statistics.median(seconds)

    @staticmethod
    def worst(seconds: list[float]) -> float:
        return 1000 * max(seconds)


def unfinished(client: DurableClient, batch_id: str) -> int:
    with client.db.read() as s:
        query = (
            select(func.count())
            .select_from(RunRow)
            .where(RunRow.batch_id == batch_id, col(RunRow.status).not_in(FINISHED))
        )
        return int(s.exec(query).one())


def not_done(client: DurableClient, batch_ids: list[str]) -> int:
    with client.db.read() as s:
        query = (
            select(func.count())
            .select_from(RunRow)
            .where(col(RunRow.batch_id).in_(batch_ids), RunRow.status != "done")
        )
        return int(s.exec(query).one())


def outbox_rows(client: DurableClient) -> int:
    with client.db.read() as s:
        return int(s.exec(select(func.count()).select_from(OutboxRow)).one())


async def finished(client: DurableClient, batch_id: str, left: int = 0) -> float:
    """Wait until at most `left` runs of the batch are unfinished; the moment it was seen."""
    while await asyncio.to_thread(unfinished, client, batch_id) > left:  # noqa: ASYNC110 (polls a database)
        await asyncio.sleep(0.2)
    return time.perf_counter()


async def interactive(client: DurableClient, n: int) -> float:
    """One interactive run, waited for: its latency in seconds."""
    began = time.perf_counter()
    result = await client.run("bench", f"interactive {n}", timeout=600)
    if result.status != "done":
        raise RuntimeError(f"an interactive run ended {result.status}")
    return time.perf_counter() - began


async def interactive_until(client: DurableClient, done: asyncio.Future[float]) -> list[float]:
    """Interactive runs one after another, each started before `done` is."""
    seconds: list[float] = []
    while not done.done():
        seconds.append(await interactive(client, len(seconds)))
    return seconds


async def measure(args: argparse.Namespace, settings: Settings, store: str, layout: str) -> Figures:
    client = DurableClient(settings=settings)
    try:
        for n in range(2):  # the first runs open connections; not measured
            await interactive(client, n)
        idle = [await interactive(client, n) for n in range(args.interactive)]

        jobs = [(f"job-{n}", f"big job {n}") for n in range(args.jobs)]
        big_began = time.perf_counter()
        big = await client.start_batch("bench", jobs, started_by="bench")
        start_seconds = time.perf_counter() - big_began
        big_finished = asyncio.ensure_future(finished(client, big.batch_id))
        first_done = await finished(client, big.batch_id, left=args.jobs - 1)

        await finished(client, big.batch_id, left=args.jobs - args.jobs // 10)
        small_jobs = [(f"small-{n}", f"small job {n}") for n in range(args.small)]
        small_began = time.perf_counter()
        small = await client.start_batch("bench", small_jobs, started_by="bench")
        during_runs = asyncio.ensure_future(interactive_until(client, big_finished))
        small_done = await finished(client, small.batch_id)
        small_big_left = await asyncio.to_thread(unfinished, client, big.batch_id)
        big_done = await big_finished
        during = await during_runs

        began = time.perf_counter()
        status = await asyncio.to_thread(batch_status, client.db, big.batch_id)
        status_ms = 1000 * (time.perf_counter() - began)
        began = time.perf_counter()
        results = await asyncio.to_thread(batch_results, client.db, big.batch_id)
        export_ms = 1000 * (time.perf_counter() - began)
        if status.total != args.jobs or len(results) != args.jobs:
            raise RuntimeError(f"the batch shows {status.total} runs and exports {len(results)}")
        await asyncio.sleep(1.0)  # the last sent-marks
        return Figures(
            store=store,
            layout=layout,
            jobs=args.jobs,
            turns=args.turns,
            start_seconds=start_seconds,
            big_seconds=big_done - big_began,
            first_done_seconds=first_done - big_began,
            small_jobs=args.small,
            small_seconds=small_done - small_began,
            small_big_left=small_big_left,
            idle=idle,
            during=during,
            not_done=await asyncio.to_thread(not_done, client, [big.batch_id, small.batch_id]),
            status_ms=status_ms,
            export_ms=export_ms,
            outbox_left=await asyncio.to_thread(outbox_rows, client),
        )
    finally:
        client.close()


LAYOUTS = {
    # name: [(RELAYQ_WORKER_BATCHES, turns in flight)] per worker process
    "shared": [("serve", 500)],
    "split": [("skip", 100), ("only", 500)],
}


def one(args: argparse.Namespace, base: Path, store: str, layout: str) -> Figures | None:
    made = bench_store(base / layout, store, f"batch_{layout}")
    if made is None:
        return None
    home, url, name = made
    port = free_port()
    env = bench_env(home, url, port, f"relayq-bench-batch-{os.getpid()}-{store}-{layout}:")
    # No log line per task: 15,000 turns' lines would cost the worker more than the turns.
    env["RELAYQ_TASK_LOG"] = "0"
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", str(args.latency), "--turns", str(args.turns)],
        cwd=ROOT,
    )  # fmt: skip
    workers = []
    for n, (mode, in_flight) in enumerate(LAYOUTS[layout]):
        log = home / f"worker-{n}.log"
        own = env | {"RELAYQ_WORKER_BATCHES": mode}
        workers.append((log, start_worker(own, "asyncio", in_flight, log, f"bench-batch-{n}")))
    try:
        for log, worker in workers:
            worker_ready(log, worker)
        time.sleep(1.0)  # the workers' first beats and sweeps are not the batch's
        return asyncio.run(measure(args, Settings.from_env(env), store, layout))
    finally:
        for _, worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for _, worker in workers:
            worker.wait(timeout=60)
        server.terminate()
        server.wait(timeout=10)
        if store != "sqlite":
            drop_postgres(name)


def print_table(figures: list[Figures], latency: float) -> None:
    print(f"\n{os.cpu_count()} cores, model latency {latency:g} s; {describe_layouts()}\n")
    print(
        "| store | layout | batch | jobs | turns | started in s | first run done at s "
        "| finished in s | turns/s | not done |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for f in figures:
        turns = f.jobs * f.turns
        print(
            f"| {f.store} | {f.layout} | big | {f.jobs} | {turns} | {f.start_seconds:.2f} "
            f"| {f.first_done_seconds:.1f} | {f.big_seconds:.1f} | {turns / f.big_seconds:.1f} "
            f"| {f.not_done} |"
        )
        print(
            f"| {f.store} | {f.layout} | small, started at a tenth of the big | {f.small_jobs} "
            f"| {f.small_jobs * f.turns} | | | {f.small_seconds:.1f} | | |"
        )
    print("\ninteractive runs (as many turns), one at a time, as the host sees them\n")
    print(
        "| store | layout | idle runs | idle p50 ms | idle max ms | runs during the batches "
        "| p50 ms | max ms | p50 ratio |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for f in figures:
        during = (
            f"{f.p50(f.during):.1f} | {f.worst(f.during):.1f} "
            f"| {f.p50(f.during) / f.p50(f.idle):.2f}x"
            if f.during
            else "- | - | -"  # a batch too small to outlast the small one
        )
        print(
            f"| {f.store} | {f.layout} | {len(f.idle)} | {f.p50(f.idle):.1f} "
            f"| {f.worst(f.idle):.1f} | {len(f.during)} | {during} |"
        )
    print()
    for f in figures:
        print(
            f"{f.store}, {f.layout}: the small batch finished with {f.small_big_left} of the big "
            f"batch's {f.jobs} runs unfinished; the big batch's status read in "
            f"{f.status_ms:.0f} ms, its {f.jobs} results in {f.export_ms:.0f} ms; "
            f"{f.outbox_left} outbox rows left"
        )


def describe_layouts() -> str:
    return "; ".join(
        f"{name}: " + " + ".join(f"{mode} worker ({n} in flight)" for mode, n in workers)
        for name, workers in LAYOUTS.items()
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--jobs", type=int, default=5000, help="jobs in the big batch")
    add("--small", type=int, default=50, help="jobs in the small batch started after it")
    add("--turns", type=int, default=3, help="model turns per run")
    add("--latency", type=float, default=0.2, help="seconds the model takes per call")
    add("--interactive", type=int, default=10, help="interactive runs measured idle")
    add("--stores", default="sqlite", help="stores, comma-separated: sqlite,postgresql")
    add("--layouts", default="shared,split", help="worker layouts, comma-separated")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    with bench_home("rq-bench-batch-") as base:
        figures = [
            f
            for store in args.stores.split(",")
            for layout in args.layouts.split(",")
            if (f := one(args, base, store, layout))
        ]
    print_table(figures, args.latency)


if __name__ == "__main__":
    main()
