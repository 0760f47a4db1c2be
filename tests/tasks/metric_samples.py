"""This process's Prometheus samples, read as a scrape reads them (tests/tasks/test_metrics.py,
and the eager host's in tests/durable/test_metrics.py)."""

from __future__ import annotations

from prometheus_client import REGISTRY


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0
