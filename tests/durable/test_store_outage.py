"""The store goes away under runs in flight: none is stranded, none fails, no tool call is
repeated without its attempt counting up, and the worker lives through it.

Issue 19: with PostgreSQL crashed for 10 s under 60 in-flight runs, every turn
in flight raised, its message was acknowledged, and all 60 runs were still
`running` minutes after the store was back (their claim named a worker whose
heartbeat was fresh again, so no sweep took them). Hosts got a raw driver
error. Here the store is a PostgreSQL of the test's own, crashed with `pg_ctl
stop -m immediate` and started again; and a SQLite file that another process
keeps locked for longer than the busy timeout, under two workers that must
not take each other's runs for a dead worker's when it frees.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import and_, func, or_
from sqlmodel import col, select

from store import Database, RunRow, StoreUnavailable, get_run
from store.statements import LEDGER
from tasks import DurableClient, Settings
from tests.postgres_server import PrivatePostgres

from .conftest import SUBMITTER, Broker, Eventually, Worker, serving
from .store_outage_agents import CALLS

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first

BOUND = 30.0
"""Seconds from the store's return to every run finished."""
OUTAGE = 10.0
"""Seconds the store stays away."""


def _env(broker: Broker, tmp_path: Path, database_url: str, **extra: str) -> dict[str, str]:
    # The store is a PostgreSQL of the test's own: its worker's pool is a deployment's, not
    # the suite's small one for the machine's shared server (tests/conftest.py), which a
    # store slowed down made wait past the pool's timeout.
    shared = {k: v for k, v in os.environ.items() if k != "RELAYQ_STORE_CONNECTIONS"}
    return {
        **shared,
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": database_url,
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": "tests.durable.store_outage_agents",
        "RELAYQ_TEST_LOG": str(tmp_path / "log"),
        "RELAYQ_CONCURRENCY": "100",
        **extra,
    }


def tool_attempts(log: Path) -> dict[tuple[str, str], list[int]]:
    """Each tool call's executions, by (run, call): the attempt each one was told."""
    found: dict[tuple[str, str], list[int]] = defaultdict(list)
    path = log / "tool.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        _, run_id, call_id, _, attempt = line.split()
        found[(run_id, call_id)].append(int(attempt))
    return found


def in_flight(db: Database, run_ids: list[str]) -> int:
    """Runs begun and not finished: in a turn, or queued for their next one. In one query,
    so that a poll sees one moment: runs of 0.2 s turns spend a good part of their time
    between turns, and a slow machine sends fewer turns at once."""
    status, turns = col(RunRow.status), col(RunRow.turns)
    begun = or_(status == "running", and_(status == "queued", turns >= 1))
    query = select(func.count()).select_from(RunRow).where(col(RunRow.id).in_(run_ids), begun)
    with db.read() as s:
        return int(s.exec(query).one())


async def all_finished(db: Database, run_ids: list[str]) -> bool:
    return all(get_run(db, r).status not in ("queued", "running") for r in run_ids)


async def outlive(workers: list[Worker], since: float, seconds: float) -> None:
    """Until `seconds` after `since` (the outage under test), the workers stay alive."""
    while time.monotonic() - since < seconds:
        for worker in workers:
            assert worker.proc is not None
            assert worker.proc.poll() is None, "a worker died of the outage"
        await asyncio.sleep(0.2)


async def finish_in_bound(
    db: Database, run_ids: list[str], eventually: Eventually, back_at: float, what: str
) -> None:
    """Every run finishes within the bound of the store's return (`what` it was)."""
    await eventually(lambda: all_finished(db, run_ids), timeout=BOUND, what="every run to finish")
    print(f"{len(run_ids)} runs finished {time.monotonic() - back_at:.1f} s after {what}")


def check_runs(db: Database, log: Path, run_ids: list[str]) -> None:
    """Every run done, and no tool call told the same attempt twice.

    The tool's last execution was told the attempt the ledger counted. An attempt may
    be missing from the log: a start counted in a commit whose answer the outage lost
    ran nothing, and the next start counts on from it ("may have run, never did run",
    docs/durable-runs.md).
    """
    runs = [get_run(db, r) for r in run_ids]
    assert [r.status for r in runs] == ["done"] * len(runs), {r.error for r in runs}
    attempts = tool_attempts(log)
    with db.connect() as conn:
        counted = {
            (run_id, call_id): executions
            for run_id, call_id, executions in conn.execute(
                select(LEDGER.c.run_id, LEDGER.c.call_id, LEDGER.c.executions).where(
                    LEDGER.c.run_id.in_(run_ids)
                )
            )
        }
    for run_id in run_ids:
        for n in range(1, CALLS + 1):
            seen = attempts[(run_id, f"c{n}")]
            assert seen, f"{run_id} c{n} never ran"
            assert seen == sorted(set(seen)), f"{run_id} c{n} told the same attempt twice: {seen}"
            assert seen[-1] == counted[run_id, f"c{n}"], (run_id, n, seen, counted[run_id, f"c{n}"])


@pytest.mark.postgres
@pytest.mark.timeout(180)
async def test_runs_in_flight_when_postgresql_crashes_finish_once_it_is_back(
    private_pg: PrivatePostgres, broker: Broker, tmp_path: Path, eventually: Eventually
):
    # Given a worker on a PostgreSQL of this test's own (its URL with a password, which
    # trust authentication ignores and no error may show), and 60 runs in flight
    url = private_pg.url.replace("postgres@", "postgres:hunter2@")
    env = _env(broker, tmp_path, url)
    worker = Worker(env, tmp_path / "worker.log").start()
    assert worker.proc is not None
    settings = Settings.from_env(env)
    client = DurableClient(settings=settings)
    api = serving(settings)
    try:
        server = api.__enter__()
        run_ids = await client.start_many("outlast", [f"outage {i}" for i in range(60)])
        await eventually(lambda: in_flight(client.db, run_ids) >= 30, what="runs in flight")

        # When the server crashes and stays down
        private_pg.crash()
        down_at = time.monotonic()

        # Then a host meanwhile gets one typed error, naming the store and no password ...
        with pytest.raises(StoreUnavailable) as refused:
            await client.start("outlast", "during the outage")
        assert f"127.0.0.1:{private_pg.port}" in str(refused.value)
        assert "hunter2" not in str(refused.value) + repr(refused.value.args)
        # ... the API answers 503 with a Retry-After ...
        async with server.http(SUBMITTER) as http:
            res = await http.post("/api/runs", json={"agent": "outlast", "prompt": "x"})
        assert res.status_code == 503, res.text
        assert int(res.headers["Retry-After"]) >= 1
        assert "hunter2" not in res.text
        # ... and the worker lives through the outage
        await outlive([worker], down_at, OUTAGE)
        private_pg.start()
        back_at = time.monotonic()

        # And every run finishes within the bound of the store's return, each tool call
        # run once (or again as a counted attempt), by the same worker process
        await finish_in_bound(client.db, run_ids, eventually, back_at, "PostgreSQL returned")
        check_runs(client.db, tmp_path / "log", run_ids)
        assert worker.proc.poll() is None
        log = worker.logfile.read_text()
        assert "hunter2" not in log
        assert "Traceback" not in log, log[-3000:]
    finally:
        api.__exit__(None, None, None)
        client.close()
        worker.stop()


@pytest.mark.timeout(180)
async def test_runs_in_flight_when_sqlite_stays_locked_past_the_busy_timeout_finish_once(
    broker: Broker, tmp_path: Path, eventually: Eventually, monkeypatch: pytest.MonkeyPatch
):
    # Given two workers on one SQLite file with a 1 s busy timeout, that take a worker
    # silent for 3 s for dead, and 60 runs in flight across them
    path = tmp_path / "relayq.db"
    quick = {
        "RELAYQ_SQLITE_BUSY_TIMEOUT": "1",
        "RELAYQ_HEARTBEAT_EVERY": "0.5",
        "RELAYQ_WORKER_TIMEOUT": "3",
        "RELAYQ_SWEEP_EVERY": "1",
    }
    env = _env(broker, tmp_path, f"sqlite:///{path}", RELAYQ_CONCURRENCY="50", **quick)
    monkeypatch.setenv("RELAYQ_SQLITE_BUSY_TIMEOUT", "1")  # the host's store, too
    workers = [Worker(env, tmp_path / f"worker-{n}.log").start() for n in range(2)]
    client = DurableClient(settings=Settings.from_env(env))
    try:
        run_ids = await client.start_many("outlast", [f"locked {i}" for i in range(60)])
        await eventually(lambda: in_flight(client.db, run_ids) >= 30, what="runs in flight")

        # When another process holds the file's write lock for 8 s: past the busy
        # timeout, and past the time a worker may go without a heartbeat
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            await client.start("outlast", "while locked")
        assert "locked" in str(refused.value)
        await outlive(workers, locked_at, 8.0)
        lock.execute("COMMIT")
        lock.close()
        freed_at = time.monotonic()

        # Then every run finishes, none taken from a live worker (no crash counted), and
        # no tool call repeated without its attempt counting up
        await finish_in_bound(client.db, run_ids, eventually, freed_at, "the lock freed")
        check_runs(client.db, tmp_path / "log", run_ids)
        assert [get_run(client.db, r).crashes for r in run_ids] == [0] * len(run_ids)
        assert [w.proc.poll() for w in workers if w.proc is not None] == [None, None]
    finally:
        client.close()
        for worker in workers:
            worker.stop()
