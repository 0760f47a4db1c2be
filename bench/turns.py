"""What one turn costs the worker as a conversation grows: CPU, bytes written, storage.

    python -m bench.turns                               # runs of 25, 200 and 800 turns
    python -m bench.turns --lengths 25,800 --total 1600 --stores sqlite,postgresql

For each length L, one asyncio worker process runs `--total / L` runs of L turns each
(the same number of turns at every length) against the local model server answering
at once, `--in-flight` runs at a time at every length (so only the length differs:
more runs at once share the worker's costs per wakeup). Measured from the worker's
own counters (/proc): CPU seconds (user and system) and bytes written to storage,
divided by the turns taken; and the store's growth per turn. On PostgreSQL the
worker writes nothing itself: the server's write-ahead log grows instead
(`pg_current_wal_lsn`, the whole server's, so run it on a quiet one). Each row's
ratio is to the shortest length's, measured in the same run: a flat cost per turn
is 1.0x at every length.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from bench.homes import bench_home
from bench.inflight import (
    bench_env,
    bench_store,
    cpu_seconds,
    drop_postgres,
    free_port,
    start_worker,
    wait_all,
    wait_ready,
)
from store import Database
from tasks import DurableClient, Settings

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cost:
    store: str
    length: int
    runs: int
    turns: int
    cpu_seconds: float
    bytes_written: int
    """By the worker process; on PostgreSQL, by the server to its write-ahead log."""
    stored_bytes: int
    seconds: float
    failed: int

    def cpu_ms(self) -> float:
        return 1000 * self.cpu_seconds / self.turns

    def written_kb(self) -> float:
        return self.bytes_written / self.turns / 1000

    def stored_per_turn(self) -> float:
        return self.stored_bytes / self.turns


def written(pid: int) -> int:
    """Bytes the process caused to be written to storage (`write_bytes`)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def wal_position(url: str) -> int:
    """Where PostgreSQL's write-ahead log stands, in bytes (0 for SQLite)."""
    if url.startswith("sqlite"):
        return 0
    db = Database(url)
    try:
        with db.read() as s:
            query = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
            return int(s.execute(text(query)).scalar_one())
    finally:
        db.dispose()


def store_size(url: str, home: Path) -> int:
    if url.startswith("sqlite"):
        return sum(p.stat().st_size for p in home.glob("relayq.db*"))
    db = Database(url)
    try:
        with db.read() as s:
            return int(s.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    finally:
        db.dispose()


def start_server(port: int, length: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", "0", "--turns", str(length)],
        cwd=ROOT,
    )  # fmt: skip
    time.sleep(1.0)
    return server


async def measure(
    env: dict[str, str], url: str, home: Path, length: int, runs: int, in_flight: int
) -> Cost:
    settings = Settings.from_env(env)
    client = DurableClient(settings=settings)
    log = home / f"worker-{length}.log"
    worker = start_worker(env, "asyncio", max(runs, 1), log, f"bench-turns-{length}")
    try:
        await asyncio.to_thread(wait_ready, log, worker)
        # The worker's start (imports, migrations) is not a turn's cost.
        await asyncio.sleep(1.0)
        cpu, size = cpu_seconds(worker.pid), store_size(url, home)
        io = written(worker.pid) + wal_position(url)
        started = time.perf_counter()
        failed = 0
        for first in range(0, runs, in_flight):
            prompts = [f"long {i}" for i in range(first, min(runs, first + in_flight))]
            failed += await wait_all(client, set(await client.start_many("bench-long", prompts)))
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(worker.pid) - cpu
        io = written(worker.pid) + wal_position(url) - io
        size = store_size(url, home) - size
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        client.close()
    store = "sqlite" if url.startswith("sqlite") else "postgresql"
    return Cost(store, length, runs, runs * length, cpu, io, size, seconds, failed)


def one(args: argparse.Namespace, base: Path, store: str) -> list[Cost]:
    made = bench_store(base, store, "turns")
    if made is None:
        return []
    home, url, name = made
    port = free_port()
    env = bench_env(home, url, port, f"relayq-bench-turns-{os.getpid()}-{store}:")
    out = []
    try:
        for length in args.lengths:
            server = start_server(port, length)
            try:
                runs = max(1, args.total // length)
                out.append(asyncio.run(measure(env, url, home, length, runs, args.in_flight)))
            finally:
                server.terminate()
                server.wait(timeout=10)
    finally:
        if store != "sqlite":
            drop_postgres(name)
    return out


def print_table(results: list[Cost], in_flight: int) -> None:
    print(f"\none asyncio worker process, {os.cpu_count()} cores, model answering at once, "
          f"{in_flight} runs at a time\n")  # fmt: skip
    print("| store | turns a run | runs | worker CPU ms/turn | vs shortest | kB written/turn "
          "| vs shortest | stored B/turn | seconds | not done |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for store in dict.fromkeys(r.store for r in results):
        mine = [r for r in results if r.store == store]
        first = mine[0]
        for r in mine:
            print(
                f"| {r.store} | {r.length} | {r.runs} | {r.cpu_ms():.2f} "
                f"| {r.cpu_ms() / first.cpu_ms():.2f}x | {r.written_kb():.1f} "
                f"| {r.written_kb() / max(first.written_kb(), 1e-9):.2f}x "
                f"| {r.stored_per_turn():.0f} | {r.seconds:.1f} | {r.failed} |"
            )
    print("\nkB written: by the worker process (sqlite); to the server's write-ahead log "
          "(postgresql)")  # fmt: skip


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--lengths", default="25,200,800", help="turns a run, comma-separated")
    add("--total", type=int, default=3200, help="turns at each length (runs = total / length)")
    add("--stores", default="sqlite", help="stores, comma-separated: sqlite,postgresql")
    add("--in-flight", type=int, default=4, help="runs at a time, at every length")
    args = parser.parse_args()
    args.lengths = [int(n) for n in args.lengths.split(",")]
    return args


def main() -> None:
    args = parse()
    results = []
    with bench_home("rq-bench-turns-") as base:
        for store in args.stores.split(","):
            results += one(args, base, store)
    print_table(results, args.in_flight)


if __name__ == "__main__":
    main()
