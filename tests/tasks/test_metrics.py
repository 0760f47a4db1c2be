"""The provider limiter's metrics hooks (`tasks.observability.metrics`): its waits and 429s
land in their metrics, and a provider is named by its host alone."""

from __future__ import annotations

from tasks.observability import metrics
from tests.tasks.metric_samples import sample


def test_the_provider_limiters_waits_and_429s_land_in_their_metrics():
    waited = sample("relayq_provider_limit_wait_seconds_count", provider="api.test", model="m")
    total = sample("relayq_provider_limit_wait_seconds_sum", provider="api.test", model="m")
    limited = sample(
        "relayq_provider_rate_limited_total", provider="api.test", model="m", status="529"
    )

    metrics.observe_limit_wait("api.test", 1.5, model="m")
    metrics.count_rate_limited("api.test", model="m", status=529)

    assert sample("relayq_provider_limit_wait_seconds_count", provider="api.test", model="m") == (
        waited + 1
    )
    assert sample("relayq_provider_limit_wait_seconds_sum", provider="api.test", model="m") == (
        total + 1.5
    )
    assert sample(
        "relayq_provider_rate_limited_total", provider="api.test", model="m", status="529"
    ) == (limited + 1)


def test_a_provider_is_named_by_its_host_alone():
    from relayq.providers import ProviderConfig

    config = ProviderConfig(base_url="https://user:pw@api.example.com:8443/v1", model="m")
    assert metrics.provider_label(config) == "api.example.com"
    assert metrics.provider_label(None) == "in-process"
