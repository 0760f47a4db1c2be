"""A worker's long life: what it holds, sampled while 100,000 turns go through it.

    python -m bench.soak                          # 100,000 turns: 20 waves of 1,000 runs of 5
    python -m bench.soak --waves 4 --wave 200     # a short one
    python -m bench.soak --store postgresql

One asyncio worker, a local model server answering after `--latency` (0.05 s), the
machine's Redis (else the embedded one). Runs go through in waves of `--wave`; every
other wave is a batch, so batch queues come and go. After each wave, with the worker
idle: its resident memory, open file descriptors and threads; the broker's client
connections on the benchmark's db and its keys under the benchmark's prefix.

The verdict compares the last wave with the first plateau, the wave a quarter of the
way in (the caches fill first: the provider's fragments cache up to its 64 MiB bound):
memory may grow by `--rss-slack` (10%), nothing else may grow at all; each verdict says
by how much it did. Issue 51's target: nothing grows past its first plateau.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.homes import bench_home
from bench.inflight import (
    bench_env,
    drop_postgres,
    free_port,
    postgres_url,
    rss_mb,
    start_worker,
    stop_workers,
    wait_all,
    wait_ready,
)
from bench.model_server import ServerProcess
from tasks import DurableClient, Settings

__all__ = ["Sample", "main"]


@dataclass(frozen=True)
class Sample:
    """What the worker and the broker hold after a wave."""

    wave: int
    turns: int
    """Turns taken in all, by the end of the wave."""
    seconds: float
    rss_mb: float
    fds: int
    threads: int
    clients: int
    """Connections to the broker on the benchmark's db, the sampler's own left out."""
    keys: int
    """Keys under the benchmark's prefix."""
    failed: int


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def clients_of(broker: redis.Redis, db: int) -> int:
    mine = broker.client_id()
    return sum(1 for c in broker.client_list() if int(c["db"]) == db and int(c["id"]) != mine)


def keys_of(broker: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in broker.scan_iter(match=f"{prefix}*", count=1000))


async def soak(args: argparse.Namespace, env: dict[str, str], home: Path) -> list[Sample]:
    settings = Settings.from_env(env)
    log = home / "worker.log"
    # INFO for its "ready." line; no line a task (RELAYQ_TASK_LOG=0): 100,000 of them
    quiet = env | {"RELAYQ_TASK_LOG": "0"}
    worker = start_worker(quiet, "asyncio", args.concurrency, log, "bench-soak")
    client = DurableClient(settings=settings)
    broker = redis.Redis.from_url(settings.broker_url.replace("redis+socket://", "unix://"))
    db = int(broker.connection_pool.connection_kwargs.get("db", 0))
    samples: list[Sample] = []
    try:
        await asyncio.to_thread(wait_ready, log, worker)
        began = time.perf_counter()
        for wave in range(1, args.waves + 1):
            prompts = [f"wave {wave} job {i}" for i in range(args.wave)]
            if wave % 2 == 0:
                jobs = [(f"w{wave}j{i}", p) for i, p in enumerate(prompts)]
                ids = list((await client.start_batch("bench", jobs, name=f"w{wave}")).runs.values())
            else:
                ids = await client.start_many("bench", prompts)
            failed = await wait_all(client, set(ids))
            await asyncio.sleep(args.settle)  # the batch's queue let go, the last acks sent
            samples.append(
                Sample(
                    wave=wave,
                    turns=wave * args.wave * args.turns,
                    seconds=time.perf_counter() - began,
                    rss_mb=rss_mb(worker.pid),
                    fds=fds_of(worker.pid),
                    threads=threads_of(worker.pid),
                    clients=clients_of(broker, db),
                    keys=keys_of(broker, settings.key_prefix),
                    failed=failed,
                )
            )
            print_sample(samples[-1])
    finally:
        stop_workers([worker])
        client.close()
        broker.close()
    return samples


def print_sample(s: Sample) -> None:
    print(
        f"| {s.wave} | {s.turns:,} | {s.seconds:.0f} | {s.rss_mb:.1f} | {s.fds} | {s.threads} "
        f"| {s.clients} | {s.keys} | {s.failed} |",
        flush=True,
    )


def verdicts(samples: list[Sample], rss_slack: float) -> list[str]:
    """Each measure's peak after the first plateau against its peak up to it. The plateau
    is the wave a quarter of the way in (the second, at least), once the caches have
    filled to their bounds."""
    if len(samples) < 3:
        return ["too few waves for a plateau"]
    k = max(len(samples) // 4, 1)
    before, after = samples[: k + 1], samples[k + 1 :]
    said = []
    for name in ("rss_mb", "fds", "threads", "clients", "keys"):
        # Descriptors come and go with the model server's idle connections: a leak is a
        # floor that rises. The rest, a peak.
        most = min if name == "fds" else max
        then = most(getattr(s, name) for s in before)
        now = most(getattr(s, name) for s in after)
        bound = then * (1 + rss_slack) if name == "rss_mb" else then
        grows = "GROWS" if now > bound else "flat"
        said.append(
            f"{name}: {then:g} up to wave {k + 1}, {now:g} after ({now / then:.3f}x): {grows}"
        )
    said.append(f"runs not done: {sum(s.failed for s in samples)}")
    return said


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--waves", type=int, default=20, help="waves of runs, one after the other")
    add("--wave", type=int, default=1000, help="runs in each wave")
    add("--turns", type=int, default=5, help="turns of each run")
    add("--latency", type=float, default=0.05, help="the model server's seconds a call")
    add("--concurrency", type=int, default=500, help="the worker's turns at once")
    add("--store", default="sqlite", choices=("sqlite", "postgresql"))
    add("--settle", type=float, default=3.0, help="seconds idle before each sample")
    add("--rss-slack", type=float, default=0.10, help="memory's allowed growth past the plateau")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    port = free_port()
    server = ServerProcess(port, "--latency", str(args.latency), "--turns", str(args.turns))
    server.start()
    name = f"relayq_bench_soak_{os.getpid()}"
    try:
        with bench_home("rq-bench-soak-") as home:
            url = (
                f"sqlite:///{home / 'relayq.db'}" if args.store == "sqlite" else postgres_url(name)
            )
            if url is None:
                sys.exit("no PostgreSQL server to soak on")
            env = bench_env(home, url, port, f"relayq-bench-soak-{os.getpid()}:")
            print(f"\none asyncio worker, {args.store}, {args.waves} waves of {args.wave} runs "
                  f"of {args.turns} turns, model latency {args.latency:g} s\n")  # fmt: skip
            print("| wave | turns | s | worker RSS MiB | fds | threads | broker clients "
                  "| broker keys | not done |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            samples = asyncio.run(soak(args, env, home))
    finally:
        server.kill()
        if args.store != "sqlite":
            drop_postgres(name)
    print()
    for line in verdicts(samples, args.rss_slack):
        print(f"- {line}")


if __name__ == "__main__":
    main()
