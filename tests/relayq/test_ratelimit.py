"""Provider limits in the core: what a config limits, the no-op limiter, the model wrapper, hooks.

The shared limiter (Redis) is tested in tests/tasks/test_limiter.py and, across
worker processes, in tests/durable/test_provider_limits.py.
"""

from __future__ import annotations

import logging
import pickle

import pytest
from pydantic import ValidationError

from relayq import InProcessRequest, InProcessResponse, ModelError, Usage
from relayq.providers import ProviderConfig
from relayq.ratelimit import (
    LimitCounters,
    LimitedModel,
    Limiter,
    LimiterHooks,
    LimitWait,
    Permit,
    ProviderLimits,
    ProviderRejected,
    Throttled,
    estimate_prompt_tokens,
)


def config(**limits: int) -> ProviderConfig:
    return ProviderConfig(base_url="https://user:secret@api.example.com/v1", model="m", **limits)


REQUEST = InProcessRequest(messages=[{"role": "user", "content": "x" * 400}], tools=[])


def test_a_config_without_limits_is_not_limited():
    assert not ProviderLimits.of(config()).limited


def test_a_config_with_limits_names_its_endpoint_without_its_secrets():
    limits = ProviderLimits.of(config(requests_per_minute=60, max_in_flight=2))

    assert limits.limited
    assert (limits.requests_per_minute, limits.max_in_flight) == (60, 2)
    assert limits.tokens_per_minute is None
    assert limits.label == "api.example.com/m"
    assert "secret" not in repr(limits)


def test_the_same_endpoint_and_model_share_their_counts_and_another_model_does_not():
    a = ProviderLimits.of(config(requests_per_minute=60))
    b = ProviderLimits.of(config(requests_per_minute=30, max_in_flight=1))
    other = ProviderLimits.of(config(requests_per_minute=60).model_copy(update={"model": "n"}))

    assert a.key == b.key
    assert a.key != other.key


def test_limits_must_be_positive():
    for field in ("requests_per_minute", "tokens_per_minute", "max_in_flight"):
        with pytest.raises(ValidationError):
            config(**{field: 0})


def test_max_tokens_counts_as_the_replys_tokens_and_the_timeout_bounds_the_lease():
    limits = ProviderLimits.of(
        config(tokens_per_minute=1000).model_copy(update={"max_tokens": 256, "timeout": 10.0})
    )
    assert limits.completion_tokens == 256
    assert 10 < limits.lease <= 60


def test_a_prompt_is_estimated_at_about_four_characters_a_token():
    assert 100 <= estimate_prompt_tokens(REQUEST) <= 120


def test_throttled_is_a_signal_that_survives_pickling():
    signal = Throttled("api.example.com/m", 12.5, "paused")

    again = pickle.loads(pickle.dumps(signal))

    assert (again.provider, again.retry_in, again.reason) == ("api.example.com/m", 12.5, "paused")
    assert "again in 12.5 s" in str(again)
    assert not isinstance(signal, ModelError)


async def test_the_default_limiter_lets_every_call_go_at_once():
    limits = ProviderLimits.of(config(max_in_flight=1))
    limiter = Limiter()

    first = await limiter.acquire(limits, prompt_tokens=5, max_wait=0)
    second = await limiter.acquire(limits, prompt_tokens=5, max_wait=0)

    assert first.tokens == second.tokens == 5
    await limiter.release(first, used=None)


class Recording(Limiter):
    """The no-op limiter, remembering what it was asked."""

    def __init__(self, hooks=()):
        super().__init__(hooks)
        self.asked: list[str] = []

    async def acquire(self, limits, *, prompt_tokens, max_wait):
        self.asked.append(f"acquire {prompt_tokens} within {max_wait:g}")
        return Permit(limits=limits, id="p1", tokens=prompt_tokens, prompt_tokens=prompt_tokens)

    async def release(self, permit, *, used):
        self.asked.append(f"release {permit.id} used={None if used is None else used.total_tokens}")

    async def rejected(self, limits, *, status, retry_after):
        self.asked.append(f"rejected {status} after {retry_after}")
        await super().rejected(limits, status=status, retry_after=retry_after)


async def test_a_limited_call_is_acquired_then_released_with_the_tokens_it_used():
    limits = ProviderLimits.of(config(tokens_per_minute=1000))
    limiter = Recording()

    async def model(request):
        return InProcessResponse(content="hi", usage=Usage(total_tokens=42))

    reply = await LimitedModel(model, limiter, limits, max_wait=3)(REQUEST)

    assert reply.content == "hi"
    tokens = estimate_prompt_tokens(REQUEST)
    assert limiter.asked == [f"acquire {tokens} within 3", "release p1 used=42"]


async def test_a_429_is_told_to_the_limiter_before_the_slot_is_given_back():
    limits = ProviderLimits.of(config(max_in_flight=1))
    counters = LimitCounters()
    heard: list[ProviderRejected] = []

    class Listening(LimiterHooks):
        def after_rejected(self, event):
            heard.append(event)

    limiter = Recording([counters, Listening()])

    async def model(request):
        raise ModelError("slow down", retryable=True, retry_after=7.0, status=429)

    with pytest.raises(ModelError):
        await LimitedModel(model, limiter, limits, max_wait=3)(REQUEST)

    assert limiter.asked[1:] == ["rejected 429 after 7.0", "release p1 used=0"]
    counts = counters.snapshot()["api.example.com/m"]
    assert (counts.rejected, counts.paused_seconds) == (1, 7.0)
    assert heard == [
        ProviderRejected(
            provider="api.example.com/m", host="api.example.com", model="m", status=429,
            retry_after=7.0,
        )
    ]  # fmt: skip


async def test_another_error_releases_the_slot_at_the_estimate():
    limits = ProviderLimits.of(config(max_in_flight=1))
    limiter = Recording()

    async def model(request):
        raise ModelError("bad request", status=400)

    with pytest.raises(ModelError):
        await LimitedModel(model, limiter, limits, max_wait=3)(REQUEST)

    assert limiter.asked[1:] == ["release p1 used=None"]


def test_counters_count_waits_requeues_and_rejections_per_provider():
    counters = LimitCounters()
    counters.after_wait(LimitWait(provider="a/m", seconds=1.5, reason="requests"))
    counters.after_wait(LimitWait(provider="a/m", seconds=0.5, reason="tokens"))
    counters.after_wait(LimitWait(provider="a/m", seconds=9, reason="paused", requeued=True))
    counters.after_rejected(ProviderRejected(provider="b/m", status=529, retry_after=None))

    snap = counters.snapshot()

    assert (snap["a/m"].waits, snap["a/m"].wait_seconds, snap["a/m"].requeued) == (2, 2.0, 1)
    assert (snap["b/m"].rejected, snap["b/m"].paused_seconds) == (1, 0.0)


def test_a_failing_hook_is_logged_and_the_others_still_hear(caplog):
    class Broken(LimiterHooks):
        def after_wait(self, event):
            raise RuntimeError("boom")

    counters = LimitCounters()
    limiter = Limiter([Broken(), counters])

    with caplog.at_level(logging.ERROR, logger="relayq.ratelimit"):
        limiter.hooks.emit_now(LimitWait(provider="a/m", seconds=1.0, reason="in_flight"))

    assert counters.snapshot()["a/m"].waits == 1
    assert "after_wait" in caplog.text
