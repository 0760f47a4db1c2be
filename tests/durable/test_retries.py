"""Provider errors: retryable ones are Celery retries with backoff; others fail the run."""

from __future__ import annotations

from itertools import pairwise

from tasks import DurableClient

from .conftest import Durable


async def test_a_rate_limited_model_is_retried_until_it_answers(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model that is rate limited twice, then answers
    # When the run goes through the worker
    res = await client.run("flaky", prompt, timeout=30)

    # Then the turn is retried after each failure and the run ends with the answer
    assert res.status == "done", res.error
    assert res.text == "finally"
    assert res.error is None, "a successful try clears the last error"
    assert durable.count("model", prompt) == 3


async def test_a_retry_waits_at_least_as_long_as_the_provider_asked(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model rate limited twice with "Retry-After: 0.4 s"
    res = await client.run("patient", prompt, timeout=30)

    # Then each try comes at least that long after the one before
    assert res.status == "done", res.error
    log = (durable.log / "model-times.log").read_text().splitlines()
    tries = [float(t) for key, t in (line.split("\t") for line in log) if key == prompt]
    assert len(tries) == 3
    gaps = [later - earlier for earlier, later in pairwise(tries)]
    assert all(gap >= 0.4 for gap in gaps), gaps


async def test_a_model_that_stays_overloaded_fails_the_run_once_the_retries_are_spent(
    durable: Durable, client: DurableClient, prompt: str
):
    # Given a model that is always overloaded, and RELAYQ_MODEL_RETRIES=2
    res = await client.run("overloaded", prompt, timeout=30)

    # Then the first try and two retries are made, and the run fails saying so
    assert res.status == "failed"
    assert res.error is not None
    assert "529 overloaded" in res.error
    assert "gave up after 3 tries" in res.error
    assert durable.count("model", prompt) == 3


async def test_a_model_error_that_is_not_retryable_fails_the_run_at_once(
    durable: Durable, client: DurableClient, prompt: str
):
    res = await client.run("refusing", prompt, timeout=30)

    assert res.status == "failed"
    assert res.error is not None
    assert "400 bad request: no such model" in res.error
    assert "gave up" not in res.error
    assert durable.count("model", prompt) == 1
