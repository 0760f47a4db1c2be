"""A part that goes silent (no RST, no FIN) wedges nothing (issue 37): the connection is
found silent within its bound and made again, through a proxy of the test's own
(`tests.hanging_proxy`) between relayq and a real server."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tasks import DurableClient, Settings
from tests.brokers import PrivateRedis
from tests.hanging_proxy import HangingProxy

from .conftest import Eventually, Worker


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


async def test_a_hosts_announcements_come_back_after_the_broker_went_silent(
    hung: Hung, eventually: Eventually, caplog: pytest.LogCaptureFixture
):
    # Given a client subscribed to the run announcements through the proxy
    caplog.set_level(logging.INFO, logger="tasks.host.waiting")
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


@pytest.mark.timeout(150)
async def test_a_worker_consumes_again_after_its_broker_went_silent(
    hung: Hung, tmp_path: Path, eventually: Eventually, prompt: str
):
    # Given a worker whose broker connections all go through the proxy, with ten runs done
    env = {
        **os.environ,
        **hung.env,
        "RELAYQ_AGENTS": "tests.durable.agents",
        "RELAYQ_TEST_LOG": str(tmp_path / "log"),
    }
    worker = Worker(env, tmp_path / "worker.log").start()
    # The host reaches the broker directly: only the worker's connections go silent.
    direct = replace(hung.settings, broker_url=hung.broker.url, embedded_broker=False)
    try:
        async with DurableClient(settings=direct) as client:
            before = [f"{prompt} before {i}" for i in range(10)]
            for res in await asyncio.gather(
                *(client.run("two-step", p, timeout=30) for p in before)
            ):
                assert res.status == "done"

            # When the broker goes silent for 8 s, with ten runs started meanwhile, and then
            # only new connections are forwarded (the old ones stay silent for good)
            hung.proxy.black_hole()
            during = await client.start_many(
                "two-step", [f"{prompt} during {i}" for i in range(10)]
            )
            await asyncio.sleep(8)
            hung.proxy.heal()
            after = await client.start_many("two-step", [f"{prompt} after {i}" for i in range(10)])

            # Then every run, those started in the hole and after it, is done within 60 s
            results = await asyncio.gather(
                *(client.result(run_id, wait=True, timeout=60) for run_id in during + after)
            )
        assert [r.status for r in results] == ["done"] * 20
        assert worker.proc is not None
        assert worker.proc.poll() is None  # never restarted
    finally:
        worker.stop()
