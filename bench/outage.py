"""A provider outage under load: runs done and failed, with and without provider circuits.

    python -m bench.outage                  # 40 runs of 5 turns, the provider down 90 s
    python -m bench.outage --runs 200 --down 120
    python -m bench.outage --hang store     # the store silent 20 s instead (`bench.hang`)
    python -m bench.outage --hang broker

Two worker processes (asyncio pool, SQLite store, Redis broker) run the
benchmark's agent against a local model server (`bench.model_server`, in a
process of its own). Once every run is under way the server is killed
(SIGKILL: connections refused, as for a provider gone) and started again on
the same port `--down` seconds later. The same batch runs twice in one go:
with the circuit (RELAYQ_PROVIDER_CIRCUIT=1: the turns wait for the provider
without spending tries, one probe every RELAYQ_PROVIDER_PROBE_EVERY) and
without it (=0: each turn spends its RELAYQ_MODEL_RETRIES retries, backoff from
RELAYQ_RETRY_BASE, doubling, and its run fails once they are spent). The
settings are the defaults unless given: 5 retries from 1 s spend about 30 s.

Each row says how the runs ended, the tries the outage spent (the runs'
`attempts`), the model calls the server answered, and how long after the
provider's return the runs finished (the median run and the last).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlmodel import col, select

from bench.hang import measure_hang, print_hang_table
from bench.homes import bench_home, mode_folders
from bench.inflight import (
    free_port,
    model_env,
    redis_url,
    start_worker,
    stop_workers,
    wait_all,
    wait_ready,
)
from bench.model_server import ServerProcess
from store import RunRow
from tasks import DurableClient, Settings

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class Outcome:
    circuit: bool
    runs: int
    done: int
    failed: int
    attempts: int
    """Failed tries the runs counted, summed."""
    answered: int
    """Model calls the server answered after it came back."""
    median_after: float
    """Seconds from the provider's return to the median run's end (runs done only)."""
    last_after: float
    errors: set[str]


def _ended(client: DurableClient, ids: list[str]) -> list[RunRow]:
    with client.db.read() as s:
        return list(s.exec(select(RunRow).where(col(RunRow.id).in_(ids))))


async def _under_way(server: ServerProcess, runs: int) -> None:
    """Until the server has answered a call for every run (each has more to make)."""
    while int(server.stats()["answered"] or 0) < runs:  # noqa: ASYNC110 (polls the server)
        await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace, home: Path, circuit: bool) -> Outcome:
    server = ServerProcess(
        free_port(), "--latency", str(args.latency), "--turns", str(args.turns)
    ).start()
    env = model_env(home, server, "outage") | {
        "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
        "RELAYQ_PROVIDER_CIRCUIT": "1" if circuit else "0",
        "RELAYQ_PROVIDER_PROBE_EVERY": str(args.probe_every),
        "RELAYQ_MODEL_RETRIES": str(args.retries),
        "RELAYQ_RETRY_BASE": str(args.retry_base),
    }
    broker = redis_url()
    if broker:
        env["RELAYQ_BROKER_URL"] = broker
    logs = [home / f"worker-{n}.log" for n in range(args.workers)]
    workers = [
        start_worker(env, "asyncio", args.runs, log, f"bench-outage-{n}")
        for n, log in enumerate(logs)
    ]
    client = DurableClient(settings=Settings.from_env(env))
    try:
        for log, worker in zip(logs, workers, strict=True):
            await asyncio.to_thread(wait_ready, log, worker)
        ids = await client.start_many("bench", [f"job {i}" for i in range(args.runs)])
        await _under_way(server, args.runs)
        server.kill()
        await asyncio.sleep(args.down)  # the outage itself
        server.start()
        back = time.time()
        await wait_all(client, set(ids))
        answered = int(server.stats()["answered"] or 0)
        runs = await asyncio.to_thread(_ended, client, ids)
    finally:
        stop_workers(workers)
        client.close()
        server.kill()
    after = sorted(_seconds_after(r.updated_at, back) for r in runs if r.status == "done")
    return Outcome(
        circuit=circuit,
        runs=args.runs,
        done=sum(r.status == "done" for r in runs),
        failed=sum(r.status == "failed" for r in runs),
        attempts=sum(r.attempts for r in runs),
        answered=answered,
        median_after=statistics.median(after) if after else 0.0,
        last_after=after[-1] if after else 0.0,
        errors={(r.error or "")[:70] for r in runs if r.status == "failed"},
    )


def _seconds_after(moment: datetime, back: float) -> float:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.timestamp() - back


def print_table(results: list[Outcome], args: argparse.Namespace) -> None:
    print(
        f"\n{args.workers} worker processes, {os.cpu_count()} cores; {args.runs} runs of "
        f"{args.turns} turns, model latency {args.latency:g} s; the provider killed once every "
        f"run was under way and back {args.down:g} s later; RELAYQ_MODEL_RETRIES="
        f"{args.retries}, RELAYQ_RETRY_BASE={args.retry_base:g}, RELAYQ_PROVIDER_PROBE_EVERY="
        f"{args.probe_every:g}\n"
    )
    print("| provider circuit | runs | done | failed | tries spent | calls after its return "
          "| median run done after its return (s) | last (s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {'on' if r.circuit else 'off'} | {r.runs} | {r.done} | {r.failed} "
            f"| {r.attempts} | {r.answered} | {r.median_after:.1f} | {r.last_after:.1f} |"
        )
    for r in results:
        for error in sorted(r.errors):
            print(f"\ncircuit {'on' if r.circuit else 'off'}, failed with: {error}...")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--runs", type=int, default=40, help="runs started at once")
    add("--turns", type=int, default=5, help="model calls per run")
    add("--latency", type=float, default=0.5, help="seconds the model takes per call")
    add("--down", type=float, help="seconds the part is away (90 for the provider, 20 hung)")
    add("--hang", choices=("store", "broker"), help="silence this part instead (bench.hang)")
    add("--postgres", default=os.environ.get("RELAYQ_TEST_POSTGRES", PG_ADMIN),
        help="--hang store: the server to make a database of the benchmark's own on")  # fmt: skip
    add("--give-up", type=float, default=300.0, help="--hang: seconds to wait for every run")
    add("--workers", type=int, default=2, help="worker processes")
    add("--retries", type=int, default=5, help="RELAYQ_MODEL_RETRIES")
    add("--retry-base", type=float, default=1.0, help="RELAYQ_RETRY_BASE")
    add("--probe-every", type=float, default=5.0, help="RELAYQ_PROVIDER_PROBE_EVERY")
    add("--modes", default="on,off", help="circuit on, off, or both (on,off)")
    args = parser.parse_args(argv)
    if args.down is None:
        args.down = 20.0 if args.hang else 90.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.hang:
        with bench_home("rq-bench-hang-") as home:
            folders = mode_folders("defaults,tighter", home)
            hung = [asyncio.run(measure_hang(args, folder, mode)) for mode, folder in folders]
        print_hang_table(hung, args)
        return
    with bench_home("rq-bench-outage-") as home:
        results = [
            asyncio.run(measure(args, folder, circuit=mode == "on"))
            for mode, folder in mode_folders(args.modes, home)
        ]
    print_table(results, args)


if __name__ == "__main__":
    main()
