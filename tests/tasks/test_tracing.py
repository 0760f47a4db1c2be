"""Tracing's switch (`tasks.observability.tracing`): `RELAYQ_OTEL=0` turns it off even with a
tracer provider. Traces of real runs, eager and on a worker: tests/durable/test_tracing.py."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tasks.observability import tracing


def test_relayq_otel_0_turns_tracing_off_even_with_a_provider(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
):
    assert tracing.enabled()
    monkeypatch.setenv(tracing.OTEL_ENV, "0")
    assert not tracing.enabled()
