"""What a durable turn costs the host: end-to-end latency, and the host's CPU per turn.

    python -m bench.latency                          # SQLite; 300 sequential runs, 200 at once
    python -m bench.latency --sequential 100 --many 100 --stores sqlite,postgresql

One asyncio worker process, the local model server answering at once. Each
phase measures the client's two ways of waiting side by side, in the same run,
against the same worker: `pushed` (workers announce the runs they settle; one
query reads every woken run) and `polled` (each run polled on its own, every 10
to 250 ms, as the client waited before issue 13). Everything else is the same
client: store calls inline on SQLite, one read for a run's result.

- sequential: runs of one turn, one at a time (`client.run`), alternating
  blocks of each way; the latency of each run as the host sees it (start to
  result), p50 and p90, and the host's CPU (`time.process_time`) per turn;
- many: `--many` runs of 5 turns started at once (`start_many`) and waited on
  together (`result(wait=True)` for each, gathered); the host's CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port, start_worker
from bench.inflight import wait_ready as worker_ready
from bench.turns import start_server
from tasks import DurableClient, Settings
from tasks.client.client import Waiting

WAYS: tuple[Waiting, ...] = ("pushed", "polled")
MANY_TURNS = 5


@dataclass
class Sequential:
    store: str
    way: str
    seconds: list[float]
    cpu: float

    def p(self, q: int) -> float:
        """The q-th percentile, in ms."""
        return 1000 * statistics.quantiles(self.seconds, n=100)[q - 1]

    def cpu_ms(self) -> float:
        return 1000 * self.cpu / len(self.seconds)


@dataclass
class Many:
    store: str
    way: str
    runs: int
    seconds: float
    cpu: float
    not_done: int

    def cpu_ms(self) -> float:
        return 1000 * self.cpu / (self.runs * MANY_TURNS)


async def sequential(settings: Settings, store: str, runs: int) -> list[Sequential]:
    out = {way: Sequential(store, way, [], 0.0) for way in WAYS}
    block = max(runs // 2, 2)
    for n in range(4):  # pushed, polled, pushed, polled: each way `runs` in all
        way = WAYS[n % 2]
        async with DurableClient(settings=settings, waiting=way) as client:
            for i in range(3):  # warm: connections, the waiter's subscription
                await client.run("bench", f"warm {way} {n} {i}")
            cpu = time.process_time()
            for i in range(block):
                started = time.perf_counter()
                res = await client.run("bench", f"seq {way} {n} {i}", timeout=60)
                out[way].seconds.append(time.perf_counter() - started)
                assert res.status == "done", res.error
            out[way].cpu += time.process_time() - cpu
    return list(out.values())


async def many(settings: Settings, store: str, runs: int) -> list[Many]:
    out = []
    for way in WAYS:
        async with DurableClient(settings=settings, waiting=way) as client:
            await client.run("bench", f"warm {way}")
            cpu, started = time.process_time(), time.perf_counter()
            ids = await client.start_many("bench", [f"many {way} {i}" for i in range(runs)])
            results = await asyncio.gather(*(client.result(r, wait=True, timeout=300) for r in ids))
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        not_done = sum(1 for r in results if r.status != "done")
        out.append(Many(store, way, runs, seconds, cpu, not_done))
    return out


@contextmanager
def serving(env: dict[str, str], home: Path, name: str, turns: int) -> Iterator[None]:
    """The model server, answering at once after `turns` turns a run, and one asyncio worker."""
    port = int(env["RELAYQ_BENCH_MODEL_URL"].split(":")[-1].split("/")[0])
    server = start_server(port, turns)
    log = home / f"worker-{name}.log"
    worker = start_worker(env, "asyncio", 500, log, f"bench-latency-{name}")
    try:
        worker_ready(log, worker)
        time.sleep(0.5)  # the worker's first beat and sweep are not a turn's cost
        yield
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        server.terminate()
        server.wait(timeout=10)


def one(args: argparse.Namespace, base: Path, store: str) -> tuple[list[Sequential], list[Many]]:
    made = bench_store(base, store, "latency")
    if made is None:
        return [], []
    home, url, name = made
    env = bench_env(home, url, free_port(), f"relayq-bench-latency-{os.getpid()}-{store}:")
    settings = Settings.from_env(env)
    try:
        with serving(env, home, "sequential", 1):
            seq = asyncio.run(sequential(settings, store, args.sequential))
        with serving(env, home, "many", MANY_TURNS):
            at_once = asyncio.run(many(settings, store, args.many))
    finally:
        if store != "sqlite":
            drop_postgres(name)
    return seq, at_once


def print_tables(seq: list[Sequential], at_once: list[Many]) -> None:
    print(f"\none asyncio worker process, {os.cpu_count()} cores, model answering at once\n")
    print("sequential: runs of one turn, one at a time; latency as the host sees it\n")
    print("| store | waiting | runs | p50 ms | p90 ms | host CPU ms/turn |")
    print("|---|---|---:|---:|---:|---:|")
    for r in seq:
        print(
            f"| {r.store} | {r.way} | {len(r.seconds)} | {r.p(50):.2f} | {r.p(90):.2f} "
            f"| {r.cpu_ms():.2f} |"
        )
    print(f"\nmany: runs of {MANY_TURNS} turns started and waited on at once\n")
    print("| store | waiting | runs | turns | seconds | host CPU ms/turn | not done |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for m in at_once:
        print(
            f"| {m.store} | {m.way} | {m.runs} | {m.runs * MANY_TURNS} | {m.seconds:.1f} "
            f"| {m.cpu_ms():.2f} | {m.not_done} |"
        )
    print()
    for store in dict.fromkeys(r.store for r in seq):
        ways = {r.way: r for r in seq if r.store == store}
        crowd = {r.way: r for r in at_once if r.store == store}
        pushed, polled = ways["pushed"], ways["polled"]
        print(
            f"{store}: pushed / polled: sequential p50 {pushed.p(50) / polled.p(50):.2f}x, "
            f"p90 {pushed.p(90) / polled.p(90):.2f}x, host CPU per turn "
            f"{pushed.cpu_ms() / polled.cpu_ms():.2f}x; many, host CPU per turn "
            f"{crowd['pushed'].cpu_ms() / crowd['polled'].cpu_ms():.2f}x"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--sequential", type=int, default=300, help="runs of one turn, one at a time, per way")
    add("--many", type=int, default=200, help=f"runs of {MANY_TURNS} turns started at once")
    add("--stores", default="sqlite", help="stores, comma-separated: sqlite,postgresql")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    seq: list[Sequential] = []
    at_once: list[Many] = []
    with bench_home("rq-bench-latency-") as base:
        for store in args.stores.split(","):
            s, m = one(args, base, store)
            seq += s
            at_once += m
    print_tables(seq, at_once)


if __name__ == "__main__":
    main()
