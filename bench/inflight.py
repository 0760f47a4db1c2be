"""How many model calls one worker keeps in flight: durable turns per second against the ideal.

    python -m bench.inflight                      # 500 runs of 5 turns, 1 s model latency
    python -m bench.inflight --runs 200 --latency 0.5 --pools asyncio,threads
    python -m bench.inflight --pools asyncio --stores sqlite --batch-queues 0,10,100

A local model server answers every call after a fixed latency. N runs start
at once against this one machine's workers: one process per pool, or N with
`pool*N` (Redis broker; SQLite and PostgreSQL stores). With all N in flight
the ideal is N / latency turns per second; the table shows what each pool
achieved, as a share of that ideal, and the workers' peak memory. Pools other
than asyncio hold a process or a thread per turn, so they get their own,
smaller N (`--classic-runs`), and the ratio is still to their ideal.

`--batch-queues 0,10,100` measures each count side by side: before the runs start,
that many batches of one run each wait on a relay call, so the workers consume that
many batch queues besides their own (each `BRPOP` names every queue at every priority
step) while the measured runs go through the turn queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import func
from sqlmodel import col, select

from bench.homes import bench_home
from store import Database, RunRow, migrate
from tasks import DurableClient, Settings

if TYPE_CHECKING:
    from bench.model_server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("RELAYQ_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class Outcome:
    store: str
    pool: str
    concurrency: int
    runs: int
    turns: int
    seconds: float
    peak_rss_mb: float
    failed: int
    cpu_seconds: float = 0.0
    """The worker processes' CPU (user and system) while the runs ran."""
    batch_queues: int = 0
    """Idle batch queues the workers consumed meanwhile."""

    def cpu_ms(self) -> float:
        return 1000 * self.cpu_seconds / self.turns

    def turns_per_second(self) -> float:
        return self.turns / self.seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every worker's process group, then wait for each (a warm shutdown)."""
    for worker in workers:
        os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=60)


def model_env(home: Path, server: ServerProcess, name: str) -> dict[str, str]:
    """A worker's environment for the benchmark's agent on the local model server, its
    store and key prefix its own (`home`); the broker is the settings' default."""
    return {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_KEY_PREFIX": f"relayq-bench-{name}-{home.name}-{os.getpid()}:",
        "RELAYQ_AGENTS": "bench.agents",
        "RELAYQ_BENCH_MODEL_URL": server.url,
        "RELAYQ_BENCH_KEY": "bench-key",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def redis_url() -> str:
    """The machine's Redis on its own db number, or "" for the embedded broker."""
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.3):
            return "redis://127.0.0.1:6379/14"
    except OSError:
        return ""


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / TICKS


def tree_cpu(pid: int) -> float:
    """`cpu_seconds` of a process and its live children (a prefork worker's pool)."""
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        children = ""
    total = 0.0
    for p in [pid, *(int(c) for c in children.split())]:
        try:
            total += cpu_seconds(p)
        except OSError:
            continue
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MiB."""
    total = 0
    pids = [pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in children.split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Sampler(threading.Thread):
    """The peak of the workers' summed resident memory."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, sum(rss_mb(p) for p in self.pids))


def migrated(database_url: str) -> None:
    """The store at `database_url` migrated to head (`store.migrate`)."""
    db = Database(database_url)
    try:
        migrate(db)
    finally:
        db.dispose()


def start_worker(
    env: dict[str, str],
    pool: str,
    concurrency: int,
    log: Path,
    name: str,
    loglevel: str = "INFO",
) -> subprocess.Popen[bytes]:
    env = env | {"RELAYQ_POOL": pool, "RELAYQ_CONCURRENCY": str(concurrency)}
    # The store migrated here first, as a deployment's is: a worker that migrates a new
    # store keeps Alembic's memory (about 10 MiB), which is not the turns' cost.
    migrated(Settings.from_env(env).database_url)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers", "worker", "--loglevel", loglevel,
             "--without-mingle", "--without-gossip", "-n", f"{name}@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return proc


async def measure(
    env: dict[str, str],
    spec: str,
    concurrency: int,
    runs: int,
    turns: int,
    home: Path,
    loglevel: str = "INFO",
    batch_queues: int = 0,
) -> Outcome:
    """`spec` is a pool, or `pool*N` for N worker processes on this machine; with
    `batch_queues`, that many batches wait on a relay call while the runs go."""
    pool, _, procs = spec.partition("*")
    count = int(procs or 1)
    settings = Settings.from_env(env)
    client = DurableClient(settings=settings)
    logs = [home / f"worker-{pool}-{n}.log" for n in range(count)]
    each = -(-concurrency // count)
    workers = [
        start_worker(env, pool, each, log, f"bench-{pool}-{n}", loglevel)
        for n, log in enumerate(logs)
    ]
    sampler = Sampler([w.pid for w in workers])
    try:
        for log, worker in zip(logs, workers, strict=True):
            await asyncio.to_thread(wait_ready, log, worker)
        if batch_queues:
            await idle_batches(client, batch_queues, logs)
        # The workers' start (imports, migrations) is not the turns' cost.
        await asyncio.sleep(1.0)
        sampler.start()
        cpu = sum(tree_cpu(w.pid) for w in workers)
        started = time.perf_counter()
        ids = await client.start_many("bench", [f"job {i}" for i in range(runs)])
        failed = await wait_all(client, set(ids))
        seconds = time.perf_counter() - started
        cpu = sum(tree_cpu(w.pid) for w in workers) - cpu
    finally:
        sampler.stop.set()
        stop_workers(workers)
        client.close()
    store = "postgresql" if "postgresql" in env["RELAYQ_DATABASE_URL"] else "sqlite"
    return Outcome(
        store, spec, each * count, runs, runs * turns, seconds, sampler.peak, failed, cpu,
        batch_queues,
    )  # fmt: skip


async def idle_batches(client: DurableClient, count: int, logs: list[Path]) -> None:
    """`count` batches of one `bench-relayed` run each, left waiting on their relay call,
    and every worker consuming their queues (`workers.batch_queues`), as its log says."""
    for n in range(count):
        await client.start_batch("bench-relayed", [(f"idle-{n}", "wait")], name=f"idle-{n}")
    deadline = time.monotonic() + 120
    while not all(log.read_bytes().count(b"Started consuming from") >= count for log in logs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not all consume the {count} batch queues")
        await asyncio.sleep(0.2)


def wait_ready(log: Path, worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while b"ready." not in log.read_bytes():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


async def wait_all(client: DurableClient, ids: set[str]) -> int:
    """Wait until no run is queued or running; returns how many did not end `done`."""

    def count(statuses: tuple[str, ...]) -> int:
        with client.db.read() as s:
            query = (
                select(func.count())
                .select_from(RunRow)
                .where(col(RunRow.id).in_(ids), col(RunRow.status).in_(statuses))
            )
            return int(s.exec(query).one())

    while await asyncio.to_thread(count, ("queued", "running")):  # noqa: ASYNC110 (polls a database)
        await asyncio.sleep(0.1)
    return len(ids) - await asyncio.to_thread(count, ("done",))


def bench_store(base: Path, store: str, tag: str) -> tuple[Path, str, str] | None:
    """A benchmark's home under `base` and its store: (home, database URL, PostgreSQL
    database name, made for this process and `tag`); None, said, when PostgreSQL is
    asked for and no server answers."""
    home = base / store
    home.mkdir(parents=True)
    name = "relayq_bench_" + re.sub(r"\W", "_", f"{os.getpid()}_{tag}")
    url = f"sqlite:///{home / 'relayq.db'}" if store == "sqlite" else postgres_url(name)
    if url is None:
        print(f"skipping {store}: no server", file=sys.stderr)
        return None
    return home, url, name


def postgres_url(name: str) -> str | None:
    """A fresh PostgreSQL database for the run, if a server answers; dropped by `drop_postgres`."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}"')
    except Exception:
        return None
    return PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name


def drop_postgres(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--runs", type=int, default=500, help="runs started at once (asyncio pool)")
    add("--classic-runs", type=int, default=40, help="runs for the prefork/threads pools")
    add("--turns", type=int, default=5, help="model turns per run")
    add("--latency", type=float, default=1.0, help="seconds the model takes per call")
    add(
        "--pools",
        default="asyncio,asyncio*2,prefork",
        help="pools to compare, comma-separated; pool*N runs N worker processes",
    )
    add("--stores", default="sqlite,postgresql", help="stores to compare, comma-separated")
    add("--loglevel", default="INFO", help="the workers' log level (INFO logs every task)")
    add(
        "--batch-queues",
        default="0",
        help="idle batch queues the workers consume meanwhile; comma-separated counts are "
        "measured side by side",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", str(args.latency), "--turns", str(args.turns)],
        cwd=ROOT,
    )  # fmt: skip
    results = []
    try:
        time.sleep(1.5)
        with bench_home("rq-bench-") as home:
            for store in args.stores.split(","):
                for pool in args.pools.split(","):
                    for queues in (int(n) for n in args.batch_queues.split(",")):
                        slug = f"{pool.replace('*', 'x')}-{queues}"
                        results += one(args, home / f"{store}-{slug}", store, pool, port, queues)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print_table(results, args.latency)


def one(
    args: argparse.Namespace, home: Path, store: str, pool: str, port: int, batch_queues: int = 0
) -> list[Outcome]:
    kind = pool.partition("*")[0]
    runs = args.runs if kind == "asyncio" else args.classic_runs
    concurrency = runs if kind in ("asyncio", "threads") else (os.cpu_count() or 2)
    home.mkdir(parents=True)
    name = "relayq_bench_" + re.sub(r"\W", "_", f"{os.getpid()}_{home.name}")
    url = f"sqlite:///{home / 'relayq.db'}" if store == "sqlite" else postgres_url(name)
    if url is None:
        print(f"skipping {store}: no server", file=sys.stderr)
        return []
    env = bench_env(home, url, port, f"relayq-bench-{home.name}-{os.getpid()}:")
    try:
        outcome = measure(
            env, pool, concurrency, runs, args.turns, home, args.loglevel, batch_queues
        )
        return [asyncio.run(outcome)]
    finally:
        if store != "sqlite":
            drop_postgres(name)


def bench_env(home: Path, url: str, port: int, prefix: str) -> dict[str, str]:
    """A benchmark worker's environment: its home and store, its own key prefix on the
    machine's Redis (or the embedded broker), and the model server on `port`."""
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": url,
        "RELAYQ_KEY_PREFIX": prefix,
        "RELAYQ_AGENTS": "bench.agents",
        "RELAYQ_BENCH_MODEL_URL": f"http://127.0.0.1:{port}/v1",
        "RELAYQ_BENCH_KEY": "bench-key",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    broker = redis_url()
    if broker:
        env["RELAYQ_BROKER_URL"] = broker
    return env


def print_table(results: list[Outcome], latency: float) -> None:
    print(
        f"\none worker machine, {os.cpu_count()} cores, model latency {latency:g} s; "
        "ideal = runs in flight / latency\n"
    )
    print("| store | pool | batch queues | in flight | runs | turns | seconds | turns/s | ideal "
          "| % of ideal | worker CPU ms/turn | peak RSS MiB | not done |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ideal = min(r.runs, r.concurrency) / latency
        rate = r.turns_per_second()
        print(
            f"| {r.store} | {r.pool} | {r.batch_queues} | {r.concurrency} | {r.runs} | {r.turns} "
            f"| {r.seconds:.1f} "
            f"| {rate:.1f} | {ideal:.0f} | {100 * rate / ideal:.0f}% | {r.cpu_ms():.2f} "
            f"| {r.peak_rss_mb:.0f} "
            f"| {r.failed} |"
        )
    for store in dict.fromkeys(r.store for r in results):
        mine = {r.pool: r for r in results if r.store == store}
        for pool, fast in mine.items():
            for other_pool, slow in mine.items():
                if pool.startswith("asyncio") and not other_pool.startswith("asyncio"):
                    ratio = fast.turns_per_second() / slow.turns_per_second()
                    print(f"\n{store}: {pool} / {other_pool}, turns per second: {ratio:.1f}x")


if __name__ == "__main__":
    main()
