"""A part that goes silent (no RST, no FIN) wedges nothing (issue 37): the connection is
found silent within its bound and made again, through a proxy of the test's own
(`bench.hanging_proxy`) between relayq and a real server."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import col, select

from bench.hanging_proxy import HangingProxy
from store import Database, RunRow
from tasks import DurableClient, Settings
from tasks.broker.publish import sender_app
from tests.brokers import PrivateRedis
from tests.ports import free_port
from tests.postgres_server import PrivatePostgres

from .conftest import SUBMITTER, Broker, Eventually, Worker, serving
from .test_store_outage import _env, all_finished, check_runs, in_flight, outlive, tool_attempts

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first

SOON_TAKEN_OVER = {
    "RELAYQ_HEARTBEAT_EVERY": "1",
    "RELAYQ_WORKER_TIMEOUT": "4",
    "RELAYQ_REDELIVER_AFTER": "4",
}


@dataclass
class Hung:
    broker: PrivateRedis
    proxy: HangingProxy
    env: dict[str, str]
    settings: Settings


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[Hung]:
    """A Redis of the test's own, reached through a proxy that can go silent; checks of
    the broker's connections every second, and a 2 s bound on each command."""
    with PrivateRedis(tmp_path / "redis") as broker, HangingProxy(broker.port) as proxy:
        env = {
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": f"sqlite:///{tmp_path / 'relayq.db'}",
            "RELAYQ_BROKER_URL": f"redis://127.0.0.1:{proxy.port}/0",
            "RELAYQ_KEY_PREFIX": "hung:",
            "RELAYQ_BROKER_TIMEOUT": "2",
            "RELAYQ_BROKER_HEALTH_CHECK": "1",
        }
        yield Hung(broker, proxy, env, Settings.from_env(env))


def _worker_at_defaults(hung: Hung, tmp_path: Path, **extra: str) -> tuple[Worker, Settings]:
    """A worker, with the default bounds, whose broker connections all go through the
    proxy; and the settings of a host that reaches the broker directly (only the worker's
    connections go silent)."""
    env = {**os.environ, **hung.env, "RELAYQ_TEST_LOG": str(tmp_path / "log"), **extra}
    for bound in ("RELAYQ_BROKER_TIMEOUT", "RELAYQ_BROKER_HEALTH_CHECK"):
        env.pop(bound)
    worker = Worker(env, tmp_path / "worker.log").start()
    assert worker.proc is not None
    return worker, replace(hung.settings, broker_url=hung.broker.url, embedded_broker=False)


async def test_a_hosts_announcements_come_back_after_the_broker_went_silent(
    hung: Hung, eventually: Eventually, caplog: pytest.LogCaptureFixture
):
    # Given a client subscribed to the run announcements through the proxy
    caplog.set_level(logging.INFO, logger="tasks.client.waiting")
    async with DurableClient(settings=hung.settings) as client:
        waiter = client._waiter_here()
        await eventually(lambda: waiter.subscription is not None, what="the first subscription")
        first = waiter.subscription

        # When the broker goes silent for 5 s, and then only new connections are forwarded
        hung.proxy.black_hole()
        await eventually(lambda: waiter.subscription is None, timeout=10, what="the silence seen")
        hung.proxy.heal()

        # Then the client subscribes again on a new connection, and says so once each way
        await eventually(
            lambda: (waiter.subscription or 0) > (first or 0), timeout=15, what="a new subscription"
        )
    said = [r.getMessage() for r in caplog.records if "run announcements" in r.getMessage()]
    assert said == [
        "run announcements: the broker went silent; connecting again",
        "run announcements: the broker answers again",
    ]


def _unheard(port: int) -> float:
    """The worker's `relayq_broker_unheard_seconds`, scraped."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "relayq_broker_unheard_seconds":
                return float(sample.value)
    return 0.0


async def _through_a_silence(
    proxy: HangingProxy,
    worker: Worker,
    client: DurableClient,
    eventually: Eventually,
    log: Path,
    midway: Callable[[], object] = lambda: None,
) -> object:
    """With 40 runs in flight: the part silent for 20 s (ten runs started meanwhile, and
    `midway` called 12 s in), then only new connections carried, the old ones silent for
    good; ten runs started after. Every run must be done within 60 s of the heal, each
    tool call run once (or again only as a counted attempt), by the same worker process.
    Returns what `midway` did."""
    run_ids = await client.start_many("outlast", [f"silent {i}" for i in range(40)])
    await eventually(lambda: in_flight(client.db, run_ids) >= 20, what="runs in flight")
    proxy.black_hole()
    silent_at = time.monotonic()
    during = await client.start_many("outlast", [f"during {i}" for i in range(10)])
    await outlive([worker], silent_at, 12)
    seen = midway()
    await outlive([worker], silent_at, 20)
    proxy.heal()
    healed_at = time.monotonic()
    after = await client.start_many("outlast", [f"after {i}" for i in range(10)])

    every = run_ids + during + after
    await eventually(lambda: all_finished(client.db, every), timeout=60, what="all done")
    print(f"{len(every)} runs done {time.monotonic() - healed_at:.1f} s after the heal")
    check_runs(client.db, log, every)
    assert worker.proc is not None
    assert worker.proc.poll() is None
    return seen


async def _through_a_slowness(
    proxy: HangingProxy,
    worker: Worker,
    client: DurableClient,
    eventually: Eventually,
    log: Path,
) -> str:
    """With 20 runs in flight: every packet through the proxy held 2 s, for 30 s. Every
    run must be done, each tool call run once, on its first attempt (no turn taken for a
    dead worker's), by the same worker process. Returns the worker's log."""
    run_ids = await client.start_many("outlast", [f"slow {i}" for i in range(20)])
    await eventually(lambda: in_flight(client.db, run_ids) >= 10, what="runs in flight")
    proxy.slow(2.0)
    await outlive([worker], time.monotonic(), 30)
    proxy.fast()

    await eventually(lambda: all_finished(client.db, run_ids), timeout=90, what="all done")
    check_runs(client.db, log, run_ids)
    attempts = tool_attempts(log)
    assert {tuple(seen) for seen in attempts.values()} == {(1,)}
    assert worker.proc is not None
    assert worker.proc.poll() is None
    return worker.logfile.read_text()


@pytest.mark.timeout(240)
async def test_runs_in_flight_when_the_broker_goes_silent_finish_once_it_answers(
    hung: Hung, tmp_path: Path, eventually: Eventually
):
    # Given a worker, with the default bounds, whose broker connections all go through the
    # proxy, serving its metrics, and 40 runs in flight
    port = free_port()
    worker, direct = _worker_at_defaults(
        hung,
        tmp_path,
        RELAYQ_AGENTS="tests.durable.store_outage_agents",
        RELAYQ_CONCURRENCY="100",
        RELAYQ_WORKER_METRICS_PORT=str(port),
        RELAYQ_WORKER_METRICS_ADDR="127.0.0.1",
    )
    client = DurableClient(settings=direct)
    try:
        # When the broker goes silent for 20 s under 40 runs in flight (see the helper)
        # Then every run is done within 60 s of the heal, by the same worker process
        unheard = await _through_a_silence(
            hung.proxy, worker, client, eventually, tmp_path / "log", lambda: _unheard(port)
        )

        # And the consumer's silence was a metric, back near 0 once it heard the broker again
        assert isinstance(unheard, float)
        assert unheard >= 5
        await eventually(lambda: _unheard(port) < 3, what="the broker heard again")
    finally:
        client.close()
        worker.stop()


@dataclass
class BehindProxy:
    proxy: HangingProxy
    worker: Worker
    client: DurableClient
    """A host reaching the store directly: only the worker's connections go through."""


@contextmanager
def _worker_behind_proxy(
    pg: PrivatePostgres, broker: Broker, tmp_path: Path, **extra: str
) -> Iterator[BehindProxy]:
    """A worker, with the default bounds, whose store connections all go through a proxy
    to a PostgreSQL of the test's own."""
    with HangingProxy(pg.port) as proxy:
        env = _env(broker, tmp_path, pg.url.replace(f":{pg.port}/", f":{proxy.port}/"), **extra)
        for bound in ("RELAYQ_STORE_STATEMENT_TIMEOUT", "RELAYQ_STORE_SILENT_AFTER"):
            env.pop(bound, None)
        worker = Worker(env, tmp_path / "worker.log").start()
        client = DurableClient(settings=replace(Settings.from_env(env), database_url=pg.url))
        try:
            yield BehindProxy(proxy, worker, client)
        finally:
            client.close()
            worker.stop()


@pytest.mark.postgres
@pytest.mark.timeout(240)
async def test_runs_in_flight_when_the_store_goes_silent_finish_once_it_answers(
    private_pg: PrivatePostgres, broker: Broker, tmp_path: Path, eventually: Eventually
):
    # Given a worker whose store connections go through the proxy
    with _worker_behind_proxy(private_pg, broker, tmp_path) as part:
        # When the store goes silent for 20 s under 40 runs in flight (see the helper)
        # Then every run is done within 60 s of the heal, by the same worker process
        await _through_a_silence(part.proxy, part.worker, part.client, eventually, tmp_path / "log")
        log = part.worker.logfile.read_text()
        assert "the store went silent" in log, log[-3000:]


@pytest.mark.postgres
@pytest.mark.timeout(240)
async def test_a_worker_whose_store_stays_silent_gives_its_runs_to_another_worker(
    private_pg: PrivatePostgres, broker: Broker, tmp_path: Path, eventually: Eventually
):
    # Given two workers on one broker: A reaches the store through the proxy, B directly;
    # and 40 runs in flight. The store's bounds are the defaults; a dead worker's runs are
    # taken over sooner than by default (the handover's own tests are test_sweeper's).
    with _worker_behind_proxy(private_pg, broker, tmp_path, **SOON_TAKEN_OVER) as part:
        b_env = {**part.worker.env, "RELAYQ_DATABASE_URL": private_pg.url}
        other = Worker(b_env, tmp_path / "other.log").start()
        try:
            client = part.client
            run_ids = await client.start_many("outlast", [f"cut off {i}" for i in range(40)])
            await eventually(lambda: in_flight(client.db, run_ids) >= 20, what="runs in flight")

            # When A's store goes silent for good: old connections and new ones alike,
            # while it holds runs mid-turn
            await eventually(lambda: held_by(client.db, part.worker), what="A holding runs")
            part.proxy.black_hole()
            silent_at = time.monotonic()
            held = held_by(client.db, part.worker)
            after = await client.start_many("outlast", [f"later {i}" for i in range(10)])

            # Then A, alive but cut off, beats no more, and B takes its runs over: every
            # run is done within 90 s, each tool call run once or again as a counted attempt.
            # (A still takes messages it cannot run, each sent again by B's sweeper once
            # overdue: RELAYQ_WORKER_TIMEOUT and RELAYQ_REDELIVER_AFTER)
            every = run_ids + after
            await eventually(lambda: all_finished(client.db, every), timeout=90, what="all done")
            print(f"{len(every)} runs done {time.monotonic() - silent_at:.1f} s after the silence")
            check_runs(client.db, tmp_path / "log", every)
            # ... the runs A held mid-turn among them, each taken on by B: every turn they
            # made after the silence was B's, A writing nothing since
            assert held, "A held no run when its store went silent"
            with client.db.read() as s:
                taken = s.exec(select(RunRow).where(col(RunRow.id).in_(held))).all()
            assert {r.id: r.status for r in taken} == dict.fromkeys(held, "done")
            assert all(r.turns > held[r.id] for r in taken), [(r.id, r.turns) for r in taken]
            for worker in (part.worker, other):
                assert worker.proc is not None
                assert worker.proc.poll() is None
        finally:
            other.stop()


def held_by(db: Database, worker: Worker) -> dict[str, int]:
    """The runs `worker`'s process holds mid-turn now (its id is `host:pid:random`), with
    the turns each has made."""
    assert worker.proc is not None
    with db.read() as s:
        holding = select(RunRow.id, RunRow.turns).where(
            RunRow.status == "running", col(RunRow.worker).like(f"%:{worker.proc.pid}:%")
        )
        return {run_id: turns for run_id, turns in s.exec(holding)}


@pytest.mark.postgres
@pytest.mark.timeout(240)
async def test_a_slow_store_slows_runs_down_and_fails_or_takes_over_none(
    private_pg: PrivatePostgres, broker: Broker, tmp_path: Path, eventually: Eventually
):
    # Given a worker whose store connections go through the proxy, and 20 runs in flight
    with _worker_behind_proxy(private_pg, broker, tmp_path) as part:
        # When every packet to and from the store is held 2 s, for 30 s
        # Then every run is done, each tool call run once, on its first attempt (see the
        # helper), and no connection was taken for silent
        log = await _through_a_slowness(
            part.proxy, part.worker, part.client, eventually, tmp_path / "log"
        )
        assert "went silent" not in log, log[-3000:]


@pytest.mark.timeout(180)
async def test_remote_control_and_events_come_back_after_the_pubsub_connection_went_silent(
    hung: Hung, tmp_path: Path, eventually: Eventually
):
    # Given a worker, with the default bounds, whose broker connections go through the
    # proxy, answering a remote-control ping from a host that reaches the broker directly
    worker, direct = _worker_at_defaults(hung, tmp_path, RELAYQ_AGENTS="tests.durable.agents")
    control = sender_app(direct).control

    def answered() -> bool:
        return bool(control.ping(timeout=0.5))

    try:
        await eventually(lambda: asyncio.to_thread(answered), what="the first ping answered")

        # When its pub/sub connection alone goes silent for good (new ones are carried)
        hung.proxy.black_hole(only=b"SUBSCRIBE")
        assert not await asyncio.to_thread(answered)

        # Then it subscribes again: pings are answered, and a broadcast turning task events
        # on reaches it, within the default checks' bound
        await eventually(lambda: asyncio.to_thread(answered), timeout=60, what="pings again")
        await asyncio.to_thread(control.enable_events)
        await eventually(
            lambda: "Events of group {task} enabled by remote" in worker.logfile.read_text(),
            what="the broadcast turning events on",
        )
        assert worker.proc is not None
        assert worker.proc.poll() is None
    finally:
        worker.stop()


@pytest.mark.timeout(240)
async def test_a_slow_broker_slows_runs_down_and_fails_or_takes_over_none(
    hung: Hung, tmp_path: Path, eventually: Eventually
):
    # Given a worker, with the default bounds, whose broker connections all go through the
    # proxy, and 20 runs in flight
    worker, direct = _worker_at_defaults(
        hung, tmp_path, RELAYQ_AGENTS="tests.durable.store_outage_agents", RELAYQ_CONCURRENCY="100"
    )
    client = DurableClient(settings=direct)
    try:
        # When every packet to and from the broker is held 2 s, for 30 s
        # Then every run is done, each tool call run once, on its first attempt (see the
        # helper), and no connection was dropped for silent
        log = await _through_a_slowness(hung.proxy, worker, client, eventually, tmp_path / "log")
        assert "dropping stale connection" not in log, log[-3000:]
        assert "could not announce" not in log, log[-3000:]
    finally:
        client.close()
        worker.stop()


@pytest.mark.postgres
@pytest.mark.timeout(150)
async def test_the_api_answers_503_while_its_store_is_silent_and_serves_once_it_answers(
    private_pg: PrivatePostgres, broker: Broker, tmp_path: Path
):
    # Given the API, with the default bounds, on a store reached through the proxy
    with HangingProxy(private_pg.port) as proxy:
        url = private_pg.url.replace(f":{private_pg.port}/", f":{proxy.port}/")
        settings = Settings.from_env(_env(broker, tmp_path, url))
        DurableClient(settings=settings).open().close()  # migrates the store
        with serving(settings) as server:
            async with server.http(SUBMITTER) as http:
                assert (await http.get("/api/runs")).status_code == 200

                # When the store goes silent under a request
                proxy.black_hole()
                silent = await http.get("/api/runs", timeout=90)

                # Then the request is answered 503 (the store unavailable), not held for good
                assert silent.status_code == 503, silent.text
                assert int(silent.headers["Retry-After"]) >= 1

                # And once new connections are answered again, the next request is served
                proxy.heal()
                assert (await http.get("/api/runs", timeout=90)).status_code == 200
