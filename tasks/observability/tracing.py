"""OpenTelemetry traces of durable runs: one trace per run, off unless asked for.

On when `RELAYQ_OTEL=1` (relayq then sets the OpenTelemetry SDK up, unless the host
has: the exporter `OTEL_TRACES_EXPORTER` names, `otlp` by default, which needs
`opentelemetry-exporter-otlp`), or when the host has configured a tracer provider
(`opentelemetry.trace.set_tracer_provider`, or `use_tracer_provider` for relayq's
spans alone). `RELAYQ_OTEL=0` turns it off. Without the `otel` extra nothing here
does anything, and nothing costs more than a flag test while it is off.

A run's trace, every span a child of the first:

    relayq.run         the host starts the run (a root, linked to the host's current span)
    relayq.turn        each turn, on the process that took it
      relayq.model     the turn's model call
    relayq.suspension  a request, from its opening to its answer or expiry
    relayq.decision    each answer or vote on it, where it was given (API, CLI, host)
    relayq.resume      the answer applied to the transcript, on a worker

The run keeps its trace's context, a W3C `traceparent`, in the store
(`runs.trace_context`), and its turn messages carry it as a `traceparent` task
header, so every process joins the same trace however long the run waits and
wherever it goes on. Spans carry ids, the agent, statuses and counts: never a
prompt, an answer, a tool's arguments or a key.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery.signals import before_task_publish

from store import Database
from store.outbox import TURN_TASK
from store.traces import RUNS_PER_STATEMENT, keep_trace_contexts, run_traces
from tasks.hooks import (
    AnswerApplied,
    AnswerApplying,
    ModelCalled,
    ModelCalling,
    RequestDecided,
    RunHooks,
    Sending,
    TurnEnded,
    TurnStarted,
)
from tasks.storeio import Patience, StoreDoor, at_once

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider


try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context as _Empty
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _OTEL = True
except ImportError:  # the `otel` extra is not installed: no traces
    _OTEL = False

__all__ = ["OTEL_ENV", "Tracing", "enabled", "use_tracer_provider"]

OTEL_ENV = "RELAYQ_OTEL"

log = logging.getLogger(__name__)

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
_REMEMBERED = 10_000

_chosen: TracerProvider | None = None
_setup_lock = threading.Lock()
_set_up = False


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace relayq's runs with `provider` (None: back to the global one), whatever
    `RELAYQ_OTEL` and the global provider say, short of `RELAYQ_OTEL=0`."""
    global _chosen
    _chosen = provider


def enabled() -> bool:
    """Whether relayq's spans go anywhere: see the module's docstring."""
    if not _OTEL:
        return False
    flag = os.environ.get(OTEL_ENV, "").strip().lower()
    if flag in _OFF:
        return False
    if _chosen is not None or flag in _ON:
        return True
    return not isinstance(
        trace.get_tracer_provider(), ProxyTracerProvider | trace.NoOpTracerProvider
    )


def _tracer() -> Tracer:
    if _chosen is not None:
        return _chosen.get_tracer("relayq")
    if isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        _set_up_sdk()
    return trace.get_tracer("relayq")


def _set_up_sdk() -> None:
    """RELAYQ_OTEL=1 and no provider configured: the SDK's, with the exporter the
    environment names (`OTEL_TRACES_EXPORTER`: otlp, console or none)."""
    global _set_up
    with _setup_lock:
        if _set_up:
            return
        _set_up = True
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider as SdkProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            log.warning("%s=1, but the OpenTelemetry SDK is not installed: no traces", OTEL_ENV)
            return
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "relayq"}
        provider = SdkProvider(resource=Resource.create(attributes))
        exporter = _exporter(os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip())
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        for module in (
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
            "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        ):
            try:
                return __import__(module, fromlist=["OTLPSpanExporter"]).OTLPSpanExporter()
            except ImportError:
                continue
        log.warning(
            "%s=1 exports with OTLP, which is not installed (pip install "
            "opentelemetry-exporter-otlp); spans are dropped",
            OTEL_ENV,
        )
    elif name != "none":
        log.warning("OTEL_TRACES_EXPORTER=%s is not one relayq sets up; spans are dropped", name)
    return None


# -- the run's context: the store, the task headers, and this process's memory -----------------


class _Remembered:
    """Run id -> traceparent of runs this process has seen lately: what the turn messages
    it sends carry as their header (sending happens on other threads)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> str | None:
        with self._lock:
            found = self._items.get(run_id)
            if found is not None:
                self._items.move_to_end(run_id)
            return found

    def put(self, run_id: str, traceparent: str) -> None:
        with self._lock:
            self._items[run_id] = traceparent
            self._items.move_to_end(run_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_remembered = _Remembered(_REMEMBERED)


@before_task_publish.connect
def _carry_context(
    sender: str | None = None,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """A turn message carries its run's trace context as a `traceparent` header."""
    if sender != TURN_TASK or headers is None or "traceparent" in headers:
        return
    try:
        run_id = str(body[0][0])  # protocol 2: (args, kwargs, embed); args = [run_id, version]
    except (TypeError, IndexError, KeyError):
        return
    traceparent = _remembered.get(run_id)
    if traceparent is not None:
        headers["traceparent"] = traceparent


def _traceparent(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _context(traceparent: str) -> Context:
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


@dataclass(frozen=True)
class _Run:
    agent: str
    traceparent: str


def _contexts(
    db: Database, run_ids: Sequence[str], caller: SpanContext | None = None
) -> dict[str, _Run]:
    """Each run's trace; a run that has none yet gets one now (its `relayq.run` span,
    linked to `caller`, the span current where the run was started)."""
    found: dict[str, _Run] = {}
    for start in range(0, len(run_ids), RUNS_PER_STATEMENT):
        runs = run_traces(db, run_ids[start : start + RUNS_PER_STATEMENT])
        found.update({r.run_id: _Run(r.agent, r.traceparent) for r in runs if r.traceparent})
        fresh = [r for r in runs if not r.traceparent]
        if fresh:
            agents = {r.run_id: r.agent for r in fresh}
            roots = {r.run_id: _root(r.run_id, r.agent, r.batch_id, caller) for r in fresh}
            kept = keep_trace_contexts(db, {run_id: tp for run_id, (tp, _) in roots.items()})
            for run_id, (tp, span) in roots.items():
                # A root another process stored first stays unended, so never exported: a
                # trace has one root, not an orphan beside it.
                if kept.get(run_id) == tp:
                    span.end()
            found.update({run_id: _Run(agents[run_id], tp) for run_id, tp in kept.items()})
    for run_id, run in found.items():
        _remembered.put(run_id, run.traceparent)
    return found


def _root(
    run_id: str, agent: str, batch_id: str | None, caller: SpanContext | None
) -> tuple[str, Span]:
    """A new trace for the run: its `relayq.run` span, linked to `caller`, not yet ended
    (ended once the store keeps it). (Passed in: this runs on a store thread, where the
    host's current span is not current.)"""
    attributes = {"relayq.run_id": run_id, "relayq.agent": agent}
    if batch_id:
        attributes["relayq.batch_id"] = batch_id
    span = _tracer().start_span(
        "relayq.run",
        context=_Empty(),  # a root: the caller's span is linked, not the parent
        kind=SpanKind.PRODUCER,
        attributes=attributes,
        links=[trace.Link(caller)] if caller is not None and caller.is_valid else None,
    )
    return _traceparent(span) or "", span


# -- the hook: the host's sends and decisions, the worker's turns, model calls and resumes -------


@dataclass
class _Open:
    """A span this hook opened in a `before_*` method, current until its `after_*`."""

    span: Span
    token: object


_turn_span: ContextVar[_Open | None] = ContextVar("relayq_turn_span", default=None)
_model_span: ContextVar[_Open | None] = ContextVar("relayq_model_span", default=None)
_resume_span: ContextVar[_Open | None] = ContextVar("relayq_resume_span", default=None)


class Tracing(RunHooks):
    """The runs' OpenTelemetry spans, from the events of a runtime or a host client.

    `store` is the runtime's or the client's door; `patiently` waits out a store outage
    (the worker's, for the reads a turn cannot do without).
    Every method returns at once while tracing is off (`enabled()`).
    """

    on_loop = True  # quick, and made for the loop (`RunHooks.on_loop`)

    def __init__(self, store: StoreDoor, patiently: Patience = at_once) -> None:
        self.store = store
        self.patiently = patiently

    async def before_send(self, event: Sending) -> None:
        """Each run without a trace gets one before its turn messages go, and they carry it."""
        if not enabled():
            return
        turns = {str(r.args[0]) for r in event.rows if r.task == TURN_TASK and r.args}
        run_ids = sorted(rid for rid in turns if _remembered.get(rid) is None)
        if run_ids:
            await self.store.call(_contexts, self.store.db, run_ids, _caller())

    async def after_request_decided(self, event: RequestDecided) -> None:
        """A `relayq.decision` span for an answer the store took, from when it was asked."""
        if not enabled():
            return
        runs = await self.store.call(_contexts, self.store.db, [event.run_id], _caller())
        run = runs.get(event.run_id)
        if run is None:
            return
        span = _tracer().start_span(
            "relayq.decision",
            context=_context(run.traceparent),
            start_time=event.started_ns,
            attributes={
                "relayq.run_id": event.run_id,
                "relayq.agent": run.agent,
                "relayq.request_id": event.request_id,
                "relayq.decision.ok": event.ok,
                "relayq.decision.resolved": event.resolved,
                "relayq.via": event.via,
            },
        )
        span.end()

    async def _run_context(self, run_id: str, known: str | None) -> Context:
        """The run's trace: `known` (a message's header, the store's column), else this
        process's memory, else the store's, else a new one."""
        traceparent = known or _remembered.get(run_id)
        if traceparent is None:
            found = (await self.patiently(self.store.call, _contexts, self.store.db, [run_id])).get(
                run_id
            )
            traceparent = found.traceparent if found is not None else ""
        else:
            _remembered.put(run_id, traceparent)
        return _context(traceparent)

    async def before_turn(self, event: TurnStarted) -> None:
        """The turn's `relayq.turn` span, current while the turn runs."""
        if not enabled():
            return
        parent = await self._run_context(event.run_id, event.traceparent)
        span = _tracer().start_span(
            "relayq.turn",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "relayq.run_id": event.run_id,
                "relayq.agent": event.agent,
                "relayq.turn": event.turn,
                "relayq.attempt": event.attempt,
            },
        )
        _open(_turn_span, span)

    def after_turn(self, event: TurnEnded) -> None:
        opened = _close(_turn_span)
        if opened is None:
            return
        span = opened.span
        span.set_attribute("relayq.outcome", event.outcome.value)
        if event.request_id is not None:
            span.set_attribute("relayq.request_id", event.request_id)
        if event.error is not None:
            # The exception's type only: its text may quote a prompt or a key.
            span.set_status(StatusCode.ERROR, event.error)
        span.end()

    def before_model_call(self, event: ModelCalling) -> None:
        """The `relayq.model` span of one model call, a child of the turn's."""
        if not enabled():
            return
        span = _tracer().start_span(
            "relayq.model",
            kind=SpanKind.CLIENT,
            attributes={"server.address": event.provider, "gen_ai.request.model": event.model},
        )
        _open(_model_span, span)

    def after_model_call(self, event: ModelCalled) -> None:
        opened = _close(_model_span)
        if opened is None:
            return
        span = opened.span
        if event.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", event.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", event.usage.completion_tokens)
        if event.error is not None:
            span.set_status(StatusCode.ERROR, event.error)
        span.end()

    async def before_answer_applied(self, event: AnswerApplying) -> None:
        """The `relayq.resume` span around applying an answer, and the request's
        `relayq.suspension` span, from its opening to its answer, the first time."""
        if not enabled():
            return
        row = await self.patiently(self.store.request_trace, event.request_id)
        if row is None:
            return
        parent = await self._run_context(row.run_id, row.trace_context)
        attributes = {
            "relayq.run_id": row.run_id,
            "relayq.agent": row.agent,
            "relayq.request_id": event.request_id,
            "relayq.request.kind": row.kind,
            "relayq.request.status": row.status,
        }
        if row.outcome:
            attributes["relayq.request.outcome"] = row.outcome
        if not row.applied and row.answered_at is not None:
            span = _tracer().start_span(
                "relayq.suspension",
                context=parent,
                start_time=_ns(row.created_at),
                attributes=attributes,
            )
            span.end(end_time=_ns(row.answered_at))
        span = _tracer().start_span(
            "relayq.resume", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )
        _open(_resume_span, span)

    def after_answer_applied(self, event: AnswerApplied) -> None:
        opened = _close(_resume_span)
        if opened is not None:
            if event.error is not None:
                opened.span.set_status(StatusCode.ERROR, event.error)
            opened.span.end()


def _caller() -> SpanContext:
    """The span current here, which a new run's trace links to."""
    return trace.get_current_span().get_span_context()


def _open(slot: ContextVar[_Open | None], span: Span) -> None:
    """Make `span` current until `_close(slot)`."""
    slot.set(_Open(span, otel_context.attach(trace.set_span_in_context(span))))


def _close(slot: ContextVar[_Open | None]) -> _Open | None:
    """The span `slot` holds, no longer current."""
    opened = slot.get()
    if opened is not None:
        slot.set(None)
        otel_context.detach(opened.token)  # type: ignore[arg-type]
    return opened
