"""The shared limiter on a real Redis: its scripts, its waits, its pauses, its failures.

A private `redis-server` of this module's own (tests/brokers.py), so a test may
stop it. Callers in other processes (`tests.tasks.limiter_crowd`) show that the
scripts stay atomic when many ask at once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from relayq import Agent, InProcessRequest, InProcessResponse, ModelError, Usage, define_tool
from relayq.circuit import CircuitModel
from relayq.providers import ProviderConfig, ProviderModel
from relayq.ratelimit import LimitCounters, LimitedModel, ProviderLimits, Throttled
from tasks import DurableClient, Settings
from tasks.broker.limiter import RedisLimiter, limited_model, limiter_for
from tests import forkserver
from tests.brokers import PrivateRedis
from tests.ports import free_port
from tests.provider_server import API_KEY, ProviderServer, error, openai_calls, openai_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def counters() -> LimitCounters:
    return LimitCounters()


@pytest.fixture
async def limiter(private_redis, prefix, counters):
    limiter = RedisLimiter(private_redis.url, prefix=prefix, hooks=[counters])
    yield limiter
    await limiter.aclose()


def limits(key: str = "p", **numbers) -> ProviderLimits:
    return ProviderLimits(key=key, label=f"test/{key}", **numbers)


def redis_time_us(private_redis: PrivateRedis) -> int:
    seconds, micros = private_redis.client().time()
    return int(seconds) * 1_000_000 + int(micros)


# -- many processes at once -------------------------------------------------------------------


def run_crowd(private_redis, prefix, key, *, processes=4, callers=50, **numbers) -> list[dict]:
    options = [f"--{name.replace('_', '-')}={value}" for name, value in numbers.items()]
    command = [sys.executable, "-m", "tests.tasks.limiter_crowd", private_redis.url, prefix, key]
    command += [str(callers), *options]
    procs = [
        forkserver.spawn(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    conn = private_redis.client()
    try:
        while int(conn.get(prefix + "ready") or 0) < processes:
            if any(p.poll() is not None for p in procs):
                break
        conn.set(prefix + "go", 1)
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs)
    return [json.loads(out) for out in outs]


def test_four_processes_asking_at_once_never_hold_more_slots_than_the_cap(private_redis, prefix):
    # Given four processes of 50 callers each, and a cap of 3 calls in flight
    # When they all acquire at once, each holding its slot a few milliseconds
    results = run_crowd(private_redis, prefix, "cap", in_flight=3)

    # Then all 200 got their slot, and never were more than 3 held at a time
    assert sum(r["granted"] for r in results) == 200
    assert max(r["peak"] for r in results) == 3


def test_four_processes_asking_at_once_each_get_a_moment_of_their_own(private_redis, prefix):
    # Given a requests clock that moves 5 ms per call (12,000 a minute)
    before = redis_time_us(private_redis)

    # When 200 callers in four processes reserve a moment at once
    results = run_crowd(private_redis, prefix, "rpm", rpm=12_000)

    # Then the clock moved on once per call: no two callers shared a moment
    assert sum(r["granted"] for r in results) == 200
    state = private_redis.client().hget(f"{prefix}limits:{{rpm}}:state", "req")
    assert int(state) >= before + 200 * 5_000


# -- one process ------------------------------------------------------------------------------


async def test_a_call_further_away_than_its_wait_is_throttled_with_when_to_come_back(
    limiter, counters
):
    # Given one call a second
    one_a_second = limits(requests_per_minute=60)
    await limiter.acquire(one_a_second, prompt_tokens=1, max_wait=5)

    # When the next call may wait only 0.2 s
    with pytest.raises(Throttled) as raised:
        await limiter.acquire(one_a_second, prompt_tokens=1, max_wait=0.2)

    # Then it is told to come back before its moment, to wait the rest in place
    assert raised.value.reason == "requests"
    assert 0 < raised.value.retry_in <= 1.0
    assert counters.snapshot()["test/p"].requeued == 1


async def test_a_pause_from_one_process_holds_the_callers_of_another(
    private_redis, prefix, limiter, counters
):
    # Given a provider that answered 429 with Retry-After: 20 here
    capped = limits(max_in_flight=5)
    await limiter.rejected(capped, status=429, retry_after=20.0)

    # When another limiter (as in another process) asks for a call
    other = RedisLimiter(private_redis.url, prefix=prefix)
    try:
        with pytest.raises(Throttled) as raised:
            await other.acquire(capped, prompt_tokens=1, max_wait=1.0)
    finally:
        await other.aclose()

    # Then it waits out the pause, in its queue
    assert raised.value.reason == "paused"
    assert raised.value.retry_in > 10
    counts = counters.snapshot()["test/p"]
    assert (counts.rejected, counts.paused_seconds) == (1, 20.0)


async def test_the_tokens_a_reply_used_move_the_tokens_clock_and_teach_the_estimate(
    private_redis, prefix, limiter
):
    # Given 60,000 tokens a minute, and no max_tokens: a reply is counted as the average seen
    per_minute = limits(tokens_per_minute=60_000)
    first = await limiter.acquire(per_minute, prompt_tokens=10, max_wait=1)
    assert first.tokens == 10

    # When the reply used 1,510 tokens (1.5 s of the clock)
    await limiter.release(first, used=Usage(total_tokens=1510))

    # Then the next call waits for the tokens, and is counted at what replies use
    with pytest.raises(Throttled) as raised:
        await limiter.acquire(per_minute, prompt_tokens=10, max_wait=1)
    assert raised.value.reason == "tokens"
    state = private_redis.client().hgetall(f"{prefix}limits:{{p}}:state")
    assert float(state[b"extra"]) == 1500.0
    second = await limiter.acquire(per_minute, prompt_tokens=10, max_wait=10)
    assert second.tokens == 1510


async def test_max_tokens_counts_every_reply_at_its_most(limiter):
    capped = limits(tokens_per_minute=60_000, completion_tokens=256)

    permit = await limiter.acquire(capped, prompt_tokens=10, max_wait=1)

    assert permit.tokens == 266


async def test_a_caller_cancelled_while_it_waits_for_its_moment_frees_its_slot(
    private_redis, prefix, limiter
):
    # Given one call in ten seconds (long enough that a loaded machine still finds the second
    # caller asleep: at one a second a full suite once found it done), at most one in
    # flight, and a first call made
    both = limits(requests_per_minute=6, max_in_flight=1)
    first = await limiter.acquire(both, prompt_tokens=1, max_wait=1)
    await limiter.release(first, used=None)

    # When the second caller, holding the slot while it sleeps to its moment, is cancelled
    waiting = asyncio.create_task(limiter.acquire(both, prompt_tokens=1, max_wait=20))
    inflight = f"{prefix}limits:{{p}}:inflight"
    conn = private_redis.client()
    while not conn.zcard(inflight):  # noqa: ASYNC110 (another process's view of Redis)
        await asyncio.sleep(0.005)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    # Then the slot is free again (its release goes out after the cancellation: on a loaded
    # machine a second is not always enough, so the wait has a deadline, not a count)
    deadline = asyncio.get_running_loop().time() + 10
    while conn.zcard(inflight) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    assert conn.zcard(inflight) == 0


async def test_an_unreachable_redis_lets_calls_go_unlimited_and_says_so(counters, caplog):
    # Given a limiter whose Redis does not answer
    port = free_port()
    limiter = RedisLimiter(f"redis://127.0.0.1:{port}/0", prefix="x:", hooks=[counters])

    # When two calls ask
    first = await limiter.acquire(limits(max_in_flight=1), prompt_tokens=1, max_wait=5)
    second = await limiter.acquire(limits(max_in_flight=1), prompt_tokens=1, max_wait=5)
    await limiter.release(first, used=None)
    await limiter.aclose()

    # Then both go, the failure is counted for each, and warned about once, without the URL
    assert first.id == second.id == ""
    assert counters.snapshot()["test/p"].unavailable == 2
    warnings = [r for r in caplog.records if "unlimited" in r.getMessage()]
    assert len(warnings) == 1
    assert str(port) not in caplog.text


def test_a_process_has_one_limiter_on_its_brokers_redis(tmp_path):
    embedded = Settings.from_env({"RELAYQ_HOME": str(tmp_path), "RELAYQ_KEY_PREFIX": "a:"})
    other = Settings.from_env({"RELAYQ_BROKER_URL": "amqp://h", "RELAYQ_KEY_PREFIX": "a:"})

    shared = limiter_for(embedded)

    assert isinstance(shared, RedisLimiter)
    assert shared.url == f"unix://{tmp_path.resolve() / 'redis.sock'}"
    assert (shared.prefix, limiter_for(embedded)) == ("a:", shared)
    assert not isinstance(limiter_for(other), RedisLimiter), "no Redis: no shared limits"


def unwrapped(model: Any) -> Any:
    """The limited model inside the provider's circuit (`tasks.broker.circuit`)."""
    assert isinstance(model, CircuitModel), "every provider's calls go through its circuit"
    return model.model


def test_a_turn_waits_in_place_up_to_the_setting_and_half_its_time_limit(tmp_path):
    settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path), "RELAYQ_LIMIT_WAIT": "12"})
    config = ProviderConfig(base_url="http://127.0.0.1:9/v1", model="m", max_in_flight=2)
    agent = Agent("limits-waits", config, register=False)

    long_turn = unwrapped(limited_model(settings, agent, 600))
    short_turn = unwrapped(limited_model(settings, agent, 10))

    assert isinstance(long_turn, LimitedModel)
    assert isinstance(short_turn, LimitedModel)
    assert (long_turn.max_wait, short_turn.max_wait) == (12, 5)
    assert isinstance(long_turn.limiter, RedisLimiter)


def test_a_provider_without_limits_is_only_watched_and_a_plain_model_left_alone(tmp_path):
    settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})
    watched = Agent(
        "limits-watched", ProviderConfig(base_url="http://h/v1", model="m"), register=False
    )
    plain = Agent("limits-plain", lambda req: InProcessResponse(content="x"), register=False)

    model = unwrapped(limited_model(settings, watched, 600))

    assert isinstance(model, LimitedModel)
    assert not isinstance(model.limiter, RedisLimiter), "no Redis round trip for it"
    assert limited_model(settings, plain, 600) is plain.durable_model


# -- a real provider --------------------------------------------------------------------------


async def test_a_429_with_retry_after_pauses_the_provider_for_the_next_caller(
    limiter, counters, monkeypatch
):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with ProviderServer() as server:
        # Given a provider that answers the first call with 429, Retry-After: 30
        server.script += [error(429, "slow down", **{"retry-after": "30"}), openai_text("hi")]
        config = ProviderConfig(
            base_url=server.openai_url, model="m", api_key_env="LIMIT_TEST_KEY", max_in_flight=4
        )
        monkeypatch.setenv("LIMIT_TEST_KEY", API_KEY)
        provider = ProviderModel(config).without_retries()
        found = ProviderLimits.of(config)
        model = LimitedModel(provider, limiter, found, max_wait=1.0)
        request = InProcessRequest(messages=[{"role": "user", "content": "hi"}], tools=[])

        # When one call is refused, and another follows
        with pytest.raises(ModelError) as refused:
            await model(request)
        with pytest.raises(Throttled) as throttled:
            await model(request)
        await provider.aclose()

    # Then the second never reached the provider: it waits out the pause in its queue
    assert refused.value.status == 429
    assert throttled.value.reason == "paused"
    assert len(server.seen) == 1
    assert counters.snapshot()[found.label].rejected == 1


async def test_an_eager_run_goes_back_in_line_for_its_provider_and_finishes(
    private_redis, prefix, tmp_path, monkeypatch
):
    # Given an eager client (no worker), a provider limited to 120 calls a minute (one
    # every 0.5 s), and turns that may wait in place only 0.1 s
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("LIMIT_TEST_KEY", API_KEY)
    settings = Settings.from_env(
        {
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_BROKER_URL": private_redis.url,
            "RELAYQ_KEY_PREFIX": prefix,
            "RELAYQ_LIMIT_WAIT": "0.1",
        }
    )
    with ProviderServer() as server:
        server.script += [openai_calls(("c1", "step", {})), openai_text("stepped once")]
        config = ProviderConfig(
            base_url=server.openai_url, model="m", api_key_env="LIMIT_TEST_KEY",
            requests_per_minute=120,
        )  # fmt: skip
        step = define_tool("step", "take a step", None, lambda args, ctx: "ok")
        agent = Agent("limits-eager", config, tools=[step], register=False)
        client = DurableClient(eager=True, settings=settings)
        # (the turns it queues, as written to the outbox: the rows go once they take effect)
        countdowns: list[float] = []

        def queued(conn: Any, clause: Any, multiparams: Any, params: Any, *_: Any) -> None:
            if getattr(getattr(clause, "table", None), "name", None) == "relayq_outbox":
                rows = multiparams or [params]
                countdowns.extend(float(r.get("countdown") or 0) for r in rows if r)

        for engine in client.db.engines:
            event.listen(engine, "after_execute", queued)

        # When it runs two turns
        result = await client.run(agent, "go")
        shared = limiter_for(settings)
        assert isinstance(shared, RedisLimiter)
        await shared.aclose()
        assert isinstance(agent.durable_model, ProviderModel)
        await agent.durable_model.aclose()

    # Then its second turn went back in line with a countdown, and the run finished
    assert (result.status, result.text) == ("done", "stepped once")
    assert len(server.seen) == 2
    assert any(c > 0 for c in countdowns), countdowns
    client.close()


def test_a_wait_in_place_is_a_metric_and_a_wait_in_the_queue_is_not():
    from prometheus_client import REGISTRY

    from relayq.ratelimit import LimitWait
    from tasks.observability import metrics

    labels = {"provider": "metrics.example", "model": "m1"}

    def observed() -> float:
        return REGISTRY.get_sample_value("relayq_provider_limit_wait_seconds_count", labels) or 0.0

    before = observed()
    hook = metrics._LimitWaits()
    hook.after_wait(
        LimitWait(
            provider="metrics.example/m1",
            host="metrics.example",
            model="m1",
            seconds=1.5,
            reason="requests",
        )
    )
    hook.after_wait(
        LimitWait(
            provider="metrics.example/m1",
            host="metrics.example",
            model="m1",
            seconds=9.0,
            reason="requests",
            requeued=True,
        )
    )
    assert observed() == before + 1
