"""Finished work purged at volume, beside live work (`store.retention`, `relayq purge`).

    python -m bench.retention                     # 200,000 finished runs of 3 turns
    python -m bench.retention --runs 20000 --stores sqlite

For each store, a fresh one is seeded with `--runs` runs that finished 60 to 48 days ago,
each with the rows a run of 3 turns with a local tool leaves: its 6 messages, 2
ledger rows, and a `run.finished` event delivered to a webhook (its delivery and
attempt). One asyncio worker serves interactive runs (one turn, the model answering
at once), one at a time: first idle, then while `relayq purge --finished-before 30d`
runs in a process of its own (as `relayq purge` does it, each write transaction
timed). The table gives the purge's time and rate, its longest write transaction, the
interactive latency idle and during it (the goal: a p50 within 1.5x of idle), and the
store's rows and bytes before and after (SQLite: the file after a checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, insert, text
from sqlmodel import SQLModel, col, select

from bench.batch import interactive
from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port
from bench.latency import serving
from store import Database, migrate
from store.models import (
    DeliveryAttemptRow,
    DeliveryRow,
    EventRow,
    LedgerRow,
    MessageRow,
    RunRow,
    utcnow,
)
from store.retention import purge_finished
from tasks import DurableClient, Settings

ROOT = Path(__file__).resolve().parents[1]
SEED_CHUNK = 2000
"""Runs seeded a transaction."""


@dataclass
class Figures:
    store: str
    runs: int
    seed_seconds: float
    purge_seconds: float
    purged: int
    longest_ms: float
    """The purge's longest write transaction."""
    longest_removal_ms: float
    longest_vacuum_ms: float
    idle: list[float]
    during: list[float]
    rows_before: int
    rows_after: int
    """Every table's rows, the interactive runs' among them."""
    seeded_left: int
    """Rows of the seeded runs still in the store after the purge."""
    bytes_before: int
    bytes_after: int

    @staticmethod
    def ms(seconds: list[float], q: float) -> float:
        ordered = sorted(seconds)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def seed_rows(first: int, count: int) -> dict[type[SQLModel], list[dict[str, Any]]]:
    """`count` runs, numbered from `first`, as a 3-turn run with a local tool leaves them."""
    start = utcnow() - timedelta(days=60)
    rows: dict[type[SQLModel], list[dict[str, Any]]] = {
        m: [] for m in (RunRow, MessageRow, LedgerRow, EventRow, DeliveryRow, DeliveryAttemptRow)
    }
    for n in range(first, first + count):
        at = start + timedelta(seconds=5 * n)  # a run finished every 5 s, 60 to 48 days ago
        run_id = f"run_seed{n:08d}"
        rows[RunRow].append({
            "id": run_id, "agent": "bench", "conversation_id": run_id, "status": "done",
            "version": 6, "turns": 3, "text": "finished after 2 steps", "created_at": at,
            "updated_at": at,
        })  # fmt: skip
        bodies = transcript(n)
        for seq, body in enumerate(bodies):
            rows[MessageRow].append({
                "conversation_id": run_id, "seq": seq, "run_id": run_id, "role": body["role"],
                "body": body, "created_at": at,
            })  # fmt: skip
        for step in range(2):
            rows[LedgerRow].append({
                "run_id": run_id, "at": 1 + 2 * step, "call_id": f"call_{step}", "attempt": "",
                "outcome": {"output": f"step {step} done"}, "created_at": at,
            })  # fmt: skip
        event_id = f"ev_seed{n:08d}"
        rows[EventRow].append({
            "id": event_id, "type": "run.finished", "run_id": run_id,
            "payload": {"run_id": run_id, "status": "done"}, "created_at": at,
        })  # fmt: skip
        rows[DeliveryRow].append({
            "id": n + 1, "event_id": event_id, "endpoint": "ops", "state": "delivered",
            "attempts": 1, "next_at": at, "delivered_at": at, "last_status": 200, "created_at": at,
        })  # fmt: skip
        rows[DeliveryAttemptRow].append({
            "delivery_id": n + 1, "event_id": event_id, "endpoint": "ops", "attempt": 1,
            "status": 200, "duration_ms": 12.0, "at": at,
        })  # fmt: skip
    return rows


def transcript(n: int) -> list[dict[str, Any]]:
    """A run's 6 messages: the prompt, two tool calls with their results, the answer."""
    bodies: list[dict[str, Any]] = [
        {"role": "user", "content": f"job {n}: look up the order and refund it"}
    ]
    for step in range(2):
        call = {"name": "step", "arguments": f'{{"n": {step}}}'}
        bodies.append({
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{step}", "type": "function", "function": call}],
        })  # fmt: skip
        bodies.append({"role": "tool", "tool_call_id": f"call_{step}", "content": "done"})
    bodies.append({"role": "assistant", "content": "finished after 2 steps"})
    return bodies


def seed(db: Database, runs: int) -> None:
    for first in range(0, runs, SEED_CHUNK):
        chunk = seed_rows(first, min(SEED_CHUNK, runs - first))
        with db.transaction() as conn:
            for model, rows in chunk.items():
                conn.execute(insert(model.__table__), rows)  # type: ignore[attr-defined]


def row_count(db: Database) -> int:
    tables = [t for name, t in SQLModel.metadata.tables.items() if name.startswith("relayq_")]
    with db.read() as s:
        return sum(int(s.exec(select(func.count()).select_from(t)).one()) for t in tables)


def seeded_rows(db: Database) -> int:
    """Rows of the seeded runs, by their ids (`run_seed...`, `ev_seed...`)."""
    with db.read() as s:
        return sum(
            int(
                s.exec(
                    select(func.count()).select_from(model).where(col(column).like(pattern))
                ).one()
            )
            for model, column, pattern in (
                (RunRow, RunRow.id, "run_seed%"),
                (MessageRow, MessageRow.run_id, "run_seed%"),
                (LedgerRow, LedgerRow.run_id, "run_seed%"),
                (EventRow, EventRow.id, "ev_seed%"),
                (DeliveryRow, DeliveryRow.event_id, "ev_seed%"),
                (DeliveryAttemptRow, DeliveryAttemptRow.event_id, "ev_seed%"),
            )
        )


def store_bytes(db: Database) -> int:
    """The store's size: SQLite's file once its write-ahead log is checkpointed into it,
    PostgreSQL's database."""
    with db.connect() as conn:
        if db.is_sqlite:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            path = conn.engine.url.database
            assert path is not None
            return os.path.getsize(path)
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


async def purge_beside_interactive(
    env: dict[str, str], settings: Settings, interactive_runs: int
) -> tuple[list[float], list[float], Purge]:
    """Interactive runs idle, then while a purge runs in a process of its own."""
    async with DurableClient(settings=settings) as client:
        for n in range(3):  # the first runs open connections; not measured
            await interactive(client, n)
        idle = [await interactive(client, n) for n in range(interactive_runs)]
        purge = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.retention", "--purge", settings.database_url,
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        finished = asyncio.ensure_future(purge.communicate())
        during: list[float] = []
        while not finished.done():
            during.append(await interactive(client, len(during)))
        out, _ = await finished
        if purge.returncode != 0:
            raise RuntimeError(f"the purge exited {purge.returncode}")
    return idle, during, Purge(**json.loads(out))


@dataclass
class Purge:
    runs: int
    seconds: float
    transactions: list[tuple[str, float]]
    """Each write transaction's kind (`removal`, `vacuum`) and length in seconds (SQLite's
    write lock held that long; PostgreSQL's reads are transactions too, `read`)."""

    def longest(self, kind: str | None = None) -> float:
        return max((t for k, t in self.transactions if kind in (None, k)), default=0.0)


def purge(url: str) -> Purge:
    """What `relayq purge --finished-before 30d` does, each write transaction timed."""
    db = Database(url)
    lengths: list[tuple[str, float]] = []
    began: dict[int, tuple[float, list[str]]] = {}
    # The write transactions' engine: on SQLite the one of `store.sqlite_writes`; on
    # PostgreSQL the one engine.
    engine = db.engines[-1]

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        began[id(conn)] = (time.perf_counter(), [])

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if id(conn) in began:
            began[id(conn)][1].append(statement.lstrip()[:30].lower())

    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        at, statements = began.pop(id(conn), (time.perf_counter(), []))
        lengths.append((_kind(statements), time.perf_counter() - at))

    try:
        start = time.perf_counter()
        purged = purge_finished(db, utcnow() - timedelta(days=30))
        return Purge(purged.runs, time.perf_counter() - start, lengths)
    finally:
        db.dispose()


def _kind(statements: list[str]) -> str:
    if any(s.startswith("delete") for s in statements):
        return "removal"
    # The vacuum's pragmas go through the driver's cursor, unseen here: a write
    # transaction with no statement of SQLAlchemy's is one of them.
    return "vacuum" if not statements else "read"


def one(args: argparse.Namespace, base: Path, store: str) -> Figures | None:
    made = bench_store(base, store, "retention")
    if made is None:
        return None
    home, url, name = made
    env = bench_env(home, url, free_port(), f"relayq-bench-retention-{os.getpid()}-{store}:")
    settings = Settings.from_env(env)
    db = Database(url)
    try:
        migrate(db)
        began = time.perf_counter()
        seed(db, args.runs)
        if not db.is_sqlite:
            # As autovacuum would have, long before a purge of runs 30 days old: the
            # planner needs to know how many rows the bulk load left.
            with db.connect() as conn:
                conn.execute(text("ANALYZE"))
        seed_seconds = time.perf_counter() - began
        rows_before, bytes_before = row_count(db), store_bytes(db)
        with serving(env, home, "retention", 1):
            idle, during, purged = asyncio.run(
                purge_beside_interactive(env, settings, args.interactive)
            )
        return Figures(
            store=store, runs=args.runs, seed_seconds=seed_seconds,
            purge_seconds=purged.seconds, purged=purged.runs,
            longest_ms=1000 * purged.longest(),
            longest_removal_ms=1000 * purged.longest("removal"),
            longest_vacuum_ms=1000 * purged.longest("vacuum"),
            idle=idle, during=during, rows_before=rows_before,
            rows_after=row_count(db), seeded_left=seeded_rows(db),
            bytes_before=bytes_before, bytes_after=store_bytes(db),
        )  # fmt: skip
    finally:
        db.dispose()
        if store != "sqlite":
            drop_postgres(name)


def print_table(figures: list[Figures]) -> None:
    print(
        "| store | finished runs | purged | purge s | runs/s | longest transaction ms "
        "| longest removal / vacuum ms "
        "| interactive p50 idle / during ms "
        "| during / idle | p99 idle / during ms | rows before → after | MB before → after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figures:
        p50_idle, p50_during = statistics.median(f.idle), statistics.median(f.during)
        print(
            f"| {f.store} | {f.runs:,} | {f.purged:,} | {f.purge_seconds:.1f} "
            f"| {f.purged / f.purge_seconds:,.0f} | {f.longest_ms:.0f} "
            f"| {f.longest_removal_ms:.0f} / {f.longest_vacuum_ms:.0f} "
            f"| {1000 * p50_idle:.1f} / {1000 * p50_during:.1f} | {p50_during / p50_idle:.2f}x "
            f"| {Figures.ms(f.idle, 0.99):.1f} / {Figures.ms(f.during, 0.99):.1f} "
            f"| {f.rows_before:,} → {f.rows_after:,} "
            f"| {f.bytes_before / 2**20:,.1f} → {f.bytes_after / 2**20:,.1f} |"
        )
    print()
    for f in figures:
        during = f"{len(f.during)} interactive runs during the purge"
        print(f"{f.store}: seeded in {f.seed_seconds:.1f} s; {during}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--runs", type=int, default=200_000, help="finished runs of 3 turns to purge")
    add("--interactive", type=int, default=50, help="interactive runs measured idle")
    add("--stores", default="sqlite,postgresql", help="stores to compare, comma-separated")
    add("--purge", metavar="URL", help=argparse.SUPPRESS)  # the purge's own process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.purge:
        print(json.dumps(vars(purge(args.purge))))
        return
    figures: list[Figures] = []
    with bench_home("rq-bench-retention-") as base:
        for store in args.stores.split(","):
            made = one(args, base, store)
            if made is not None:
                figures.append(made)
                print_table([made])  # each store's figures as soon as they are in
                sys.stdout.flush()
    if len(figures) > 1:
        print_table(figures)


if __name__ == "__main__":
    main()
