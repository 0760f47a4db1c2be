"""Every Redis client of relayq's own takes its bounds from the settings (issue 37), on a
broker over TCP and on the embedded one's Unix socket alike: a user's fresh machine has
only the latter, where a TCP-only option (keepalives) would fail every client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.hanging_proxy import HangingProxy
from tasks import Settings
from tasks.broker.announce import Announcer
from tasks.broker.circuit_views import batch_waits
from tasks.broker.peek import QueuePeek
from tasks.broker.redis_clients import RedisBounds, close_redis, redis_pool
from tests.brokers import PrivateRedis
from workers.embedded import ensure_embedded_redis, stop_embedded_redis


@pytest.fixture(params=["tcp", "unix"])
def settings(
    request: pytest.FixtureRequest, private_redis: PrivateRedis, tmp_path: Path, prefix: str
) -> Iterator[Settings]:
    """Settings on a Redis over TCP, then on the embedded broker's socket; 3 s bounds."""
    env = {
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_KEY_PREFIX": prefix,
        "RELAYQ_BROKER_TIMEOUT": "3",
        "RELAYQ_BROKER_HEALTH_CHECK": "4",
    }
    if request.param == "tcp":
        yield Settings.from_env({**env, "RELAYQ_BROKER_URL": private_redis.url})
        return
    embedded = Settings.from_env(env)
    ensure_embedded_redis(embedded)
    try:
        yield embedded
    finally:
        stop_embedded_redis(embedded)


def test_the_bounds_are_the_settings(settings: Settings):
    bounds = RedisBounds.of(settings)
    assert (bounds.timeout, bounds.health_check) == (3.0, 4.0)
    url = settings.redis_url
    assert url is not None
    options = bounds.options(url)
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 3.0
    assert options["health_check_interval"] == 4
    assert options.get("socket_keepalive", False) is url.startswith("redis:")


def test_every_client_of_ours_talks_to_the_broker(settings: Settings):
    # The announcer publishes, the queue peek reads, the circuits' views read
    announcer = Announcer(settings)
    try:
        announcer.announce(["run_1"])
        announcer.published()
    finally:
        announcer.close()
    assert QueuePeek(settings).oldest(["relayq.turns"]) == {"relayq.turns": []}
    assert batch_waits(settings, "batch_1") == []


async def test_the_per_loop_pools_talk_to_the_broker(settings: Settings):
    url = settings.redis_url
    assert url is not None
    client = redis_pool(url, owner="test", max_connections=2, bounds=RedisBounds.of(settings))
    try:
        assert await client.ping()
    finally:
        await close_redis(client)


def test_a_command_that_timed_out_is_not_sent_again(private_redis: PrivateRedis, prefix: str):
    # Given our clients (sync, and a per-loop pool) with a 1 s bound, on a Redis whose next
    # packet is held 2 s and whose later ones pass at once: an answer too late, on a
    # connection that a resend would find quick again
    key = f"{prefix}once"
    bounds = RedisBounds(timeout=1.0, health_check=10.0)
    with HangingProxy(private_redis.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"

        def held_once() -> None:
            proxy.slow(2.0)
            threading.Timer(0.5, proxy.fast).start()

        sync_client = redis.Redis.from_url(url, **bounds.options(url))

        async def incr_on_the_pool() -> None:
            client = redis_pool(url, owner="test", max_connections=2, bounds=bounds)
            try:
                await client.ping()
                held_once()
                with pytest.raises(redis.TimeoutError):
                    await client.incr(key)
            finally:
                await close_redis(client)

        try:
            # When one INCR times out on each
            sync_client.ping()
            held_once()
            with pytest.raises(redis.TimeoutError):
                sync_client.incr(key)
            asyncio.run(incr_on_the_pool())
        finally:
            sync_client.close()

        # Then the server ran each once, late: neither client sent it again on its own
        # (redis-py's `retry_on_timeout` would; a limiter's or circuit's script or a
        # publish sent twice counts twice, so our caller decides, as for an outage)
        direct = private_redis.client()
        try:
            deadline = time.monotonic() + 10
            while direct.get(key) != b"2" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert direct.get(key) == b"2"
        finally:
            direct.close()
