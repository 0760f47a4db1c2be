"""A worker host that traces (`RELAYQ_AGENTS=...,tests.durable.traced_worker`): it sets
the global OpenTelemetry tracer provider up, as a host would, and writes each span
it ends to `$RELAYQ_TEST_SPANS` (one JSON object a line), and each task's
`traceparent` header to `$RELAYQ_TEST_SPANS.headers`, so a test in another process
can read them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery.signals import task_prerun
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS = Path(os.environ.get("RELAYQ_TEST_SPANS", ".relayq/test-spans.jsonl"))
_lock = threading.Lock()


def _line(path: Path, record: dict[str, Any]) -> None:
    with _lock, path.open("a") as out:
        out.write(json.dumps(record) + "\n")


class FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            assert span.context is not None
            _line(
                SPANS,
                {
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "start": span.start_time,
                    "end": span.end_time,
                    "attributes": dict(span.attributes or {}),
                    "status": span.status.status_code.name,
                },
            )
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
trace.set_tracer_provider(provider)


@task_prerun.connect
def _note_header(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    header = getattr(task.request, "traceparent", None) if task is not None else None
    _line(
        SPANS.with_suffix(".headers"),
        {
            "task": getattr(task, "name", None),
            "args": list(task.request.args or []),
            "traceparent": header,
        },
    )
