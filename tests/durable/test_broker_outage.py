"""A worker rides out a broker outage: it reconnects and consumes again, and never exits 0 unasked.

Issue #9: Redis killed and restarted with turns in flight, and the worker
exited with status 0 about 6 s later (kombu's `AttributeError: 'NoneType'
object has no attribute 'hostname'` while Celery released the lost
connection). Each test has a Redis of its own (`tests.brokers.PrivateRedis`),
kills it with turns in flight, and brings it back empty, as a broker that
lost its memory: what was queued then is gone (the store's sweeper sends it
again), so the tests publish new runs once it is back.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks import DurableClient, Settings
from tests.brokers import PrivateRedis

from .conftest import Eventually, Worker
from .outage_agents import release

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first

LOST = "Connection to broker lost"
CONNECTED = "Connected to redis://"
DETACHED = "finished after its broker connection was lost"


@dataclass
class Outage:
    """A private Redis, a SQLite store, and the worker a test starts on them."""

    redis: PrivateRedis
    env: dict[str, str]
    home: Path
    worker: Worker | None = None

    def start_worker(self, *, pool: str, concurrency: int, **env: str) -> Worker:
        env = {**self.env, "RELAYQ_POOL": pool, "RELAYQ_CONCURRENCY": str(concurrency), **env}
        self.worker = Worker(env, self.home / f"worker-{pool}.log")
        return self.worker.start()

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    def log(self) -> str:
        assert self.worker is not None
        return self.worker.logfile.read_text(errors="replace")

    def models_started(self) -> set[str]:
        path = self.home / "log" / "model.log"
        return set(path.read_text().splitlines()) if path.exists() else set()


@pytest.fixture
def outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    log = tmp_path / "log"
    # `release` writes the gates the worker reads; restored after the test, as the tests
    # after it on this lane record what they send under the session's log
    monkeypatch.setenv("RELAYQ_TEST_LOG", str(log))
    redis = PrivateRedis(tmp_path / "redis").start()
    env = {
        **os.environ,
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": f"sqlite:///{tmp_path / 'relayq.db'}",
        "RELAYQ_BROKER_URL": redis.url,
        "RELAYQ_KEY_PREFIX": "relayq-outage:",
        "RELAYQ_AGENTS": "tests.durable.agents,tests.durable.outage_agents",
        "RELAYQ_TEST_LOG": str(log),
    }
    o = Outage(redis, env, tmp_path)
    try:
        yield o
    finally:
        if o.worker is not None:
            o.worker.stop()
        redis.stop()


@pytest.mark.parametrize(
    ("pool", "concurrency", "seconds"),
    [("asyncio", 50, 6.0), ("asyncio", 50, 20.0), ("prefork", 3, 6.0)],
    ids=["asyncio-6s", "asyncio-20s", "prefork-6s"],
)
async def test_a_worker_rides_out_a_broker_outage_and_consumes_again(
    outage: Outage, eventually: Eventually, pool: str, concurrency: int, seconds: float
):
    # Given a worker with two turns in flight and a slot free, so that it also
    # waits on the broker for more (what made releasing the lost connection fail)
    worker = outage.start_worker(pool=pool, concurrency=concurrency)
    assert worker.proc is not None
    pid = worker.proc.pid
    during, after = f"during {uuid.uuid4().hex}", f"after {uuid.uuid4().hex}"
    async with DurableClient(settings=outage.settings) as client:
        held = [await client.start("held", p) for p in (during, after)]
    await eventually(
        lambda: {during, after} <= outage.models_started(), what="both turns to be in flight"
    )

    # When the broker is killed, one turn is let go while it is away, the broker
    # comes back empty after `seconds`, and the other turn is let go after that
    outage.redis.kill()
    killed = time.monotonic()
    await eventually(lambda: LOST in outage.log(), what="the worker to notice the outage")
    release(during)
    async with DurableClient(settings=outage.settings) as client:

        async def done(run_ids: list[str], *, every: bool = True) -> bool:
            finished = [(await client.result(r)).status == "done" for r in run_ids]
            return all(finished) if every else any(finished)

        if pool == "asyncio":
            # (A prefork child holding a turn is ended with the connection: its run is
            # sent again once the broker is back.)
            await eventually(
                lambda: done(held[:1]), timeout=seconds - 1, what="a turn to end meanwhile"
            )
        while time.monotonic() - killed < seconds:
            stopping = worker.proc.poll() is not None or "Unrecoverable error" in outage.log()
            assert not stopping, f"the worker stops:\n{outage.log()[-3000:]}"
            await asyncio.sleep(0.1)
        if pool == "asyncio":
            assert (await client.result(held[1])).status == "running", "the other held on"
        outage.redis.restart_empty()
        back = time.monotonic()
        with outage.redis.client() as conn:
            assert conn.dbsize() == 0, "the broker came back empty"

        # Then the worker reconnects and takes new runs to the end ...
        fresh = [await client.start("two-step", f"fresh {i} {uuid.uuid4().hex}") for i in range(5)]
        await eventually(lambda: done(fresh, every=False), timeout=45, what="a new run to end")
        consumed_again = time.monotonic() - back
        await eventually(lambda: done(fresh), timeout=15, what="every new run to finish")
        release(after)
        # ... the turns it held finished and stored what they did, each once let go (not
        # by its model's own deadline) ...
        await eventually(lambda: done(held), what="the turns held across the outage to end")
        assert [(await client.result(r)).text for r in held] == ["released", "released"]
        if pool == "asyncio":
            # ... one while the broker was away, one after it came back, neither
            # acknowledged ...
            await eventually(lambda: outage.log().count(DETACHED) == 2, what="both to be logged")

    # ... and it is the same process, which logged the outage and went on
    print(f"{pool}, {seconds:g} s outage: a new run done {consumed_again:.1f} s after the return")
    assert worker.proc.poll() is None
    assert worker.proc.pid == pid
    text = outage.log()
    assert text.count(CONNECTED) == 2, "connected at start, and again after the outage"
    assert "Unrecoverable error" not in text
    # A stop asked for is still a clean exit.
    worker.stop()
    assert worker.proc.returncode == 0


@pytest.mark.timeout(120)
async def test_a_worker_holds_its_concurrency_in_flight_again_after_the_broker_returns_empty(
    outage: Outage, eventually: Eventually
):
    # Given a worker of 50 turns at once with one turn held in flight, and a model that
    # answers only when 40 of its calls wait together (`tests.durable.agents.crowd`)
    outage.start_worker(
        pool="asyncio",
        concurrency=50,
        RELAYQ_TEST_CROWD="40",
        RELAYQ_TEST_CROWD_WAIT="15",
        RELAYQ_MODEL_RETRIES="0",
    )
    held = f"held {uuid.uuid4().hex}"
    async with DurableClient(settings=outage.settings) as client:
        await client.start("held", held)
    await eventually(lambda: held in outage.models_started(), what="the turn to be in flight")

    # When the broker is killed and comes back empty
    outage.redis.kill()
    await eventually(lambda: LOST in outage.log(), what="the worker to notice the outage")
    outage.redis.restart_empty()
    await eventually(
        lambda: outage.log().count(CONNECTED) == 2, timeout=30, what="the worker to reconnect"
    )

    # Then it takes 40 turns at once again (Celery restores its prefetch from the pool's
    # size after a reconnect: one at a time if the pool says it has one process)
    async with DurableClient(settings=outage.settings) as client:
        ids = [await client.start("crowd", f"crowd {i} {uuid.uuid4().hex}") for i in range(40)]
        results = await asyncio.gather(*(client.result(i, wait=True, timeout=40) for i in ids))
    release(held)
    assert [r.status for r in results] == ["done"] * 40, {r.error for r in results}


async def test_a_worker_that_stops_on_its_own_exits_non_zero(
    outage: Outage, eventually: Eventually
):
    # Given the worker as the issue found it (Celery's own consumer, which stops
    # when releasing a lost connection fails), with a turn in flight and a slot free
    worker = outage.start_worker(pool="asyncio", concurrency=4, RELAYQ_TEST_CELERYS_CONSUMER="1")
    assert worker.proc is not None
    prompt = f"in flight {uuid.uuid4().hex}"
    async with DurableClient(settings=outage.settings) as client:
        await client.start("held", prompt)
    await eventually(lambda: prompt in outage.models_started(), what="the turn to be in flight")

    # When the broker goes away
    outage.redis.kill()
    await eventually(lambda: LOST in outage.log(), what="the worker to notice the outage")
    release(prompt)  # its warm stop waits for the turn

    # Then the worker stops, with a status that a supervisor restarts it on
    await eventually(lambda: worker.proc.poll() is not None, what="the worker to stop")
    assert "Unrecoverable error" in outage.log()
    assert worker.proc.returncode == 1
