"""Retries of 429, 5xx and timeouts, the server's Retry-After, and errors that are not retried."""

from __future__ import annotations

import email.utils
import time

import pytest

from relayq import InProcessRequest, ModelError
from relayq.providers import ProviderConfig, ProviderModel
from tests.provider_server import API_KEY, Reply, error

from .wire import STYLES, text_reply, toolkit, url_of


@pytest.mark.parametrize("style", STYLES)
async def test_a_429_is_retried_no_sooner_than_its_retry_after(style, server, connect):
    server.script += [error(429, "slow down", **{"Retry-After": "1"}), text_reply(style, "ok")]

    started = time.monotonic()
    result = await connect(style).run("hi", await toolkit())
    waited = time.monotonic() - started

    assert result.text == "ok"
    assert len(server.seen) == 2
    assert waited >= 0.95, f"retried after {waited:.2f} s, before the server's Retry-After: 1"


@pytest.mark.parametrize("style", STYLES)
async def test_a_503_is_retried_and_the_run_succeeds(style, server, connect):
    server.script += [error(503, "unavailable"), text_reply(style, "ok")]

    result = await connect(style).run("hi", await toolkit())

    assert result.status == "done"
    assert result.text == "ok"
    assert len(server.seen) == 2


async def test_anthropics_529_overloaded_is_retried(server, connect):
    overloaded = Reply(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        status=529,
    )
    server.script += [overloaded, text_reply("anthropic", "ok")]

    result = await connect("anthropic").run("hi", await toolkit())

    assert result.text == "ok"
    assert len(server.seen) == 2


@pytest.mark.parametrize("style", STYLES)
async def test_retry_after_ms_is_honoured_over_the_default_backoff(style, server, connect):
    # The first backoff is at most 1 s; the server asks for 1.1 s.
    server.script += [
        error(429, "slow down", **{"retry-after-ms": "1100"}),
        text_reply(style, "ok"),
    ]

    started = time.monotonic()
    result = await connect(style).run("hi", await toolkit())
    waited = time.monotonic() - started

    assert result.text == "ok"
    assert waited >= 1.05, f"retried after {waited:.2f} s, before retry-after-ms: 1100"


@pytest.mark.parametrize("style", STYLES)
async def test_a_400_fails_at_once_with_its_status_and_body(style, server, connect):
    server.script += [error(400, "model 'm' does not exist"), text_reply(style, "never")]

    with pytest.raises(ModelError) as raised:
        await connect(style).run("hi", await toolkit())

    assert len(server.seen) == 1, "a 400 is not retried"
    assert raised.value.retryable is False
    assert raised.value.status == 400
    assert raised.value.retry_after is None
    assert "400" in str(raised.value)
    assert "does not exist" in str(raised.value)


@pytest.mark.parametrize("style", STYLES)
async def test_a_wrong_key_is_a_401_that_is_not_retried(style, server, connect):
    # The server checks the key the way the real APIs do.
    with pytest.raises(ModelError) as raised:
        await connect(style, api_key="sk-wrong-key-000000").run("hi", await toolkit())

    assert raised.value.status == 401
    assert raised.value.retryable is False
    assert len(server.seen) == 1


@pytest.mark.parametrize("style", STYLES)
async def test_when_retries_run_out_the_last_error_is_raised(style, server, connect):
    server.script += [error(503, "down"), error(503, "down"), error(503, "down")]

    with pytest.raises(ModelError) as raised:
        await connect(style, retries=1).run("hi", await toolkit())

    assert len(server.seen) == 2, "one call and one retry"
    assert raised.value.retryable is True
    assert raised.value.status == 503


@pytest.mark.parametrize("style", STYLES)
async def test_a_model_without_retries_raises_on_the_first_503_with_the_retry_hint(
    style, server, close_later
):
    server.script += [error(503, "down", **{"Retry-After": "7"}), text_reply(style, "ok")]
    config = ProviderConfig(style=style, base_url=url_of(server, style), model="m", retries=5)
    model = close_later(ProviderModel(config, api_key=API_KEY).without_retries())

    with pytest.raises(ModelError) as raised:
        await model(InProcessRequest(messages=[{"role": "user", "content": "hi"}], tools=[]))

    assert len(server.seen) == 1
    assert raised.value.retryable is True
    assert raised.value.status == 503
    assert raised.value.retry_after == 7.0


async def test_a_retry_after_given_as_an_http_date_is_read_as_seconds_from_now(server, close_later):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.script.append(error(429, "later", **{"Retry-After": when}))
    config = ProviderConfig(base_url=url_of(server, "openai"), model="m")
    model = close_later(ProviderModel(config, api_key=API_KEY, retries=0))

    with pytest.raises(ModelError) as raised:
        await model.complete([{"role": "user", "content": "hi"}])

    assert raised.value.retry_after is not None
    assert 25 <= raised.value.retry_after <= 31


@pytest.mark.parametrize("style", STYLES)
async def test_a_reply_slower_than_the_timeout_is_a_retryable_timeout_error(style, server, connect):
    late = text_reply(style, "too late")
    late.delay = 1.0
    server.script += [late, text_reply(style, "never asked")]

    started = time.monotonic()
    with pytest.raises(ModelError) as raised:
        await connect(style, timeout=0.3, retries=0).run("hi", await toolkit())

    assert time.monotonic() - started < 0.9, "the client gave up at its timeout"
    assert raised.value.retryable is True
    assert "timed out" in str(raised.value)
    assert len(server.seen) == 1, "retries=0: no second request"
