"""Provider limits shared by two workers: the rate relayq achieves, and the 429s it gets.

    python -m bench.limits                      # 20 calls a second, 150 runs of 4 turns
    python -m bench.limits --limit 10 --runs 100

A local model server (`bench.model_server --limit-rps`) enforces a rate limit
as providers do, a token bucket of `limit` calls refilled `limit` a second,
and answers 429 with Retry-After above it. Two worker processes (asyncio pool,
SQLite store, Redis broker) run the same batch against it twice: once with
the agent's `ProviderConfig(requests_per_minute=limit * 60)`, the limiter
shared through Redis, and once without, where every call goes at once and a
429 is retried on its own after its Retry-After (up to 1,000 tries, so no run
fails). The server counts what it answered and what it refused; the achieved
rate is the answered calls over the time from the first to the last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from bench.agents import STEP, bench_model
from bench.homes import bench_home, mode_folders
from bench.inflight import free_port, redis_url, start_worker, stop_workers, wait_all, wait_ready
from bench.model_server import ServerProcess
from relayq import Agent
from tasks import DurableClient, Settings

_rpm = os.environ.get("RELAYQ_BENCH_RPM")

limited = Agent(
    "bench-limits",
    bench_model(requests_per_minute=int(_rpm) if _rpm else None),
    tools=[STEP],
    max_turns=50,
)
"""The benchmark's agent; limited when RELAYQ_BENCH_RPM is set (the workers' environment)."""


@dataclass
class Outcome:
    limiter: bool
    limit: float
    runs: int
    answered: int
    refused: int
    span: float
    """Seconds from the first answered call to the last, on the server's clock."""
    seconds: float
    """Seconds from starting the runs to the last one ending."""
    not_done: int

    @property
    def rate(self) -> float:
        return (self.answered - 1) / self.span if self.span > 0 else 0.0


async def measure(args: argparse.Namespace, home: Path, limiter: bool) -> Outcome:
    server = ServerProcess(
        free_port(), "--latency", str(args.latency), "--turns", str(args.turns),
        "--limit-rps", str(args.limit),
    ).start()  # fmt: skip
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
        "RELAYQ_KEY_PREFIX": f"relayq-bench-limits-{home.name}-{os.getpid()}:",
        "RELAYQ_AGENTS": "bench.limits",
        "RELAYQ_BENCH_MODEL_URL": server.url,
        "RELAYQ_BENCH_KEY": "bench-key",
        "RELAYQ_MODEL_RETRIES": "1000",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    if limiter:
        env["RELAYQ_BENCH_RPM"] = str(round(args.limit * 60))
    broker = redis_url()
    if broker:
        env["RELAYQ_BROKER_URL"] = broker
    logs = [home / f"worker-{n}.log" for n in range(args.workers)]
    workers = [
        start_worker(env, "asyncio", args.runs, log, f"bench-limits-{n}")
        for n, log in enumerate(logs)
    ]
    client = DurableClient(settings=Settings.from_env(env))
    try:
        for log, worker in zip(logs, workers, strict=True):
            await asyncio.to_thread(wait_ready, log, worker)
        started = time.perf_counter()
        ids = await client.start_many("bench-limits", [f"job {i}" for i in range(args.runs)])
        not_done = await wait_all(client, set(ids))
        seconds = time.perf_counter() - started
        found = server.stats()
    finally:
        stop_workers(workers)
        client.close()
        server.kill()
    first, last = found["first"], found["last"]
    span = float(last) - float(first) if first is not None and last is not None else 0.0
    return Outcome(
        limiter=limiter,
        limit=args.limit,
        runs=args.runs,
        answered=int(found["answered"] or 0),
        refused=int(found["refused"] or 0),
        span=span,
        seconds=seconds,
        not_done=not_done,
    )


def print_table(results: list[Outcome], args: argparse.Namespace) -> None:
    print(
        f"\n{args.workers} worker processes, {os.cpu_count()} cores; server limit "
        f"{args.limit:g} calls/s (token bucket, 429 + Retry-After above it); "
        f"{args.runs} runs of {args.turns} turns, model latency {args.latency:g} s\n"
    )
    print("| relayq limiter | calls answered | 429s received | seconds | achieved calls/s "
          "| % of limit | runs not done |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        name = f"on (requests_per_minute={round(r.limit * 60)})" if r.limiter else "off"
        print(
            f"| {name} | {r.answered} | {r.refused} | {r.seconds:.1f} | {r.rate:.2f} "
            f"| {100 * r.rate / r.limit:.1f}% | {r.not_done} |"
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--limit", type=float, default=20.0, help="calls a second the server allows")
    add("--runs", type=int, default=150, help="runs started at once")
    add("--turns", type=int, default=4, help="model calls per run")
    add("--latency", type=float, default=0.5, help="seconds the model takes per call")
    add("--workers", type=int, default=2, help="worker processes")
    add("--modes", default="on,off", help="limiter on, off, or both (on,off)")
    return parser.parse_args()


def main() -> None:
    args = parse()
    with bench_home("rq-bench-limits-") as home:
        results = [
            asyncio.run(measure(args, folder, limiter=mode == "on"))
            for mode, folder in mode_folders(args.modes, home)
        ]
    print_table(results, args)


if __name__ == "__main__":
    main()
